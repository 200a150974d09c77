"""pgqueue's side of bench/compare.py: one scenario on one scratch database, one JSON line out.

Runs with the Python of pgqueue's benchmark virtualenv (the repository checkout installed
there like a user would install it) and imports only pgqueue, psycopg, the standard library
and _common. The same module is the workers' handler module: ``pgqueue worker
pgqueue_contender:tasks`` imports it, the no-op handler notes each task it runs, and at exit
each worker process writes its notes into bench_runs for the harness's exactly-once check.

Worker: the real CLI, ``pgqueue --database-url URL worker pgqueue_contender:tasks
--processes P --concurrency C --log-level WARNING``.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path
from typing import Any

import _common as common
import psycopg

import pgqueue
from pgqueue import migrate

tasks = pgqueue.TaskRegistry()
# (task id, enqueue time from the payload, handler start time): appended by the handler, the
# cheapest record there is; written to the database once, at exit.
_runs: list[tuple[Any, Any, float]] = []


@tasks.handler(common.TASK_TYPE)
async def noop(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    started = time.time()
    _runs.append((ctx.task_id, payload.get("t"), started))


@atexit.register
def _write_runs() -> None:
    """At worker exit (after a graceful SIGTERM), COPY this process's runs into bench_runs."""
    dsn = os.environ.get(common.DSN_ENV)
    if not _runs or not dsn:
        return
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(common.RUNS_COPY) as copy:
        pid = os.getpid()
        for task_id, enqueued_at, started in _runs:
            copy.write_row((str(task_id), enqueued_at, started, pid))


