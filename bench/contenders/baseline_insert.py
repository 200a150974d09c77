"""The bare single-row INSERT loop that enqueue_single is compared with (no queue library).

What a queue's one-task-per-transaction submit cannot beat on this server: one connection,
autocommit, one INSERT of (uuid, jsonb, priority, created_at) per statement into a plain table
with a primary key, the same payload. psycopg prepares the statement after a few executions,
as it does for any repeated query. Runs with pgqueue's virtualenv's Python (for psycopg only):
alone, or, as bench/compare.py runs it, in blocks alternating with pgqueue.enqueue's inside
pgqueue's contender script (``--baseline``), so that both see the same moment's load.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import _common as common
import psycopg
from psycopg.types.json import Jsonb

TABLE = """
CREATE TABLE bare_insert (
    id uuid PRIMARY KEY,
    payload jsonb NOT NULL,
    priority smallint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
INSERT = "INSERT INTO bare_insert (id, payload, priority) VALUES (%s, %s, %s)"


SETTINGS = {
    "api": "conn.execute(INSERT ...), a prepared statement",
    "connection": "psycopg, autocommit",
}


def create_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute(TABLE)


def insert_block(conn: psycopg.Connection[Any], tasks: int) -> float:
    """``tasks`` single-row INSERTs on an autocommit connection, one commit each; seconds."""
    data = common.payload()
    started = time.perf_counter()
    for _ in range(tasks):
        conn.execute(INSERT, (uuid.uuid4(), Jsonb(data), 1))
    return time.perf_counter() - started


def in_table(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM bare_insert").fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    if args.scenario != "enqueue_single":
        raise SystemExit("the bare INSERT baseline only has the enqueue_single scenario")
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        create_table(conn)
        elapsed = insert_block(conn, args.tasks)
        count = in_table(conn)
    common.emit(
        {
            "contender": "bare INSERT",
            "version": psycopg.__version__,
            "scenario": args.scenario,
            "tasks": args.tasks,
            "per_s": round(args.tasks / elapsed, 1),
            "in_table": count,
            "settings": SETTINGS,
        }
    )


if __name__ == "__main__":
    main()
