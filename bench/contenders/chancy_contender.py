"""Chancy's side of bench/compare.py: one scenario on one scratch database, one JSON line out.

Runs with the Python of Chancy's own virtualenv (chancy and psycopg from PyPI) and imports
only chancy, psycopg, the standard library and _common. The same module holds the app the
workers load: ``chancy --app chancy_contender.app worker start`` (Chancy's documented worker
command; one process each, so a two-process drain starts two of them).

Configured for speed within Chancy's documented options: the queue runs on the AsyncExecutor
(its executor for async jobs: the default ProcessExecutor would run each no-op in a process
pool), with eager polling on (the queue fetches again as soon as a job completes instead of
waiting for its 5 s polling interval: what its docs advise when jobs are continuously
available, as in a drain), the queue's concurrency chosen by a sweep (see bench/compare.py),
the app's default pool (up to 10 connections) and default plugins (leadership, pruner,
recovery, metrics, workflows), NOTIFY on push (the default), its logger at WARNING (at its
default INFO it logs a line per job pulled). Bulk enqueue is ``Chancy.push_many`` (one INSERT
per job, one transaction per batch). Chancy writes job results in batches, once a second
(``Worker.send_outgoing_interval``), so completions show in its table in steps of up to a
second; the handler starts/s column is free of that. Schema: Chancy's own migrations; the
jobs table is logged, its bookkeeping tables (chancy_leader, chancy_workers,
chancy_queue_rate_limits: leader election, worker heartbeats, rate-limit windows, no job
data) are UNLOGGED by its design, which the harness allows for these names only.
"""

# No ``from __future__ import annotations`` here: Chancy passes the job to a keyword-only
# parameter annotated with the QueuedJob class itself, and a string annotation is skipped.

import asyncio
import atexit
import importlib.metadata
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as common
import psycopg
from chancy import Chancy, Job, Queue, QueuedJob, job

QUEUE = "default"
LOG = logging.getLogger("chancy")
LOG.setLevel(logging.WARNING)
LOG.addHandler(logging.StreamHandler())

app = Chancy(os.environ.get(common.DSN_ENV, ""), log=LOG)
# (job id, enqueue time from the kwargs, handler start time): written to bench_runs at exit.
_runs: list[tuple[Any, float | None, float]] = []


@job(queue=QUEUE)
async def noop(*, data: str, t: float | None = None, job: QueuedJob) -> None:
    started = time.time()
    _runs.append((job.id, t, started))


@atexit.register
def _write_runs() -> None:
    """At worker exit (after a graceful SIGTERM), COPY this process's runs into bench_runs."""
    dsn = os.environ.get(common.DSN_ENV)
    if not _runs or not dsn:
        return
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(common.RUNS_COPY) as copy:
        pid = os.getpid()
        for job_id, enqueued_at, started in _runs:
            copy.write_row((str(job_id), enqueued_at, started, pid))


def worker_command() -> list[str]:
    cli = str(Path(sys.executable).parent / "chancy")
    return [cli, "--app", "chancy_contender.app", "worker", "start"]


def new_job(enqueued_at: float | None = None) -> Job:
    template: Job = noop.job  # type: ignore[attr-defined]
    return template.with_kwargs(**common.payload(enqueued_at))


async def enqueue_bulk(chancy: Chancy, total: int, batch_size: int) -> float:
    started = time.perf_counter()
    jobs = [new_job() for _ in range(total)]
    async for _refs in chancy.push_many(jobs, batch_size=batch_size):
        pass
    return time.perf_counter() - started


async def count(conn: psycopg.AsyncConnection[Any], where: str = "") -> int:
    row = await (await conn.execute(f"SELECT count(*) FROM chancy_jobs {where}")).fetchone()
    assert row is not None
    return int(row[0])


def completions(conn: psycopg.AsyncConnection[Any]) -> Callable[[], Awaitable[int]]:
    """The finished jobs' count, polled by common.await_completions."""
    return lambda: count(conn, "WHERE state = 'succeeded'")


async def run(args: Any) -> dict[str, Any]:
    deadline = common.Deadline(args.timeout)
    result: dict[str, Any] = {
        "contender": "chancy",
        "version": importlib.metadata.version("chancy"),
        "scenario": args.scenario,
        "tasks": args.tasks,
    }
    env = common.worker_env(args.dsn)
    # Submitting: one connection (a pool of one), as for the other contenders.
    chancy = Chancy(args.dsn, min_connection_pool_size=1, max_connection_pool_size=1, log=LOG)
    async with (
        chancy,
        await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn,
    ):
        await chancy.migrate()
        await chancy.declare(
            Queue(
                QUEUE,
                concurrency=args.concurrency,
                executor=Chancy.Executor.Async,
                eager_polling=True,
            ),
            upsert=True,
        )

        if args.scenario == "enqueue_single":
            one = new_job()
            started = time.perf_counter()
            for _ in range(args.tasks):
                await chancy.push(one)  # a pool connection: one transaction each
            elapsed = time.perf_counter() - started
            result.update(per_s=round(args.tasks / elapsed, 1), in_table=await count(conn))
            result["settings"] = {"connection": "psycopg pool of 1", "api": "Chancy.push"}

        elif args.scenario == "enqueue_bulk":
            elapsed = await enqueue_bulk(chancy, args.tasks, args.batch_size)
            result.update(per_s=round(args.tasks / elapsed, 1), in_table=await count(conn))
            result["settings"] = {
                "api": "Chancy.push_many (one transaction per batch)",
                "batch_size": args.batch_size,
            }

        elif args.scenario == "drain":
            elapsed = await enqueue_bulk(chancy, args.tasks, args.batch_size)
            result["enqueue_per_s"] = round(args.tasks / elapsed, 1)
            clock = common.DrainClock(args.tasks)
            workers = common.Workers(
                [worker_command() for _ in range(args.processes)], env, args.log_dir
            )
            try:
                await common.await_completions(
                    completions(conn), clock, workers, deadline, args.poll_interval
                )
            finally:
                result["worker_exit_codes"] = workers.stop()
            result.update(clock.result())
            result["settings"] = {
                "processes": args.processes,
                "queue_concurrency_per_process": args.concurrency,
                "executor": "AsyncExecutor, eager polling",
                "pool_size_per_process": "10 (default)",
                "handler": "async no-op",
                "enqueue_batch_size": args.batch_size,
            }

        elif args.scenario == "latency":
            workers = common.Workers([worker_command()], env, args.log_dir)
            try:
                for _ in range(args.warmup):
                    await chancy.push(new_job())
                clock = common.DrainClock(args.warmup)
                await common.await_completions(completions(conn), clock, workers, deadline, 0.05)
                await asyncio.sleep(0.5)
                interval = args.interval_ms / 1000
                start = time.monotonic()
                for i in range(args.tasks):
                    await asyncio.sleep(common.pace(start, i, interval))
                    await chancy.push(new_job(time.time()))
                total = args.warmup + args.tasks
                clock = common.DrainClock(total)
                await common.await_completions(completions(conn), clock, workers, deadline, 0.05)
            finally:
                result["worker_exit_codes"] = workers.stop()
            result["settings"] = {
                "processes": 1,
                "queue_concurrency": args.concurrency,
                "executor": "AsyncExecutor, eager polling",
                "interval_ms": args.interval_ms,
                "warmup_tasks": args.warmup,
            }
    return result


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], batch_size=1000, concurrency=100)
    common.emit(asyncio.run(run(args)))


if __name__ == "__main__":
    # Run as the module the workers import (the job's function is "chancy_contender.noop"),
    # not as __main__.
    import chancy_contender

    chancy_contender.main()
