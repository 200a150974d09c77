"""Submitting a task with a concurrency key, through every way the library submits one, and
reading the key back: stored in ``pgqueue.tasks.concurrency_key``, on the Task an enqueue
returns, on ``get_task``/``list_tasks``, on the claimed task and on the handler's context.

A task without a key stores NULL (it is claimed in plain order); a bad key is refused before
anything is written, naming the field.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until
from psycopg.pq import TransactionStatus

import pgqueue
import pgqueue.aio
from pgqueue.registry import TaskRegistry


def stored_keys(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[str | None]:
    """The concurrency_key column of these tasks, in the order of ``ids``."""
    rows = dict(
        conn.execute(
            "SELECT id, concurrency_key FROM pgqueue.tasks WHERE id = ANY(%s)", [ids]
        ).fetchall()
    )
    assert set(rows) == set(ids), "some task was not written"
    return [rows[i] for i in ids]


def claimed_keys(conn: psycopg.Connection[Any], queue: str, count: int) -> dict[uuid.UUID, Any]:
    """What a claim of ``queue`` hands a worker: each task's concurrency key, by id."""
    claimed = pgqueue.claim(conn, [queue], limit=count, worker_id="w")
    return {t.id: t.concurrency_key for t in claimed}


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


# --- one task ----------------------------------------------------------------------------------


def test_enqueue_stores_the_key_and_every_read_returns_it(conn):
    result = pgqueue.enqueue(conn, "report", {"n": 1}, queue="q", concurrency_key="acct-42")

    assert result.task.concurrency_key == "acct-42"
    assert stored_keys(conn, [result.id]) == ["acct-42"]
    assert pgqueue.get_task(conn, result.id).concurrency_key == "acct-42"
    [listed] = pgqueue.list_tasks(conn, queue="q")
    assert listed.concurrency_key == "acct-42"
    assert pgqueue.get_task(conn, result.id).to_dict()["concurrency_key"] == "acct-42"
    assert claimed_keys(conn, "q", 1) == {result.id: "acct-42"}


def test_enqueue_without_a_key_stores_null_and_reads_back_none(conn):
    result = pgqueue.enqueue(conn, "report", {"n": 1}, queue="q")

    assert result.task.concurrency_key is None
    assert stored_keys(conn, [result.id]) == [None]
    assert pgqueue.get_task(conn, result.id).concurrency_key is None
    assert claimed_keys(conn, "q", 1) == {result.id: None}


def test_the_key_is_stored_verbatim_in_bytes_and_case(conn):
    keys = ["Acct-42", "acct-42", " padded ", "\U0001f389" * 200, "k" * 200]
    ids = [pgqueue.enqueue(conn, "t", concurrency_key=k).id for k in keys]

    assert stored_keys(conn, ids) == keys
    assert [pgqueue.get_task(conn, i).concurrency_key for i in ids] == keys


def test_an_idempotent_enqueue_stores_the_key_and_a_repeat_returns_it(conn):
    first = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")
    again = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")

    assert (first.created, again.created) == (True, False)
    assert first.task.concurrency_key == again.task.concurrency_key == "acct-1"
    assert stored_keys(conn, [first.id]) == ["acct-1"]


# --- many tasks --------------------------------------------------------------------------------


def test_enqueue_many_of_prepared_tasks_stores_each_ones_key(conn):
    specs = [
        pgqueue.prepare("t", {"i": 0}, queue="bulk", concurrency_key="a"),
        pgqueue.prepare("t", {"i": 1}, queue="bulk"),
        pgqueue.prepare("t", {"i": 2}, queue="bulk", concurrency_key="b"),
    ]

    results = pgqueue.enqueue_many(conn, specs)

    ids = [r.id for r in results]
    assert [r.task.concurrency_key for r in results] == ["a", None, "b"]
    assert stored_keys(conn, ids) == ["a", None, "b"]
    assert claimed_keys(conn, "bulk", 3) == dict(zip(ids, ["a", None, "b"], strict=True))


