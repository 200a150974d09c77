"""The canvas's finer steps through real ``pgqueue worker`` processes: an immutable step
(``si``) ignores its parent's result, a ``parent_result="first"`` step receives it in its
first parameter, and an error handler (``link_error``) runs only when its step failed, with
the failed task, while the workflow's result stays its steps'."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from canvas_handlers import cv_add, cv_alert, cv_alert_async, cv_fail, cv_sub
from test_worker_processes import FAST, Workers, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(120)]

REGISTRY = "canvas_handlers:tasks"
FINAL = {pgqueue.TaskStatus.COMPLETED, pgqueue.TaskStatus.FAILED, pgqueue.TaskStatus.CANCELLED}


def final(conn: psycopg.Connection[Any], *handles: Any) -> bool:
    return all(pgqueue.get_task(conn, h.id).status in FINAL for h in handles)


def every_task(handle: pgqueue.WorkflowHandle) -> list[Any]:
    return [*handle.tasks, *handle.error_handlers]


def test_an_immutable_step_and_a_parent_result_first_step_run_by_workers(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    proc = workers.start(database_url, *FAST, registry=REGISTRY)
    immutable = pgqueue.chain(cv_add.s(1, 2), cv_add.si(10, 20)).enqueue(conn)
    first = pgqueue.chain(cv_sub.s(10, 3), cv_sub.s(1, parent_result="first")).enqueue(conn)
    unbound = pgqueue.chain(cv_sub.s(10, 3), cv_sub.s(1)).enqueue(conn)
    wait_until(
        lambda: final(conn, *immutable.tasks, *first.tasks, *unbound.tasks),
        timeout=60,
        what="the chains to finish",
        alive=[proc],
    )
    # It ran after its parent (which it sees in ctx.parents) but took none of its result.
    assert immutable.wait(conn, timeout=5) == {"sum": 30, "parents": 1}
    assert first.wait(conn, timeout=5) == 6  # cv_sub(7, 1)
    assert unbound.wait(conn, timeout=5) == -6  # cv_sub(1, 7)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_an_error_handler_runs_only_when_its_step_failed_and_receives_the_failed_task(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers, executor: str
):
    """As much in a child process (``--executor process``) as in the worker's own."""
    proc = workers.start(database_url, "--executor", executor, *FAST, registry=REGISTRY)
    failing = pgqueue.chain(
        cv_fail.s("the disk is full").link_error(
            cv_alert.s(channel="ops"), cv_alert_async.s(channel="pager")
        ),
        # Cancelled because its parent failed: it did not fail, so its handler does not run.
        cv_add.s(y=1).link_error(cv_alert_async.s(channel="never")),
    ).enqueue(conn)
    passing = pgqueue.chain(
        cv_sub.s(1, 2).link_error(cv_alert.s(channel="ops")), cv_sub.s(y=10)
    ).enqueue(conn)
    wait_until(
        lambda: final(conn, *every_task(failing), *every_task(passing)),
        timeout=60,
        what="the workflows and their error handlers to finish",
        alive=[proc],
    )

    failed_step, after = (pgqueue.get_task(conn, t.id) for t in failing.tasks)
    handler, async_handler, not_run = (pgqueue.get_task(conn, t.id) for t in failing.error_handlers)
    assert failed_step.status is pgqueue.TaskStatus.FAILED
    assert after.status is pgqueue.TaskStatus.CANCELLED  # the chain stops as before
    assert handler.status is pgqueue.TaskStatus.COMPLETED and handler.workflow_id is None
    received = handler.result["failed"]
    assert handler.result["channel"] == "ops"
    assert async_handler.result == {"channel": "pager", "failed": received}
    assert not_run.status is pgqueue.TaskStatus.COMPLETED and not_run.result is None
    assert received["task_id"] == str(failed_step.id) and received["type"] == "cv_fail"
    assert received["error"] == "ValueError: the disk is full"
    assert received["traceback"].startswith("Traceback (most recent call last)")
    with pytest.raises(pgqueue.WorkflowFailed):
        failing.wait(conn, timeout=5)

    # The step completed: its handler completed without being called, outside the workflow,
    # whose result is still its last step's.
    [skipped] = (pgqueue.get_task(conn, t.id) for t in passing.error_handlers)
    assert skipped.status is pgqueue.TaskStatus.COMPLETED and skipped.result is None
    assert passing.wait(conn, timeout=5) == -11  # cv_sub(cv_sub(1, 2), 10)
