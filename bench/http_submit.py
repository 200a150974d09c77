"""Submits per second over HTTP: `pgqueue serve` on a scratch database, under a load generator.

    python -m bench.http_submit --server-url postgresql://postgres@127.0.0.1:5432/postgres \
        --workers 1 --concurrency 32 --duration 20 --generator both

It creates a scratch database on the server (dropped afterwards), migrates it, and starts
``python -m pgqueue --database-url URL serve --port P --workers W --log-level warning`` with
an API token (so every request is authenticated, as in production), waits for /readyz, warms
up, then drives POST /api/v1/tasks with a ~2 KB JSON body from C keep-alive connections for D
seconds (or until --requests responses) with each generator asked for:

* ``httpx``: asyncio + httpx.AsyncClient, C tasks in a closed loop. Reports requests/s,
  p50/p95/p99 latency, and errors (a non-202 status or a failed request; must be 0).
* ``wrk``: wrk (C connections, 2 threads) with a Lua script for the POST body; it costs far
  less CPU than the Python generator, so it leaves more of the machine to the server.

After each run it counts the tasks in the database: for httpx, which waits for its last
responses, the count must equal the 202 responses exactly; wrk stops with up to C requests in
flight that the server may still commit, so there it must lie in [202s, 202s + C].

The load generator shares the machine's cores with the server and PostgreSQL: each result
gives the CPU seconds the server processes, the load generator and the whole machine used in
the measured window (from /proc). Durability is whatever the server has (the machine's
PostgreSQL: fsync and synchronous_commit on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

from pgqueue import migrate

TOKEN = "bench-token"
PATH = "/api/v1/tasks"
BRIEF_PEAK = 350  # submits/s the brief asks the API to sustain
MAX_DURATION = 300.0
READY_DEADLINE = 60.0
REQUEST_TIMEOUT = 30.0


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def request_body(size: int) -> bytes:
    """A submit body of ``size`` bytes (at least the bare envelope): type, queue, payload."""
    task: dict[str, Any] = {
        "type": "bench.http",
        "queue": "default",
        "payload": {"order_id": 12345, "customer": "c-67890", "note": ""},
    }
    bare = len(json.dumps(task, separators=(",", ":")).encode())
    task["payload"]["note"] = "x" * max(0, size - bare)
    return json.dumps(task, separators=(",", ":")).encode()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(p / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


# --- CPU accounting from /proc ---------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[str, int, float]]:
    """Every visible process: pid -> (command name, parent pid, CPU seconds used so far)."""
    out: dict[int, tuple[str, int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()  # from the state on
        out[int(entry.name)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and its descendants that are alive."""
    processes = _processes()
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, (_, parent, _) in processes.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(processes[pid][2] for pid in tree if pid in processes)


def postgres_cpu_seconds() -> float:
    """CPU seconds used so far by the PostgreSQL processes visible here (postmaster,
    backends, walwriter, checkpointer...); 0 when the server is elsewhere."""
    return sum(cpu for comm, _, cpu in _processes().values() if comm.startswith("postgres"))


def machine_busy_seconds() -> float:
    """CPU seconds the machine's cores spent busy since boot (/proc/stat: user, nice, system,
    irq, softirq; not idle, iowait or steal). Counts every process, other tenants' too."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return float("nan")
    return (values[0] + values[1] + values[2] + values[5] + values[6]) / TICK


def children_cpu_seconds() -> float:
    """CPU seconds used by this process's children that have been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuWindow:
    """CPU seconds used between start() and stop(), by name."""

    meters: dict[str, Callable[[], float]]
    started: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, server_pid: int, generator: Callable[[], float]) -> CpuWindow:
        return cls(
            {
                "server_cpu_s": lambda: tree_cpu_seconds(server_pid),
                "load_generator_cpu_s": generator,
                "postgres_cpu_s": postgres_cpu_seconds,
                "machine_busy_cpu_s": machine_busy_seconds,
            }
        )

    def start(self) -> None:
        self.started = {name: meter() for name, meter in self.meters.items()}

    def stop(self) -> None:
        self.used = {name: meter() - self.started[name] for name, meter in self.meters.items()}

    def report(self, responses: int) -> dict[str, float]:
        """The CPU seconds used, and the server's and PostgreSQL's CPU ms per response."""
        n = max(responses, 1)
        return {
            **{name: round(seconds, 1) for name, seconds in self.used.items()},
            "server_cpu_ms_per_request": round(1000 * self.used["server_cpu_s"] / n, 2),
            "postgres_cpu_ms_per_request": round(1000 * self.used["postgres_cpu_s"] / n, 2),
        }


