"""/api/v1/limits: how many tasks of a type or a queue may run at once (in all, and per
concurrency key), and how often they may start, across every worker."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import LimitIn, LimitOut, LimitRemovedOut

router = APIRouter(prefix=V1, route_class=Route)

Kind = Literal["type", "queue"]


def _target(kind: Kind, name: str) -> tuple[str | None, str | None]:
    # The library takes the limit's target as one of two keywords, type= or queue=.
    return (name, None) if kind == "type" else (None, name)


@router.get("/limits", response_model=list[LimitOut], responses=responses(*COMMON))
async def list_limits(state: AppState) -> list[LimitOut]:
    """Every limit, with the tasks running under it, its starts in the rate window, and its
    concurrency keys with tasks running and at their per-key cap."""
    async with state.connection() as conn:
        limits = await aio.list_limits(conn)
    return [LimitOut.of(x) for x in limits]


@router.put(
    "/limits/{kind}/{name:pgqueue_name}",
    response_model=LimitOut,
    responses=responses(400, *COMMON),
)
async def set_limit(kind: Kind, name: str, body: LimitIn, state: AppState) -> LimitOut:
    """Limit a task type or a queue across every worker: at most ``max_running`` at once,
    ``rate`` starts per ``per_seconds`` (spaced evenly with a ``burst``, else in any window of
    that length), and at most ``per_key_max_running`` at once per concurrency key. A limit
    set here is the operator's: a rate_limit the workers declare never overwrites it."""
    type_, queue = _target(kind, name)
    async with state.connection() as conn:
        limit = await aio.set_limit(
            conn,
            type=type_,
            queue=queue,
            max_running=body.max_running,
            rate=body.rate,
            per=body.per_seconds,
            per_key_max_running=body.per_key_max_running,
            burst=body.burst,
        )
    return LimitOut.of(limit)


@router.delete(
    "/limits/{kind}/{name:pgqueue_name}",
    response_model=LimitRemovedOut,
    responses=responses(*COMMON),
)
async def clear_limit(kind: Kind, name: str, state: AppState) -> LimitRemovedOut:
    """Remove a limit (``removed`` says whether there was one)."""
    type_, queue = _target(kind, name)
    async with state.connection() as conn:
        removed = await aio.clear_limit(conn, type=type_, queue=queue)
    return LimitRemovedOut(kind=kind, name=name, removed=removed)
