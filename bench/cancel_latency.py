"""How long a cancel of a running task takes to reach its handler, with real
processes: a `pgqueue worker` and a `pgqueue serve`, both from the tree under test.

    python -m bench.cancel_latency --server-url postgresql://postgres@127.0.0.1:5432/postgres
    python -m bench.cancel_latency --server-url ... --tree /tmp/pgqueue-main   # before

Tasks are submitted through the API and read back with plain SQL, so that one harness measures
trees of different schemas; ``pgqueue.cancel`` is this checkout's (its statement works on
either schema; the NOTIFY it sends is heard only by a worker that listens for it).

The worker runs long handlers that poll ``ctx.should_stop()`` every 10 ms and, once it turns
true, raise Cancel with the wall-clock time they saw it (the task's last_error). Tasks are
started a batch at a time; each running one is then cancelled, alternately by the library
(``pgqueue.cancel``, from this process) and by the HTTP API (``DELETE /api/v1/tasks/ID`` to
the serve process), a few milliseconds apart, at a random point of the heartbeat's cycle,
and the latency is the handler's time less the
time just before the cancel was sent (one machine, one clock). Each run gets a fresh
database on the given server, migrated by the tree under test, and drops it afterwards.

``--tree PATH`` runs the worker and the API from another checkout (PYTHONPATH=PATH): a git
worktree of main measures the heartbeat-only path. The worker's lease is 30 s (the default),
so its heartbeat, the only path before this change, comes every 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue

HANDLERS = """
import time
from pgqueue import Cancel, TaskRegistry

tasks = TaskRegistry()


@tasks.handler("hold")
def hold(payload, ctx):
    deadline = time.monotonic() + 120
    while not ctx.should_stop():
        if time.monotonic() > deadline:
            return "never told"
        time.sleep(0.01)
    raise Cancel(f"saw stop at {time.time():.6f}")
"""


def database_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)
    return value


def submit(base: str) -> uuid.UUID:
    """A task, through the HTTP API of the tree under test (its schema, its enqueue)."""
    request = urllib.request.Request(
        f"{base}/tasks",
        data=json.dumps({"type": "hold"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return uuid.UUID(json.loads(response.read())["task_id"])


def status(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str | None:
    row = conn.execute("SELECT status FROM pgqueue.tasks WHERE id = %s", (task_id,)).fetchone()
    return None if row is None else str(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", required=True, help="a database on the server to use")
    parser.add_argument("--tree", type=Path, help="run the worker and API from this checkout")
    parser.add_argument("--cancels", type=int, default=100, help="how many cancels (100)")
    parser.add_argument("--batch", type=int, default=10, help="tasks running at once (10)")
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="also write the latencies here")
    args = parser.parse_args()

    name = f"pgqueue_cancel_bench_{uuid.uuid4().hex[:8]}"
    url = database_url(args.server_url, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    work = Path(tempfile.mkdtemp(prefix="cancel-bench-"))
    (work / "cancel_bench_handlers.py").write_text(HANDLERS)
    paths = [str(work)] + ([str(args.tree.resolve())] if args.tree else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PGQUEUE_DATABASE_URL"] = url
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pgq = [sys.executable, "-m", "pgqueue"]
        subprocess.run([*pgq, "migrate"], env=env, check=True, capture_output=True, cwd=work)
        code = subprocess.run(
            [sys.executable, "-c", "import pgqueue, sys; print(pgqueue.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            cwd=work,
        ).stdout.strip()
        port = free_port()
        log = (work / "worker.log").open("wb")
        procs.append(
            subprocess.Popen(
                [*pgq, "worker", "cancel_bench_handlers:tasks", "--concurrency",
                 str(args.batch), "--lease-seconds", str(args.lease_seconds),
                 "--log-format", "json"],
                env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=log,
            )
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [*pgq, "serve", "--port", str(port), "--log-level", "warning"],
                env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}/api/v1"

        def api_up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    return True
            except OSError:
                return False

        wait_for(api_up, 60, "the API")
        latencies: dict[str, list[float]] = {"library": [], "http": []}
        with psycopg.connect(url, autocommit=True) as conn:
            done = 0
            while done < args.cancels:
                n = min(args.batch, args.cancels - done)
                ids = [submit(base) for _ in range(n)]
                for task_id in ids:
                    wait_for(lambda t=task_id: status(conn, t) == "running", 60, "a task to run")
                # The handlers are in their polling loops. Then a random part of a heartbeat
                # interval, so that the cancels fall anywhere in the heartbeat's cycle: a
                # batch started just after a beat would otherwise always wait a whole one.
                time.sleep(0.05 + random.uniform(0.0, args.lease_seconds / 3))
                asked: dict[uuid.UUID, tuple[str, float]] = {}
                for i, task_id in enumerate(ids):
                    via = "http" if (done + i) % 2 else "library"
                    asked[task_id] = (via, time.time())
                    if via == "library":
                        pgqueue.cancel(conn, task_id)
                    else:
                        request = urllib.request.Request(f"{base}/tasks/{task_id}", method="DELETE")
                        with urllib.request.urlopen(request, timeout=10) as response:
                            assert response.status == 202, response.status
                    time.sleep(random.uniform(0.0, 0.02))
                for task_id, (via, t0) in asked.items():
                    wait_for(
                        lambda t=task_id: status(conn, t) == "cancelled",
                        args.lease_seconds + 30,
                        "a cancelled task",
                    )
                    row = conn.execute(
                        "SELECT last_error FROM pgqueue.tasks WHERE id = %s", (task_id,)
                    ).fetchone()
                    assert row is not None
                    seen = float(str(row[0]).removeprefix("saw stop at "))
                    latencies[via].append(seen - t0)
                done += n
        everything = latencies["library"] + latencies["http"]
        report: dict[str, Any] = {"pgqueue": code, "lease_seconds": args.lease_seconds}
        for label, values in (*latencies.items(), ("all", everything)):
            report[label] = {
                "n": len(values),
                "p50_ms": round(percentile(values, 0.50) * 1000, 1),
                "p95_ms": round(percentile(values, 0.95) * 1000, 1),
                "p99_ms": round(percentile(values, 0.99) * 1000, 1),
                "max_ms": round(max(values) * 1000, 1),
                "mean_ms": round(statistics.fmean(values) * 1000, 1),
            }
        via = [
            json.loads(line).get("via")
            for line in (work / "worker.log").read_text(errors="replace").splitlines()
            if '"task.cancel_requested"' in line
        ]
        report["worker_heard_via"] = {
            v or "heartbeat (no via field)": via.count(v) for v in set(via)
        }
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps({**report, "latencies": latencies}, indent=2))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with psycopg.connect(args.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
