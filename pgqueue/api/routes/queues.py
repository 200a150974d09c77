"""/api/v1/queues: each queue's settings: list them, pause and resume, and set retention."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1
from pgqueue.api.schemas import QueueOut, RetentionIn

router = APIRouter(prefix=V1)


@router.get("/queues", response_model=list[QueueOut], responses=responses(*COMMON))
async def list_queues(state: AppState) -> list[QueueOut]:
    """Queues with unfinished tasks or a setting, and whether each is paused."""
    async with state.connection() as conn:
        states = await aio.list_queues(conn)
    return [QueueOut(**dataclasses.asdict(q)) for q in states]


@router.post("/queues/{name}/pause", response_model=QueueOut, responses=responses(*COMMON))
async def pause_queue(name: str, state: AppState) -> QueueOut:
    """Stop every worker from claiming this queue's tasks until it is resumed (running
    tasks finish; submitting still works; it stays paused across restarts)."""
    async with state.connection() as conn:
        paused = await aio.pause_queue(conn, name)
    return QueueOut(**dataclasses.asdict(paused))


@router.post("/queues/{name}/resume", response_model=QueueOut, responses=responses(*COMMON))
async def resume_queue(name: str, state: AppState) -> QueueOut:
    """Let workers claim this queue's tasks again; idle workers are woken at once."""
    async with state.connection() as conn:
        resumed = await aio.resume_queue(conn, name)
    return QueueOut(**dataclasses.asdict(resumed))


@router.put("/queues/{name}/retention", response_model=QueueOut, responses=responses(400, *COMMON))
async def set_queue_retention(name: str, body: RetentionIn, state: AppState) -> QueueOut:
    """How long this queue's finished tasks are kept, in place of the workers' defaults;
    pruning applies it from its next round on."""
    async with state.connection() as conn:
        q = await aio.set_queue_retention(
            conn, name, completed=body.completed_seconds, dead=body.dead_seconds
        )
    return QueueOut(**dataclasses.asdict(q))
