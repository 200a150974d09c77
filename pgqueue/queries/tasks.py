"""One task, or a page of them, by id or filter: read, list, cancel; dead letters replayed,
discarded and counted. What the CLI, the HTTP API and ``pgqueue.get_task`` and friends run.
Statements: sql/tasks.sql.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pgqueue.error_text import ErrorText, split_error
from pgqueue.errors import TaskNotFound
from pgqueue.models import Priority, Task, TaskStatus
from pgqueue.queries.driver import Op, Query


def task_get(task_id: uuid.UUID) -> Op[Task]:
    rows = yield Query("task_get", {"id": task_id})
    if not rows:
        raise TaskNotFound(task_id)
    return Task.from_row(rows[0])


@dataclasses.dataclass(frozen=True)
class TaskSummary:
    """A task as a list shows it: every field of ``Task`` but its payload and result, which
    are not read at all (task_list_summary), so a page costs the same whatever was submitted.

    ``payload_stored_bytes`` and ``result_stored_bytes`` (None: no result) are what the values
    take as stored (``pg_column_size``: jsonb, after PostgreSQL's compression), read from the
    row without fetching the values. They are not the size of the JSON text that the size
    limits count: knowing that would take reading and printing each value, the cost this
    form exists to avoid. Enough to see which tasks carry large values, and to compare them.
    """

    id: uuid.UUID
    queue: str
    type: str
    priority: Priority
    status: TaskStatus
    attempts: int
    max_attempts: int
    visible_after: datetime
    idempotency_key: str | None
    last_error: str | None
    cancel_requested: bool
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    submitted_priority: Priority | None
    ready_since: datetime | None
    snoozes: int
    expires_at: datetime | None
    workflow_id: uuid.UUID | None
    parents_pending: int | None
    cancelled_by: uuid.UUID | None
    concurrency_key: str | None
    progress: dict[str, Any] | None
    payload_stored_bytes: int
    result_stored_bytes: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskSummary:
        # Decoded by Task.from_row, so that both forms read every column alike.
        task = Task.from_row({**row, "payload": None, "result": None})
        shared = {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)}
        return cls(
            **{name: value for name, value in shared.items() if name not in _LEFT_OUT},
            payload_stored_bytes=row["payload_stored_bytes"],
            result_stored_bytes=row["result_stored_bytes"],
        )

    @property
    def error(self) -> ErrorText | None:
        """The last error split into its summary (the exception) and its traceback."""
        return None if self.last_error is None else split_error(self.last_error)


_LEFT_OUT = frozenset({"payload", "result"})  # the fields of Task a summary has not


def _list_params(
    status: TaskStatus | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> dict[str, Any]:
    return {
        "status": status.value if status else None,
        "type": type,
        "queue": queue,
        "limit": limit,
        "before_created": before[0] if before else None,
        "before_id": before[1] if before else None,
    }


def task_list(
    *,
    status: TaskStatus | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> Op[list[Task]]:
    rows = yield Query("task_list", _list_params(status, type, queue, limit, before))
    return [Task.from_row(r) for r in rows]


def task_list_summary(
    *,
    status: TaskStatus | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> Op[list[TaskSummary]]:
    """task_list's page, as summaries: what a list that shows no payload or result reads."""
    rows = yield Query("task_list_summary", _list_params(status, type, queue, limit, before))
    return [TaskSummary.from_row(r) for r in rows]


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
