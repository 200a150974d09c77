"""Enqueue joins the caller's transaction: commit means the task exists, rollback means it
never existed, and idle workers are woken (pg_notify) only when the caller commits.

Covered for every connection kind pgqueue accepts: psycopg 3 sync and async connections, and
SQLAlchemy 2 sync and async sessions (psycopg dialect). Also: scheduled tasks, enqueue_many,
the Client convenience form, and a database without the pgqueue schema.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import pgqueue
import pgqueue.aio

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def count_tasks(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0]


def count_orders(conn) -> int:
    return conn.execute("SELECT count(*) FROM orders").fetchone()[0]


def sqlalchemy_url(database_url: str) -> str:
    return "postgresql+psycopg://" + database_url.split("://", 1)[1]


@pytest.fixture
def orders(conn):
    """An application table, to show the task commits or rolls back with the caller's rows."""
    conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")


@pytest.fixture
def listener(connect):
    """An autocommit connection listening on the channel pgqueue notifies."""
    listening = connect(autocommit=True, direct=True)
    listening.execute('LISTEN "pgqueue"')
    return listening


def notifications_before_marker(listener, conn) -> list[str]:
    """Payloads delivered on the pgqueue channel before a marker sent now by ``conn``.

    Notifications are delivered in commit order, so everything committed before the marker
    arrives before it; whatever is not received by then was never sent.
    """
    marker = f"marker-{uuid.uuid4().hex}"
    conn.execute("SELECT pg_notify('pgqueue', %s)", [marker])
    received = []
    for note in listener.notifies(timeout=10):
        assert note.channel == "pgqueue"
        if note.payload == marker:
            return received
        received.append(note.payload)
    pytest.fail("the marker notification did not arrive within 10 s")


# --- psycopg 3, sync -------------------------------------------------------------------------


def test_rolled_back_enqueue_leaves_no_task(connect, conn, orders):
    tx = connect(autocommit=False)
    tx.execute("INSERT INTO orders (id) VALUES (1)")
    result = pgqueue.enqueue(tx, "send_receipt", {"order_id": 1})
    assert result.created
    tx.rollback()

    assert count_tasks(conn) == 0
    assert count_orders(conn) == 0
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, result.id)


def test_committed_enqueue_exists_with_the_callers_rows(connect, conn, orders):
    tx = connect(autocommit=False)
    tx.execute("INSERT INTO orders (id) VALUES (1)")
    result = pgqueue.enqueue(tx, "send_receipt", {"order_id": 1}, priority="high", queue="mail")
    tx.commit()

    task = pgqueue.get_task(conn, result.id)
    assert task.status is pgqueue.TaskStatus.QUEUED
    assert (task.type, task.queue, task.payload) == ("send_receipt", "mail", {"order_id": 1})
    assert task.priority is pgqueue.Priority.HIGH
    assert count_orders(conn) == 1


