"""/healthz and /readyz: liveness and readiness for a process supervisor or a load balancer,
outside /api/v1 and open without a token (BearerAuth leaves them open), as probes carry none.

Added to the app itself by :func:`add_to` rather than through an APIRouter: FastAPI lists an
included router in ``app.routes`` as one opaque entry, and whoever checks that an app serves
its probes' paths (the deployment manifests' test does) reads ``app.routes``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from pgqueue import migrate
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import error
from pgqueue.api.schemas import ErrorOut, HealthOut, LivenessOut
from pgqueue.errors import PgQueueError
from pgqueue.roles import privileges_explained

# How long /healthz waits for a database connection: a liveness probe must answer quickly
# (Kubernetes gives it 1 s by default) whatever the database does.
HEALTH_WAIT_SECONDS = 0.5


async def healthz(state: AppState) -> LivenessOut:
    """The process is alive: 200 whatever the database says (no authentication), with the
    schema revision the database is at and whether it is the one this pgqueue expects
    (read waiting at most HEALTH_WAIT_SECONDS; /readyz is the probe that fails on it)."""
    revision, reachable = None, True
    try:
        with privileges_explained():
            async with state.connection(check_schema=False, timeout=HEALTH_WAIT_SECONDS) as conn:
                revision = await state.schema_revision(conn)
    except PgQueueError:
        reachable = False
    expected = state.head or migrate.head()
    return LivenessOut(
        status="ok",
        database="reachable" if reachable else "unreachable",
        schema_revision=revision,
        expected_schema_revision=expected,
        schema_current=revision == expected,
    )


async def readyz(state: AppState) -> Any:
    """The database is reachable and its schema is at this pgqueue's revision."""
    try:
        with privileges_explained():
            async with state.connection(check_schema=False) as conn:
                revision = await state.check_schema(conn)
    except PgQueueError as exc:
        return error(503, "not_ready", str(exc))
    return HealthOut(status="ready", schema_revision=revision)


def add_to(app: FastAPI) -> None:
    app.get("/healthz", response_model=LivenessOut)(healthz)
    app.get("/readyz", response_model=HealthOut, responses={503: {"model": ErrorOut}})(readyz)
