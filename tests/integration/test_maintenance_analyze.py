"""Maintenance refreshes the table's statistics after a burst, so the claim keeps walking the
index: with statistics from when the table was small, the planner read and sorted the whole
backlog on every claim (measured: 8,000 instead of 23,000 tasks/s on a 100,000-task drain).
The claim's current shape walks the index even on stale statistics, but other statements'
plans (pruning, promotion, listing) still depend on them."""

from __future__ import annotations

import asyncio

import psycopg

import pgqueue
from pgqueue.queries import claiming, driver
from pgqueue.worker.maintenance import Maintenance


def analyze_count(conn) -> int:
    row = conn.execute(
        "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables"
        " WHERE relid = 'pgqueue.tasks'::regclass"
    ).fetchone()
    return int(row[0])


def claim_plan(conn) -> str:
    """The plan a worker gets: its statements are prepared, and PostgreSQL soon settles on a
    generic plan for them, chosen from the statistics alone."""
    sql = driver.statements()["task_claim"]
    # The worker's claim, its parameters as claiming.task_claim builds them.
    query = next(claiming.task_claim(queues=["default"], limit=100, owner="w", lease_seconds=30))
    assert isinstance(query, driver.Query)
    params = query.params
    conn.execute("BEGIN")
    try:
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        with conn.cursor() as cur:
            cur.execute("EXPLAIN (COSTS OFF) " + sql, params, prepare=True)
            rows = cur.fetchall()
    finally:
        conn.execute("ROLLBACK")
    return "\n".join(r[0] for r in rows)


def run_analyze_once(database_url: str) -> int:
    async def go() -> int:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            return await Maintenance().analyze_once(aconn)

    return asyncio.run(go())


def test_a_burst_onto_a_never_analyzed_table_is_analyzed_once_and_the_claim_uses_the_index(
    database_url, conn
):
    # A new installation: the table has never been analyzed when the first burst arrives.
    conn.execute(
        "INSERT INTO pgqueue.tasks (id, queue, type, payload)"
        " SELECT gen_random_uuid(), 'default', 't', jsonb_build_object('data', repeat('x', 100))"
        "   FROM generate_series(1, 100000)"
    )
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the flush happens at the end of this transaction
    before = analyze_count(conn)
    row = conn.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'pgqueue.tasks'::regclass"
    ).fetchone()
    assert row is not None and row[0] < 1000, "the planner's statistics are not stale: no test"

    assert run_analyze_once(database_url) >= 100000

    assert analyze_count(conn) == before + 1
    plan = claim_plan(conn)
    assert "Index Scan using tasks_claim_idx" in plan, plan
    assert "Sort Key: tasks.priority" not in plan, plan
    assert run_analyze_once(database_url) == 0  # fresh statistics: nothing to do
    assert analyze_count(conn) == before + 1


def test_a_few_changes_do_not_trigger_an_analyze(database_url, conn):
    conn.execute("ANALYZE pgqueue.tasks")
    pgqueue.enqueue_many(conn, [{"type": "t"}] * 50)
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    before = analyze_count(conn)

    assert run_analyze_once(database_url) == 0
    assert analyze_count(conn) == before
