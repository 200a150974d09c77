"""enqueue_columns, the columnar bulk enqueue: the same rows as enqueue_many of the same tasks,
ids in the order given, claimable in that order, every payload checked before anything is
written, all in the caller's transaction."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

import pgqueue
import pgqueue.aio
from pgqueue import RetryPolicy
from pgqueue.queries import driver, task_types
from pgqueue.registry import TaskRegistry

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
COLUMNS = (
    "queue, type, payload, priority, status, attempts, max_attempts, backoff_base,"
    " backoff_factor, backoff_cap, visible_after, created_at, policy_default, expires_at,"
    " idempotency_key, trace_context"
)


def stored(conn: Any, ids: list[Any]) -> list[tuple[Any, ...]]:
    return [
        conn.execute(f"SELECT {COLUMNS} FROM pgqueue.tasks WHERE id = %s", (i,)).fetchone()
        for i in ids
    ]


def count_tasks(conn: Any) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0]


def declare_types(conn: Any) -> None:
    tasks = TaskRegistry()

    @tasks.handler("declared", retry=RetryPolicy(max_attempts=5, base=2, factor=3, cap=60))
    def declared(payload, ctx):
        return None

    driver.run(conn, task_types.task_types_declare("w1", tasks.declarations()))


OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "queue and priority": {"queue": "q", "priority": "high"},
    "delay and expiry": {"delay": 90, "expires_in": 3600},
    "run_at": {"run_at": T0 + timedelta(days=1), "expires_at": T0 + timedelta(days=2)},
    "retry": {"max_attempts": 7, "retry": RetryPolicy(max_attempts=4, base=0.5)},
}


@pytest.mark.parametrize("type", ["plain", "declared"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_it_stores_the_rows_enqueue_many_stores_for_the_same_tasks(conn, type, name):
    declare_types(conn)
    options = OPTIONS[name]
    payloads = [{"n": i, "s": "é"} for i in range(3)] + [None]

    ids = pgqueue.enqueue_columns(conn, type, payloads, now=T0, **options)
    many = pgqueue.enqueue_many(
        conn, [{"type": type, "payload": p, **options} for p in payloads], now=T0
    )

    assert stored(conn, ids) == stored(conn, [r.id for r in many])
    assert [row[2] for row in stored(conn, ids)] == [*payloads[:3], {}]


def test_ids_come_back_in_order_and_the_tasks_are_claimed_in_that_order(conn):
    ids = pgqueue.enqueue_columns(conn, "t", [{"i": i} for i in range(300)], now=T0)

    assert len(ids) == len(set(ids)) == 300 and ids == sorted(ids)
    claimed = pgqueue.claim(conn, ["default"], limit=300, worker_id="w", now=T0)
    assert [t.id for t in claimed] == ids
    assert [t.payload["i"] for t in claimed] == list(range(300))


def test_a_rollback_leaves_none_of_the_batch(database_url, conn):
    with psycopg.connect(database_url) as tx:
        assert len(pgqueue.enqueue_columns(tx, "t", [{"i": i} for i in range(50)])) == 50
        tx.rollback()
        assert count_tasks(conn) == 0
        pgqueue.enqueue_columns(tx, "t", [{"i": 1}])
        tx.commit()
    assert count_tasks(conn) == 1


BAD = {
    "not an object": ([{"a": 1}, [1], {"b": 2}], pgqueue.InvalidPayload),
    "too large": ([{"a": 1}, {"x": "y" * 2_000_000}], pgqueue.PayloadTooLarge),
    "not JSON": ([{"a": {1, 2}}], pgqueue.InvalidPayload),
    "NUL": ([{"a": "\x00"}], pgqueue.InvalidPayload),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_payload_is_refused_with_enqueue_many_s_error_and_nothing_written(
    database_url, conn, name
):
    payloads, error = BAD[name]
    with pytest.raises(error) as many:
        pgqueue.enqueue_many(conn, [{"type": "t", "payload": p} for p in payloads])
    with psycopg.connect(database_url) as tx:
        tx.execute("SELECT 1")  # in a transaction of its own: it stays usable
        with pytest.raises(error) as columns:
            pgqueue.enqueue_columns(tx, "t", payloads)
        assert str(columns.value) == str(many.value)
        assert tx.info.transaction_status is TransactionStatus.INTRANS
        tx.execute("SELECT 1")
    assert count_tasks(conn) == 0


@pytest.mark.parametrize(
    ("args", "options", "error", "field"),
    [
        (("", [{}]), {}, pgqueue.ValidationError, "type"),
        (("t", [{}]), {"queue": "a\x00"}, pgqueue.ValidationError, "queue"),
        (("t", [{}]), {"priority": "urgent"}, pgqueue.InvalidPriority, "priority"),
        (("t", [{}]), {"delay": -1}, pgqueue.ValidationError, "delay"),
        (("t", [{}]), {"run_at": T0, "delay": 1}, pgqueue.ValidationError, "run_at"),
        (("t", [{}]), {"max_attempts": 0}, pgqueue.ValidationError, "max_attempts"),
        (("t", {"a": 1}), {}, pgqueue.ValidationError, "payloads"),
        (("t", "abc"), {}, pgqueue.ValidationError, "payloads"),
        (("t", 5), {}, pgqueue.ValidationError, "payloads"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(conn, args, options, error, field):
    with pytest.raises(error) as info:
        pgqueue.enqueue_columns(conn, *args, **options)
    assert info.value.field == field
    assert count_tasks(conn) == 0


def test_no_payloads_writes_nothing_and_returns_no_ids(conn):
    assert pgqueue.enqueue_columns(conn, "t", []) == []
    assert pgqueue.enqueue_columns(conn, "t", iter([])) == []
    assert count_tasks(conn) == 0


def test_async_columns_insert_in_the_callers_transaction(database_url, conn):
    async def scenario() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            assert len(await pgqueue.aio.enqueue_columns(aconn, "a", [{}] * 3)) == 3
            await aconn.rollback()
            kept = await pgqueue.aio.enqueue_columns(aconn, "b", ({"i": i} for i in range(4)))
            await aconn.commit()
            return kept

    kept = asyncio.run(scenario())

    assert [pgqueue.get_task(conn, i).payload for i in kept] == [{"i": i} for i in range(4)]
    assert count_tasks(conn) == 4


def test_the_client_enqueues_columns_and_commits(database_url, conn):
    with pgqueue.Client(database_url) as client:
        ids = client.enqueue_columns("t", [{"i": 1}, {"i": 2}])
    assert [pgqueue.get_task(conn, i).payload for i in ids] == [{"i": 1}, {"i": 2}]
