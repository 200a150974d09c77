"""PgQueuer's side of bench/compare.py: one scenario on one scratch database, one JSON line out.

Runs with the Python of PgQueuer's own virtualenv (pgqueuer and asyncpg from PyPI) and
imports only pgqueuer, asyncpg, the standard library and _common. The same module is the
workers' factory module: ``pgq run pgqueuer_contender:worker --batch-size B`` (PgQueuer's
documented worker command; it has no multi-process option, so the drain starts two of them).

Configured as PgQueuer recommends for speed: the asyncpg driver (its README's and its own
benchmark's default), uvloop (which ``pgq run`` uses when installed, as here), unlimited
in-process concurrency (its default), and a dequeue batch chosen by a sweep (see
bench/compare.py). Tables are installed with PgQueuer's default durability, ``durable``
(every table logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as common
import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries


def encoded_payload() -> bytes:
    """The shared payload as PgQueuer takes it (bytes); after parse_args set its size."""
    return json.dumps(common.payload()).encode()


@contextlib.asynccontextmanager
async def worker() -> AsyncIterator[PgQueuer]:
    """The ``pgq run`` factory: one asyncpg connection, the no-op entrypoint.

    The handler notes each job it runs; when ``pgq run`` shuts down (SIGTERM), the notes go
    into bench_runs for the harness's exactly-once check.
    """
    dsn = os.environ[common.DSN_ENV]
    connection = await asyncpg.connect(dsn)
    pgq = PgQueuer(AsyncpgDriver(connection))
    runs: list[tuple[int, bytes | None, float]] = []

    @pgq.entrypoint(common.TASK_TYPE)
    async def noop(job: Job) -> None:
        started = time.time()
        runs.append((job.id, job.payload, started))

    try:
        yield pgq
    finally:
        await connection.close()
        await write_runs(dsn, runs)


async def write_runs(dsn: str, runs: list[tuple[int, bytes | None, float]]) -> None:
    if not runs:
        return
    pid = os.getpid()
    records = [
        (str(job_id), json.loads(data).get("t") if data else None, started, pid)
        for job_id, data, started in runs
    ]
    connection = await asyncpg.connect(dsn)
    try:
        await connection.copy_records_to_table(
            "bench_runs",
            records=records,
            columns=["task_id", "enqueued_at", "started_at", "pid"],
        )
    finally:
        await connection.close()


def worker_command(batch_size: int) -> list[str]:
    cli = str(Path(sys.executable).parent / "pgq")
    return [
        cli,
        "run",
        "pgqueuer_contender:worker",
        "--batch-size",
        str(batch_size),
        "--log-level",
        "WARNING",
    ]


async def enqueue_bulk(queries: Queries, total: int, batch_size: int) -> float:
    payload = encoded_payload()
    started = time.perf_counter()
    for start in range(0, total, batch_size):
        n = min(batch_size, total - start)
        await queries.enqueue([common.TASK_TYPE] * n, [payload] * n, [0] * n)
    return time.perf_counter() - started


def completions(
    remaining: Callable[[], Awaitable[int]], clock: common.DrainClock
) -> Callable[[], Awaitable[int]]:
    """Completed = enqueued - rows left: PgQueuer deletes a job from its table when done."""

    async def done() -> int:
        return clock.total - await remaining()

    return done


async def run(args: Any) -> dict[str, Any]:
    deadline = common.Deadline(args.timeout)
    connection = await asyncpg.connect(args.dsn)
    queries = Queries(AsyncpgDriver(connection))
    await queries.install()
    result: dict[str, Any] = {
        "contender": "pgqueuer",
        "version": importlib.metadata.version("pgqueuer"),
        "scenario": args.scenario,
        "tasks": args.tasks,
    }

    async def remaining() -> int:
        return int(await connection.fetchval("SELECT count(*) FROM pgqueuer"))

    payload = encoded_payload()
    if args.scenario == "enqueue_single":
        started = time.perf_counter()
        for _ in range(args.tasks):
            await queries.enqueue(common.TASK_TYPE, payload)  # asyncpg: autocommit each
        elapsed = time.perf_counter() - started
        result.update(per_s=round(args.tasks / elapsed, 1), in_table=await remaining())
        result["settings"] = {"connection": "asyncpg, autocommit", "api": "Queries.enqueue"}

    elif args.scenario == "enqueue_bulk":
        elapsed = await enqueue_bulk(queries, args.tasks, args.batch_size)
        result.update(per_s=round(args.tasks / elapsed, 1), in_table=await remaining())
        result["settings"] = {
            "api": "Queries.enqueue with lists (one statement per batch)",
            "batch_size": args.batch_size,
        }

    elif args.scenario == "drain":
        elapsed = await enqueue_bulk(queries, args.tasks, args.batch_size)
        result["enqueue_per_s"] = round(args.tasks / elapsed, 1)
        clock = common.DrainClock(args.tasks)
        workers = common.Workers(
            [worker_command(args.dequeue_batch) for _ in range(args.processes)],
            common.worker_env(args.dsn),
            args.log_dir,
        )
        try:
            await common.await_completions(
                completions(remaining, clock), clock, workers, deadline, args.poll_interval
            )
        finally:
            result["worker_exit_codes"] = workers.stop()
        result.update(clock.result())
        result["settings"] = {
            "processes": args.processes,
            "dequeue_batch_size": args.dequeue_batch,
            "concurrency_per_process": "unlimited (default)",
            "driver": "asyncpg, one connection per worker (AsyncpgDriver)",
            "handler": "async no-op",
            "enqueue_batch_size": args.batch_size,
        }

    elif args.scenario == "latency":
        workers = common.Workers(
            [worker_command(args.dequeue_batch)], common.worker_env(args.dsn), args.log_dir
        )
        try:
            for _ in range(args.warmup):
                await queries.enqueue(common.TASK_TYPE, payload)
            clock = common.DrainClock(args.warmup)
            await common.await_completions(
                completions(remaining, clock), clock, workers, deadline, 0.05
            )
            await asyncio.sleep(0.5)
            interval = args.interval_ms / 1000
            start = time.monotonic()
            for i in range(args.tasks):
                await asyncio.sleep(common.pace(start, i, interval))
                enqueued_at = time.time()
                data = json.dumps(common.payload(enqueued_at)).encode()
                await queries.enqueue(common.TASK_TYPE, data)
            clock = common.DrainClock(args.warmup + args.tasks)
            await common.await_completions(
                completions(remaining, clock), clock, workers, deadline, 0.05
            )
        finally:
            result["worker_exit_codes"] = workers.stop()
        result["settings"] = {
            "processes": 1,
            "dequeue_batch_size": args.dequeue_batch,
            "interval_ms": args.interval_ms,
            "warmup_tasks": args.warmup,
        }

    await connection.close()
    return result


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], batch_size=5000, dequeue_batch=10)
    try:
        import uvloop
    except ImportError:  # pgqueuer installs it on Linux; without it, plain asyncio
        common.emit(asyncio.run(run(args)))
    else:
        common.emit(uvloop.run(run(args)))


if __name__ == "__main__":
    main()