def test_uncommitted_enqueue_is_invisible_to_other_connections(connect, conn):
    tx = connect(autocommit=False)
    result = pgqueue.enqueue(tx, "send_receipt", {"order_id": 1})
    # The caller's own transaction sees its task; nobody else does yet.
    assert pgqueue.get_task(tx, result.id).id == result.id
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, result.id)
    assert pgqueue.claim(conn, ["default"], limit=10, worker_id="w1") == []

    tx.commit()
    assert [t.id for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w1")] == [result.id]


def test_rolled_back_enqueue_frees_its_idempotency_key(connect, conn):
    tx = connect(autocommit=False)
    first = pgqueue.enqueue(tx, "charge", {"n": 1}, idempotency_key="order-1")
    tx.rollback()

    second = pgqueue.enqueue(conn, "charge", {"n": 2}, idempotency_key="order-1")
    assert second.created
    assert second.id != first.id
    assert pgqueue.get_task(conn, second.id).payload == {"n": 2}
    assert count_tasks(conn) == 1


# --- SQLAlchemy 2, sync ----------------------------------------------------------------------


def test_sqlalchemy_session_rollback_discards_the_task(database_url, conn, orders):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with Session(engine) as session:
            session.execute(text("INSERT INTO orders (id) VALUES (1)"))
            result = pgqueue.enqueue(session, "send_receipt", {"order_id": 1})
            assert result.created
            # Inside the session's transaction the task is there ...
            assert pgqueue.get_task(session, result.id).id == result.id
            session.rollback()
            # ... and after the rollback it never was.
            assert pgqueue.list_tasks(session) == []
    finally:
        engine.dispose()

    assert count_tasks(conn) == 0
    assert count_orders(conn) == 0


def test_sqlalchemy_session_commit_keeps_the_task(database_url, conn, orders):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with Session(engine) as session:
            session.execute(text("INSERT INTO orders (id) VALUES (1)"))
            result = pgqueue.enqueue(session, "send_receipt", {"order_id": 1})
            session.commit()
    finally:
        engine.dispose()

    assert pgqueue.get_task(conn, result.id).payload == {"order_id": 1}
    assert count_orders(conn) == 1


def test_sqlalchemy_scoped_session_commits_and_rolls_back_the_task(database_url, conn, orders):
    """A scoped_session (Flask-SQLAlchemy's ``db.session``) is the registry of the current
    thread's Session: pgqueue works in that Session's transaction."""
    engine = create_engine(sqlalchemy_url(database_url))
    session = scoped_session(sessionmaker(engine))
    try:
        session.execute(text("INSERT INTO orders (id) VALUES (1)"))
        discarded = pgqueue.enqueue(session, "send_receipt", {"order_id": 1})
        assert pgqueue.get_task(session, discarded.id).id == discarded.id
        session.rollback()

        session.execute(text("INSERT INTO orders (id) VALUES (2)"))
        kept = pgqueue.enqueue(session, "send_receipt", {"order_id": 2})
        session.commit()
        # After the commit the session can wait too (queued: no worker runs here).
        with pytest.raises(pgqueue.WaitTimeout):
            pgqueue.wait(session, kept.id, timeout=0.2)
    finally:
        session.remove()
        engine.dispose()

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]
    assert conn.execute("SELECT array_agg(id) FROM orders").fetchone()[0] == [2]


def test_sqlalchemy_connection_begin_block_commits_the_task(database_url, conn):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.begin() as sa_conn:
            kept = pgqueue.enqueue(sa_conn, "t", {"which": "kept"})
        with pytest.raises(RuntimeError, match="abort"), engine.begin() as sa_conn:
            discarded = pgqueue.enqueue(sa_conn, "t", {"which": "discarded"})
            raise RuntimeError("abort")
    finally:
        engine.dispose()

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, discarded.id)


def test_sqlalchemy_connection_commit_as_you_go_keeps_the_task(database_url, conn):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as sa_conn:
            kept = pgqueue.enqueue(sa_conn, "t", {"which": "kept"})
            sa_conn.commit()
    finally:
        engine.dispose()

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]


def test_sqlalchemy_connection_rollback_as_you_go_discards_the_task(database_url, conn):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as sa_conn:
            discarded = pgqueue.enqueue(sa_conn, "t", {"which": "discarded"})
            sa_conn.rollback()
            # Later work on the same connection commits; the rolled-back task must not.
            sa_conn.execute(text("SELECT 1"))
            sa_conn.commit()
    finally:
        engine.dispose()

    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, discarded.id)


def test_sqlalchemy_async_connection_commit_as_you_go_keeps_the_task(database_url, conn):
    async def scenario():
        engine = create_async_engine(sqlalchemy_url(database_url))
        try:
            async with engine.connect() as sa_conn:
                kept = await pgqueue.aio.enqueue(sa_conn, "t", {"which": "kept"})
                await sa_conn.commit()
            return kept
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]


def test_sqlalchemy_connection_rollback_discards_the_task(database_url, conn):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as sa_conn:
            sa_conn.execute(text("SELECT 1"))  # begins SQLAlchemy's transaction
            discarded = pgqueue.enqueue(sa_conn, "t", {"which": "discarded"})
            assert pgqueue.get_task(sa_conn, discarded.id).id == discarded.id
            sa_conn.rollback()
            assert pgqueue.list_tasks(sa_conn) == []
    finally:
        engine.dispose()

    assert count_tasks(conn) == 0


