"""Pickup latency and idle cost of a worker behind a transaction-mode PgBouncer, polling, against
a direct worker woken by LISTEN, in one run.

    python -m bench.pooler_latency --server-url postgresql://postgres@127.0.0.1:5432/postgres

Two phases of ``--seconds`` (30) each, on one scratch database: tasks arrive at ``--rate``
(20/s; exponential gaps, seeded, so the same arrivals in both phases) for

1. ``pgqueue worker --pooler transaction`` whose database URL goes through a private PgBouncer
   in transaction mode (tests/pgbouncer.py's), with no LISTEN URL: it polls adaptively
   (pgqueue/worker/claimer.py); the producer enqueues through the pooler too;
2. ``pgqueue worker`` on the direct URL, woken by the enqueue's NOTIFY.

The pickup is from just before the enqueue call to the handler's start, which the handler
records itself (``time.time()`` on entry, written through ``ctx.connection``); one machine,
one clock. Each worker has the queue to itself, and the first ``--warmup`` (2) seconds of a
phase are left out.

Then the idle cost (``--idle-seconds``, 60, each): one worker and no task, first the polling
one through the pooler, then the listening direct one. Counted on the server: the database's
committed transactions (``pg_stat_database.xact_commit``, every statement of an autocommit
worker being one; read from another database, so the reads are not counted) and the CPU
time of the database's backends (``/proc/PID/stat``, this machine's server only); and the
worker process's own CPU time. PostgreSQL 15 flushes a backend's counters at most once a
second, and an idle one's within 10 s, so the window is long and read 11 s after it ends
(the end read waits for the late flush; the start read's late flush falls in the window).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue
from tests.pgbouncer import pgbouncer

HANDLERS = """
import time
from pgqueue import TaskRegistry

tasks = TaskRegistry()


@tasks.handler("pickup")
def pickup(payload, ctx):
    started = time.time()
    ctx.connection.execute(
        "INSERT INTO bench_starts (task_id, started) VALUES (%s, %s)", (ctx.task_id, started)
    )
