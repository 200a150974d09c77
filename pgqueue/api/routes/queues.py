"""/api/v1/queues: each queue's settings: list them, pause and resume, set retention, and
remove them."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Query

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import QueueOut, QueueRemovedOut, RetentionIn

router = APIRouter(prefix=V1, route_class=Route)


@router.get("/queues", response_model=list[QueueOut], responses=responses(*COMMON))
async def list_queues(state: AppState) -> list[QueueOut]:
    """Queues with tasks (in any status) or a setting, and whether each is paused."""
    async with state.connection() as conn:
        states = await aio.list_queues(conn)
    return [QueueOut(**dataclasses.asdict(q)) for q in states]


@router.post(
    "/queues/{name:pgqueue_name}/pause",
    response_model=QueueOut,
    responses=responses(404, *COMMON),
)
async def pause_queue(
    name: str,
    state: AppState,
    create: Annotated[
        bool,
        Query(
            description="Pause a queue that has no tasks and no settings yet (without it, "
            "such a name is refused with 404: most often it is a typo)."
        ),
    ] = False,
) -> QueueOut:
    """Stop every worker from claiming this queue's tasks until it is resumed (running
    tasks finish; submitting still works; it stays paused across restarts)."""
    async with state.connection() as conn:
        paused = await aio.pause_queue(conn, name, create=create)
    return QueueOut(**dataclasses.asdict(paused))


@router.delete(
    "/queues/{name:pgqueue_name}",
    response_model=QueueRemovedOut,
    responses=responses(*COMMON),
)
async def remove_queue(name: str, state: AppState) -> QueueRemovedOut:
    """Forget this queue's settings (paused, retention): a paused queue runs again, with the
    workers' retention; its tasks are not touched (``removed`` says whether it had any)."""
    async with state.connection() as conn:
        removed = await aio.remove_queue(conn, name)
    return QueueRemovedOut(name=name, removed=removed)


@router.post(
    "/queues/{name:pgqueue_name}/resume",
    response_model=QueueOut,
    responses=responses(404, *COMMON),
)
async def resume_queue(name: str, state: AppState) -> QueueOut:
    """Let workers claim this queue's tasks again; idle workers are woken at once. A queue
    with no tasks and no settings is refused with 404 (most often a typo)."""
    async with state.connection() as conn:
        resumed = await aio.resume_queue(conn, name, missing_ok=False)
    return QueueOut(**dataclasses.asdict(resumed))


@router.put(
    "/queues/{name:pgqueue_name}/retention",
    response_model=QueueOut,
    responses=responses(400, 404, *COMMON),
)
async def set_queue_retention(
    name: str,
    body: RetentionIn,
    state: AppState,
    create: Annotated[
        bool,
        Query(
            description="Set it on a queue that has no tasks and no settings yet (without it, "
            "such a name is refused with 404: most often it is a typo)."
        ),
    ] = False,
) -> QueueOut:
    """How long this queue's finished tasks are kept, in place of the workers' defaults;
    pruning applies it from its next round on."""
    async with state.connection() as conn:
        q = await aio.set_queue_retention(
            conn, name, completed=body.completed_seconds, dead=body.dead_seconds, create=create
        )
    return QueueOut(**dataclasses.asdict(q))