# --- SQLAlchemy 2, async ---------------------------------------------------------------------


def test_sqlalchemy_async_session_rollback_discards_and_commit_keeps(database_url, conn, orders):
    async def scenario():
        engine = create_async_engine(sqlalchemy_url(database_url))
        try:
            async with AsyncSession(engine) as session:
                await session.execute(text("INSERT INTO orders (id) VALUES (1)"))
                discarded = await pgqueue.aio.enqueue(session, "send_receipt", {"order_id": 1})
                assert discarded.created
                await session.rollback()
                assert await pgqueue.aio.list_tasks(session) == []

                await session.execute(text("INSERT INTO orders (id) VALUES (2)"))
                kept = await pgqueue.aio.enqueue(session, "send_receipt", {"order_id": 2})
                await session.commit()
            return discarded, kept
        finally:
            await engine.dispose()

    discarded, kept = asyncio.run(scenario())

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]
    assert pgqueue.get_task(conn, kept.id).payload == {"order_id": 2}
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, discarded.id)
    assert conn.execute("SELECT array_agg(id) FROM orders").fetchone()[0] == [2]


def test_sqlalchemy_async_scoped_session_commits_and_rolls_back_the_task(
    database_url, conn, orders
):
    async def scenario():
        engine = create_async_engine(sqlalchemy_url(database_url))
        session = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
        try:
            await session.execute(text("INSERT INTO orders (id) VALUES (1)"))
            discarded = await pgqueue.aio.enqueue(session, "send_receipt", {"order_id": 1})
            await session.rollback()

            await session.execute(text("INSERT INTO orders (id) VALUES (2)"))
            kept = await pgqueue.aio.enqueue(session, "send_receipt", {"order_id": 2})
            await session.commit()
            return discarded, kept
        finally:
            await session.remove()
            await engine.dispose()

    discarded, kept = asyncio.run(scenario())

    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, discarded.id)
    assert conn.execute("SELECT array_agg(id) FROM orders").fetchone()[0] == [2]


# --- psycopg 3, async ------------------------------------------------------------------------


def test_psycopg_async_connection_rollback_discards_and_commit_keeps(database_url, conn):
    async def scenario():
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            discarded = await pgqueue.aio.enqueue(aconn, "t", {"which": "discarded"})
            assert (await pgqueue.aio.get_task(aconn, discarded.id)).id == discarded.id
            await aconn.rollback()
            with pytest.raises(pgqueue.TaskNotFound):
                await pgqueue.aio.get_task(aconn, discarded.id)

            kept = await pgqueue.aio.enqueue(aconn, "t", {"which": "kept"})
            many = await pgqueue.aio.enqueue_many(aconn, [{"type": "t2"}, {"type": "t3"}])
            await aconn.commit()
            return discarded, kept, many

    discarded, kept, many = asyncio.run(scenario())

    assert {t.id for t in pgqueue.list_tasks(conn)} == {kept.id, many[0].id, many[1].id}
    assert pgqueue.get_task(conn, kept.id).payload == {"which": "kept"}
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, discarded.id)


# --- waking workers: pg_notify ---------------------------------------------------------------


def test_rolled_back_enqueue_sends_no_notification(connect, conn, listener):
    tx = connect(autocommit=False)
    pgqueue.enqueue(tx, "t", queue="emails")
    tx.rollback()

    assert notifications_before_marker(listener, conn) == []


def test_committed_enqueue_notifies_its_queue_name_at_commit(connect, conn, listener):
    tx = connect(autocommit=False)
    pgqueue.enqueue(tx, "t", queue="emails")
    # Not delivered while the transaction is open ...
    assert notifications_before_marker(listener, conn) == []
    tx.commit()
    # ... delivered once it commits, with the queue name as payload.
    assert notifications_before_marker(listener, conn) == ["emails"]


