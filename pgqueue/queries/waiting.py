"""Waiting for a task to finish: the waiter's registration (which the finishing
statements wake), its removal, the API hub's batched forms, and the channels notified.

The wait loop itself is ``pgqueue.waiting``; the drivers run its Listen and AwaitNotify steps
(``driver``). Statements: sql/waiting.sql.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from pgqueue.errors import TaskNotFound
from pgqueue.models import Task
from pgqueue.queries.driver import Op, Query, Row

DONE_CHANNEL = "pgqueue_done"
# Tasks became ready that are older than where a worker's claims got to (a released dependant,
# a replayed dead letter): the payload is the queue; see worker/claim_starts.py.
RELEASED_CHANNEL = "pgqueue_released"


def task_waiter_add(task_id: uuid.UUID, waiter: uuid.UUID, seconds: float) -> Op[Task]:
    """Register ``waiter`` for ``seconds`` and read the task (TaskNotFound if there is none)."""
    rows = yield Query("task_waiter_add", {"id": task_id, "waiter": waiter, "seconds": seconds})
    if not rows:
        raise TaskNotFound(task_id)
    return Task.from_row(rows[0])


def task_waiter_remove(task_id: uuid.UUID, waiter: uuid.UUID) -> Op[None]:
    yield Query("task_waiter_remove", {"id": task_id, "waiter": waiter})


# The API's waiter hub runs many waits' reads as one statement each (api/waiters.py): the
# rows of each task, by id (a task missing has none).


def task_waiter_add_many(
    waits: Sequence[tuple[uuid.UUID, uuid.UUID, float]],
) -> Op[dict[uuid.UUID, list[Row]]]:
    """Register (task id, waiter, seconds) each and read their tasks."""
    ids, waiters, seconds = (list(column) for column in zip(*waits, strict=True))
    rows = yield Query("task_waiter_add_many", {"ids": ids, "waiters": waiters, "seconds": seconds})
    return {row["id"]: [row] for row in rows}


def task_get_many(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, list[Row]]]:
    rows = yield Query("task_get_many", {"ids": list(ids)})
    return {row["id"]: [row] for row in rows}


def task_statuses(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, str]]:
    rows = yield Query("task_statuses", {"ids": list(ids)})
    return {row["id"]: row["status"] for row in rows}


def task_waiter_remove_many(waits: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Op[None]:
    ids, waiters = (list(column) for column in zip(*waits, strict=True))
    yield Query("task_waiter_remove_many", {"ids": ids, "waiters": waiters})
