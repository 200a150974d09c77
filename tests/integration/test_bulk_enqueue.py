"""Bulk enqueue streams keyless tasks with binary COPY and keyed ones with INSERT ... ON
CONFLICT; whichever way a task goes in, what enqueue_many returns is exactly what is stored,
the batch keeps its order, and it is all-or-nothing even on an autocommit connection."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
import pgqueue.aio

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_returned_tasks_equal_the_stored_rows_for_copied_and_keyed_tasks(conn):
    items = [
        {"type": "plain", "payload": {"n": 0, "nested": {"a": [1, 2.5, None, "é"]}}},
        {"type": "keyed", "payload": {"n": 1}, "idempotency_key": "k1", "priority": "high"},
        {"type": "plain", "payload": {"n": 2}, "queue": "other", "max_attempts": 7},
        {"type": "delayed", "payload": {"n": 3}, "delay": 90},
        {"type": "at", "payload": {"n": 4}, "run_at": T0 + timedelta(days=1)},
        {"type": "keyed", "payload": {"n": 5}, "idempotency_key": "k2", "delay": 5},
    ]
    results = pgqueue.enqueue_many(conn, items, now=T0)

    assert [r.task.payload["n"] for r in results] == [0, 1, 2, 3, 4, 5]
    assert all(r.created for r in results)
    for r in results:
        assert pgqueue.get_task(conn, r.id) == r.task
    assert results[0].task.created_at == T0
    assert results[3].task.visible_after == T0 + timedelta(seconds=90)
    assert results[4].task.visible_after == T0 + timedelta(days=1)
    assert results[5].task.visible_after == T0 + timedelta(seconds=5)
    assert results[2].task.max_attempts == 7


def test_copied_tasks_are_claimed_in_the_order_given(conn):
    pgqueue.enqueue_many(conn, [{"type": "t", "payload": {"i": i}} for i in range(300)], now=T0)

    claimed = pgqueue.claim(conn, ["default"], limit=300, worker_id="w", now=T0)

    assert [t.payload["i"] for t in claimed] == list(range(300))


def test_a_batch_that_fails_part_way_leaves_nothing_even_on_an_autocommit_connection(conn):
    # The keyless tasks are copied first; the keyed insert then fails. The batch must not be
    # half-stored, although each statement would commit on its own on this connection.
    conn.execute(
        """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.type = 'boom' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$;
           CREATE TRIGGER refuse BEFORE INSERT ON pgqueue.tasks
           FOR EACH ROW EXECUTE FUNCTION refuse();"""
    )
    batch = [{"type": "fine"}, {"type": "boom", "idempotency_key": "k"}]

    with pytest.raises(psycopg.errors.RaiseException):
        pgqueue.enqueue_many(conn, batch)

    assert conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0] == 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_async_bulk_enqueue_copies_in_the_callers_transaction(database_url, conn):
    async def scenario() -> list[pgqueue.Task]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            rolled_back = await pgqueue.aio.enqueue_many(aconn, [{"type": "a"}] * 3)
            assert len(rolled_back) == 3
            await aconn.rollback()
            kept = await pgqueue.aio.enqueue_many(
                aconn, [{"type": "b", "payload": {"i": i}} for i in range(4)]
            )
            await aconn.commit()
            return [r.task for r in kept]

    kept = asyncio.run(scenario())

    stored = pgqueue.list_tasks(conn)
    assert {t.id for t in stored} == {t.id for t in kept}
    for t in kept:
        assert pgqueue.get_task(conn, t.id) == t