def test_enqueue_many_notifies_each_ready_queue_once_on_commit(connect, conn, listener):
    batch = [
        {"type": "t", "queue": "a"},
        {"type": "t", "queue": "b"},
        {"type": "t", "queue": "a"},
        {"type": "t", "queue": "later", "delay": 3600},
    ]
    tx = connect(autocommit=False)
    pgqueue.enqueue_many(tx, batch)
    tx.rollback()
    assert notifications_before_marker(listener, conn) == []

    pgqueue.enqueue_many(tx, batch)
    tx.commit()
    assert notifications_before_marker(listener, conn) == ["a", "b"]


def test_scheduled_enqueue_does_not_wake_workers(conn, listener):
    pgqueue.enqueue(conn, "t", queue="later", delay=3600)
    pgqueue.enqueue(conn, "t", queue="later", run_at=datetime.now(UTC) + timedelta(hours=1))

    assert notifications_before_marker(listener, conn) == []
    assert count_tasks(conn) == 2


# --- scheduled tasks -------------------------------------------------------------------------


def test_delayed_task_is_stored_invisible_until_its_delay_passes(conn):
    result = pgqueue.enqueue(conn, "t", delay=90, now=T0)

    task = pgqueue.get_task(conn, result.id)
    assert task.created_at == T0
    assert task.visible_after == T0 + timedelta(seconds=90)
    assert task.status is pgqueue.TaskStatus.QUEUED
    before = T0 + timedelta(seconds=89)
    assert pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=before) == []
    after = T0 + timedelta(seconds=90)
    claimed = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=after)
    assert [t.id for t in claimed] == [result.id]


def test_task_with_future_run_at_is_stored_with_that_visible_after(conn):
    run_at = T0 + timedelta(days=2, minutes=5)
    result = pgqueue.enqueue(conn, "t", run_at=run_at, now=T0)

    assert pgqueue.get_task(conn, result.id).visible_after == run_at
    just_before = run_at - timedelta(microseconds=1)
    assert pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=just_before) == []


def test_scheduled_task_on_the_real_clock_has_visible_after_in_the_future(connect, conn):
    tx = connect(autocommit=False)
    delayed = pgqueue.enqueue(tx, "t", delay=600)
    at = pgqueue.enqueue(tx, "t", run_at=datetime.now(UTC) + timedelta(hours=3))
    tx.commit()

    server_now = conn.execute("SELECT now()").fetchone()[0]
    delayed_task = pgqueue.get_task(conn, delayed.id)
    assert delayed_task.visible_after == delayed_task.created_at + timedelta(seconds=600)
    assert delayed_task.visible_after > server_now + timedelta(seconds=500)
    assert pgqueue.get_task(conn, at.id).visible_after > server_now + timedelta(hours=2)
    assert pgqueue.claim(conn, ["default"], limit=10, worker_id="w") == []


# --- enqueue_many ----------------------------------------------------------------------------


def test_enqueue_many_returns_results_in_the_order_given(conn):
    prepared = pgqueue.prepare("second", {"n": 2}, priority="low")
    items = [
        {"type": "first", "payload": {"n": 1}},
        prepared,
        {"type": "third", "payload": {"n": 3}, "queue": "other"},
        pgqueue.prepare("fourth", {"n": 4}),
    ]
    results = pgqueue.enqueue_many(conn, items)

    assert [r.task.type for r in results] == ["first", "second", "third", "fourth"]
    assert [r.task.payload for r in results] == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    assert all(r.created for r in results)
    assert results[1].id == prepared.id
    assert results[1].task.priority is pgqueue.Priority.LOW
    assert results[2].task.queue == "other"
    assert {t.id for t in pgqueue.list_tasks(conn)} == {r.id for r in results}


def test_enqueue_many_inserts_the_whole_batch_in_one_transaction(conn):
    # On an autocommit connection each statement is its own transaction with its own now():
    # one shared created_at proves the batch went in together.
    results = pgqueue.enqueue_many(conn, [{"type": "t", "payload": {"i": i}} for i in range(500)])

    assert len(results) == 500
    assert count_tasks(conn) == 500
    assert len({r.task.created_at for r in results}) == 1
    assert [r.task.payload["i"] for r in results] == list(range(500))


