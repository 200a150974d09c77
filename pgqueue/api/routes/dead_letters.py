"""/api/v1/dead-letters: tasks whose attempts are spent (status ``failed``); list them, and
replay or discard them one at a time or by filter."""

from __future__ import annotations

from fastapi import APIRouter

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.pagination import PAGE_DESCRIPTION, task_page
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import (
    BulkOut,
    Cursor,
    DeadLetterCount,
    DeadLetterFilter,
    Limit,
    ListFields,
    Name,
    TaskOut,
    TaskPage,
    TaskSummaryPage,
)
from pgqueue.errors import InvalidTaskState, ValidationError
from pgqueue.models import TaskStatus

router = APIRouter(prefix=V1, route_class=Route)


@router.get(
    "/dead-letters",
    response_model=TaskPage | TaskSummaryPage,
    responses={200: PAGE_DESCRIPTION, **responses(*COMMON)},
)
async def list_dead_letters(
    state: AppState,
    type: Name = None,
    queue: Name = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    fields: ListFields = "full",
) -> TaskPage | TaskSummaryPage:
    """The dead-letter queue (status ``failed``), newest first. Whole tasks (TaskPage), or
    with ``fields=summary`` without their payloads and results (TaskSummaryPage)."""
    return await task_page(state, TaskStatus.FAILED, type, queue, limit, cursor, fields)


@router.get("/dead-letters/count", response_model=DeadLetterCount, responses=responses(*COMMON))
async def count_dead_letters(
    state: AppState, type: Name = None, queue: Name = None
) -> DeadLetterCount:
    """How many dead letters match the filter (none: all of them), so that a bulk replay or
    discard can name its count before it is confirmed."""
    async with state.connection() as conn:
        return DeadLetterCount(count=await aio.count_dead_letters(conn, type=type, queue=queue))


@router.post(
    "/dead-letters/{task_id}/replay",
    response_model=TaskOut,
    responses=responses(404, 409, *COMMON),
)
async def replay_one(task_id: str, state: AppState) -> TaskOut:
    """Put one dead letter back in the queue with fresh attempts."""
    async with state.connection() as conn:
        done = await aio.replay(conn, [task_id], limit=1)
        task = await aio.get_task(conn, task_id)
    if not done:
        raise InvalidTaskState(task.id, task.status.value, "is not a dead letter")
    return TaskOut.of(task)


def _selection(body: DeadLetterFilter) -> None:
    # A bulk operation on every dead letter must be asked for by name, never by an empty filter.
    if not (body.all or body.type or body.queue):
        raise ValidationError("all", "give type and/or queue, or all: true")
    if body.all and (body.type or body.queue):
        raise ValidationError("all", "all: true cannot be combined with a filter")


@router.post("/dead-letters/replay", response_model=BulkOut, responses=responses(400, *COMMON))
async def replay_many(body: DeadLetterFilter, state: AppState) -> BulkOut:
    """Replay dead letters matching the filter (at most ``limit`` per call)."""
    _selection(body)
    async with state.connection() as conn:
        ids = await aio.replay(conn, type=body.type, queue=body.queue, limit=body.limit)
    return BulkOut(count=len(ids), task_ids=ids)


@router.delete(
    "/dead-letters/{task_id}", response_model=BulkOut, responses=responses(404, 409, *COMMON)
)
async def discard_one(task_id: str, state: AppState) -> BulkOut:
    """Delete one dead letter for good."""
    async with state.connection() as conn:
        task = await aio.get_task(conn, task_id)
        ids = await aio.discard(conn, [task.id], limit=1)
    if not ids:
        raise InvalidTaskState(task.id, task.status.value, "is not a dead letter")
    return BulkOut(count=1, task_ids=ids)


@router.post("/dead-letters/discard", response_model=BulkOut, responses=responses(400, *COMMON))
async def discard_many(body: DeadLetterFilter, state: AppState) -> BulkOut:
    """Delete dead letters matching the filter (at most ``limit`` per call)."""
    _selection(body)
    async with state.connection() as conn:
        ids = await aio.discard(conn, type=body.type, queue=body.queue, limit=body.limit)
    return BulkOut(count=len(ids), task_ids=ids)
