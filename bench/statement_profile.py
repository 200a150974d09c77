"""What each of pgqueue's statements costs the server, per task, on each path of a task's life.

    python -m bench.statement_profile                  # 2,000 single enqueues, 20,000 bulk,
                                                       # a 20,000-task drain by 1 process
    python -m bench.statement_profile --tasks 50000 --single 3000

Why: bench.compare times whole paths on a shared machine, where a 10 % change hides in the
noise. This one asks the server what it did: a private PostgreSQL 15 (the system's binaries,
/usr/lib/postgresql/15/bin, which ship pg_stat_statements; fsync and synchronous_commit on),
``pg_stat_statements`` reset before each phase and read after it:

* ``single``: ``pgqueue.enqueue`` on an autocommit connection, one task per call and
  transaction; then the bare one-row INSERT of bench/contenders/baseline_insert.py, as many.
* ``bulk``: ``enqueue_many`` then ``enqueue_columns``, 1,000 a call.
* ``drain``: a backlog (bulk enqueued, not counted) drained by ``pgqueue worker`` (1
  process, concurrency 500, an async no-op handler: bench/contenders/pgqueue_contender.py).

Per phase and statement (those run at least once per 2,000 tasks): calls and rows per task,
mean execution time (the executor's, not the round trip), buffers hit and dirtied, WAL
records, full-page images and bytes, all per task. Then, from ``pg_stat_user_tables`` and
``pg_stat_user_indexes``: heap tuples written per task (inserts, updates and how many were
HOT) and index entries read per task, by index (in the drain, tasks_retention_idx's reads
are this script's own: it counts the completed tasks five times a second), and the live
entries each index gained (``bt_page_stats`` over its leaf pages, the
pageinspect extension), since no statistics view counts entries written. For inserts that is
what was written; after updates it undercounts, since btree's bottom-up deletion removes the
entries of superseded row versions as pages fill: a non-HOT update writes one entry in every
index whose predicate its new version meets (RESULTS.md counts them from the predicates).
Round trips per task on each path: the statements' calls per task (each is one round trip,
or one message of a pipeline), plus one COMMIT where the client commits (bulk) and none on
autocommit.

Autovacuum is off in this server (a vacuum mid-phase would remove index entries before they
are counted). The figures are for one server version and one machine; compare them with each
other, not with bench.compare's wall-clock rates.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.private_postgres import SERVER_SETTINGS, private_server

BENCH = Path(__file__).resolve().parent
CONTENDERS = BENCH / "contenders"
PG15 = Path("/usr/lib/postgresql/15/bin")
TASK_TYPE = "bench.noop"
STATS = """
SELECT regexp_replace(left(query, 400), '\\s+', ' ', 'g') AS query, query AS full_text, calls, rows,
       mean_exec_time, shared_blks_hit, shared_blks_dirtied, wal_records, wal_fpi, wal_bytes
  FROM pg_stat_statements
 WHERE query NOT ILIKE '%%pg_stat_statements%%' AND query NOT ILIKE 'SET %%'
   AND calls > 0
 ORDER BY mean_exec_time * calls DESC
"""
INDEX_ENTRIES = """
SELECT c.relname,
       coalesce((SELECT sum(s.live_items)
                   FROM generate_series(1, pg_relation_size(c.oid) / 8192 - 1) AS b,
                        LATERAL bt_page_stats(c.oid::regclass::text, b::integer) AS s
                  WHERE s.type = 'l'), 0) AS entries
  FROM pg_class AS c JOIN pg_index AS i ON i.indexrelid = c.oid
 WHERE i.indrelid = 'pgqueue.tasks'::regclass
 ORDER BY 1
"""


# This script's own statements, left out of the tables.
OWN = re.compile(
    r"pg_stat|bt_page_stats|CHECKPOINT|TRUNCATE|count\(\*\)|CREATE |SHOW ", re.IGNORECASE
)


def flush(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn``'s backend publish its table and index counts now (it would within 10 s
    of going idle), so that the phase's figures include them."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    if not conn.autocommit:
        conn.commit()


def _normal(text: str) -> str:
    """A statement's text with every parameter and constant as ``$`` and single spaces: how
    pg_stat_statements's text (constants as $1, $2, ...) and pgqueue's (%(name)s) compare."""
    parameter = r"'[^']*'|\$\d+|%\(\w+\)[sbt]|\b\d+(?:\.\d+)?\b|\b(?:true|false|NULL)\b"
    text = re.sub(parameter, "$", text)
    return re.sub(r"\s+", " ", text).strip().rstrip(";")


def name_of(query: str, full: str) -> str:
    """pgqueue's name for the statement (pgqueue/sql/*.sql), else its first words."""
    from pgqueue.queries.driver import statements as pgqueue_statements

    known = {_normal(text): name for name, text in pgqueue_statements().items()}
    found = known.get(_normal(full))
    if found:
        return found
    words = query.split()
    return " ".join(words[:12])[:100]


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_stat_statements_reset()")
    conn.execute("SELECT pg_stat_reset()")