def test_enqueue_many_in_a_rolled_back_transaction_leaves_nothing(connect, conn):
    tx = connect(autocommit=False)
    results = pgqueue.enqueue_many(tx, [{"type": "t"} for _ in range(5)])
    assert len(results) == 5
    tx.rollback()

    assert count_tasks(conn) == 0


def test_enqueue_many_returns_existing_task_for_a_used_idempotency_key(conn):
    existing = pgqueue.enqueue(conn, "charge", {"v": "original"}, idempotency_key="k-old")

    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "a"},
            {"type": "charge", "payload": {"v": "again"}, "idempotency_key": "k-old"},
            {"type": "b", "idempotency_key": "k-new"},
        ],
    )

    assert [r.created for r in results] == [True, False, True]
    assert results[1].id == existing.id
    assert results[1].task.payload == {"v": "original"}
    assert results[2].task.idempotency_key == "k-new"
    assert count_tasks(conn) == 3


def test_enqueue_many_with_a_key_repeated_inside_the_batch_creates_one_task(conn):
    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "charge", "payload": {"n": 1}, "idempotency_key": "dup"},
            {"type": "other"},
            {"type": "charge", "payload": {"n": 2}, "idempotency_key": "dup"},
        ],
    )

    assert [r.created for r in results] == [True, True, False]
    assert results[0].id == results[2].id
    assert results[2].task.payload == {"n": 1}
    rows = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE idempotency_key = 'dup'"
    ).fetchone()
    assert rows[0] == 1
    assert count_tasks(conn) == 2


def test_enqueue_many_of_nothing_returns_nothing(conn):
    assert pgqueue.enqueue_many(conn, []) == []
    assert count_tasks(conn) == 0


# --- the Client convenience form -------------------------------------------------------------


def test_client_enqueue_commits_its_own_transaction(database_url, conn, listener):
    with pgqueue.Client(database_url) as client:
        one = client.enqueue("t", {"n": 1}, queue="client-q")
        many = client.enqueue_many([{"type": "t", "payload": {"n": 2}}])

    # Visible from an unrelated connection: the Client committed.
    assert pgqueue.get_task(conn, one.id).payload == {"n": 1}
    assert pgqueue.get_task(conn, many[0].id).payload == {"n": 2}
    assert notifications_before_marker(listener, conn) == ["client-q", "default"]


def test_client_on_a_database_without_schema_says_to_migrate(empty_database_url):
    client = pgqueue.Client(empty_database_url)
    try:
        with pytest.raises(pgqueue.SchemaNotReady, match="pgqueue migrate"):
            client.enqueue("t")
    finally:
        client.close()

    with psycopg.connect(empty_database_url, autocommit=True) as check:
        assert check.execute("SELECT to_regclass('pgqueue.tasks')").fetchone()[0] is None


# --- a database without the schema -----------------------------------------------------------

SCHEMALESS_CALLS = {
    "enqueue": lambda c: pgqueue.enqueue(c, "t"),
    "enqueue_many": lambda c: pgqueue.enqueue_many(c, [{"type": "t"}]),
    "get_task": lambda c: pgqueue.get_task(c, uuid.uuid4()),
    "list_tasks": lambda c: pgqueue.list_tasks(c),
    "cancel": lambda c: pgqueue.cancel(c, uuid.uuid4()),
    "claim": lambda c: pgqueue.claim(c, ["default"], limit=1, worker_id="w"),
    "queue_stats": lambda c: pgqueue.queue_stats(c),
}


def test_module_functions_on_a_database_without_schema_raise_schema_not_ready(
    empty_database_url, subtests
):
    with psycopg.connect(empty_database_url, autocommit=True) as bare:
        for name, call in SCHEMALESS_CALLS.items():
            with (
                subtests.test(call=name),
                pytest.raises(pgqueue.SchemaNotReady, match="pgqueue migrate"),
            ):
                call(bare)

    async def async_enqueue():
        async with await psycopg.AsyncConnection.connect(empty_database_url) as aconn:
            await pgqueue.aio.enqueue(aconn, "t")

    with (
        subtests.test(call="aio.enqueue"),
        pytest.raises(pgqueue.SchemaNotReady, match="pgqueue migrate"),
    ):
        asyncio.run(async_enqueue())
