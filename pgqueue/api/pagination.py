"""Pages of tasks, newest first, for /tasks and /dead-letters.

The cursor is the last task's (created_at, id), the listing's sort key, so a page follows
from where the last one ended even while tasks are added; opaque (base64) so that clients
pass it back rather than build one.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgqueue import aio
from pgqueue.api.schemas import TaskOut, TaskPage, TaskSummaryOut, TaskSummaryPage
from pgqueue.api.state import ApiState
from pgqueue.errors import ValidationError
from pgqueue.models import Task, TaskStatus
from pgqueue.operations import list_args
from pgqueue.queries import driver, task_types, tasks
from pgqueue.queries.tasks import TaskSummary

# The list endpoints' 200: which of the two shapes comes back.
PAGE_DESCRIPTION = {
    "description": "A page of whole tasks (TaskPage), or with fields=summary of tasks without "
    "their payloads and results (TaskSummaryPage)"
}


def encode_cursor(task: Task | TaskSummary) -> str:
    raw = f"{task.created_at.isoformat()}|{task.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, task_id = raw.partition("|")
        return datetime.fromisoformat(created), uuid.UUID(task_id)
    except (ValueError, UnicodeDecodeError):
        raise ValidationError("cursor", "is not a cursor this API returned") from None


async def task_page(
    state: ApiState,
    status: TaskStatus | str | None,
    type: str | None,
    queue: str | None,
    limit: int,
    cursor: str | None,
    fields: str = "full",
) -> TaskPage | TaskSummaryPage:
    """A page of whole tasks, or with ``fields="summary"`` of summaries, read by a statement
    that leaves the payload and the result in the database (task_list_summary): each may be a
    MiB, and a list that shows neither, refreshed every few seconds, should not cost that."""
    before = decode_cursor(cursor) if cursor else None
    if fields == "summary":
        args = list_args(status, type, queue, limit, before)
        async with state.connection() as conn:
            summaries = await driver.arun(conn, tasks.task_list_summary(**args))
            timeouts = await declared_timeouts(conn, summaries)
        return TaskSummaryPage(
            items=[
                TaskSummaryOut.of_summary(t, timeout_seconds=timeout_of(t, timeouts))
                for t in summaries
            ],
            next_cursor=encode_cursor(summaries[-1]) if len(summaries) == limit else None,
        )
    async with state.connection() as conn:
        whole = await aio.list_tasks(
            conn, status=status, type=type, queue=queue, limit=limit, before=before
        )
        timeouts = await declared_timeouts(conn, whole)
    next_cursor = encode_cursor(whole[-1]) if len(whole) == limit else None
    items = [TaskOut.of(t, timeout_seconds=timeout_of(t, timeouts)) for t in whole]
    return TaskPage(items=items, next_cursor=next_cursor)


async def declared_timeouts(conn: Any, page: Sequence[Task | TaskSummary]) -> dict[str, float]:
    """The handler timeouts the running tasks' types declare (pgqueue.task_types, as workers
    recorded them), read only when some task is running: what shows a task overrunning its
    timeout (a sync handler's thread the worker waits for) without anything more recorded."""
    if not any(t.status is TaskStatus.RUNNING for t in page):
        return {}
    rows = await driver.arun(conn, task_types.task_types_list())
    return {r["type"]: float(r["timeout"]) for r in rows if r["timeout"] is not None}


def timeout_of(task: Task | TaskSummary, timeouts: dict[str, float]) -> float | None:
    return timeouts.get(task.type) if task.status is TaskStatus.RUNNING else None
