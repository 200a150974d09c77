"""Waiting for a task's result on the caller's connection, woken by a notification."""

from __future__ import annotations

import uuid

from pgqueue.models import Task
from pgqueue.operations.checks import check_seconds, parse_task_id
from pgqueue.queries.driver import WaitOp, waiting_operation
from pgqueue.waiting import DEFAULT_POLL_INTERVAL, wait_loop


@waiting_operation
def wait(
    task_id: uuid.UUID | str,
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> WaitOp[Task]:
    """Wait until the task is final and return it: completed (read ``.result``), failed
    (dead-lettered: ``.last_error``) or cancelled. It returns rather than raises for the
    last two: the caller reads ``.status``, ``.result`` and ``.attempts`` either way.

    Raises WaitTimeout (a TimeoutError, naming the task, its type and its status, with the
    task as last read in ``.task``) after ``timeout`` seconds; the task goes on. An unknown
    id is TaskNotFound.

    The connection must not be inside a transaction (WaitInTransaction): commit the one that
    enqueued the task first, since workers cannot see it before, and notifications arrive
    only between transactions. An autocommit connection suits best; on another, each read
    runs in a short transaction of its own. The wait holds the connection throughout.

    It is woken by a notification when the task finishes, not by polling; it also reads the
    task every ``poll_interval`` seconds, in case a notification was missed. Behind a
    transaction-mode pooler (``PGQUEUE_POOLER=transaction``, or a connection opened with
    ``pooler="transaction"``), where LISTEN hears nothing, it listens on a connection of its
    own to ``PGQUEUE_LISTEN_URL`` (a direct URL) when that is set, and otherwise polls, every
    0.05 s at first and every 0.5 s at most, returning within about half a second.
    """
    return wait_loop(
        parse_task_id(task_id),
        check_seconds("timeout", timeout),
        check_seconds("poll_interval", poll_interval),
    )
