"""/api/v1/failures: recent failed attempts with their errors, both those waiting for a retry
and the newest dead letters (the dashboard's failures panel)."""

from __future__ import annotations

from fastapi import APIRouter

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import FailureOut, FailuresOut, Limit

router = APIRouter(prefix=V1, route_class=Route)


@router.get("/failures", response_model=FailuresOut, responses=responses(*COMMON))
async def failures(state: AppState, limit: Limit = 20) -> FailuresOut:
    """Recent failures with their errors: up to ``limit`` tasks waiting for a retry after a
    failed attempt, and up to ``limit`` of the newest dead letters."""
    async with state.connection() as conn:
        found = await aio.recent_failures(conn, limit=limit)
    return FailuresOut(
        retrying=[FailureOut.of(f) for f in found if not f.dead],
        dead=[FailureOut.of(f) for f in found if f.dead],
    )