"""

CLK_TCK = os.sysconf("SC_CLK_TCK")


def database_url(server_url: str, name: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Phase:
    """A worker process started from ``work`` on ``url``, its log in ``work``."""

    def __init__(self, name: str, work: Path, env: dict[str, str], url: str, *options: str):
        self.log_path = work / f"{name}.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "worker", "bench_pooler_handlers:tasks",
             "--log-format", "json", "--log-level", "WARNING", *options],
            env={**env, "PGQUEUE_DATABASE_URL": url}, cwd=work,
            stdout=subprocess.DEVNULL, stderr=self.log,
        )  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.proc.returncode not in (0, -15):
            raise SystemExit(f"worker exited with {self.proc.returncode}: {self.log_path}")


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return value


def pickups(
    producer_url: str, reader: psycopg.Connection[Any], queue: str, gaps: list[float], warmup: float
) -> dict[str, Any]:
    """Enqueue one task per gap into ``queue`` (the worker's), then the pickups after warm-up."""
    enqueued: dict[uuid.UUID, float] = {}
    with psycopg.connect(producer_url, autocommit=True, prepare_threshold=None) as producer:
        first = pgqueue.enqueue(producer, "pickup", {}, queue=queue).id  # the worker is up
        wait_for(lambda: started(reader, [first]), 60, "the worker's first task")
        time.sleep(1.0)  # an idle worker: the first arrival finds the polls backed off
        began = time.monotonic()
        next_at = began
        for gap in gaps:
            next_at += gap
            time.sleep(max(0.0, next_at - time.monotonic()))
            at = time.time()
            task_id = pgqueue.enqueue(producer, "pickup", {}, queue=queue).id
            if time.monotonic() - began >= warmup:
                enqueued[task_id] = at
    ids = list(enqueued)
    starts = wait_for(lambda: started(reader, ids), 120, f"the {len(ids)} tasks of {queue}")
    values = [(starts[t] - enqueued[t]) * 1000 for t in ids]
    return {
        "tasks": len(values),
        "p50_ms": round(percentile(values, 0.5), 1),
        "p90_ms": round(percentile(values, 0.9), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "max_ms": round(max(values), 1),
        "mean_ms": round(statistics.fmean(values), 1),
    }


def started(reader: psycopg.Connection[Any], ids: list[uuid.UUID]) -> dict[uuid.UUID, float]:
    rows = reader.execute(
        "SELECT task_id, started FROM bench_starts WHERE task_id = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0]: r[1] for r in rows} if len(rows) == len(ids) else {}


def idle_cost(
    admin: psycopg.Connection[Any], name: str, worker: Phase, seconds: float
) -> dict[str, Any]:
    """The database's commits and its backends' CPU over ``seconds`` of an idle worker."""

    def commits() -> int:
        admin.execute("SELECT pg_stat_clear_snapshot()")
        row = admin.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
        return int(row[0]) if row else 0

    def backends() -> dict[int, float]:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchall()
        return {r[0]: cpu_seconds(r[0]) for r in rows}

    time.sleep(15)  # started, first claims done, polls backed off, start-up flushed
    c0, b0, w0 = commits(), backends(), cpu_seconds(worker.proc.pid)
    time.sleep(seconds)
    b1, w1 = backends(), cpu_seconds(worker.proc.pid)
    time.sleep(11)  # the backends' last counters of the window flushed
    c1 = commits()
    server_cpu = sum(b1[p] - b0.get(p, 0.0) for p in b1)
    return {
        "seconds": seconds,
        "commits_per_s": round((c1 - c0) / seconds, 2),
        "server_cpu_ms_per_s": round(server_cpu * 1000 / seconds, 2),
        "worker_cpu_ms_per_s": round((w1 - w0) * 1000 / seconds, 2),
        "backends": len(b1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a database on the server to use (a scratch database is made beside it)",
    )  # fmt: skip
    parser.add_argument("--rate", type=float, default=20.0, help="tasks per second (20)")
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase (30)")
    parser.add_argument("--warmup", type=float, default=2.0, help="left out of each phase (2)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="per idle worker (60)")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    name = f"pgqueue_pooler_bench_{uuid.uuid4().hex[:8]}"
    url = database_url(args.server_url, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    work = Path(tempfile.mkdtemp(prefix="pooler-bench-"))
    (work / "bench_pooler_handlers.py").write_text(HANDLERS)
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(Path.cwd())])
    rng = random.Random(args.seed)
    gaps: list[float] = []
    while sum(gaps) < args.seconds:
        gaps.append(rng.expovariate(args.rate))
    results: dict[str, Any] = {"rate": args.rate, "arrivals": len(gaps)}
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            migrate = [sys.executable, "-m", "pgqueue", "--database-url", url, "migrate"]
            subprocess.run(migrate, env=env, check=True, capture_output=True, cwd=work)
            with psycopg.connect(url, autocommit=True) as reader:
                reader.execute(
                    "CREATE TABLE bench_starts (task_id uuid PRIMARY KEY, started float8)"
                )
                with pgbouncer(args.server_url) as pooler:
                    pooled = pooler.pooled_url(url)
                    run = [
                        ("pooled_poll", pooled, ["--pooler", "transaction"]),
                        ("direct_listen", url, []),
                    ]
                    for label, worker_url, options in run:
                        worker = Phase(label, work, env, worker_url, *options, "--queue", label)
                        try:
                            results[label] = pickups(worker_url, reader, label, gaps, args.warmup)
                        finally:
                            worker.stop()
                        print(label, json.dumps(results[label]), flush=True)
                    for label, worker_url, options in run:
                        worker = Phase(f"{label}_idle", work, env, worker_url, *options)
                        try:
                            results[f"{label}_idle"] = idle_cost(
                                admin, name, worker, args.idle_seconds
                            )
                        finally:
                            worker.stop()
                        print(f"{label}_idle", json.dumps(results[f"{label}_idle"]), flush=True)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
