"""Shared parts of the load benchmarks (design_load, soak): a scratch database, real worker and
API processes in their own process groups, open-loop producers, and CPU accounting.

Why these pieces look the way they do:

* **Open loop.** A producer that waits for one submit before sending the next measures its own
  latency, not the queue's: if the queue slows down, the load drops and hides it. The
  producers here send task *i* at ``t0 + i / rate`` by the wall clock, whatever happened to
  the previous ones, and report how late they were against that schedule.
* **Processes in their own groups.** ``pgqueue worker --processes N`` is a supervisor with
  children; ``pgqueue serve`` may fork too. Each is started with a new session so that one
  ``killpg`` in a ``finally`` reaches every descendant, whatever state the run ended in.
* **CPU by component.** On a 2-core machine shared with other work, "it kept up" means little
  without what it cost. CPU seconds are read per process from /proc (psutil), sampled during
  the run so that processes which exit meanwhile still count, and the producer's own CPU is
  measured per thread (``time.thread_time``), so the sampler's work is not billed to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
import psycopg

import pgqueue
from pgqueue import migrate

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
TICK = os.sysconf("SC_CLK_TCK")
CONNECT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 10,
    # No statement may hang a benchmark: 60 s is far beyond anything these run.
    "options": "-c statement_timeout=60000",
}


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that a benchmark stopped with ``kill`` (or a timeout)
    still runs its ``finally`` blocks: the workers it started are in their own sessions and
    would outlive it, and the scratch database would stay behind."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


# --- the scratch database ------------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "pgqueue_load") -> Iterator[tuple[str, str]]:
    """A fresh, migrated database on the server, dropped (even if a process still holds a
    connection to it) when the block ends. Yields (url, name)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(server_url, name)
        migrate.upgrade(url)
        yield url, name
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def private_server(pg_bin: str | None = None) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free port, with the server defaults (autovacuum on,
    fsync and synchronous_commit on) and the shared server's memory settings; yields its URL
    and stops and deletes it afterwards.

    Why: the shared server here runs with ``autovacuum = off`` (its CI configuration), and a
    soak on it can only show dead tuples piling up; the table's autovacuum reloptions need a
    server whose autovacuum runs. initdb refuses to run as root, so as root the cluster
    belongs to the ``postgres`` user.
    """
    import glob
    import pwd
    import shutil

    bindir = pg_bin or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None
    )
    if bindir is None or not Path(bindir, "initdb").exists():
        raise SystemExit("no PostgreSQL binaries found: give --pg-bin (the dir with initdb)")
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="pgqueue-private-pg-"))
    if as_user:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data = root / "data"
    port = free_port()
    pg_ctl = [*as_user, str(Path(bindir, "pg_ctl")), "-D", str(data)]
    started = False
    try:
        subprocess.run(
            [*as_user, str(Path(bindir, "initdb")), "-D", str(data), "-U", "postgres",
             "--auth=trust", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        options = (
            f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root} "
            "-c shared_buffers=128MB -c max_wal_size=1GB -c fsync=on -c synchronous_commit=on "
            "-c autovacuum=on"
        )
        subprocess.run(
            [*pg_ctl, "-o", options, "-l", str(root / "server.log"), "-w", "-t", "60", "start"],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            try:
                subprocess.run(
                    [*pg_ctl, "-m", "fast", "-w", "-t", "30", "stop"],
                    capture_output=True, timeout=60,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                subprocess.run(
                    [*pg_ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60
                )
        shutil.rmtree(root, ignore_errors=True)


# --- processes -----------------------------------------------------------------------------


def stop_group(proc: subprocess.Popen[bytes], sig: int, grace: float) -> None:
    """Ask the group leader to stop with ``sig``; after ``grace`` seconds, or once it has
    exited, SIGKILL whatever is left in its process group (children it did not reap)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@contextlib.contextmanager
