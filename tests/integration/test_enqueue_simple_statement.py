"""A submit with no options but queue and priority takes task_insert_simple, a shorter form
of task_insert_plain (fewer parameters, fewer columns back). Both must store the same row and
answer with the same Task, with and without a declaration of the type."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from pgqueue import RetryPolicy
from pgqueue.enqueue import prepare
from pgqueue.queries import driver, submitting, task_types
from pgqueue.queries.driver import Query
from pgqueue.registry import TaskRegistry

T0 = datetime(2030, 1, 1, tzinfo=UTC)
COLUMNS = (
    "queue, type, payload, priority, status, attempts, max_attempts, backoff_base,"
    " backoff_factor, backoff_cap, visible_after, created_at, trace_context, policy_default,"
    " expires_at, concurrency_key, idempotency_key, ready_since, submitted_priority"
)


def declare(conn: Any) -> None:
    tasks = TaskRegistry()

    @tasks.task(
        name="send_receipt",
        queue="mail",
        priority="high",
        retry=RetryPolicy(max_attempts=5, base=2, factor=3, cap=60),
    )
    def send_receipt(order: int) -> None:
        return None

    driver.run(conn, task_types.task_types_declare("w1", tasks.declarations()))


def insert(conn: Any, spec: Any) -> tuple[str, Any]:
    """Insert ``spec`` as enqueue does; which statement did it, and the Task it answered."""
    names: list[str] = []
    op = submitting.task_insert(spec, T0)

    def recorded() -> Any:
        reply = None
        try:
            while True:
                step = op.send(reply)
                if isinstance(step, Query):
                    names.append(step.name)
                reply = yield step
        except StopIteration as stop:
            return stop.value

    task, created = driver.run(conn, recorded())
    assert created
    return names[0], task


def row(conn: Any, task_id: Any) -> tuple[Any, ...]:
    found = conn.execute(f"SELECT {COLUMNS} FROM pgqueue.tasks WHERE id = %s", (task_id,))
    return tuple(found.fetchone())


@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "declared"])
@pytest.mark.parametrize(
    "options",
    [{}, {"queue": "reports"}, {"priority": "low"}, {"queue": "reports", "priority": 0}],
    ids=["no-options", "queue", "priority", "both"],
)
def test_the_simple_insert_stores_and_answers_what_the_plain_insert_does(
    conn: Any, declared: bool, options: dict[str, Any]
) -> None:
    if declared:
        declare(conn)
    payload = {"order": 1042}
    # run_at = the statement's clock: due at once, as with no option, but an option given,
    # so the plain statement takes it.
    name_simple, simple = insert(conn, prepare("send_receipt", payload, **options))
    name_plain, plain = insert(conn, prepare("send_receipt", payload, run_at=T0, **options))
    assert (name_simple, name_plain) == ("task_insert_simple", "task_insert_plain")
    assert row(conn, simple.id) == row(conn, plain.id)
    assert dataclasses.replace(simple, id=plain.id) == plain
    # The declaration (or the default) really was applied, by both alike.
    assert simple.queue == options.get("queue", "mail" if declared else "default")
    assert simple.max_attempts == (5 if declared else 3)
