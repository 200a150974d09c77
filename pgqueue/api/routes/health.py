"""/healthz and /readyz: liveness and readiness for a process supervisor or a load balancer,
outside /api/v1 and open without a token (BearerAuth leaves them open), as probes carry none.

Added to the app itself by :func:`add_to` rather than through an APIRouter: FastAPI lists an
included router in ``app.routes`` as one opaque entry, and whoever checks that an app serves
its probes' paths (the deployment manifests' test does) reads ``app.routes``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import error
from pgqueue.api.schemas import ErrorOut, HealthOut
from pgqueue.errors import PgQueueError


async def healthz() -> HealthOut:
    """The process is alive (no database access, no authentication)."""
    return HealthOut(status="ok")


async def readyz(state: AppState) -> Any:
    """The database is reachable and its schema is at this pgqueue's revision."""
    try:
        async with state.connection(check_schema=False) as conn:
            revision = await state.check_schema(conn)
    except PgQueueError as exc:
        return error(503, "not_ready", str(exc))
    return HealthOut(status="ready", schema_revision=revision)


def add_to(app: FastAPI) -> None:
    app.get("/healthz", response_model=HealthOut)(healthz)
    app.get("/readyz", response_model=HealthOut, responses={503: {"model": ErrorOut}})(readyz)