def test_enqueue_many_of_dicts_stores_their_keys_whatever_other_options_they_have(conn):
    items: list[dict[str, Any]] = [
        {"type": "t", "payload": {"i": 0}, "concurrency_key": "a"},
        {"type": "t", "payload": {"i": 1}},
        {"type": "t", "concurrency_key": "b", "max_attempts": 5},
        {"type": "t", "concurrency_key": None, "queue": "default"},
    ]

    results = pgqueue.enqueue_many(conn, items)

    assert [r.task.concurrency_key for r in results] == ["a", None, "b", None]
    assert stored_keys(conn, [r.id for r in results]) == ["a", None, "b", None]
    assert pgqueue.get_task(conn, results[2].id).max_attempts == 5


def test_a_batch_without_keys_stores_null_keys(conn):
    results = pgqueue.enqueue_many(conn, [{"type": "t"}, pgqueue.prepare("t")])

    assert stored_keys(conn, [r.id for r in results]) == [None, None]


def test_enqueue_many_with_idempotency_keys_stores_the_concurrency_keys(conn):
    results = pgqueue.enqueue_many(
        conn,
        [
            pgqueue.prepare("t", idempotency_key="k1", concurrency_key="a"),
            pgqueue.prepare("t", idempotency_key="k2"),
            pgqueue.prepare("t", concurrency_key="c"),  # no idempotency key: by COPY
        ],
    )
    again = pgqueue.enqueue_many(conn, [pgqueue.prepare("t", idempotency_key="k1")])

    assert [r.task.concurrency_key for r in results] == ["a", None, "c"]
    assert stored_keys(conn, [r.id for r in results]) == ["a", None, "c"]
    assert (again[0].created, again[0].task.concurrency_key) == (False, "a")


def test_enqueue_columns_gives_every_task_the_one_key(conn):
    ids = pgqueue.enqueue_columns(conn, "t", [{"i": 0}, {"i": 1}], concurrency_key="acct-7")

    assert stored_keys(conn, ids) == ["acct-7", "acct-7"]


def test_enqueue_columns_gives_each_task_its_key_from_the_column(conn):
    ids = pgqueue.enqueue_columns(
        conn, "t", [{"i": 0}, {"i": 1}, None], queue="cols", concurrency_keys=["a", None, "c"]
    )

    assert stored_keys(conn, ids) == ["a", None, "c"]
    assert claimed_keys(conn, "cols", 3) == dict(zip(ids, ["a", None, "c"], strict=True))


def test_enqueue_columns_without_keys_stores_null_keys(conn):
    ids = pgqueue.enqueue_columns(conn, "t", [{"i": 0}, {"i": 1}])

    assert stored_keys(conn, ids) == [None, None]


# --- tasks with parents ------------------------------------------------------------------------


def test_a_task_with_parents_keeps_its_key_while_waiting_and_once_released(conn):
    parent = pgqueue.enqueue(conn, "parent", queue="p")
    child = pgqueue.enqueue(
        conn, "child", queue="c", depends_on=[parent.id], concurrency_key="acct-3"
    )

    assert child.task.status is pgqueue.TaskStatus.WAITING
    assert child.task.concurrency_key == "acct-3"
    assert stored_keys(conn, [child.id]) == ["acct-3"]
    [claimed] = pgqueue.claim(conn, ["p"], limit=1, worker_id="w")
    pgqueue.complete(conn, claimed.lease, None)
    assert claimed_keys(conn, "c", 1) == {child.id: "acct-3"}


def test_a_batch_with_parents_stores_each_tasks_key(conn):
    root = pgqueue.prepare("root", concurrency_key="a")
    leaf = pgqueue.prepare("leaf", depends_on=[root], concurrency_key="b")
    plain = pgqueue.prepare("leaf", depends_on=[root])

    results = pgqueue.enqueue_many(conn, [root, leaf, plain])

    assert [r.task.concurrency_key for r in results] == ["a", "b", None]
    assert stored_keys(conn, [r.id for r in results]) == ["a", "b", None]


def test_a_workflow_step_by_type_name_carries_its_key(conn):
    flow = pgqueue.chain(
        pgqueue.step("fetch", {"url": "u"}, concurrency_key="acct-1"),
        pgqueue.step("store"),
    )

    handle = flow.enqueue(conn)

    ids = [t.id for t in handle.tasks]
    assert stored_keys(conn, ids) == ["acct-1", None]
    assert [t.task.concurrency_key for t in pgqueue.workflow(conn, handle.id).tasks] == [
        "acct-1",
        None,
    ]


