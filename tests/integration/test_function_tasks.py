"""Tasks declared as Python functions, through the library.

``@tasks.task`` on a function with ordinary parameters: enqueued in the caller's transaction
with its arguments bound by name, checked before anything is written, with the declared
queue, priority and retry policy as defaults that per-call options override, and, once a
worker recorded the type, the same defaults and checks for a submit by type name.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import pgqueue
from pgqueue.queries import driver, task_types
from pgqueue.registry import TaskRegistry


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def declare(conn: psycopg.Connection[Any], tasks: TaskRegistry) -> None:
    """What a worker does at its start: record the registry in pgqueue.task_types."""
    driver.run(conn, task_types.task_types_declare("w1", tasks.declarations()))


def receipts() -> tuple[TaskRegistry, Any, Any]:
    tasks = TaskRegistry()

    @tasks.task(name="send_receipt", queue="mail", priority="high", max_attempts=7)
    def send_receipt(order_id: int, *, resend: bool = False) -> str:
        return f"receipt {order_id} {resend}"

    @tasks.task
    def undeclared(note: str | None = None) -> None:
        return None

    return tasks, send_receipt, undeclared


# --- declaring and enqueueing ------------------------------------------------------------------


def test_enqueue_binds_positional_and_keyword_arguments_by_parameter_name(conn):
    _, send_receipt, _ = receipts()

    handle = send_receipt.enqueue(conn, 42, resend=True)

    assert isinstance(handle, pgqueue.TaskHandle)
    assert (handle.type, handle.created) == ("send_receipt", True)
    task = pgqueue.get_task(conn, handle.id)
    assert task.payload == {"order_id": 42, "resend": True}
    assert handle.task.payload == task.payload
    # Left-out arguments with defaults are not stored: the function's default applies.
    assert pgqueue.get_task(conn, send_receipt.enqueue(conn, order_id=7).id).payload == {
        "order_id": 7
    }


def test_the_decorated_function_stays_callable_as_itself(conn):
    _, send_receipt, _ = receipts()

    assert send_receipt(5, resend=True) == "receipt 5 True"
    assert send_receipt.__name__ == "send_receipt"
    assert count_tasks(conn) == 0


def test_the_type_is_named_by_module_and_qualname_unless_given():
    _, send_receipt, undeclared = receipts()

    assert send_receipt.type == "send_receipt"
    assert undeclared.type == f"{__name__}.receipts.<locals>.undeclared"


def test_enqueue_joins_the_callers_transaction_and_a_rollback_leaves_nothing(database_url, conn):
    _, send_receipt, _ = receipts()
    with psycopg.connect(database_url) as tx:  # not autocommit: one transaction
        handle = send_receipt.enqueue(tx, 1)
        assert count_tasks(tx) == 1  # visible inside it...
        assert count_tasks(conn) == 0  # ...and to no one else before the commit
        tx.rollback()
    assert count_tasks(conn) == 0
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, handle.id)

    with psycopg.connect(database_url) as tx:
        kept = send_receipt.enqueue(tx, 2)
        tx.commit()
    assert pgqueue.get_task(conn, kept.id).payload == {"order_id": 2}


def test_enqueue_takes_a_sqlalchemy_session_and_its_rollback(database_url, conn):
    _, send_receipt, _ = receipts()
    engine = create_engine("postgresql+psycopg://" + database_url.split("://", 1)[1])
    try:
        with Session(engine) as session:
            send_receipt.enqueue(session, 1)
            session.rollback()
        with Session(engine) as session:
            kept = send_receipt.enqueue(session, 2)
            session.commit()
    finally:
        engine.dispose()
    assert [t.id for t in pgqueue.list_tasks(conn)] == [kept.id]


# --- arguments checked before anything is written ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "payload: argument 'order_id' is missing"),
        ((1,), {"foo": 2}, "payload: unexpected argument 'foo'"),
        (
            (datetime(2030, 1, 1, tzinfo=UTC),),
            {},
            "payload: argument 'order_id': datetime is not JSON",
        ),
        (("x",), {}, "payload: argument 'order_id' must be integer, not string"),
        ((1,), {"resend": "yes"}, "payload: argument 'resend' must be boolean, not string"),
        ((True,), {}, "payload: argument 'order_id' must be integer, not boolean"),
        ((1, 2), {}, "payload: send_receipt takes 1 positional argument but 2 were given"),
        ((1,), {"order_id": 1}, "payload: argument 'order_id' is given twice"),
        ((float("nan"),), {}, "payload: argument 'order_id': nan is not JSON"),
    ],
)
def test_a_bad_argument_is_named_and_nothing_is_inserted(conn, args, kwargs, message):
    _, send_receipt, _ = receipts()

    with pytest.raises(pgqueue.InvalidArgument) as caught:
        send_receipt.enqueue(conn, *args, **kwargs)

    assert str(caught.value) == message
    assert isinstance(caught.value, pgqueue.ValidationError)
    assert caught.value.field == "payload"
    assert count_tasks(conn) == 0


def test_a_bad_argument_deep_in_a_value_is_named_as_not_json(conn):
    tasks = TaskRegistry()

    @tasks.task(name="notify")
    def notify(to: list[str], extra: dict[str, Any] | None = None) -> None:
        return None

    with pytest.raises(pgqueue.InvalidArgument, match=r"argument 'extra': set is not JSON"):
        notify.enqueue(conn, ["a"], extra={"tags": {1, 2}})
    with pytest.raises(pgqueue.InvalidArgument, match=r"argument 'to' must be array, not object"):
        notify.enqueue(conn, {"a": 1})
    assert count_tasks(conn) == 0


def test_a_function_taking_star_args_is_refused_when_declared():
    tasks = TaskRegistry()

    with pytest.raises(pgqueue.ValidationError, match=r"\*items cannot be stored in a task"):

        @tasks.task(name="bad")
        def bad(*items: int) -> None:
            return None


def test_check_arguments_by_type_name_gives_the_error_the_function_gives(conn):
    tasks, send_receipt, _ = receipts()
    # No worker recorded the type yet: nothing is known, so anything goes.
    pgqueue.check_arguments(conn, "send_receipt", {"foo": 1})
    declare(conn, tasks)

    for payload in ({}, {"order_id": 1, "foo": 2}, {"order_id": "x"}):
        with pytest.raises(pgqueue.InvalidArgument) as direct:
            send_receipt.enqueue(conn, **payload)
        with pytest.raises(pgqueue.InvalidArgument) as by_name:
            pgqueue.check_arguments(conn, "send_receipt", payload)
        assert str(by_name.value) == str(direct.value)
        assert by_name.value.argument == direct.value.argument
    pgqueue.check_arguments(conn, "send_receipt", {"order_id": 1, "resend": True})
    # A handler(payload, ctx) type records no parameters: any payload.
    pgqueue.check_arguments(conn, "some_handler_type", {"anything": [1]})
    assert count_tasks(conn) == 0


# --- declared defaults, and per-call options over them ----------------------------------------


def test_declared_queue_priority_and_attempts_apply_and_per_call_options_win(conn):
    _, send_receipt, _ = receipts()

    declared = pgqueue.get_task(conn, send_receipt.enqueue(conn, 1).id)
    assert (declared.queue, declared.priority, declared.max_attempts) == (
        "mail",
        pgqueue.Priority.HIGH,
        7,
    )

    urgent = send_receipt.options(queue="urgent", priority="low", max_attempts=2)
    overridden = pgqueue.get_task(conn, urgent.enqueue(conn, 2).id)
    assert (overridden.queue, overridden.priority, overridden.max_attempts) == (
        "urgent",
        pgqueue.Priority.LOW,
        2,
    )
    # Field by field: only the queue given, the rest declared.
    partly = pgqueue.get_task(conn, send_receipt.options(queue="other").enqueue(conn, 3).id)
    assert (partly.queue, partly.priority, partly.max_attempts) == (
        "other",
        pgqueue.Priority.HIGH,
        7,
    )
    # The options object leaves the declaration alone.
    assert pgqueue.get_task(conn, send_receipt.enqueue(conn, 4).id).queue == "mail"


def test_options_can_carry_an_idempotency_key_and_a_delay(conn):
    _, send_receipt, _ = receipts()
    keyed = send_receipt.options(idempotency_key="order-1", delay=60)

    first = keyed.enqueue(conn, 1)
    again = keyed.enqueue(conn, 1)

    assert (first.created, again.created, again.id) == (True, False, first.id)
    task = pgqueue.get_task(conn, first.id)
    assert task.visible_after > task.created_at


def test_options_carry_an_expiry_and_refuse_a_mismatched_key_reuse(conn):
    """Every enqueue option reaches a function task through ``.options``: the expiry and
    key_reuse="refuse", which refuses a reused key with other arguments
    and hands back the original for the same ones."""
    _, send_receipt, _ = receipts()

    expiring = send_receipt.options(expires_in=60).enqueue(conn, 1)
    task = pgqueue.get_task(conn, expiring.id)
    assert task.expires_at is not None
    assert 59 <= (task.expires_at - task.created_at).total_seconds() <= 61

    strict = send_receipt.options(idempotency_key="order-9", key_reuse="refuse")
    first = strict.enqueue(conn, 9)
    assert strict.enqueue(conn, 9).id == first.id  # the same request again: the original
    with pytest.raises(pgqueue.IdempotencyConflict) as refused:
        strict.enqueue(conn, 10)
    assert refused.value.task_id == first.id and refused.value.differing_fields == ("payload",)
    with pytest.raises(pgqueue.IdempotencyConflict):
        strict.enqueue_many(conn, [{"order_id": 11}])
    assert count_tasks(conn) == 2
    with pytest.raises(pgqueue.ValidationError, match="key_reuse"):
        send_receipt.options(key_reuse="sometimes")


def test_a_submit_by_type_name_gets_what_a_worker_declared_and_its_own_options_win(conn):
    tasks, _, undeclared = receipts()
    # Before any worker declared the type: the global defaults.
    early = pgqueue.enqueue(conn, "send_receipt", {"order_id": 1}).task
    assert (early.queue, early.priority) == ("default", pgqueue.Priority.NORMAL)
    declare(conn, tasks)

    result = pgqueue.enqueue(conn, "send_receipt", {"order_id": 2})
    stored = pgqueue.get_task(conn, result.id)
    for task in (result.task, stored):  # the answer says what was stored
        assert (task.queue, task.priority, task.max_attempts) == ("mail", pgqueue.Priority.HIGH, 7)

    given = pgqueue.get_task(
        conn, pgqueue.enqueue(conn, "send_receipt", {"order_id": 3}, queue="q2", priority="low").id
    )
    assert (given.queue, given.priority) == ("q2", pgqueue.Priority.LOW)
    keyed = pgqueue.enqueue(conn, "send_receipt", {"order_id": 4}, idempotency_key="k").task
    assert (keyed.queue, keyed.priority) == ("mail", pgqueue.Priority.HIGH)
    # A type that declares no queue gets the default one.
    plain = pgqueue.enqueue(conn, undeclared.type, {}).task
    assert (plain.queue, plain.priority) == ("default", pgqueue.Priority.NORMAL)


def test_a_bulk_submit_by_type_name_applies_the_declared_queue_and_priority(conn):
    tasks, _, _ = receipts()
    declare(conn, tasks)

    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "send_receipt", "payload": {"order_id": 1}},  # COPY path
            {"type": "send_receipt", "payload": {"order_id": 2}, "queue": "q2"},
            {"type": "send_receipt", "payload": {"order_id": 3}, "idempotency_key": "a"},  # keyed
            {"type": "other", "payload": {}},
        ],
    )

    got = [(r.task.queue, r.task.priority) for r in results]
    stored = [(t.queue, t.priority) for t in (pgqueue.get_task(conn, r.id) for r in results)]
    high, normal = pgqueue.Priority.HIGH, pgqueue.Priority.NORMAL
    assert got == stored == [("mail", high), ("q2", high), ("mail", high), ("default", normal)]


# --- bulk ----------------------------------------------------------------------------------------


def test_enqueue_many_takes_argument_dicts_and_bound_calls(conn):
    _, send_receipt, _ = receipts()

    handles = send_receipt.enqueue_many(
        conn, [{"order_id": 1}, {"order_id": 2, "resend": True}, send_receipt.bind(3)]
    )

    assert [pgqueue.get_task(conn, h.id).payload for h in handles] == [
        {"order_id": 1},
        {"order_id": 2, "resend": True},
        {"order_id": 3},
    ]
    assert {h.task.queue for h in handles} == {"mail"}
    # bind() gives what pgqueue.enqueue_many takes, mixed with other tasks.
    mixed = pgqueue.enqueue_many(conn, [send_receipt.bind(4, resend=True), {"type": "other"}])
    assert pgqueue.get_task(conn, mixed[0].id).payload == {"order_id": 4, "resend": True}


def test_one_bad_call_in_a_batch_inserts_none_of_it(conn):
    _, send_receipt, _ = receipts()

    with pytest.raises(pgqueue.InvalidArgument, match=r"payload: argument 'order_id' is missing"):
        send_receipt.enqueue_many(conn, [{"order_id": 1}, {"resend": True}])
    with pytest.raises(pgqueue.InvalidArgument, match=r"unexpected argument 'x'"):
        send_receipt.enqueue_many(conn, [{"order_id": 1}, {"order_id": 2, "x": 1}])
    with pytest.raises(pgqueue.ValidationError, match=r"items must be dicts"):
        send_receipt.enqueue_many(conn, [[1]])
    assert count_tasks(conn) == 0


# --- async -----------------------------------------------------------------------------------


def test_aenqueue_and_aenqueue_many_on_an_async_connection(database_url, conn):
    tasks, send_receipt, _ = receipts()
    declare(conn, tasks)

    async def scenario() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await send_receipt.aenqueue(aconn, 1)
            await aconn.rollback()
            one = await send_receipt.aenqueue(aconn, 2, resend=True)
            many = await send_receipt.aenqueue_many(aconn, [{"order_id": 3}])
            with pytest.raises(pgqueue.InvalidArgument, match="argument 'order_id' is missing"):
                await send_receipt.aenqueue(aconn)
            with pytest.raises(pgqueue.InvalidArgument, match="unexpected argument 'foo'"):
                await pgqueue.aio.check_arguments(aconn, "send_receipt", {"order_id": 1, "foo": 1})
            await aconn.commit()
            return [one, *many]

    handles = asyncio.run(scenario())
    assert [pgqueue.get_task(conn, h.id).payload for h in handles] == [
        {"order_id": 2, "resend": True},
        {"order_id": 3},
    ]
    assert count_tasks(conn) == 2


# --- the worker calls the function -----------------------------------------------------------


def test_a_worker_calls_the_function_with_its_arguments_and_the_context(database_url, conn):
    tasks = TaskRegistry()
    seen: dict[str, Any] = {}

    @tasks.task(name="with_context")
    def with_context(a: int, /, b: str, *, ctx: pgqueue.TaskContext | None = None) -> str:
        assert ctx is not None
        seen["ctx"] = (ctx.task_id, ctx.type, ctx.attempt)
        return f"{a}-{b}"

    @tasks.task(name="async_one")
    async def async_one(n: int, ctx: pgqueue.TaskContext, **extra: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"n": n, "extra": extra, "type": ctx.type}

    sync_task = with_context.enqueue(conn, 1, "x")
    async_task = async_one.enqueue(conn, 5, colour="red")  # type: ignore[call-arg]
    assert pgqueue.get_task(conn, sync_task.id).payload == {"a": 1, "b": "x"}

    def done() -> bool:
        return all(
            pgqueue.get_task(conn, h.id).status is pgqueue.TaskStatus.COMPLETED
            for h in (sync_task, async_task)
        )

    run_worker_until(database_url, tasks, done)

    assert pgqueue.get_task(conn, sync_task.id).result == "1-x"
    assert seen["ctx"] == (sync_task.id, "with_context", 1)
    assert pgqueue.get_task(conn, async_task.id).result == {
        "n": 5,
        "extra": {"colour": "red"},
        "type": "async_one",
    }
    # The worker recorded the parameters (the context is not one of them).
    (row,) = [
        r for r in driver.run(conn, task_types.task_types_list()) if r["type"] == "with_context"
    ]
    assert row["parameters"] == {
        "parameters": [
            {"name": "a", "kind": "positional", "required": True, "types": ["integer"]},
            {"name": "b", "kind": "positional_or_keyword", "required": True, "types": ["string"]},
        ],
        "extra": False,
    }


def test_the_context_parameter_is_not_an_argument(conn):
    tasks = TaskRegistry()

    @tasks.task(name="ctx_only")
    def ctx_only(n: int, ctx: pgqueue.TaskContext | None = None) -> None:
        return None

    with pytest.raises(pgqueue.InvalidArgument, match="'ctx' is the task's context"):
        ctx_only.enqueue(conn, 1, ctx=None)
    assert count_tasks(conn) == 0


def test_handler_style_tasks_keep_working_beside_function_tasks(database_url, conn):
    tasks, send_receipt, _ = receipts()

    @tasks.handler("old_style")
    def old_style(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return payload["x"]

    old = pgqueue.enqueue(conn, "old_style", {"x": 3})
    new = send_receipt.enqueue(conn, 9)

    def done() -> bool:
        return all(
            pgqueue.get_task(conn, h.id).status is pgqueue.TaskStatus.COMPLETED for h in (old, new)
        )

    run_worker_until(database_url, tasks, done, queues=["default", "mail"])
    assert pgqueue.get_task(conn, old.id).result == 3
    assert pgqueue.get_task(conn, new.id).result == "receipt 9 False"
