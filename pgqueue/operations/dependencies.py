"""Tasks with parents and workflows: a task's parents and children, a workflow read,
cancelled, and waited for.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgqueue.errors import WorkflowCancelled, WorkflowFailed
from pgqueue.models import Parent, WorkflowInfo, WorkflowStatus
from pgqueue.operations.checks import check_seconds, parse_task_id, parse_workflow_id
from pgqueue.queries import dependencies
from pgqueue.queries.driver import Op, WaitOp, operation, waiting_operation
from pgqueue.waiting import DEFAULT_POLL_INTERVAL, workflow_wait_loop


@operation
def parents(task_id: uuid.UUID | str) -> Op[list[Parent]]:
    """The parents of a task (its depends_on, in that order) with their statuses and
    results; empty for a task without parents."""
    return dependencies.task_parents(parse_task_id(task_id))


@operation
def children(task_id: uuid.UUID | str) -> Op[list[Parent]]:
    """The tasks that depend on this one, with their statuses."""
    return dependencies.task_children(parse_task_id(task_id))


@operation
def workflow(workflow_id: uuid.UUID | str) -> Op[WorkflowInfo]:
    """The workflow with this id as it is now: its status (running, completed, failed,
    cancelled: derived from its tasks as the pgqueue.workflows view does), how many tasks are
    in each status, its tasks in build order with their parents and children, and its final
    result (``.result``). WorkflowNotFound if no task belongs to it."""
    return dependencies.workflow_get(parse_workflow_id(workflow_id))


@operation
def cancel_workflow(
    workflow_id: uuid.UUID | str, *, now: datetime | None = None
) -> Op[WorkflowInfo]:
    """Cancel every unfinished task of the workflow and return the workflow as it is then.

    Waiting and queued tasks are cancelled at once; a running one is asked to stop, as
    :func:`cancel` does (cooperative: its handler sees ``should_stop()``; if it completes
    anyway, its result stands), so the workflow may still be running until it ends. Finished
    tasks are left as they are; cancelling a finished workflow changes nothing.
    WorkflowNotFound for an unknown id."""
    return _cancel_workflow(parse_workflow_id(workflow_id), now)


def _cancel_workflow(workflow_id: uuid.UUID, now: datetime | None) -> Op[WorkflowInfo]:
    info: WorkflowInfo = yield from dependencies.workflow_get(workflow_id)  # WorkflowNotFound
    if not info.status.is_final:
        yield from dependencies.workflow_cancel(workflow_id, now)
        info = yield from dependencies.workflow_get(workflow_id)
    return info


def _workflow_outcome(info: WorkflowInfo) -> Any:
    if info.status is WorkflowStatus.FAILED:
        raise WorkflowFailed(info)
    if info.status is WorkflowStatus.CANCELLED:
        raise WorkflowCancelled(info)
    return info.result


def wait_workflow_loop(workflow_id: uuid.UUID, timeout: float, poll_interval: float) -> WaitOp[Any]:
    info = yield from workflow_wait_loop(workflow_id, timeout, poll_interval)
    return _workflow_outcome(info)


@waiting_operation
def wait_workflow(
    workflow_id: uuid.UUID | str,
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> WaitOp[Any]:
    """Wait until every task of the workflow is final and return its final result: the result
    of its sink task (the one nothing depends on), or the list of its sinks' results in build
    order if it has several.

    Raises WorkflowFailed if a task was dead-lettered, WorkflowCancelled if the workflow ended
    cancelled (each with the workflow in ``.info`` and the task in ``.task``), and
    WorkflowWaitTimeout (a WaitTimeout, as a task's wait raises) after ``timeout`` seconds;
    the workflow goes on. WorkflowNotFound for an unknown id. As :func:`wait`, the connection
    must not be inside a transaction, and the wait is woken by notifications when the
    workflow's tasks finish, with a read every ``poll_interval`` seconds as a fallback
    (behind a transaction-mode pooler, as :func:`wait`: LISTEN on ``PGQUEUE_LISTEN_URL``, else
    a poll every 0.5 s at most).
    """
    return wait_workflow_loop(
        parse_workflow_id(workflow_id),
        check_seconds("timeout", timeout),
        check_seconds("poll_interval", poll_interval),
    )