def idle_busy_cores(seconds: float = 3.0) -> float:
    """How many cores' worth of CPU the machine uses with no load from this benchmark."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return round((machine_busy_seconds() - before) / seconds, 2)


# --- the server ------------------------------------------------------------------------------


@contextlib.contextmanager
def serve(url: str, port: int, workers: int) -> Iterator[subprocess.Popen[bytes]]:
    """`pgqueue serve` as a subprocess; ready (GET /readyz answered 200) when yielded."""
    command = [
        sys.executable,
        "-m",
        "pgqueue",
        "--database-url",
        url,
        "serve",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
    ]
    env = dict(os.environ, PGQUEUE_API_TOKENS=TOKEN)
    server = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + READY_DEADLINE
        while True:
            if server.poll() is not None:
                raise SystemExit(f"pgqueue serve exited with {server.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"pgqueue serve not ready after {READY_DEADLINE} s")
            time.sleep(0.1)
        yield server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)


def task_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    count: int = row[0]
    return count


def settled_task_count(url: str, deadline_s: float = 15.0) -> int:
    """The task count once it stops moving (requests still in flight get committed)."""
    deadline = time.monotonic() + deadline_s
    last = task_count(url)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = task_count(url)
        if now == last:
            return now
        last = now
    raise SystemExit(f"the task count was still moving after {deadline_s} s")


# --- generator 1: asyncio + httpx --------------------------------------------------------------


@dataclass
class HttpxResult:
    seconds: float
    latencies: list[float]
    ok: int  # 202 responses
    errors: dict[str, int]


async def httpx_load(
    base: str, body: bytes, concurrency: int, duration: float, max_requests: int | None
) -> HttpxResult:
    """C tasks, each sending one request after another until the deadline or the budget."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    remaining = max_requests  # None: no limit but the deadline
    ok = 0
    async with httpx.AsyncClient(
        base_url=base, limits=limits, timeout=REQUEST_TIMEOUT, headers=headers
    ) as client:
        started = time.perf_counter()
        deadline = started + duration

        async def user() -> None:
            nonlocal remaining, ok
            while time.perf_counter() < deadline and remaining != 0:
                if remaining is not None:
                    remaining -= 1
                sent = time.perf_counter()
                try:
                    response = await client.post(PATH, content=body)
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - sent)
                if response.status_code == 202:
                    ok += 1
                else:
                    key = f"status {response.status_code}"
                    errors[key] = errors.get(key, 0) + 1

        await asyncio.gather(*(user() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return HttpxResult(seconds, sorted(latencies), ok, errors)


def run_httpx(
    args: argparse.Namespace, url: str, base: str, body: bytes, server_pid: int
) -> dict[str, Any]:
    # Warm up (server workers, their connection pools, the client's connections); the tasks
    # it makes are in the database but not in the figures.
    asyncio.run(httpx_load(base, body, args.concurrency, args.warmup, None))
    before = task_count(url)
    cpu = CpuWindow.of(server_pid, time.process_time)
    cpu.start()
    result = asyncio.run(httpx_load(base, body, args.concurrency, args.duration, args.requests))
    cpu.stop()
    created = task_count(url) - before
    done = len(result.latencies)
    rps = done / result.seconds
    ms = [1000 * percentile(result.latencies, p) for p in (50, 95, 99)]
    return {
        "generator": "httpx",
        "workers": args.workers,
        "concurrency": args.concurrency,
        "body_bytes": len(body),
        "seconds": round(result.seconds, 1),
        "responses": done,
        "requests_per_s": round(rps),
        "p50_ms": round(ms[0], 1),
        "p95_ms": round(ms[1], 1),
        "p99_ms": round(ms[2], 1),
        "errors": sum(result.errors.values()),
        "error_kinds": result.errors,
        "status_202": result.ok,
        "tasks_created": created,
        "tasks_match_202s": created == result.ok,
        "x_brief_peak_350": round(rps / BRIEF_PEAK, 1),
        **cpu.report(done),
    }


# --- generator 2: wrk --------------------------------------------------------------------------

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(token)s"
wrk.body = io.open("%(body)s", "rb"):read("*a")

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  accepted = 0
end

function response(status, headers, body)
  if status == 202 then
    accepted = accepted + 1
  end
end

function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do
    total = total + thread:get("accepted")
  end
  io.write(string.format(
    "WRK_RESULT {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"status_202\\": %%d, "
    .. "\\"connect\\": %%d, \\"read\\": %%d, \\"write\\": %%d, \\"status\\": %%d, "
    .. "\\"timeout\\": %%d, \\"p50_us\\": %%d, \\"p95_us\\": %%d, \\"p99_us\\": %%d}\\n",
    summary.requests, summary.duration, total,
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


def run_wrk(
    args: argparse.Namespace, url: str, base: str, body: bytes, server_pid: int
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk), or use --generator httpx")
    with tempfile.TemporaryDirectory(prefix="pgqueue-bench-") as tmp:
        body_path = Path(tmp, "body.json")
        body_path.write_bytes(body)
        script = Path(tmp, "submit.lua")
        script.write_text(WRK_SCRIPT % {"token": TOKEN, "body": body_path})

        def command(seconds: float) -> list[str]:
            threads = min(2, args.concurrency)
            return [
                wrk,
                f"-t{threads}",
                f"-c{args.concurrency}",
                f"-d{max(1, round(seconds))}s",
                f"--timeout={round(REQUEST_TIMEOUT)}s",
                "-s",
                str(script),
                base + PATH,
            ]

        subprocess.run(command(args.warmup), check=True, capture_output=True, timeout=120)
        before = settled_task_count(url)
        # wrk's CPU: what this process's reaped children used, before and after (wrk is the
        # only child reaped in between; the server runs on until the end).
        cpu = CpuWindow.of(server_pid, children_cpu_seconds)
        cpu.start()
        process = subprocess.Popen(command(args.duration), stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate(timeout=args.duration + 120)
        cpu.stop()
        if process.returncode != 0:
            raise SystemExit(f"wrk exited with {process.returncode}: {out}")
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_RESULT ")), None)
    if line is None:
        raise SystemExit(f"no result line from wrk: {out}")
    raw = json.loads(line.removeprefix("WRK_RESULT "))
    created = settled_task_count(url) - before
    seconds = raw["duration_us"] / 1e6
    rps = raw["requests"] / seconds
    errors = {k: raw[k] for k in ("connect", "read", "write", "status", "timeout") if raw[k]}
    in_flight = created - raw["status_202"]
    return {
        "generator": "wrk",
        "workers": args.workers,
        "concurrency": args.concurrency,
        "body_bytes": len(body),
        "seconds": round(seconds, 1),
        "responses": raw["requests"],
        "requests_per_s": round(rps),
        "p50_ms": round(raw["p50_us"] / 1000, 1),
        "p95_ms": round(raw["p95_us"] / 1000, 1),
        "p99_ms": round(raw["p99_us"] / 1000, 1),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "status_202": raw["status_202"],
        "tasks_created": created,
        # Requests still in flight when wrk stopped may be committed without a counted reply.
        "tasks_match_202s": 0 <= in_flight <= args.concurrency,
        "committed_after_stop": in_flight,
        "x_brief_peak_350": round(rps / BRIEF_PEAK, 1),
        **cpu.report(raw["requests"]),
    }


# --- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--workers", type=int, default=1, help="pgqueue serve --workers")
    parser.add_argument("--concurrency", type=int, default=32, help="connections")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per run")
    parser.add_argument("--requests", type=int, default=None, help="stop after N (httpx)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds, not measured")
    parser.add_argument("--body-bytes", type=int, default=2048)
    parser.add_argument(
        "--generator",
        choices=["httpx", "wrk", "both"],
        default="both" if shutil.which("wrk") else "httpx",
    )
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")
    if not 0 < args.duration <= MAX_DURATION:
        parser.error(f"--duration must be in (0, {MAX_DURATION}]")
    if args.requests is not None and args.requests < 1:
        parser.error("--requests must be at least 1")
    if not 1 <= args.concurrency <= 1000 or args.workers < 1:
        parser.error("--concurrency must be in [1, 1000] and --workers at least 1")

    name = f"pgqueue_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(args.server_url, name)
    failed = False
    try:
        migrate.upgrade(url)
        body = request_body(args.body_bytes)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        generators = ["httpx", "wrk"] if args.generator == "both" else [args.generator]
        with serve(url, port, args.workers) as server:
            for generator in generators:
                # Other work on the machine (it is shared) shows here, with none of ours.
                idle = idle_busy_cores()
                run = run_httpx if generator == "httpx" else run_wrk
                result = run(args, url, base, body, server.pid)
                result["cores"] = os.cpu_count()
                result["machine_busy_cores_before"] = idle
                print(json.dumps(result), flush=True)
                failed |= bool(result["errors"]) or not result["tasks_match_202s"]
    finally:
        with psycopg.connect(args.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if failed:
        raise SystemExit("errors, or tasks in the database that do not match the 202 responses")


if __name__ == "__main__":
    main()
