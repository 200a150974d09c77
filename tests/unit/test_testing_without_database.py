"""pgqueue.testing where no database is at hand: a task function called directly or through
``call`` gets a context rather than None, and ``eager`` runs enqueued calls at once, through
the same argument checks and JSON round trip as a real enqueue."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from typing import Any

import pytest

import pgqueue
import pgqueue.testing
from pgqueue.registry import TaskRegistry


def receipts() -> tuple[TaskRegistry, Any, list[Any]]:
    tasks = TaskRegistry()
    sent: list[Any] = []

    @tasks.task(name="send_receipt", queue="mail", max_attempts=4)
    def send_receipt(
        order_id: int, day: date, ctx: pgqueue.TaskContext | None = None
    ) -> dict[str, Any]:
        assert ctx is not None
        sent.append((order_id, day))
        return {"order": order_id, "attempt": ctx.attempt, "type": ctx.type, "queue": ctx.queue}

    return tasks, send_receipt, sent


def test_a_direct_call_of_a_task_that_uses_its_context_gets_one():
    _, send_receipt, sent = receipts()

    result = send_receipt(42, date(2026, 1, 2))

    assert result == {"order": 42, "attempt": 1, "type": "send_receipt", "queue": "mail"}
    assert sent == [(42, date(2026, 1, 2))]


def test_a_direct_call_keeps_a_context_given_by_the_caller():
    _, send_receipt, _ = receipts()
    ctx = pgqueue.testing.context(send_receipt, attempt=3)

    assert send_receipt(1, date(2026, 1, 2), ctx=ctx)["attempt"] == 3


def test_a_direct_calls_context_names_what_only_a_worker_gives():
    tasks = TaskRegistry()

    @tasks.task(name="writes")
    def writes(ctx: pgqueue.TaskContext) -> None:
        ctx.connection.execute("SELECT 1")

    with pytest.raises(AttributeError, match=r"writes was called directly.*pgqueue.testing"):
        writes()


def test_call_runs_the_function_with_a_real_task_context_and_its_decoded_arguments():
    _, send_receipt, sent = receipts()

    result = pgqueue.testing.call(send_receipt, 7, day="2026-05-06")

    assert result == {"order": 7, "attempt": 1, "type": "send_receipt", "queue": "mail"}
    assert sent == [(7, date(2026, 5, 6))]  # the ISO string decoded to the annotated date


def test_call_refuses_arguments_an_enqueue_would_refuse():
    _, send_receipt, sent = receipts()

    with pytest.raises(pgqueue.InvalidArgument, match="argument 'day' must be a date"):
        pgqueue.testing.call(send_receipt, 7, datetime.now(UTC))
    assert sent == []


def test_call_runs_an_async_task_function():
    tasks = TaskRegistry()

    @tasks.task(name="double")
    async def double(n: int, ctx: pgqueue.TaskContext) -> list[Any]:
        await asyncio.sleep(0)
        return [n * 2, ctx.attempt]

    assert pgqueue.testing.call(double, 21) == [42, 1]
    assert asyncio.run(pgqueue.testing.acall(double, 1)) == [2, 1]


def test_eager_runs_an_enqueued_call_at_once_without_a_database():
    tasks, send_receipt, sent = receipts()

    with pgqueue.testing.eager(tasks) as mode:
        handle = send_receipt.enqueue(None, 5, date(2026, 2, 3))

    assert sent == [(5, date(2026, 2, 3))]
    assert handle.status == "completed" and handle.ready() and handle.successful()
    assert handle.get() == {"order": 5, "attempt": 1, "type": "send_receipt", "queue": "mail"}
    assert handle.task.payload == {"order_id": 5, "day": "2026-02-03"}
    assert handle.wait(None, timeout=1).result == handle.get()
    assert mode.handles == [handle]
    # Outside the block, enqueue needs a connection again.
    with pytest.raises(Exception):  # noqa: B017 (None is no connection)
        send_receipt.enqueue(None, 5, date(2026, 2, 3))


def test_eager_raises_the_functions_error_unless_asked_to_record_it():
    tasks = TaskRegistry()

    @tasks.task(name="boom")
    def boom() -> None:
        raise ValueError("no such order")

    with pgqueue.testing.eager(tasks), pytest.raises(ValueError, match="no such order"):
        boom.enqueue(None)

    with pgqueue.testing.eager(tasks, propagate=False):
        handle = boom.enqueue(None)
    assert handle.status == "failed" and not handle.successful()
    assert handle.task.last_error == "ValueError: no such order"
    with pytest.raises(ValueError, match="no such order"):
        handle.get()
    assert handle.get(propagate=False) is None


def test_eager_leaves_other_registries_tasks_to_the_database():
    tasks, _, _ = receipts()
    other = TaskRegistry()

    @other.task(name="elsewhere")
    def elsewhere() -> None:
        return None

    with pgqueue.testing.eager(tasks):
        assert pgqueue.testing.eager(tasks).covers(elsewhere) is False
        with pytest.raises(Exception):  # noqa: B017 (None is no connection: not run eagerly)
            elsewhere.enqueue(None)


def test_eager_runs_tasks_that_tasks_enqueue_and_many_at_once():
    tasks = TaskRegistry()
    seen: list[int] = []

    @tasks.task(name="child")
    def child(n: int) -> None:
        seen.append(n)

    @tasks.task(name="parent")
    def parent(n: int) -> None:
        child.enqueue(None, n + 1)

    with pgqueue.testing.eager(tasks):
        parent.enqueue(None, 1)
        child.enqueue_many(None, [{"n": 10}, {"n": 11}])
        asyncio.run(child.aenqueue(None, 20))

    assert seen == [2, 10, 11, 20]


def test_eager_refuses_another_types_prepared_task_rather_than_run_it_as_this_one():
    tasks = TaskRegistry()

    @tasks.task(name="one")
    def one() -> None:
        return None

    @tasks.task(name="two")
    def two() -> None:
        return None

    with pgqueue.testing.eager(tasks), pytest.raises(pgqueue.ValidationError, match="'two'"):
        one.enqueue_many(None, [two.bind()])


def test_eager_runs_delay_and_apply_async_without_a_database_configured(monkeypatch):
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    tasks, send_receipt, sent = receipts()

    with pgqueue.testing.eager(tasks):
        delayed = send_receipt.delay(6, date(2026, 2, 4))
        applied = send_receipt.apply_async(args=(7,), kwargs={"day": date(2026, 2, 5)})

    assert sent == [(6, date(2026, 2, 4)), (7, date(2026, 2, 5))]
    assert delayed.get(timeout=1)["order"] == 6 and applied.get(timeout=1)["order"] == 7
    assert delayed.successful() and not applied.failed()