def completed(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def in_table(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def worker_command(dsn: str, processes: int, concurrency: int) -> list[str]:
    cli = str(Path(sys.executable).parent / "pgqueue")
    return [
        cli,
        "--database-url",
        dsn,
        "worker",
        "pgqueue_contender:tasks",
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--log-level",
        "WARNING",
    ]


BULK_APIS = {
    "many": "pgqueue.enqueue_many, one commit per batch",
    "columns": "pgqueue.enqueue_columns, one commit per batch",
}


def enqueue_bulk(dsn: str, total: int, batch_size: int, api: str = "many") -> float:
    """enqueue_many (or the columnar enqueue_columns) in batches, one transaction per batch;
    returns the seconds it took."""
    data = common.payload()
    item = {"type": common.TASK_TYPE, "payload": data}
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        for start in range(0, total, batch_size):
            n = min(batch_size, total - start)
            if api == "columns":
                pgqueue.enqueue_columns(conn, common.TASK_TYPE, [data] * n)
            else:
                pgqueue.enqueue_many(conn, [item] * n)
            conn.commit()
        return time.perf_counter() - started


def enqueue_block(conn: psycopg.Connection[Any], tasks: int) -> float:
    """``tasks`` calls of pgqueue.enqueue on an autocommit connection (one transaction each);
    the seconds they took."""
    data = common.payload()
    started = time.perf_counter()
    for _ in range(tasks):
        pgqueue.enqueue(conn, common.TASK_TYPE, data)
    return time.perf_counter() - started


def enqueue_single(dsn: str, tasks: int, baseline: bool) -> dict[str, Any]:
    """pgqueue.enqueue ``tasks`` times; with ``baseline``, in blocks alternating with as many
    bare one-row INSERTs (baseline_insert.py) on a second connection, each pair's order
    swapped from one pair to the next, so that both loops see the same moment's load; each
    side's rate over all its blocks, and the median of the per-pair ratios."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not baseline:
            elapsed = enqueue_block(conn, tasks)
            return {"per_s": round(tasks / elapsed, 1), "in_table": in_table(conn)}
        import baseline_insert as bare  # the contenders' directory is sys.path[0]

        with psycopg.connect(dsn, autocommit=True) as bare_conn:
            bare.create_table(bare_conn)
            enqueue_block(conn, 20)  # warm up both: prepared statements, caches
            bare.insert_block(bare_conn, 20)
            pairs = max(1, min(BASELINE_PAIRS, tasks // 50))
            mine = theirs = 0.0
            ratios = []
            for i in range(pairs):
                n = tasks // pairs + (1 if i < tasks % pairs else 0)
                if i % 2:
                    b = bare.insert_block(bare_conn, n)
                    m = enqueue_block(conn, n)
                else:
                    m = enqueue_block(conn, n)
                    b = bare.insert_block(bare_conn, n)
                mine, theirs = mine + m, theirs + b
                ratios.append(b / m)  # pgqueue's rate ÷ the bare INSERT's
            ratios.sort()
            return {
                "per_s": round(tasks / mine, 1),
                "in_table": in_table(conn) - 20,
                "baseline": {
                    "per_s": round(tasks / theirs, 1),
                    "in_table": bare.in_table(bare_conn) - 20,
                    "pairs": pairs,
                    "ratio_median": round(ratios[len(ratios) // 2], 3),
                    "settings": bare.SETTINGS,
                },
            }


BASELINE_PAIRS = 10  # enqueue_single --baseline: blocks of each, alternating


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], batch_size=5000, concurrency=50)
    deadline = common.Deadline(args.timeout)
    migrate.upgrade(args.dsn)
    result: dict[str, Any] = {
        "contender": "pgqueue",
        "version": pgqueue.__version__,
        "scenario": args.scenario,
        "tasks": args.tasks,
    }

    if args.scenario == "enqueue_single":
        result.update(enqueue_single(args.dsn, args.tasks, args.baseline))
        result["settings"] = {"connection": "psycopg, autocommit", "api": "pgqueue.enqueue"}

    elif args.scenario == "enqueue_bulk":
        api = "many" if args.bulk_api == "default" else args.bulk_api
        if api not in BULK_APIS:
            raise SystemExit(f"--bulk-api {api}: pgqueue has {', '.join(BULK_APIS)}")
        elapsed = enqueue_bulk(args.dsn, args.tasks, args.batch_size, api)
        with psycopg.connect(args.dsn) as conn:
            result.update(per_s=round(args.tasks / elapsed, 1), in_table=in_table(conn))
        result["settings"] = {"api": BULK_APIS[api], "batch_size": args.batch_size}

    elif args.scenario == "drain":
        elapsed = enqueue_bulk(args.dsn, args.tasks, args.batch_size)
        result["enqueue_per_s"] = round(args.tasks / elapsed, 1)
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            clock = common.DrainClock(args.tasks)
            workers = common.Workers(
                [worker_command(args.dsn, args.processes, args.concurrency)],
                common.worker_env(args.dsn),
                args.log_dir,
            )
            try:
                common.wait_for(
                    lambda: completed(conn), clock, workers, deadline, args.poll_interval
                )
            finally:
                result["worker_exit_codes"] = workers.stop()
            result.update(clock.result())
        result["settings"] = {
            "processes": args.processes,
            "concurrency_per_process": args.concurrency,
            "handler": "async no-op",
            "enqueue_batch_size": args.batch_size,
        }

    elif args.scenario == "latency":
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            workers = common.Workers(
                [worker_command(args.dsn, 1, args.concurrency)],
                common.worker_env(args.dsn),
                args.log_dir,
            )
            try:
                # Warm-up: the worker is ready (started, listening, through its first claim)
                # once it has run these; then it is left idle before the measured tasks.
                for _ in range(args.warmup):
                    pgqueue.enqueue(conn, common.TASK_TYPE, common.payload())
                clock = common.DrainClock(args.warmup)
                common.wait_for(lambda: completed(conn), clock, workers, deadline, 0.05)
                time.sleep(0.5)
                interval = args.interval_ms / 1000
                start = time.monotonic()
                for i in range(args.tasks):
                    time.sleep(common.pace(start, i, interval))
                    enqueued_at = time.time()
                    pgqueue.enqueue(conn, common.TASK_TYPE, common.payload(enqueued_at))
                clock = common.DrainClock(args.warmup + args.tasks)
                common.wait_for(lambda: completed(conn), clock, workers, deadline, 0.05)
            finally:
                result["worker_exit_codes"] = workers.stop()
        result["settings"] = {
            "processes": 1,
            "concurrency": args.concurrency,
            "interval_ms": args.interval_ms,
            "warmup_tasks": args.warmup,
        }

    common.emit(result)


if __name__ == "__main__":
    main()
