"""``pgqueue bench``: a quick throughput and latency check against your own database.

It answers "how fast is pgqueue here?" with the real code paths: bulk and single enqueue
through the library, a drain by real ``pgqueue worker`` processes, and the time from an
enqueue's commit to its handler starting on an idle worker. Everything happens in a queue of
its own (``pgqueue-bench-<random>``), which no real worker listens to, and the tasks are
deleted at the end, whatever happens. It is a check, not the side-by-side comparison with
other queues (that is ``python -m bench.compare`` in the repository).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from pgqueue import operations as ops
from pgqueue.config import ENV_DATABASE_URL
from pgqueue.errors import PgQueueError
from pgqueue.executor import TaskContext
from pgqueue.registry import TaskRegistry

TYPE = "pgqueue.bench.noop"

tasks = TaskRegistry()


@tasks.handler(TYPE)
async def noop(payload: dict[str, Any], ctx: TaskContext) -> dict[str, float] | None:
    """Does nothing; a latency probe (``t``: the producer's clock before enqueue) reports
    how long it waited, as its result, so the measurement needs no extra write."""
    sent = payload.get("t")
    return None if sent is None else {"latency_ms": (time.time() - sent) * 1000}


@dataclasses.dataclass
class BenchConfig:
    tasks: int = 10_000
    single: int = 1_000
    latency_samples: int = 200
    latency_interval: float = 0.02
    processes: int = 1
    concurrency: int = 100
    payload_bytes: int = 100
    timeout: float = 300.0


@dataclasses.dataclass
class BenchResult:
    queue: str
    bulk_enqueue_per_s: float
    single_enqueue_per_s: float
    drain_per_s: float
    drain_seconds: float
    ran_more_than_once: int
    latency_ms_p50: float
    latency_ms_p90: float
    latency_ms_p99: float
    latency_ms_max: float
    config: BenchConfig


Progress = Callable[[str], None]


def run(url: str, config: BenchConfig, progress: Progress = lambda line: None) -> BenchResult:
    """Run every phase in a fresh queue and delete its tasks afterwards."""
    queue = f"pgqueue-bench-{uuid.uuid4().hex[:8]}"
    payload = {"data": "x" * config.payload_bytes}
    worker: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + config.timeout
    try:
        with psycopg.connect(url) as conn:
            progress(f"bulk enqueue of {config.tasks:,} tasks into queue {queue}")
            started = time.perf_counter()
            for first in range(0, config.tasks, 1000):
                n = min(1000, config.tasks - first)
                ops.enqueue_many(conn, [{"type": TYPE, "payload": payload, "queue": queue}] * n)
                conn.commit()
            bulk_rate = config.tasks / (time.perf_counter() - started)

            progress(f"single enqueue of {config.single:,} tasks, one transaction each")
            started = time.perf_counter()
            for _ in range(config.single):
                ops.enqueue(conn, TYPE, payload, queue=queue)
                conn.commit()
            single_rate = config.single / max(time.perf_counter() - started, 1e-9)

        total = config.tasks + config.single
        progress(
            f"drain by {config.processes} worker process(es), concurrency {config.concurrency}"
        )
        worker = _start_worker(url, queue, config)
        drain_seconds = _wait_for(url, queue, total, worker, deadline, progress)

        progress(
            f"latency: {config.latency_samples} tasks, {config.latency_interval * 1000:.0f} ms "
            "apart, to an idle worker"
        )
        latencies = _latency(url, queue, config, total, worker, deadline)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE queue = %s AND attempts > 1", [queue]
            ).fetchone()
        repeated = int(row[0]) if row else 0
    finally:
        if worker is not None:
            _stop(worker)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM pgqueue.tasks WHERE queue = %s", [queue])
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    return BenchResult(
        queue=queue,
        bulk_enqueue_per_s=bulk_rate,
        single_enqueue_per_s=single_rate,
        drain_per_s=total / max(drain_seconds, 1e-6),
        drain_seconds=drain_seconds,
        ran_more_than_once=repeated,
        latency_ms_p50=statistics.median(latencies),
        latency_ms_p90=quantiles[89],
        latency_ms_p99=quantiles[98],
        latency_ms_max=max(latencies),
        config=config,
    )


def _start_worker(url: str, queue: str, config: BenchConfig) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pgqueue"]
    command += [
        "worker",
        "pgqueue.bench:tasks",
        "--queue",
        queue,
        "--processes",
        str(config.processes),
    ]
    command += ["--concurrency", str(config.concurrency), "--no-maintenance"]
    command += ["--log-level", "WARNING"]
    # Its own process group, so that stopping it reaches every worker process it started. The
    # URL goes in the environment, not on a command line that any local user can read.
    env = {**os.environ, ENV_DATABASE_URL: url}
    return subprocess.Popen(command, start_new_session=True, env=env)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def _unfinished(conn: psycopg.Connection[Any], queue: str) -> int:
    """Tasks of the benchmark's queue still queued or running. Counted this way round because
    queued and running rows are indexed (the claim and lease indexes), while counting the
    completed ones would read every finished task of the user's database, many times a
    second."""
    row = conn.execute(  # two counts: `status IN (...)` would match neither partial index
        "SELECT (SELECT count(*) FROM pgqueue.tasks WHERE queue = %(q)s AND status = 'queued')"
        "     + (SELECT count(*) FROM pgqueue.tasks WHERE queue = %(q)s AND status = 'running')",
        {"q": queue},
    ).fetchone()
    return int(row[0]) if row else 0


def _wait_for(
    url: str,
    queue: str,
    total: int,
    worker: subprocess.Popen[bytes],
    deadline: float,
    progress: Progress,
) -> float:
    """Wait until the ``total`` tasks of the queue are finished; the drain's seconds, by the
    server's clock, from the first claim to the last completion (start-up excluded)."""
    reported = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while (done := total - _unfinished(conn, queue)) < total:
            now = time.monotonic()
            if worker.poll() is not None:
                raise PgQueueError(f"the benchmark's worker exited with {worker.returncode}")
            if now > deadline:
                raise PgQueueError(f"the benchmark timed out with {done:,} of {total:,} done")
            if now - reported >= 2:
                progress(f"  {done:,} of {total:,} done")
                reported = now
            time.sleep(0.05)
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
            "  FROM pgqueue.tasks WHERE queue = %s",
            [queue],
        ).fetchone()
    return float(row[0]) if row and row[0] else 0.0


def _latency(
    url: str,
    queue: str,
    config: BenchConfig,
    already: int,
    worker: subprocess.Popen[bytes],
    deadline: float,
) -> list[float]:
    ids = []
    with psycopg.connect(url) as conn:
        for _ in range(config.latency_samples):
            time.sleep(config.latency_interval)
            ids.append(ops.enqueue(conn, TYPE, {"t": time.time()}, queue=queue).id)
            conn.commit()
    _wait_for(url, queue, already + len(ids), worker, deadline, lambda line: None)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT (result->>'latency_ms')::float8 FROM pgqueue.tasks WHERE id = ANY(%s)",
            [ids],
        ).fetchall()
    return [float(r[0]) for r in rows]
