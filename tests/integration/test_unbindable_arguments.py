"""A function task whose stored arguments cannot call the function (one missing, one it does
not take: submitted by type name before any worker recorded the parameters) is dead-lettered
at its first attempt with the reason, by a real worker, not retried to its last attempt."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from boundaries import Api
from helpers import run_worker_until

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.registry import TaskRegistry

CALLS: list[dict[str, Any]] = []

THREAD_TASKS = TaskRegistry()
PROCESS_TASKS = TaskRegistry()


@THREAD_TASKS.task(name="send_receipt")
def send_receipt(order_id: int, email: str, copy: bool = False) -> str:
    CALLS.append({"order_id": order_id, "email": email})
    return f"sent {order_id}"


@PROCESS_TASKS.task(name="send_receipt_in_a_child", executor="process")
def send_receipt_in_a_child(order_id: int, email: str, copy: bool = False) -> str:
    return f"sent {order_id}"


def finished(conn: Any, task_id: uuid.UUID) -> bool:
    return pgqueue.get_task(conn, task_id).status in ("completed", "failed")


@pytest.mark.parametrize(
    ("registry", "type_"),
    [(THREAD_TASKS, "send_receipt"), (PROCESS_TASKS, "send_receipt_in_a_child")],
    ids=["thread", "process"],
)
def test_a_payload_that_cannot_call_the_function_dead_letters_at_its_first_attempt(
    conn, database_url, registry, type_
):
    # No worker has run yet: nothing recorded the parameters, so nothing checks the payload.
    missing = pgqueue.enqueue(conn, type_, {"order_id": 7}, max_attempts=5).task.id
    unknown = pgqueue.enqueue(
        conn,
        type_,
        {"order_id": 7, "email": "a@example.com", "cc": "b@example.com"},
        max_attempts=5,
    ).task.id
    good = pgqueue.enqueue(conn, type_, {"order_id": 8, "email": "a@example.com"}).task.id

    run_worker_until(
        database_url,
        registry,
        lambda: all(finished(conn, t) for t in (missing, unknown, good)),
    )

    assert pgqueue.get_task(conn, good).result == "sent 8"
    expected = {
        missing: "UndecodableArgument: payload: argument 'email' is missing: "
        f"{type_} cannot be called with the stored payload",
        unknown: "UndecodableArgument: payload: unexpected argument 'cc': "
        f"{type_} cannot be called with the stored payload",
    }
    for task_id, error in expected.items():
        dead = pgqueue.get_task(conn, task_id)
        assert (dead.status, dead.attempts) == ("failed", 1), dead
        assert dead.last_error is not None
        assert dead.last_error.startswith(error), dead.last_error


def test_a_call_submitted_over_http_before_any_worker_ran_is_dead_lettered_not_retried(
    conn, database_url
):
    api = Api(ApiSettings(database_url=database_url))
    try:
        response = api.request(
            "POST",
            "/api/v1/tasks",
            json={"type": "send_receipt", "payload": {"order_id": 9}, "max_attempts": 3},
        )
    finally:
        api.close()
    assert response.status_code == 202, response.text  # nothing recorded yet to check against
    task_id = uuid.UUID(response.json()["task_id"])
    CALLS.clear()

    run_worker_until(database_url, THREAD_TASKS, lambda: finished(conn, task_id))

    dead = pgqueue.get_task(conn, task_id)
    assert (dead.status, dead.attempts) == ("failed", 1)
    assert dead.last_error is not None
    assert "argument 'email' is missing" in dead.last_error
    assert CALLS == []  # the function never ran
    # The worker recorded the parameters meanwhile: the same submit is now refused at once.
    with pytest.raises(pgqueue.InvalidArgument, match="argument 'email' is missing"):
        pgqueue.check_arguments(conn, "send_receipt", {"order_id": 9})
