"""The process executor against the thread executor, with a real `pgqueue worker`.

    python -m bench.executors --server-url postgresql://postgres@127.0.0.1:5432/postgres

Three measurements, each on a fresh scratch database (dropped afterwards):

(a) **CPU-bound work**: 20 tasks of about 0.15 s of pure-Python arithmetic each (calibrated
    here first), run by the thread executor (2 threads) and by the process executor (a pool
    of 2), one after the other in one worker, alternating which goes first, for ``--rounds``
    rounds. The wall time is the tasks' own span in the database: the first start to the
    last finish. The ratio is process / thread (lower is better).
(b) **No-op tasks**: the executor's own cost, a no-op's round trip through
    ``ProcessPool.run`` in this process (no database: the pipe, the JSON, the child's
    context and outcome), one task at a time and two at once; then ``--noop`` tasks drained
    by a worker with each executor at a concurrency of 2 (the pool's size, so that no task
    waits for a child): the median run time the worker logs for a task (``task.completed``
    duration_ms, from its start to its outcome) of each, and the drain rate (tasks over
    their span in the database).
(c) **Time limits**: ``--trials`` tasks stuck in C (a ``sleep`` in libc with SIGALRM
    blocked) and as many busy loops that swallow the soft limit, with a small timeout and
    hard_timeout: the share stopped within timeout + hard_timeout + 1 s (from the task's
    start in the database to its failure recorded), and how long each replacement child
    took to start (the worker's ``worker.child_started`` events: from the fork server being
    asked to the child's first word). ``--spawn-trials`` more with every child spawned
    (``PGQUEUE_PROCESS_CHILD_START=spawn``), to compare.

The machine's other load shows in every figure: compare only figures from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue
from pgqueue import migrate

HANDLERS = """
import ctypes
import signal
import time

from pgqueue import TaskRegistry, TimeLimitExceeded

tasks = TaskRegistry()


def spin(n):
    h = 2166136261
    for i in range(n):
        h = ((h ^ i) * 16777619) & 0xFFFFFFFF
    return h


@tasks.handler("cpu_thread", executor="thread")
def cpu_thread(payload, ctx):
    return spin(payload["n"])


@tasks.handler("cpu_process", executor="process")
def cpu_process(payload, ctx):
    return spin(payload["n"])


@tasks.handler("noop_thread", executor="thread")
def noop_thread(payload, ctx):
    return None


@tasks.handler("noop_process", executor="process")
def noop_process(payload, ctx):
    return None


LIMITS = dict(executor="process", timeout=TIMEOUT, hard_timeout=HARD, max_attempts=1)


@tasks.handler("stuck_in_c", **LIMITS)
def stuck_in_c(payload, ctx):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGUSR1})
    ctypes.CDLL(None).sleep(60)


@tasks.handler("busy_loop", **LIMITS)
def busy_loop(payload, ctx):
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline:
        try:
            while time.monotonic() < deadline:
                n += 1
        except TimeLimitExceeded:
            continue