# --- the async forms and the Client ------------------------------------------------------------


def test_the_async_forms_store_the_key(database_url, conn):
    async def submit() -> list[uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            one = await pgqueue.aio.enqueue(aconn, "t", concurrency_key="a")
            many = await pgqueue.aio.enqueue_many(
                aconn, [{"type": "t", "concurrency_key": "b"}, pgqueue.prepare("t")]
            )
            columns = await pgqueue.aio.enqueue_columns(aconn, "t", [{}], concurrency_keys=["c"])
            got = await pgqueue.aio.get_task(aconn, one.id)
            assert got.concurrency_key == "a"
            return [one.id, *(r.id for r in many), *columns]

    ids = asyncio.run(submit())

    assert stored_keys(conn, ids) == ["a", "b", None, "c"]


def test_the_client_stores_the_key_and_reads_it_back(database_url, conn):
    with pgqueue.Client(database_url) as client:
        one = client.enqueue("t", {}, concurrency_key="a")
        columns = client.enqueue_columns("t", [{}], concurrency_key="b")
        assert client.get_task(one.id).concurrency_key == "a"

    assert stored_keys(conn, [one.id, *columns]) == ["a", "b"]


# --- the handler's context ---------------------------------------------------------------------


def test_the_handler_sees_its_tasks_key_on_its_context(database_url, conn):
    tasks = TaskRegistry()
    seen: dict[str, str | None] = {}
    lock = threading.Lock()

    @tasks.handler("keyed")
    def keyed(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        with lock:
            seen[payload["name"]] = ctx.concurrency_key

    pgqueue.enqueue(conn, "keyed", {"name": "with"}, concurrency_key="acct-5")
    pgqueue.enqueue(conn, "keyed", {"name": "without"})

    run_worker_until(database_url, tasks, lambda: len(seen) == 2)

    assert seen == {"with": "acct-5", "without": None}


# --- an idempotency key reused with key_reuse="refuse" -------------------------------------------


def test_refuse_returns_the_original_for_the_same_key_or_none_given(conn):
    first = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")

    same = pgqueue.enqueue(
        conn, "t", idempotency_key="order-1", concurrency_key="acct-1", key_reuse="refuse"
    )
    unsaid = pgqueue.enqueue(conn, "t", idempotency_key="order-1", key_reuse="refuse")

    assert (same.created, same.id) == (False, first.id)
    assert (unsaid.created, unsaid.id) == (False, first.id)


def test_refuse_names_the_concurrency_key_when_another_tenant_reuses_an_idempotency_key(conn):
    first = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")
    unkeyed = pgqueue.enqueue(conn, "t", idempotency_key="order-2")

    with pytest.raises(pgqueue.IdempotencyConflict) as other:
        pgqueue.enqueue(
            conn, "t", idempotency_key="order-1", concurrency_key="acct-2", key_reuse="refuse"
        )
    with pytest.raises(pgqueue.IdempotencyConflict) as added:
        pgqueue.enqueue(
            conn, "t", idempotency_key="order-2", concurrency_key="acct-2", key_reuse="refuse"
        )

    assert (other.value.task_id, other.value.differing_fields) == (first.id, ("concurrency_key",))
    assert other.value.original_concurrency_key == "acct-1"
    assert "concurrency key 'acct-1'" in str(other.value)
    assert (added.value.task_id, added.value.differing_fields) == (unkeyed.id, ("concurrency_key",))
    assert count_tasks(conn) == 2


def test_refuse_in_a_batch_names_the_item_whose_concurrency_key_differs(conn):
    pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")

    with pytest.raises(pgqueue.IdempotencyConflict) as info:
        pgqueue.enqueue_many(
            conn,
            [
                pgqueue.prepare("t", idempotency_key="order-9", concurrency_key="acct-1"),
                pgqueue.prepare("t", idempotency_key="order-1", concurrency_key="acct-2"),
            ],
            key_reuse="refuse",
        )

    assert (info.value.index, info.value.differing_fields) == (1, ("concurrency_key",))
    assert count_tasks(conn) == 1


def test_the_default_key_reuse_returns_the_original_whatever_the_key(conn):
    first = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-1")

    again = pgqueue.enqueue(conn, "t", idempotency_key="order-1", concurrency_key="acct-2")

    assert (again.created, again.id, again.task.concurrency_key) == (False, first.id, "acct-1")


# --- bad keys, refused before anything is written -------------------------------------------------

BAD_KEYS: dict[str, tuple[Any, str]] = {
    "int": (42, "must be a string, not int"),
    "empty": ("", "must not be empty"),
    "blank": ("   ", "must not be empty"),
    "201 characters": ("k" * 201, "is 201 characters long; the limit is 200"),
    "NUL": ("acct\x00-1", "must not contain NUL characters"),
    "lone surrogate": ("acct\udcff", "must be valid Unicode (it has a lone surrogate)"),
}


@pytest.fixture
def tx(connect):
    """A connection in a transaction: a refused call must leave it usable and idle."""
    return connect(autocommit=False)


def submits(key: Any) -> dict[str, Any]:
    """Every library surface that takes a concurrency key, each submitting ``key``."""
    return {
        "enqueue": lambda c: pgqueue.enqueue(c, "t", concurrency_key=key),
        "enqueue idempotent": lambda c: pgqueue.enqueue(
            c, "t", idempotency_key="i", concurrency_key=key
        ),
        "prepare": lambda c: pgqueue.prepare("t", concurrency_key=key),
        "enqueue_many dict": lambda c: pgqueue.enqueue_many(
            c, [{"type": "t"}, {"type": "t", "concurrency_key": key}]
        ),
        "enqueue_many dict with options": lambda c: pgqueue.enqueue_many(
            c, [{"type": "t", "concurrency_key": key, "delay": 1}]
        ),
        "enqueue_columns": lambda c: pgqueue.enqueue_columns(c, "t", [{}], concurrency_key=key),
        "depends_on": lambda c: pgqueue.enqueue(
            c, "t", depends_on=[uuid.uuid4()], concurrency_key=key
        ),
        "step": lambda c: pgqueue.step("t", concurrency_key=key),
    }


@pytest.mark.parametrize("bad", BAD_KEYS, ids=str)
def test_a_bad_key_is_refused_naming_the_field_at_every_library_submit(tx, conn, subtests, bad):
    value, reason = BAD_KEYS[bad]
    for surface, call in submits(value).items():
        with subtests.test(surface=surface):
            with pytest.raises(pgqueue.ValidationError) as info:
                call(tx)
            assert (info.value.field, info.value.reason) == ("concurrency_key", reason)
            assert tx.info.transaction_status is TransactionStatus.IDLE  # no SQL was sent
    assert count_tasks(conn) == 0


@pytest.mark.parametrize("bad", BAD_KEYS, ids=str)
def test_a_bad_key_in_the_column_is_refused_naming_its_position(tx, conn, bad):
    value, reason = BAD_KEYS[bad]

    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.enqueue_columns(tx, "t", [{}, {}, {}], concurrency_keys=["a", None, value])

    assert (info.value.field, info.value.reason) == ("concurrency_keys", f"item 2 {reason}")
    assert tx.info.transaction_status is TransactionStatus.IDLE
    assert count_tasks(conn) == 0


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"concurrency_keys": ["a"]}, "has 1 keys for 2 payloads"),
        ({"concurrency_keys": ["a", "b", "c"]}, "has 3 keys for 2 payloads"),
        ({"concurrency_keys": "ab"}, "must be a list of keys (str or None), not str"),
        (
            {"concurrency_keys": ["a", "b"], "concurrency_key": "a"},
            "give concurrency_key (one for all) or concurrency_keys (one each), not both",
        ),
    ],
)
def test_a_key_column_that_does_not_fit_the_payloads_is_refused(tx, conn, options, reason):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.enqueue_columns(tx, "t", [{}, {}], **options)

    assert (info.value.field, info.value.reason) == ("concurrency_keys", reason)
    assert count_tasks(conn) == 0


def test_a_bad_key_anywhere_in_a_batch_writes_none_of_it(conn):
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.enqueue_many(
            conn,
            [{"type": "t", "concurrency_key": "a"}] * 50 + [{"type": "t", "concurrency_key": ""}],
        )

    assert count_tasks(conn) == 0
