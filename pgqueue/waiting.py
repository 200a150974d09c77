"""Waiting for a task's result, written once: a sans-IO loop of steps.

The loop registers the waiter and reads the task in one statement (``task_waiter_add``), then
sleeps until a notification for the task arrives on ``pgqueue_done`` or a poll is due, and
reads the task again, until it is final or the time is up. It runs on the caller's sync or
async connection (:func:`pgqueue.queries.driver.drive` and ``adrive``, each statement in a
transaction of its own: ``Transaction.EACH_STEP``), and in the HTTP API on one shared LISTEN
connection for every waiting request (:mod:`pgqueue.api.waiters`).

Why notifications and a poll: a finishing statement notifies only the tasks someone waits on
(``pgqueue.task_waiters_wake``), so a task nobody waits on pays no NOTIFY; and a notification
can still be missed (a LISTEN connection that dropped, a path that finishes a task without
the wake-up), which the poll, every ``poll_interval`` seconds, covers. Registering locks the
task's row ``FOR SHARE`` for an instant, which closes the race with a finish in flight (see
``task_waiter_add`` in sql/waiting.sql), so the poll is a fallback, not the usual path.

Behind a transaction-mode pooler (:mod:`pgqueue.pooling`) LISTEN hears nothing: the driver
listens on ``PGQUEUE_LISTEN_URL`` instead when it is set, else answers the Listen step with
False, and the loop then polls: every :data:`POLL_FIRST` seconds at first, a little less often
each time, never less often than every :data:`POLL_LONGEST` (nor than ``poll_interval``), so
that a wait returns within about half a second of the task's end. The API's hub polls for all
its waiters at once instead (api/waiters.py).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

from pgqueue.errors import WaitTimeout, WorkflowWaitTimeout
from pgqueue.models import Task, TaskStatus, WorkflowInfo
from pgqueue.queries import dependencies, tasks, waiting
from pgqueue.queries.driver import AwaitNotify, Listen, WaitOp
from pgqueue.queries.waiting import DONE_CHANNEL

DEFAULT_POLL_INTERVAL = 2.0

T = TypeVar("T")

# A waiter's row outlives its timeout by this much before another waiter may delete it as
# the leftover of a waiter that died (one that is alive removes its own row when it ends).
REGISTRATION_MARGIN = 60.0


# A wait that nothing can wake polls: first after POLL_FIRST seconds (most waits are short),
# each interval POLL_GROWTH times the last, up to POLL_LONGEST.
POLL_FIRST = 0.05
POLL_GROWTH = 1.5
POLL_LONGEST = 0.5


def poll_intervals(poll_interval: float, listening: bool) -> Iterator[float]:
    """The waits between a wait's reads: ``poll_interval`` each while notifications can wake
    it (``listening``), else short ones growing to :data:`POLL_LONGEST`."""
    if listening:
        return itertools.repeat(poll_interval)
    return _growing(min(poll_interval, POLL_LONGEST))


def _growing(longest: float) -> Iterator[float]:
    interval = min(POLL_FIRST, longest)
    while True:
        yield interval
        interval = min(interval * POLL_GROWTH, longest)


def _until_woken(
    deadline: float, next_poll: float, keys: set[str], clock: Callable[[], float]
) -> WaitOp[None]:
    """Sleep until a notification names one of ``keys`` (the tasks this waiter registered on),
    or the poll or the deadline is due: the caller then reads again. A notification for
    another waiter's task on the same connection (the API's shared one) sleeps on."""
    while True:
        due = min(deadline, next_poll)
        woken = yield AwaitNotify(DONE_CHANNEL, due - clock())
        if not woken or not keys.isdisjoint(woken) or clock() >= due:
            return


def _listening(key: uuid.UUID, body: Callable[[bool], WaitOp[T]]) -> WaitOp[T]:
    """Run ``body`` while listening on ``pgqueue_done``, telling it whether notifications will
    arrive (the driver's answer to Listen: not behind a transaction pooler without a LISTEN
    URL). Listening before registering: a notification sent after the registration commits
    is then never lost on this connection."""
    listening = yield Listen(DONE_CHANNEL, key)
    try:
        return (yield from body(listening is True))
    finally:
        yield Listen(DONE_CHANNEL, key, listen=False)


def wait_loop(
    task_id: uuid.UUID,
    timeout: float,
    poll_interval: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> WaitOp[Task]:
    """The task once it is final (completed, failed, cancelled), or WaitTimeout carrying the
    task as last read after ``timeout`` seconds. Arguments are validated by the caller."""
    return _listening(
        task_id,
        lambda listening: _wait_task(
            task_id, timeout, poll_intervals(poll_interval, listening), clock
        ),
    )


def _wait_task(
    task_id: uuid.UUID, timeout: float, intervals: Iterator[float], clock: Callable[[], float]
) -> WaitOp[Task]:
    deadline = clock() + timeout
    waiter = uuid.uuid4()
    try:
        # Inside the try: interrupted while registering (a cancelled request), the row may
        # have been written all the same; removing one that is not there costs nothing.
        task = yield from waiting.task_waiter_add(task_id, waiter, timeout + REGISTRATION_MARGIN)
        next_poll = clock() + next(intervals)
        while not task.status.is_final:
            if clock() >= deadline:
                raise WaitTimeout(task, timeout)
            yield from _until_woken(deadline, next_poll, {str(task_id)}, clock)
            task = yield from tasks.task_get(task_id)
            next_poll = clock() + next(intervals)
    finally:
        yield from waiting.task_waiter_remove(task_id, waiter)
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
    return _listening(
        workflow_id,
        lambda listening: _wait_workflow(
            workflow_id, timeout, poll_intervals(poll_interval, listening), clock
        ),
    )


def _wait_workflow(
    workflow_id: uuid.UUID, timeout: float, intervals: Iterator[float], clock: Callable[[], float]
) -> WaitOp[WorkflowInfo]:
    deadline = clock() + timeout
    waiter = uuid.uuid4()
    seconds = timeout + REGISTRATION_MARGIN
    watched: set[uuid.UUID] = set()
    try:
        info = yield from dependencies.workflow_get(workflow_id)
        next_poll = clock() + next(intervals)
        while not info.status.is_final:
            pending = [t.id for t in info.tasks if not t.status.is_final]
            if not watched.intersection(pending):
                if watched:
                    yield from waiting.task_waiter_remove_many([(i, waiter) for i in watched])
                    watched = set()
                pick = pending[-MAX_WATCHED:]
                read = yield from waiting.task_waiter_add_many([(i, waiter, seconds) for i in pick])
                watched = set(pick)
                # Registered after the read above: one may have finished in between.
                if any(TaskStatus(r[0]["status"]).is_final for r in read.values()):
                    info = yield from dependencies.workflow_get(workflow_id)
                    continue
            if clock() >= deadline:
                raise WorkflowWaitTimeout(info, timeout)
            yield from _until_woken(deadline, next_poll, {str(i) for i in watched}, clock)
            info = yield from dependencies.workflow_get(workflow_id)
            next_poll = clock() + next(intervals)
    finally:
        if watched:
            yield from waiting.task_waiter_remove_many([(i, waiter) for i in watched])
    return info
