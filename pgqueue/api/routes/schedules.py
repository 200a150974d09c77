"""/api/v1/schedules: the periodic tasks the workers declared (read-only: schedules are
declared in the workers' code, not through the API)."""

from __future__ import annotations

from fastapi import APIRouter

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import ScheduleOut

router = APIRouter(prefix=V1, route_class=Route)


@router.get("/schedules", response_model=list[ScheduleOut], responses=responses(*COMMON))
async def list_schedules(state: AppState) -> list[ScheduleOut]:
    """Periodic tasks the workers declared: cron, time zone, last tick and next run."""
    async with state.connection() as conn:
        rows = await aio.list_schedules(conn)
    return [ScheduleOut(**r) for r in rows]
