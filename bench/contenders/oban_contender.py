"""Oban-py's side of bench/compare.py: one scenario on one scratch database, one JSON line out.

Runs with the Python of Oban's own virtualenv (oban from PyPI, which needs Python 3.12 or
later, so that venv is built from a 3.12+ interpreter) and imports only oban, psycopg,
psycopg_pool, orjson, the standard library and _common. The same module holds the worker
class the workers run: ``oban start --dsn URL --queues default:C --log-level WARNING
--cron-modules oban_contender`` (Oban's documented worker command; one process each, as
Oban without Pro has no multi-process mode, so a two-process drain starts two of them).
``--cron-modules`` only makes the command import this module at start, as an application's
worker modules are imported, instead of on the first job.

Configured as Oban's own CLI configures itself: psycopg with orjson as its JSON dumper and
loader and uvloop (both what ``oban start`` installs, used here for the submitting side too),
the queue's concurrency limit chosen by a sweep (see bench/compare.py), the connection pool's
default size (10), jobs kept after completion (the default; the pruner removes them after a
day). Bulk enqueue is ``Oban.enqueue_many`` (one INSERT per job in one transaction: the open
source edition's bulk API; Oban Pro's bulk insert is not free software). Schema: Oban's own
``oban.schema.install``; the job table is logged, its two bookkeeping tables (oban_leaders,
oban_producers: leader election and producer heartbeats, no job data) are UNLOGGED by
Oban's design, which the harness allows for these two names only.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.metadata
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as common
import orjson
import psycopg
from oban import Job, Oban, worker
from oban.schema import install
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

QUEUE = "default"
# (job id, enqueue time from the args, handler start time): written to bench_runs at exit.
_runs: list[tuple[int | None, float | None, float]] = []


@worker(queue=QUEUE)
class Noop:
    async def process(self, job: Job) -> None:
        started = time.time()
        _runs.append((job.id, job.args.get("t"), started))


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


def worker_command(dsn: str, concurrency: int) -> list[str]:
    cli = str(Path(sys.executable).parent / "oban")
    return [
        cli,
        "start",
        "--dsn",
        dsn,
        "--queues",
        f"{QUEUE}:{concurrency}",
        "--log-level",
        "WARNING",
        "--cron-modules",
        "oban_contender",
    ]


async def enqueue_bulk(oban: Oban, total: int, batch_size: int) -> float:
    data = common.payload()
    started = time.perf_counter()
    for start in range(0, total, batch_size):
        n = min(batch_size, total - start)
        await oban.enqueue_many([Noop.new(data) for _ in range(n)])
    return time.perf_counter() - started


async def count(conn: psycopg.AsyncConnection[Any], where: str = "") -> int:
    row = await (await conn.execute(f"SELECT count(*) FROM oban_jobs {where}")).fetchone()
    assert row is not None
    return int(row[0])


def completions(conn: psycopg.AsyncConnection[Any]) -> Callable[[], Awaitable[int]]:
    """The finished jobs' count, polled by common.await_completions."""
    return lambda: count(conn, "WHERE state = 'completed'")


async def run(args: Any) -> dict[str, Any]:
    deadline = common.Deadline(args.timeout)
    result: dict[str, Any] = {
        "contender": "oban",
        "version": importlib.metadata.version("oban"),
        "scenario": args.scenario,
        "tasks": args.tasks,
    }
    # Submitting: one connection (a pool of one), as for the other contenders; an Oban
    # instance without queues is Oban's client mode (no leadership, no producers).
    pool = AsyncConnectionPool(conninfo=args.dsn, min_size=1, max_size=1, open=False)
    await pool.open()
    try:
        await install(pool)
        oban = Oban(pool=pool)
        env = common.worker_env(args.dsn)
        async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
            if args.scenario == "enqueue_single":
                data = common.payload()
                started = time.perf_counter()
                for _ in range(args.tasks):
                    await Noop.enqueue(data)  # a pool connection: one transaction each
                elapsed = time.perf_counter() - started
                result.update(per_s=round(args.tasks / elapsed, 1), in_table=await count(conn))
                result["settings"] = {"connection": "psycopg pool of 1", "api": "Worker.enqueue"}

            elif args.scenario == "enqueue_bulk":
                elapsed = await enqueue_bulk(oban, args.tasks, args.batch_size)
                result.update(per_s=round(args.tasks / elapsed, 1), in_table=await count(conn))
                result["settings"] = {
                    "api": "Oban.enqueue_many (one transaction per batch)",
                    "batch_size": args.batch_size,
                }

            elif args.scenario == "drain":
                elapsed = await enqueue_bulk(oban, args.tasks, args.batch_size)
                result["enqueue_per_s"] = round(args.tasks / elapsed, 1)
                clock = common.DrainClock(args.tasks)
                workers = common.Workers(
                    [worker_command(args.dsn, args.concurrency) for _ in range(args.processes)],
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
                    "queue_limit_per_process": args.concurrency,
                    "pool_size_per_process": "10 (default)",
                    "handler": "async no-op",
                    "enqueue_batch_size": args.batch_size,
                }

            elif args.scenario == "latency":
                workers = common.Workers(
                    [worker_command(args.dsn, args.concurrency)], env, args.log_dir
                )
                try:
                    for _ in range(args.warmup):
                        await Noop.enqueue(common.payload())
                    clock = common.DrainClock(args.warmup)
                    await common.await_completions(
                        completions(conn), clock, workers, deadline, 0.05
                    )
                    await asyncio.sleep(0.5)
                    interval = args.interval_ms / 1000
                    start = time.monotonic()
                    for i in range(args.tasks):
                        await asyncio.sleep(common.pace(start, i, interval))
                        await Noop.enqueue(common.payload(time.time()))
                    total = args.warmup + args.tasks
                    clock = common.DrainClock(total)
                    await common.await_completions(
                        completions(conn), clock, workers, deadline, 0.05
                    )
                finally:
                    result["worker_exit_codes"] = workers.stop()
                result["settings"] = {
                    "processes": 1,
                    "queue_limit": args.concurrency,
                    "interval_ms": args.interval_ms,
                    "warmup_tasks": args.warmup,
                }
    finally:
        await pool.close()
    return result


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], batch_size=1000, concurrency=50)
    set_json_dumps(orjson.dumps)  # as `oban start` does
    set_json_loads(orjson.loads)
    try:
        import uvloop
    except ImportError:
        common.emit(asyncio.run(run(args)))
    else:
        common.emit(uvloop.run(run(args)))


if __name__ == "__main__":
    # Run as the module the workers import (the worker's name is "oban_contender.Noop"),
    # not as __main__.
    import oban_contender

    oban_contender.main()
