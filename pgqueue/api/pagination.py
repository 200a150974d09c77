"""Pages of tasks, newest first, for /tasks and /dead-letters.

The cursor is the last task's (created_at, id), the listing's sort key, so a page follows
from where the last one ended even while tasks are added; opaque (base64) so that clients
pass it back rather than build one.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime

from pgqueue import aio
from pgqueue.api.schemas import TaskOut, TaskPage
from pgqueue.api.state import ApiState
from pgqueue.errors import ValidationError
from pgqueue.models import Task, TaskStatus


def encode_cursor(task: Task) -> str:
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
) -> TaskPage:
    before = decode_cursor(cursor) if cursor else None
    async with state.connection() as conn:
        tasks = await aio.list_tasks(
            conn, status=status, type=type, queue=queue, limit=limit, before=before
        )
    next_cursor = encode_cursor(tasks[-1]) if len(tasks) == limit else None
    return TaskPage(items=[TaskOut.of(t) for t in tasks], next_cursor=next_cursor)
