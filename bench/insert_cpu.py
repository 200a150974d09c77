"""What one row inserted into pgqueue.tasks costs the server's CPU, and which part of the
table costs it: the same INSERT into copies of the table with parts taken away.

    python -m bench.insert_cpu                # the local server, 2,000 rows a block
    python -m bench.insert_cpu --database-url postgresql://postgres@127.0.0.1:5432/postgres

Why: a durable single enqueue's wall time on a shared machine is mostly the WAL flush and
its noise, and the server's CPU per insert hides in it. Here each variant is inserted by a
PL/pgSQL loop in one backend (``DO``: each INSERT is a fresh execution of a cached plan, as a
prepared statement's is, without a round trip or a commit per row), and the backend's own
on-CPU time is read from ``/proc/<pid>/schedstat`` before and after: time spent running, not
waiting for a core, so other work on the machine moves it little. The server must run on
this machine (its backends' /proc entries are read). Variants, in blocks alternating in
order, 5 rounds, median per row:

* ``bare``: bench/contenders/baseline_insert.py's table (uuid, jsonb, smallint, timestamptz;
  a primary key);
* ``wide``: pgqueue.tasks's columns and defaults, a primary key, no CHECK, no other index;
* ``checks``: ``wide`` with pgqueue.tasks's nine CHECK constraints;
* ``checks_cheap``: the same constraints in equivalent forms that are cheaper to prepare
  (``'0'`` for ``0::double precision``, an array literal for ``ARRAY[...]``, BETWEEN);
* ``domains``: ``wide`` with the single-column constraints as domains (and the two others as
  CHECKs): a domain's check is prepared once per backend (the type cache), a table's CHECK at
  every execution of the statement;
* ``partials``: ``wide`` with pgqueue.tasks's nine partial indexes that a queued task does not
  enter (their predicates are still evaluated);
* ``claim``: ``checks`` with the two claim indexes a queued task enters;
* ``tasks``: pgqueue.tasks itself (every index and constraint);
* ``task_insert_simple``: pgqueue's own single-task statement, with its declaration join
  and RETURNING, into pgqueue.tasks.

The payload is the benchmarks' ``{"data": "x" * 100}``, a literal: its jsonb parse is done
once, at plan time, so it is not in the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from typing import Any

import psycopg

PAYLOAD = '{"data": "' + "x" * 100 + '"}'
CHECKS = """
ALTER TABLE {t}
  ADD CHECK (attempts >= 0),
  ADD CHECK (backoff_base >= 0::double precision AND backoff_factor >= 1::double precision
             AND backoff_cap >= 0::double precision),
  ADD CHECK (length(concurrency_key) >= 1 AND length(concurrency_key) <= 200),
  ADD CHECK ((status = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
  ADD CHECK (max_attempts >= 1),
  ADD CHECK (priority >= 0 AND priority <= 9),
  ADD CHECK (length(queue) >= 1 AND length(queue) <= 200),
  ADD CHECK (status = ANY (ARRAY['queued', 'running', 'completed', 'failed', 'cancelled',
                                 'waiting'])),
  ADD CHECK (length(type) >= 1 AND length(type) <= 200)
"""
CHECKS_CHEAP = """
ALTER TABLE {t}
  ADD CHECK (attempts >= 0),
  ADD CHECK (backoff_base >= '0' AND backoff_factor >= '1' AND backoff_cap >= '0'),
  ADD CHECK (length(concurrency_key) BETWEEN 1 AND 200),
  ADD CHECK ((status = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
  ADD CHECK (max_attempts >= 1),
  ADD CHECK (priority BETWEEN 0 AND 9),
  ADD CHECK (length(queue) BETWEEN 1 AND 200),
  ADD CHECK (status = ANY ('{{queued,running,completed,failed,cancelled,waiting}}'::text[])),
  ADD CHECK (length(type) BETWEEN 1 AND 200)
"""
DOMAINS = """
CREATE DOMAIN {s}.name AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN {s}.key AS text COLLATE "C" CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN {s}.priority AS smallint CHECK (VALUE BETWEEN 0 AND 9);
CREATE DOMAIN {s}.status AS text
  CHECK (VALUE = ANY ('{{queued,running,completed,failed,cancelled,waiting}}'::text[]));
CREATE DOMAIN {s}.attempts AS integer CHECK (VALUE >= 0);
CREATE DOMAIN {s}.max_attempts AS integer CHECK (VALUE >= 1);
ALTER TABLE {t} ALTER queue TYPE {s}.name, ALTER type TYPE {s}.name,
  ALTER priority TYPE {s}.priority, ALTER status TYPE {s}.status,
  ALTER attempts TYPE {s}.attempts, ALTER max_attempts TYPE {s}.max_attempts,
  ALTER concurrency_key TYPE {s}.key;
ALTER TABLE {t}
  ADD CHECK (backoff_base >= '0' AND backoff_factor >= '1' AND backoff_cap >= '0'),
  ADD CHECK ((status = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
"""
PARTIALS = """
CREATE INDEX ON {t} (expires_at) WHERE status = 'queued' AND attempts = 0
                                   AND expires_at IS NOT NULL;
CREATE INDEX ON {t} (lease_expires_at) WHERE status = 'running';
CREATE INDEX ON {t} (status, queue, finished_at)
  WHERE status = ANY (ARRAY['completed', 'failed', 'cancelled']);
CREATE INDEX ON {t} (visible_after) WHERE status = 'queued' AND attempts > 0;
CREATE INDEX ON {t} (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX ON {t} (queue, priority) WHERE status = 'waiting';
CREATE INDEX ON {t} (workflow_id) WHERE workflow_id IS NOT NULL;
CREATE INDEX ON {t} (queue, priority, concurrency_key, created_at, id)
  WHERE status = 'queued' AND concurrency_key IS NOT NULL;
CREATE UNIQUE INDEX ON {t} (idempotency_key) WHERE idempotency_key IS NOT NULL
"""
CLAIM = """
CREATE INDEX ON {t} (queue, priority, created_at, id)
  WHERE status = 'queued' AND concurrency_key IS NULL;
CREATE INDEX ON {t} (type, queue, priority, created_at, id)
  WHERE status = 'queued' AND concurrency_key IS NULL
"""


def wide(conn: psycopg.Connection[Any], schema: str, name: str, *extra: str) -> str:
    table = f"{schema}.{name}"
    conn.execute(
        f"CREATE TABLE {table} (LIKE pgqueue.tasks INCLUDING DEFAULTS) WITH (fillfactor = 90)"
    )
    conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
    for sql in extra:
        conn.execute(sql.format(t=table, s=schema))
    return f"INSERT INTO {table} (id, queue, type, payload) VALUES (gen_random_uuid(), "  \
        f"'default', 'bench.noop', '{PAYLOAD}')"  # fmt: skip


def variants(conn: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    conn.execute(
        f"CREATE TABLE {schema}.bare (id uuid PRIMARY KEY, payload jsonb NOT NULL,"
        " priority smallint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    )
    simple = (
        "INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts,"
        " backoff_base, backoff_factor, backoff_cap, visible_after, created_at, policy_default)"
        " SELECT gen_random_uuid(), coalesce(NULL::text, d.queue, 'default'), 'bench.noop',"
        f" '{PAYLOAD}'::jsonb, coalesce(NULL::smallint, d.priority, 1::smallint),"
        " coalesce(d.max_attempts, 3), coalesce(d.backoff_base, 1), coalesce(d.backoff_factor,"
        " 2), coalesce(d.backoff_cap, 300), now(), now(), CASE WHEN d.type IS NULL THEN true"
        " END FROM (SELECT) AS one LEFT JOIN pgqueue.task_types AS d ON d.type = 'bench.noop'"
        " RETURNING created_at, max_attempts, queue, priority,"
        " CASE WHEN true THEN pg_notify('pgqueue', queue) END INTO r"
    )
    return {
        "bare": f"INSERT INTO {schema}.bare (id, payload, priority)"
        f" VALUES (gen_random_uuid(), '{PAYLOAD}', 1)",
        "wide": wide(conn, schema, "wide"),
        "checks": wide(conn, schema, "checks", CHECKS),
        "checks_cheap": wide(conn, schema, "checks_cheap", CHECKS_CHEAP),
        "domains": wide(conn, schema, "domains", DOMAINS),
        "partials": wide(conn, schema, "partials", PARTIALS),
        "claim": wide(conn, schema, "claim", CHECKS, CLAIM),
        "tasks": "INSERT INTO pgqueue.tasks (id, queue, type, payload) VALUES"
        f" (gen_random_uuid(), 'default', 'bench.noop', '{PAYLOAD}')",
        "task_insert_simple": simple,
    }


def on_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.insert_cpu", description=__doc__)
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--rows", type=int, default=2000, help="rows per block")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    from pgqueue import migrate

    name = f"pgqueue_insert_cpu_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(args.database_url, dbname=name)
    try:
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA cpu")
            sqls = variants(conn, "cpu")
            row = conn.execute("SELECT pg_backend_pid(), version()").fetchone()
            assert row is not None
            pid, version = row
            times: dict[str, list[float]] = {k: [] for k in sqls}
            for rnd in range(args.rounds + 1):  # the first round warms up, uncounted
                for key in sqls if rnd % 2 == 0 else list(sqls)[::-1]:
                    before = on_cpu_ns(pid)
                    conn.execute(
                        f"DO $$ DECLARE r record; BEGIN FOR i IN 1..{args.rows} LOOP"
                        f" {sqls[key]}; END LOOP; END $$"
                    )
                    if rnd:
                        times[key].append((on_cpu_ns(pid) - before) / args.rows / 1000)
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"{version.split(' on ')[0]}; {args.rows:,} rows a block, {args.rounds} rounds")
    print()
    print("| variant | backend on-CPU µs per row, median | min-max |")
    print("|---|---|---|")
    for key, values in times.items():
        print(f"| {key} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
