"""Waiting for a task's result, written once: a sans-IO loop of steps.

The loop registers the waiter and reads the task in one statement (``task_waiter_add``), then
sleeps until a notification for the task arrives on ``pgqueue_done`` or a poll is due, and
reads the task again, until it is final or the time is up. Three drivers run it: on the
caller's sync connection (:func:`pgqueue.queries.run_waiting`), on an async one
(:func:`pgqueue.queries.arun_waiting`), and in the HTTP API on one shared LISTEN connection for
every waiting request (:mod:`pgqueue.api.waiters`).

Why notifications and a poll: a finishing statement notifies only the tasks someone waits on
(``pgqueue.task_waiters_wake``), so a task nobody waits on pays no NOTIFY; and a notification
can still be missed (a LISTEN connection that dropped, a path that finishes a task without
the wake-up), which the poll, every ``poll_interval`` seconds, covers. Registering locks the
task's row ``FOR SHARE`` for an instant, which closes the race with a finish in flight (see
``task_waiter_add`` in sql/tasks.sql), so the poll is a fallback, not the usual path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from pgqueue import queries
from pgqueue.errors import WaitTimeout, WorkflowWaitTimeout
from pgqueue.models import Task, TaskStatus, WorkflowInfo
from pgqueue.queries import DONE_CHANNEL, AwaitNotify, Listen, WaitOp

DEFAULT_POLL_INTERVAL = 2.0

# A waiter's row outlives its timeout by this much before another waiter may delete it as
# the leftover of a waiter that died (one that is alive removes its own row when it ends).
REGISTRATION_MARGIN = 60.0


def wait_loop(
    task_id: uuid.UUID,
    timeout: float,
    poll_interval: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> WaitOp[Task]:
    """The task once it is final (completed, failed, cancelled), or WaitTimeout carrying the
    task as last read after ``timeout`` seconds. Arguments are validated by the caller."""
    deadline = clock() + timeout
    waiter = uuid.uuid4()
    key = str(task_id)
    # Listening before registering: a notification sent after the registration commits is
    # then never lost on this connection.
    yield Listen(DONE_CHANNEL, task_id)
    try:
        try:
            # Inside the try: interrupted while registering (a cancelled request), the row may
            # have been written all the same; removing one that is not there costs nothing.
            seconds = timeout + REGISTRATION_MARGIN
            task = yield from queries.task_waiter_add(task_id, waiter, seconds)
            next_poll = clock() + poll_interval
            while not task.status.is_final:
                now = clock()
                if now >= deadline:
                    raise WaitTimeout(task, timeout)
                woken = yield AwaitNotify(DONE_CHANNEL, min(deadline, next_poll) - now)
                if woken and key not in woken and clock() < min(deadline, next_poll):
                    continue  # another task someone waits on; not ours, nor time to poll
                task = yield from queries.task_get(task_id)
                next_poll = clock() + poll_interval
        finally:
            yield from queries.task_waiter_remove(task_id, waiter)
    finally:
        yield Listen(DONE_CHANNEL, task_id, listen=False)
    return task


# A workflow wait registers as a waiter of at most this many of its unfinished tasks at a time
# (the last ones in build order first: the sinks, which finish last); when all of those are
# final it registers the next ones. The poll covers the rest.
MAX_WATCHED = 1000


def workflow_wait_loop(
    workflow_id: uuid.UUID,
    timeout: float,
    poll_interval: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> WaitOp[WorkflowInfo]:
    """The workflow once it is final (every task final), or WorkflowWaitTimeout carrying the
    workflow as last read after ``timeout`` seconds. As :func:`wait_loop`, but registered on
    the workflow's unfinished tasks: the finish of any of them wakes it to read the workflow
    again."""
    deadline = clock() + timeout
    waiter = uuid.uuid4()
    seconds = timeout + REGISTRATION_MARGIN
    watched: set[uuid.UUID] = set()
    yield Listen(DONE_CHANNEL, workflow_id)
    try:
        try:
            info = yield from queries.workflow_get(workflow_id)
            next_poll = clock() + poll_interval
            while not info.status.is_final:
                pending = [t.id for t in info.tasks if not t.status.is_final]
                if not watched.intersection(pending):
                    if watched:
                        yield from queries.task_waiter_remove_many([(i, waiter) for i in watched])
                        watched = set()
                    pick = pending[-MAX_WATCHED:]
                    read = yield from queries.task_waiter_add_many(
                        [(i, waiter, seconds) for i in pick]
                    )
                    watched = set(pick)
                    # Registered after the read above: one may have finished in between.
                    if any(TaskStatus(r[0]["status"]).is_final for r in read.values()):
                        info = yield from queries.workflow_get(workflow_id)
                        continue
                now = clock()
                if now >= deadline:
                    raise WorkflowWaitTimeout(info, timeout)
                woken = yield AwaitNotify(DONE_CHANNEL, min(deadline, next_poll) - now)
                ours = {str(i) for i in watched}
                if woken and ours.isdisjoint(woken) and clock() < min(deadline, next_poll):
                    continue
                info = yield from queries.workflow_get(workflow_id)
                next_poll = clock() + poll_interval
        finally:
            if watched:
                yield from queries.task_waiter_remove_many([(i, waiter) for i in watched])
    finally:
        yield Listen(DONE_CHANNEL, workflow_id, listen=False)
    return info