def statements(conn: psycopg.Connection[Any], tasks: int) -> list[list[str]]:
    rows = []
    for query, full, calls, nrows, mean, hit, dirtied, wal, fpi, wal_bytes in conn.execute(STATS):
        if calls < tasks / 2000 or OWN.search(query):  # start-up statements; this script's
            continue
        rows.append(
            [
                f"`{name_of(query, full)}`",
                f"{calls / tasks:.3f}",
                f"{nrows / tasks:.2f}",
                f"{mean * 1000:.1f}",
                f"{mean * 1000 * calls / tasks:.1f}",
                f"{hit / tasks:.1f}",
                f"{dirtied / tasks:.2f}",
                f"{wal / tasks:.2f}",
                f"{fpi / tasks:.3f}",
                f"{float(wal_bytes) / tasks:.0f}",
            ]
        )
    return rows


def table_counts(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    time.sleep(1.5)  # other backends flush their counts at most once a second when idle
    row = conn.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
        " WHERE relid = 'pgqueue.tasks'::regclass"
    ).fetchone()
    assert row is not None
    reads = conn.execute(
        "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
        " WHERE relid = 'pgqueue.tasks'::regclass ORDER BY 1"
    ).fetchall()
    entries = dict(conn.execute(INDEX_ENTRIES).fetchall())
    return {
        "table": dict(zip(("inserted", "updated", "hot_updated", "deleted"), row, strict=True)),
        "reads": {name: (scans, read) for name, scans, read in reads},
        "entries": entries,
    }


def lines_for(phase: str, conn: psycopg.Connection[Any], tasks: int, note: str) -> list[str]:
    header = [
        "statement",
        "calls/task",
        "rows/task",
        "mean exec µs",
        "exec µs/task",
        "buffers hit/task",
        "dirtied/task",
        "WAL records/task",
        "FPI/task",
        "WAL bytes/task",
    ]
    out = [f"### {phase}", "", note, ""]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in statements(conn, tasks)]
    return out


def counts_lines(before: dict[str, Any], after: dict[str, Any], tasks: int) -> list[str]:
    """Heap tuples and index entries per task over a phase (after minus before)."""
    t0, t1 = before["table"], after["table"]
    heap = {k: (t1[k] - t0[k]) / tasks for k in t1}
    out = [
        "",
        f"pgqueue.tasks, per task: {heap['inserted']:.2f} inserts, {heap['updated']:.2f} "
        f"updates ({heap['hot_updated']:.2f} HOT), {heap['deleted']:.2f} deletes.",
        "",
        "| index | live entries added/task | scans/task | entries read/task |",
        "|---|---|---|---|",
    ]
    for name, written in after["entries"].items():
        grown = (written - before["entries"].get(name, 0)) / tasks
        scans0, read0 = before["reads"].get(name, (0, 0))
        scans1, read1 = after["reads"].get(name, (0, 0))
        if grown or scans1 - scans0:
            out.append(
                f"| {name} | {grown:.2f} | {(scans1 - scans0) / tasks:.3f} | "
                f"{(read1 - read0) / tasks:.2f} |"
            )
    return out