def process_group(
    command: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    stop_signal: int = signal.SIGTERM,
    grace: float = 30.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` in a new session with its output in ``log_path``; stopped on exit."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(command),
            env=full_env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_group(proc, stop_signal, grace)


def worker_command(
    url: str,
    *,
    processes: int,
    concurrency: int,
    lease_seconds: float = 30.0,
    grace_period: float = 10.0,
    completed_retention: float | None = None,
    queues: Sequence[str] = (),
) -> list[str]:
    """The real CLI, as a user would run it; JSON logs at WARNING so that per-task lines do
    not cost the worker CPU, while every lease loss, retry or error is still written.
    ``queues`` empty leaves out ``--queue`` (the CLI's default: the queue "default"), so the
    command line of every run that names none is what it always was."""
    command = [sys.executable, "-m", "pgqueue", "--database-url", url, "worker"]
    command += ["bench.load_handlers:tasks", "--processes", str(processes)]
    for queue in queues:
        command += ["--queue", queue]
    command += ["--concurrency", str(concurrency), "--lease-seconds", str(lease_seconds)]
    command += ["--grace-period", str(grace_period), "--log-format", "json"]
    command += ["--log-level", "WARNING"]
    if completed_retention is not None:
        command += ["--completed-retention", str(completed_retention)]
    return command


def wait_for_workers(
    url: str, database: str, processes: int, proc: subprocess.Popen[bytes], timeout: float = 60
) -> float:
    """Wait until every worker process LISTENs (each has one listener connection): before
    that, a submitted task would wait for a worker to start, not for the queue. Returns the
    seconds it took."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True, **CONNECT_OPTIONS) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query = %s",
                (database, "LISTEN pgqueue"),
            ).fetchone()
            if row is not None and row[0] >= processes:
                return time.monotonic() - started
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited with {proc.returncode} while starting")
            if time.monotonic() - started > timeout:
                raise SystemExit(f"workers not listening after {timeout} s")
            time.sleep(0.2)


def serve_command(url: str, port: int, workers: int) -> list[str]:
    command = [sys.executable, "-m", "pgqueue", "--database-url", url, "serve"]
    command += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    return command


def wait_for_api(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"pgqueue serve exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"pgqueue serve not ready after {timeout} s")
        time.sleep(0.2)


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_events(path: Path) -> dict[str, int]:
    """Counts of the warning and error events a worker wrote (JSON lines), by event name;
    lines that are not JSON (a traceback from a crash) are counted as 'unparsed'."""
    counts: dict[str, int] = {}
    if not path.exists():
        return counts
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = f"{record.get('level', '?')}:{record.get('event', '?')}"
        except (json.JSONDecodeError, AttributeError):
            key = "unparsed"
        counts[key] = counts.get(key, 0) + 1
    return counts


def log_samples(path: Path, limit: int = 5) -> list[str]:
    """The first ``limit`` lines of a worker log: the evidence behind ``log_events``."""
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[:limit]


# --- CPU accounting ------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it that is alive now."""
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def postgres_pids() -> list[int]:
    """Every PostgreSQL process visible here: backends of every database and tenant, and the
    server's own (walwriter, checkpointer, autovacuum launcher...)."""
    out = []
    for p in psutil.process_iter(["name"]):
        if (p.info.get("name") or "").startswith("postgres"):
            out.append(p.pid)
    return out


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq; not idle, iowait or steal). Counts every process, other tenants' too."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (values[0] + values[1] + values[2] + values[5] + values[6]) / TICK


def idle_busy_cores(seconds: float = 3.0) -> float:
    """Cores' worth of CPU the machine uses before our load starts (other tenants)."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return round((machine_busy_seconds() - before) / seconds, 2)


class CpuMeter:
    """CPU seconds per named group of processes between ``start()`` and ``stop()``.

    Each ``sample()`` reads the cumulative CPU of every process in every group and keeps the
    last value per process, so a process that exits between samples still counts up to its
    last sample. Processes first seen after ``start()`` count from zero (they started during
    the window); those alive at ``start()`` count from their value then.
    """

    def __init__(self, groups: Mapping[str, Callable[[], Iterable[int]]]) -> None:
        self.groups = groups
        self._procs: dict[int, psutil.Process] = {}
        self._base: dict[tuple[str, int], float] = {}
        self._last: dict[tuple[str, int], float] = {}
        self._rss: dict[str, float] = {}
        self._started = False
        self.machine_start = 0.0
        self.machine_used = 0.0
        self.wall_start = 0.0
        self.wall = 0.0

    def _cpu(self, pid: int) -> tuple[float, float] | None:
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            times = proc.cpu_times()
            return times.user + times.system, proc.memory_info().rss
        except psutil.Error:
            return None

    def sample(self) -> None:
        for name, pids in self.groups.items():
            rss = 0.0
            for pid in pids():
                got = self._cpu(pid)
                if got is None:
                    continue
                cpu, mem = got
                rss += mem
                key = (name, pid)
                if key not in self._base:
                    self._base[key] = cpu if not self._started else 0.0
                self._last[key] = cpu
            self._rss[name] = max(self._rss.get(name, 0.0), rss)

    def start(self) -> None:
        self.sample()
        self._started = True
        self.machine_start = machine_busy_seconds()
        self.wall_start = time.monotonic()

    def stop(self) -> None:
        self.sample()
        self.machine_used = machine_busy_seconds() - self.machine_start
        self.wall = time.monotonic() - self.wall_start

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(self.groups, 0.0)
        for (name, _), last in self._last.items():
            out[name] += last - self._base[(name, _)]
        return out

    def max_rss_mb(self, name: str) -> float:
        return round(self._rss.get(name, 0.0) / 2**20, 1)


# --- producers -----------------------------------------------------------------------------


def payload_of(size: int, **fields: Any) -> dict[str, Any]:
    """A payload whose JSON is ``size`` bytes (at least its fields): the brief's ~2 KB."""
    payload: dict[str, Any] = {**fields, "pad": ""}
    bare = len(json.dumps(payload, separators=(",", ":")))
    payload["pad"] = "x" * max(0, size - bare)
    return payload


@dataclasses.dataclass
class ProducerStats:
    """What a producer did: per submit, when it was sent against its schedule and how long it
    took; errors by kind; the CPU its own threads used."""

    target: int = 0
    ok: int = 0
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    lateness: list[float] = dataclasses.field(default_factory=list)  # sent - scheduled, s
    latency: list[float] = dataclasses.field(default_factory=list)  # done - scheduled, s
    done_at: list[float] = dataclasses.field(default_factory=list)  # monotonic
    started: float = 0.0
    finished: float = 0.0
    cpu_seconds: float = 0.0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def submitted_by(self, moment: float) -> int:
        """Successful submits that had completed by the monotonic time ``moment``."""
        with self.lock:
            return sum(1 for t in self.done_at if t <= moment)

    @property
    def achieved_rate(self) -> float:
        span = self.finished - self.started
        return self.ok / span if span > 0 else 0.0


def _sleep_until(moment: float, stop: threading.Event) -> bool:
    """Sleep until the monotonic time ``moment``; False if asked to stop meanwhile."""
    delay = moment - time.monotonic()
    if delay > 0:
        return not stop.wait(delay)
    return not stop.is_set()


class LibraryProducer:
    """``pgqueue.enqueue`` with one task per transaction, task *i* sent at ``t0 + i/rate``.

    Slots are dealt round-robin to ``threads`` threads, each with its own connection, so that
    a slow commit delays only that thread's next slot, not the whole schedule. One thread can
    do the brief's 350/s on an idle machine, but not with room to spare under a loaded one.
    Task *i* goes to ``queues[i % len(queues)]``: by slot, not by thread, so that with two
    queues each gets exactly every other task whatever the thread count.
    """

    def __init__(
        self,
        url: str,
        *,
        rate: float,
        duration: float,
        task_type: str,
        payload: dict[str, Any],
        threads: int = 4,
        queues: Sequence[str] = ("default",),
    ) -> None:
        if not queues:
            raise ValueError("queues must name at least one queue")
        self.url = url
        self.queues = tuple(queues)
        self.rate = rate
        self.count = int(rate * duration)
        self.task_type = task_type
        self.payload = payload
        self.threads = threads
        self.stats = ProducerStats(target=self.count)
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cpu: list[float] = []

    def start(self) -> None:
        t0 = time.monotonic() + 0.2
        self.stats.started = t0
        for k in range(self.threads):
            thread = threading.Thread(target=self._run, args=(k, t0), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self, k: int, t0: float) -> None:
        cpu0 = time.thread_time()
        stats = self.stats
        try:
            conn = psycopg.connect(self.url, **CONNECT_OPTIONS)
        except psycopg.Error as exc:
            stats.error(f"connect: {type(exc).__name__}")
            return
        with conn:
            for i in range(k, self.count, self.threads):
                scheduled = t0 + i / self.rate
                if not _sleep_until(scheduled, self.stop_event):
                    break
                sent = time.monotonic()
                try:
                    queue = self.queues[i % len(self.queues)]
                    pgqueue.enqueue(conn, self.task_type, self.payload, queue=queue)
                    conn.commit()
                except Exception as exc:  # psycopg's, or pgqueue's DatabaseUnavailable: count it
                    stats.error(type(exc).__name__)
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()
                    continue
                done = time.monotonic()
                with stats.lock:
                    stats.ok += 1
                    stats.lateness.append(sent - scheduled)
                    stats.latency.append(done - scheduled)
                    stats.done_at.append(done)
        with stats.lock:
            self._cpu.append(time.thread_time() - cpu0)

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> bool:
        """Wait for the schedule to finish; False (and the threads told to stop) on timeout."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = any(t.is_alive() for t in self._threads)
        if alive:
            self.stop_event.set()
            for thread in self._threads:
                thread.join(15)
        self.stats.finished = max(self.stats.done_at, default=self.stats.started)
        self.stats.cpu_seconds = sum(self._cpu)
        return not alive


class HttpProducer:
    """POST /api/v1/tasks over keep-alive connections, open loop.

    One asyncio loop in one thread releases request *i* at ``t0 + i/rate`` into a queue that
    ``connections`` keep-alive connections drain; a request waiting for a free connection
    counts in its latency (measured from the schedule, so a slow server shows up as latency
    instead of as a lower offered rate). The client is a minimal HTTP/1.1 writer and reader on
    asyncio streams rather than httpx: httpx spends 1-2 ms of CPU a request and, with
    thousands of requests waiting for its pool, far more, so at 350/s the producer itself
    became the bottleneck (seen: 80 submits/s with the API server 86 % idle).
    """

    def __init__(
        self,
        base: str,
        *,
        rate: float,
        duration: float,
        body: bytes,
        connections: int = 64,
    ) -> None:
        self.base = base
        self.rate = rate
        self.count = int(rate * duration)
        self.duration = duration
        self.body = body
        self.connections = connections
        self.stats = ProducerStats(target=self.count)
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            asyncio.run(asyncio.wait_for(self._load(), self.duration + 90))
        except TimeoutError:
            self.stats.error("the run did not finish in time")
        finally:
            self.stats.cpu_seconds = time.thread_time() - cpu0

    def _request(self) -> bytes:
        url = urlsplit(self.base)
        head = (
            f"POST /api/v1/tasks HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body

    async def _connection(self, slots: asyncio.Queue[float | None], request: bytes) -> None:
        url = urlsplit(self.base)
        stats = self.stats
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            while (scheduled := await slots.get()) is not None:
                sent = time.monotonic()
                try:
                    writer.write(request)
                    status_line = await reader.readline()
                    length = 0
                    while (line := await reader.readline()) not in (b"\r\n", b""):
                        name, _, value = line.decode("latin-1").partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    await reader.readexactly(length)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    stats.error(type(exc).__name__)
                    writer.close()
                    reader, writer = await asyncio.open_connection(url.hostname, url.port)
                    continue
                done = time.monotonic()
                parts = status_line.split()
                if len(parts) < 2 or parts[1] != b"202":
                    stats.error(f"status {parts[1].decode() if len(parts) > 1 else '?'}")
                    continue
                with stats.lock:
                    stats.ok += 1
                    stats.lateness.append(sent - scheduled)
                    stats.latency.append(done - scheduled)
                    stats.done_at.append(done)
        finally:
            writer.close()

    async def _load(self) -> None:
        stats = self.stats
        slots: asyncio.Queue[float | None] = asyncio.Queue()
        request = self._request()
        connections = [
            asyncio.create_task(self._connection(slots, request)) for _ in range(self.connections)
        ]
        t0 = time.monotonic() + 0.2
        stats.started = t0
        for i in range(self.count):
            if self.stop_event.is_set():
                break
            scheduled = t0 + i / self.rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            slots.put_nowait(scheduled)
        for _ in connections:
            slots.put_nowait(None)
        await asyncio.gather(*connections)
        stats.finished = max(stats.done_at, default=stats.started)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.stop_event.set()
            self._thread.join(30)
            return False
        return True


# --- arithmetic and output -----------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (units of y per unit of x); 0 for fewer than 2 points."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def progress(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the tables and the JSON line."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
