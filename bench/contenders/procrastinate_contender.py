"""Procrastinate's side of bench/compare.py: one scenario on one scratch database, one JSON line.

Runs with the Python of Procrastinate's own virtualenv (procrastinate and psycopg from PyPI)
and imports only procrastinate, psycopg, the standard library and _common. The same module
holds the app the workers load: ``procrastinate --app procrastinate_contender.app
--log-level warning worker --concurrency C`` (Procrastinate's documented worker command; one
process each, so the drain starts two).

Configured for speed within Procrastinate's documented options: an async task (so the
``--concurrency`` sub-workers really overlap), concurrency chosen by a sweep (see
bench/compare.py), a connection pool as large as the concurrency plus the worker's own
side connections (its default pool has 4, which would make sub-workers queue for a
connection), LISTEN/NOTIFY on (the default), log level warning (its default, info, writes
two lines per job), finished jobs kept (the default, like pgqueue).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as common
import procrastinate
import psycopg

POOL_ENV = "BENCH_PROCRASTINATE_POOL"
SIDE_CONNECTIONS = 4  # listener, heartbeat, abort polling, periodic deferrer


def connector(dsn: str, pool_size: int) -> procrastinate.PsycopgConnector:
    return procrastinate.PsycopgConnector(conninfo=dsn, min_size=pool_size, max_size=pool_size)


app = procrastinate.App(
    connector=connector(os.environ.get(common.DSN_ENV, ""), int(os.environ.get(POOL_ENV, "4")))
)
# (job id, enqueue time from the task's arguments, handler start time), written at exit.
_runs: list[tuple[int | None, float | None, float]] = []


@app.task(name=common.TASK_TYPE, pass_context=True)
async def noop(context: procrastinate.JobContext, data: str, t: float | None = None) -> None:
    started = time.time()
    _runs.append((context.job.id, t, started))


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


def worker_command(concurrency: int) -> list[str]:
    cli = str(Path(sys.executable).parent / "procrastinate")
    return [
        cli,
        "--app",
        "procrastinate_contender.app",
        "--log-level",
        "warning",
        "worker",
        "--concurrency",
        str(concurrency),
    ]


async def enqueue_bulk(total: int, batch_size: int) -> float:
    job: dict[str, Any] = common.payload()
    started = time.perf_counter()
    for start in range(0, total, batch_size):
        n = min(batch_size, total - start)
        await noop.batch_defer_async(*[job] * n)
    return time.perf_counter() - started


def completions(conn: psycopg.AsyncConnection[Any]) -> Callable[[], Awaitable[int]]:
    """The succeeded jobs' count, polled by common.await_completions."""

    async def count() -> int:
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        row = await (await conn.execute(sql)).fetchone()
        assert row is not None
        return int(row[0])

    return count


async def run(args: Any) -> dict[str, Any]:
    deadline = common.Deadline(args.timeout)
    result: dict[str, Any] = {
        "contender": "procrastinate",
        "version": procrastinate.__version__,
        "scenario": args.scenario,
        "tasks": args.tasks,
    }
    pool_size = args.concurrency + SIDE_CONNECTIONS
    env = common.worker_env(args.dsn, **{POOL_ENV: str(pool_size)})
    # Submitting: one connection (the pool's only one), as for the other contenders.
    with app.replace_connector(connector(args.dsn, 1)):
        async with (
            app.open_async(),
            await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn,
        ):
            await app.schema_manager.apply_schema_async()

            async def in_table() -> int:
                row = await (
                    await conn.execute("SELECT count(*) FROM procrastinate_jobs")
                ).fetchone()
                assert row is not None
                return int(row[0])

            if args.scenario == "enqueue_single":
                started = time.perf_counter()
                for _ in range(args.tasks):
                    await noop.defer_async(**common.payload())
                elapsed = time.perf_counter() - started
                result.update(per_s=round(args.tasks / elapsed, 1), in_table=await in_table())
                result["settings"] = {
                    "connection": "PsycopgConnector pool of 1",
                    "api": "Task.defer_async",
                }

            elif args.scenario == "enqueue_bulk":
                elapsed = await enqueue_bulk(args.tasks, args.batch_size)
                result.update(per_s=round(args.tasks / elapsed, 1), in_table=await in_table())
                result["settings"] = {
                    "api": "Task.batch_defer_async",
                    "batch_size": args.batch_size,
                }

            elif args.scenario == "drain":
                elapsed = await enqueue_bulk(args.tasks, args.batch_size)
                result["enqueue_per_s"] = round(args.tasks / elapsed, 1)
                clock = common.DrainClock(args.tasks)
                workers = common.Workers(
                    [worker_command(args.concurrency) for _ in range(args.processes)],
                    env,
                    args.log_dir,
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
                    "concurrency_per_process": args.concurrency,
                    "pool_size_per_process": pool_size,
                    "handler": "async no-op",
                    "enqueue_batch_size": args.batch_size,
                }

            elif args.scenario == "latency":
                workers = common.Workers([worker_command(args.concurrency)], env, args.log_dir)
                try:
                    for _ in range(args.warmup):
                        await noop.defer_async(**common.payload())
                    clock = common.DrainClock(args.warmup)
                    await common.await_completions(
                        completions(conn), clock, workers, deadline, 0.05
                    )
                    await asyncio.sleep(0.5)
                    interval = args.interval_ms / 1000
                    start = time.monotonic()
                    for i in range(args.tasks):
                        await asyncio.sleep(common.pace(start, i, interval))
                        enqueued_at = time.time()
                        await noop.defer_async(**common.payload(enqueued_at))
                    total = args.warmup + args.tasks
                    clock = common.DrainClock(total)
                    await common.await_completions(
                        completions(conn), clock, workers, deadline, 0.05
                    )
                finally:
                    result["worker_exit_codes"] = workers.stop()
                result["settings"] = {
                    "processes": 1,
                    "concurrency": args.concurrency,
                    "pool_size": pool_size,
                    "interval_ms": args.interval_ms,
                    "warmup_tasks": args.warmup,
                }
    return result


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], batch_size=1000, concurrency=50)
    common.emit(asyncio.run(run(args)))


if __name__ == "__main__":
    # Run as the module the workers import, not as __main__: Procrastinate warns about (and
    # its docs advise against) an app defined in the main module.
    import procrastinate_contender

    procrastinate_contender.main()
