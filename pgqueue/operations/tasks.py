"""Inspecting and operating on tasks by id or filter: get, list, cancel; dead letters
replayed, discarded and counted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pgqueue.errors import ValidationError
from pgqueue.models import Task, TaskStatus
from pgqueue.operations.checks import check_filters, check_limit, parse_status, parse_task_id
from pgqueue.queries import tasks
from pgqueue.queries.driver import Op, operation

TaskIds = uuid.UUID | str | Iterable[uuid.UUID | str]


def parse_task_ids(ids: TaskIds | None) -> list[uuid.UUID] | None:
    """One id (a UUID or its text) or an iterable of them, as a list; None is "by filter".

    A lone string is one id, not an iterable of characters: ``replay(conn, task_id)`` works
    as ``cancel(conn, task_id)`` does."""
    if ids is None:
        return None
    if isinstance(ids, uuid.UUID | str):
        return [parse_task_id(ids)]
    if isinstance(ids, bytes | Mapping) or not isinstance(ids, Iterable):
        raise ValidationError(
            "ids",
            f"must be a task id (a UUID or its text) or a list of them, not {type(ids).__name__}",
        )
    out: list[uuid.UUID] = []
    for i in ids:
        if not isinstance(i, uuid.UUID | str):
            raise ValidationError(
                "ids", f"each must be a task id (a UUID or its text), not {type(i).__name__}"
            )
        out.append(parse_task_id(i))
    return out


def list_args(
    status: TaskStatus | str | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: Task | tuple[datetime, uuid.UUID] | None,
) -> dict[str, Any]:
    cursor = (before.created_at, before.id) if isinstance(before, Task) else before
    check_filters(type=type, queue=queue)
    return {
        "status": parse_status(status),
        "type": type,
        "queue": queue,
        "limit": check_limit(limit),
        "before": cursor,
    }


@operation
def get_task(task_id: uuid.UUID | str) -> Op[Task]:
    """The task with this id; TaskNotFound for an unknown (or malformed) id."""
    return tasks.task_get(parse_task_id(task_id))


@operation
def list_tasks(
    *,
    status: TaskStatus | str | None = None,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    before: Task | tuple[datetime, uuid.UUID] | None = None,
) -> Op[list[Task]]:
    """Tasks newest first; pass the last task of a page as ``before`` for the next page."""
    return tasks.task_list(**list_args(status, type, queue, limit, before))


@operation
def cancel(task_id: uuid.UUID | str, *, now: datetime | None = None) -> Op[Task]:
    """Cancel a task.

    A queued (or scheduled) task becomes ``cancelled`` and will never run. A running task
    cannot be stopped from outside safely, so it is flagged and, when you commit, the worker
    holding its lease is notified: its handler sees ``context.should_stop()`` turn true at
    once (at the next heartbeat if the notification was lost) and may raise ``Cancel``; if
    it completes anyway, the result stands. A finished task raises InvalidTaskState.
    """
    return tasks.task_cancel(parse_task_id(task_id), now)


@operation
def replay(
    ids: uuid.UUID | str | Iterable[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
    now: datetime | None = None,
) -> Op[list[uuid.UUID]]:
    """Move dead letters (by id, or all matching the filters) back to queued with fresh attempts.

    Works in batches of at most ``limit``; call again until it returns an empty list to replay
    more. ``ids`` is one task id (a UUID or its text) or an iterable of them; either way the
    result is the list of the ids replayed, so ``[]`` for one id means it was not a dead
    letter (unknown, or in another state: ``get_task`` says which).
    """
    check_filters(type=type, queue=queue)
    parsed = parse_task_ids(ids)
    return tasks.task_replay(parsed, type, queue, check_limit(limit), now)


@operation
def discard(
    ids: uuid.UUID | str | Iterable[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
) -> Op[list[uuid.UUID]]:
    """Delete dead letters by id or filter (at most ``limit`` per call); returns the ids.
    ``ids`` is one task id or an iterable of them, as replay's."""
    check_filters(type=type, queue=queue)
    parsed = parse_task_ids(ids)
    return tasks.task_discard(parsed, type, queue, check_limit(limit))


@operation
def count_dead_letters(*, type: str | None = None, queue: str | None = None) -> Op[int]:
    """How many dead letters match the filters: what a ``replay`` or ``discard`` by the same
    filters would take (less any that change meanwhile), for a confirmation to name."""
    check_filters(type=type, queue=queue)
    return tasks.task_dead_count(type, queue)