"""


def spin(n: int) -> int:
    h = 2166136261
    for i in range(n):
        h = ((h ^ i) * 16777619) & 0xFFFFFFFF
    return h


def calibrate(seconds: float) -> int:
    """Iterations of spin() that take about ``seconds`` here (the best of a few tries)."""
    n = 200_000
    best = min(_timed(spin, n) for _ in range(3))
    return max(1, int(n * seconds / best))


def _timed(fn: Any, *args: Any) -> float:
    began = time.perf_counter()
    fn(*args)
    return time.perf_counter() - began


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    name = f"pgqueue_exec_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(server_url, name)
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Worker:
    def __init__(self, url: str, work: Path, *options: str, env: dict[str, str] | None = None):
        self.log = work / f"worker-{uuid.uuid4().hex[:6]}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        environment.update(PGQUEUE_DATABASE_URL=url, PYTHONPATH=str(work), **(env or {}))
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgqueue", "worker", "bench_executor_handlers:tasks",
                 "--log-format", "json", "--log-level", "DEBUG", "--poll-interval", "0.1",
                 *options],
                env=environment, cwd=work, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == name:
                    out.append(event)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=60)


def enqueue(url: str, type: str, payload: dict[str, Any], n: int) -> list[uuid.UUID]:
    with psycopg.connect(url) as conn:
        results = pgqueue.enqueue_many(conn, [{"type": type, "payload": payload}] * n)
        conn.commit()
    return [r.id for r in results]


def wait_final(url: str, ids: list[uuid.UUID], timeout: float, worker: Worker) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE id = ANY(%s) "
                "AND status IN ('completed', 'failed', 'cancelled')",
                (ids,),
            ).fetchone()
            if row and row[0] == len(ids):
                return
            if worker.proc.poll() is not None:
                raise SystemExit(f"the worker exited: {worker.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {len(ids)} tasks")
            time.sleep(0.02)


def span(url: str, ids: list[uuid.UUID]) -> float:
    """Seconds from the first task's start to the last one's finish (the database's clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)) "
            "FROM pgqueue.tasks WHERE id = ANY(%s)",
            (ids,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def per_task(url: str, ids: list[uuid.UUID]) -> list[tuple[str, str | None, float]]:
    """(status, last_error, seconds from start to finish) of each task."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT status, last_error, extract(epoch FROM finished_at - started_at) "
            "FROM pgqueue.tasks WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    return [(str(s), e, float(t)) for s, e, t in rows]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cpu_bound(url: str, work: Path, rounds: int, n: int) -> dict[str, Any]:
    worker = Worker(url, work, "--concurrency", "2", "--process-pool-size", "2")
    out: dict[str, Any] = {"rounds": []}
    try:
        for r in range(rounds):
            order = ["thread", "process"] if r % 2 == 0 else ["process", "thread"]
            walls = {}
            for kind in order:
                ids = enqueue(url, f"cpu_{kind}", {"n": n}, 20)
                wait_final(url, ids, 300, worker)
                walls[kind] = span(url, ids)
            ratio = walls["process"] / walls["thread"]
            load = os.getloadavg()[0]
            out["rounds"].append({**walls, "ratio": ratio, "first": order[0], "load": load})
            print(
                f"  (a) round {r + 1}: thread {walls['thread']:.2f} s, process "
                f"{walls['process']:.2f} s, ratio {ratio:.2f} (load average {load:.1f})",
                flush=True,
            )
    finally:
        worker.stop()
    out["median_ratio"] = statistics.median(x["ratio"] for x in out["rounds"])
    return out


def round_trip(work: Path, tasks: int) -> dict[str, Any]:
    """A no-op through ProcessPool.run, in this process: the executor alone."""
    import asyncio

    from pgqueue.worker import WorkerConfig
    from pgqueue.worker.metrics import NO_METRICS
    from pgqueue.worker.processes import ProcessPool
    from pgqueue.worker.state import StopRequest

    sys.path.insert(0, str(work))
    registry = __import__("bench_executor_handlers").tasks
    out: dict[str, Any] = {}
    for streams in (1, 2):
        config = WorkerConfig(concurrency=2, process_pool_size=2)
        pool = ProcessPool(
            config, registry, "postgresql://unused", metrics=NO_METRICS,
            stop=StopRequest(), max_result_bytes=None,
        )  # fmt: skip
        pool.prepare()  # before the event loop: forked
        wall, seconds = asyncio.run(
            _round_trips(pool, registry.get("noop_process"), tasks, streams)
        )
        ms = [x * 1000 for x in seconds]
        out[f"{streams}_at_once"] = {
            "per_s": len(ms) / wall,
            "ms_p50": statistics.median(ms),
            "ms_p90": percentile(ms, 0.9),
            "ms_p99": percentile(ms, 0.99),
        }
    print(f"  (b) round trip {json.dumps(out)}", flush=True)
    return out


async def _round_trips(
    pool: Any, handler: Any, tasks: int, streams: int
) -> tuple[float, list[float]]:
    import asyncio

    from pgqueue.executor import TaskContext
    from pgqueue.models import ClaimedTask, Priority

    seconds: list[float] = []

    async def stream(n: int) -> None:
        for _ in range(n):
            now = datetime.now(UTC)
            task = ClaimedTask(
                uuid.uuid4(), "default", "noop_process", {}, Priority.NORMAL, 1, 1,
                uuid.uuid4(), now, now,
            )  # fmt: skip
            began = time.perf_counter()
            await pool.run(task, TaskContext(task, worker_id="bench"), handler)
            seconds.append(time.perf_counter() - began)

    await pool.open()
    try:
        await stream(50)  # warm up
        seconds.clear()
        began = time.perf_counter()
        await asyncio.gather(*(stream(tasks // streams) for _ in range(streams)))
        return time.perf_counter() - began, seconds
    finally:
        await pool.close()


def noop(url: str, work: Path, tasks: int) -> dict[str, Any]:
    worker = Worker(url, work, "--concurrency", "2", "--process-pool-size", "2")
    out: dict[str, Any] = {}
    try:
        for kind in ("thread", "process", "thread", "process"):  # each twice, interleaved
            ids = enqueue(url, f"noop_{kind}", {}, tasks)
            wait_final(url, ids, 600, worker)
            out.setdefault(kind, []).append(tasks / span(url, ids))
        durations: dict[str, list[float]] = {"thread": [], "process": []}
        for event in worker.events("task.completed"):
            durations[event["type"].removeprefix("noop_")].append(event["duration_ms"])
    finally:
        worker.stop()
    result = (
        {f"{kind}_per_s": statistics.median(rates) for kind, rates in out.items()}
        | {f"{kind}_duration_ms_p50": statistics.median(d) for kind, d in durations.items()}
        | {f"{kind}_duration_ms_p99": percentile(d, 0.99) for kind, d in durations.items()}
    )
    result["overhead_ms_p50"] = result["process_duration_ms_p50"] - result["thread_duration_ms_p50"]
    print(f"  (b) worker {json.dumps({k: round(v, 3) for k, v in result.items()})}", flush=True)
    return result


def limits(
    url: str, work: Path, trials: int, timeout: float, hard: float, env: dict[str, str]
) -> dict[str, Any]:
    worker = Worker(url, work, "--concurrency", "2", "--process-pool-size", "2", env=env)
    out: dict[str, Any] = {}
    try:
        for type in ("stuck_in_c", "busy_loop"):
            ids = enqueue(url, type, {}, trials)
            wait_final(url, ids, trials * (timeout + hard + 10), worker)
            rows = per_task(url, ids)
            bound = timeout + hard + 1
            stopped = [t for status, error, t in rows if status == "failed" and error and
                       error.startswith("timed out") and "killed" in error]  # fmt: skip
            within = sum(1 for t in stopped if t <= bound)
            out[type] = {
                "trials": trials,
                "killed": len(stopped),
                "within_bound": within,
                "share_within": within / trials,
                "bound_s": bound,
                "stop_s_p50": statistics.median(stopped) if stopped else None,
                "stop_s_max": max(stopped) if stopped else None,
            }
        starts = [e["start_ms"] for e in worker.events("worker.child_started")][
            2:
        ]  # not the first two
        killed_at = {e["task_id"]: e["ts"] for e in worker.events("worker.child_killed")}
        freed = [
            _seconds(e["ts"]) - _seconds(killed_at[e["task_id"]])
            for e in worker.events("task.timed_out")
            if e.get("killed") and e["task_id"] in killed_at
        ]
    finally:
        worker.stop()
    out["replacement_ms_p50"] = statistics.median(starts) if starts else None
    out["replacement_ms_p99"] = percentile(starts, 0.99) if starts else None
    out["replacement_ms_max"] = max(starts) if starts else None
    out["replacements"] = len(starts)
    out["kill_to_free_ms_p50"] = statistics.median(freed) * 1000 if freed else None
    out["kill_to_free_ms_max"] = max(freed) * 1000 if freed else None
    print(f"  (c) {json.dumps(out, default=str)}", flush=True)
    return out


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (a) (5)")
    parser.add_argument("--noop", type=int, default=2000, help="no-op tasks per drain (2000)")
    parser.add_argument("--trials", type=int, default=200, help="trials of each kind (200)")
    parser.add_argument("--spawn-trials", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.2)
    parser.add_argument("--hard-timeout", type=float, default=0.3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--only", default="cpu,round_trip,noop,limits", help="which parts (comma-separated)"
    )
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")

    work = Path(tempfile.mkdtemp(prefix="executor-bench-"))
    handlers = HANDLERS.replace("TIMEOUT", repr(args.timeout)).replace(
        "HARD", repr(args.hard_timeout)
    )
    (work / "bench_executor_handlers.py").write_text(handlers)
    n = calibrate(0.15)
    print(f"calibrated: {n} iterations = 0.15 s here; cpus={os.cpu_count()}", flush=True)
    figures: dict[str, Any] = {"iterations": n, "cpus": os.cpu_count(), "load": os.getloadavg()}
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroup.exists():  # with it on, a session's processes share one fair share of CPU
        figures["sched_autogroup"] = autogroup.read_text().strip()
    only = set(args.only.split(","))
    if "cpu" in only:
        with scratch_database(args.server_url) as url:
            figures["cpu_bound"] = cpu_bound(url, work, args.rounds, n)
    if "round_trip" in only:
        figures["round_trip"] = round_trip(work, args.noop)
    if "noop" in only:
        with scratch_database(args.server_url) as url:
            figures["noop"] = noop(url, work, args.noop)
    if "limits" in only:
        with scratch_database(args.server_url) as url:
            figures["limits_fork"] = limits(
                url, work, args.trials, args.timeout, args.hard_timeout, {}
            )
    if "limits" in only and args.spawn_trials:
        with scratch_database(args.server_url) as url:
            env = {"PGQUEUE_PROCESS_CHILD_START": "spawn"}
            figures["limits_spawn"] = limits(
                url, work, args.spawn_trials, args.timeout, args.hard_timeout, env
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    print(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
