"""One task, or a page of them, by id or filter: read, list, cancel; dead letters replayed,
discarded and counted. What the CLI, the HTTP API and ``pgqueue.get_task`` and friends run.
Statements: sql/tasks.sql.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgqueue.errors import TaskNotFound
from pgqueue.models import Task, TaskStatus
from pgqueue.queries.driver import Op, Query


def task_get(task_id: uuid.UUID) -> Op[Task]:
    rows = yield Query("task_get", {"id": task_id})
    if not rows:
        raise TaskNotFound(task_id)
    return Task.from_row(rows[0])


def task_list(
    *,
    status: TaskStatus | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> Op[list[Task]]:
    rows = yield Query(
        "task_list",
        {
            "status": status.value if status else None,
            "type": type,
            "queue": queue,
            "limit": limit,
            "before_created": before[0] if before else None,
            "before_id": before[1] if before else None,
        },
    )
    return [Task.from_row(r) for r in rows]


def task_cancel(task_id: uuid.UUID, now: datetime | None = None) -> Op[Task]:
    rows = yield Query("task_cancel", {"id": task_id, "now": now})
    if rows:
        return Task.from_row(rows[0])
    task = yield from task_get(task_id)  # raises TaskNotFound
    from pgqueue.errors import InvalidTaskState

    raise InvalidTaskState(task_id, task.status.value, "cannot cancel a finished task")


def _dead_letter_filter(
    ids: Sequence[uuid.UUID] | None, type: str | None, queue: str | None, limit: int
) -> dict[str, Any]:
    return {
        "ids": list(ids) if ids is not None else None,
        "type": type,
        "queue": queue,
        "limit": limit,
    }


def task_replay(
    ids: Sequence[uuid.UUID] | None,
    type: str | None,
    queue: str | None,
    limit: int,
    now: datetime | None = None,
) -> Op[list[uuid.UUID]]:
    rows = yield Query("task_replay", {**_dead_letter_filter(ids, type, queue, limit), "now": now})
    queues = sorted({r["queue"] for r in rows})
    if queues:
        yield Query("queue_notify_released", {"queues": queues})
    return [r["id"] for r in rows]


def task_dead_count(type: str | None, queue: str | None) -> Op[int]:
    rows = yield Query("task_dead_count", {"type": type, "queue": queue})
    return int(rows[0]["count"])


def task_discard(
    ids: Sequence[uuid.UUID] | None, type: str | None, queue: str | None, limit: int
) -> Op[list[uuid.UUID]]:
    rows = yield Query("task_discard", _dead_letter_filter(ids, type, queue, limit))
    return [r["id"] for r in rows]