def run_single(url: str, admin: psycopg.Connection[Any], n: int) -> list[str]:
    import pgqueue

    data = {"data": "x" * 100}
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(20):
            pgqueue.enqueue(conn, TASK_TYPE, data)
        reset(admin)
        before = table_counts(admin)
        started = time.perf_counter()
        for _ in range(n):
            pgqueue.enqueue(conn, TASK_TYPE, data)
        elapsed = time.perf_counter() - started
        flush(conn)
        out = lines_for(
            "Single enqueue (pgqueue.enqueue, autocommit)",
            admin,
            n,
            f"{n:,} calls, {n / elapsed:,.0f}/s. Each call is one statement and its commit.",
        )
        out += counts_lines(before, table_counts(admin), n)
        conn.execute(
            "CREATE TABLE bare_insert (id uuid PRIMARY KEY, payload jsonb NOT NULL,"
            " priority smallint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        from psycopg.types.json import Jsonb

        insert = "INSERT INTO bare_insert (id, payload, priority) VALUES (%s, %s, %s)"
        import uuid

        for _ in range(20):
            conn.execute(insert, (uuid.uuid4(), Jsonb(data), 1))
        reset(admin)
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(insert, (uuid.uuid4(), Jsonb(data), 1))
        elapsed = time.perf_counter() - started
        out += [
            "",
            *lines_for(
                "The bare one-row INSERT (baseline_insert.py's)",
                admin,
                n,
                f"{n:,} calls, {n / elapsed:,.0f}/s, the same payload, into a table with a "
                "primary key only.",
            ),
        ]
    return out


def run_bulk(url: str, admin: psycopg.Connection[Any], n: int) -> list[str]:
    import pgqueue

    data = {"data": "x" * 100}
    item = {"type": TASK_TYPE, "payload": data}
    out: list[str] = []
    with psycopg.connect(url) as conn:
        for api in ("enqueue_many", "enqueue_columns"):
            reset(admin)
            before = table_counts(admin)
            started = time.perf_counter()
            for _ in range(n // 1000):
                if api == "enqueue_many":
                    pgqueue.enqueue_many(conn, [item] * 1000)
                else:
                    pgqueue.enqueue_columns(conn, TASK_TYPE, [data] * 1000)
                conn.commit()
            elapsed = time.perf_counter() - started
            flush(conn)
            out += lines_for(
                f"Bulk enqueue ({api}, 1,000 a call, one commit each)",
                admin,
                n,
                f"{n:,} tasks, {n / elapsed:,.0f}/s; the client's COMMIT is one round trip "
                "more per call (0.001 per task).",
            )
            out += [*counts_lines(before, table_counts(admin), n), ""]
    return out


def run_drain(url: str, admin: psycopg.Connection[Any], n: int, python: str) -> list[str]:
    import pgqueue

    data = {"data": "x" * 100}
    with psycopg.connect(url) as conn:
        for _ in range(n // 1000):
            pgqueue.enqueue_columns(conn, TASK_TYPE, [data] * 1000)
            conn.commit()
    admin.execute("CHECKPOINT")
    reset(admin)
    before = table_counts(admin)
    env = dict(os.environ, PYTHONPATH=str(CONTENDERS), BENCH_DSN="")
    cli = str(Path(python).parent / "pgqueue")
    command = [cli, "--database-url", url, "worker", "pgqueue_contender:tasks"]
    command += ["--processes", "1", "--concurrency", "500", "--log-level", "WARNING"]
    started = time.perf_counter()
    worker = subprocess.Popen(command, env=env, cwd=CONTENDERS, start_new_session=True)
    try:
        while True:
            row = admin.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'"
            ).fetchone()
            assert row is not None
            if row[0] >= n:
                break
            if worker.poll() is not None or time.perf_counter() - started > 600:
                raise RuntimeError(f"the drain stopped at {row[0]} of {n}")
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(60)
    elapsed = time.perf_counter() - started
    out = lines_for(
        "Drain (pgqueue worker, 1 process, concurrency 500, async no-op handler)",
        admin,
        n,
        f"{n:,} tasks in {elapsed:.1f} s from launch, {n / elapsed:,.0f}/s. The worker's "
        "start-up, heartbeats and maintenance are in the figures, at their share per task.",
    )
    return out + counts_lines(before, table_counts(admin), n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.statement_profile")
    p.add_argument("--tasks", type=int, default=20_000, help="bulk and drain tasks")
    p.add_argument("--single", type=int, default=2_000, help="single enqueues")
    p.add_argument("--phases", default="single,bulk,drain")
    p.add_argument("--bindir", type=Path, default=PG15)
    args = p.parse_args(argv)
    settings = dict(SERVER_SETTINGS)
    settings.update(
        shared_preload_libraries="'pg_stat_statements'",
        autovacuum="off",
        track_io_timing="on",
    )
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    lines = [
        "## Statement profile (bench/statement_profile.py)",
        "",
        "```console",
        "python -m bench.statement_profile " + " ".join(sys.argv[1:] if argv is None else argv),
        "```",
        "",
    ]
    with private_server(15, bindir=args.bindir, settings=settings) as server:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE profile")
        url = server.url("profile")
        from pgqueue import migrate

        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION pg_stat_statements")
            admin.execute("CREATE EXTENSION pageinspect")
            admin.execute(
                "CREATE TABLE bench_runs (task_id text NOT NULL, enqueued_at float8,"
                " started_at float8 NOT NULL, pid int NOT NULL)"
            )
            version = admin.execute("SHOW server_version").fetchone()
            lines += [f"PostgreSQL {version[0] if version else '?'}, private, fsync on.", ""]
            if "single" in phases:
                lines += [*run_single(url, admin, args.single), ""]
            if "bulk" in phases:
                lines += run_bulk(url, admin, args.tasks)
            if "drain" in phases:
                admin.execute("TRUNCATE pgqueue.tasks")
                lines += [*run_drain(url, admin, args.tasks, sys.executable), ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
