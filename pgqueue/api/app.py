"""The application factory: builds an app from the parts and wires them together.

Nothing is decided here that a part could decide itself; what remains is what differs per
app (its settings and state) and what only the whole can fix: the order of the routes (the
order of the paths in the OpenAPI document), which dependencies they get, the exception
handlers, and the order of the middlewares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgqueue.api.dependencies import attach_state, authentication, state_of
from pgqueue.api.errors import on_http_error, on_pgqueue_error, on_validation
from pgqueue.api.middleware import (
    BearerAuth,
    BodyLimit,
    CrossSiteWrites,
    FinishReading,
    JsonBodies,
    Measure,
)
from pgqueue.api.routes import (
    dashboard,
    dead_letters,
    failures,
    health,
    limits,
    metrics,
    queues,
    schedules,
    stats,
    tasks,
    workflows,
)
from pgqueue.api.settings import ApiSettings
from pgqueue.api.state import ApiState
from pgqueue.errors import PgQueueError

# In this order: it is the order of the paths in the OpenAPI document.
V1_ROUTERS = (
    tasks.router,
    dead_letters.router,
    schedules.router,
    queues.router,
    limits.router,
    stats.router,
    failures.router,
    workflows.router,
)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state = state_of(app)
    await state.open()
    try:
        yield
    finally:
        await state.close()


def _v1(settings: ApiSettings) -> APIRouter:
    # One router per app around the shared ones: the bearer scheme depends on this app's
    # settings, and the app lists /api/v1 as a single entry of app.routes, as it always has.
    v1 = APIRouter(dependencies=authentication(settings))
    for router in V1_ROUTERS:
        v1.include_router(router)
    return v1


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """The API as an ASGI app; mount it anywhere."""
    settings = settings or ApiSettings.from_env()
    state = ApiState(settings)
    app = FastAPI(
        title="pgqueue",
        version="1",
        summary="Submit, inspect and cancel tasks of a PostgreSQL-backed job queue.",
        lifespan=lifespan,
    )
    attach_state(app, state)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(PgQueueError, on_pgqueue_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.include_router(_v1(settings))
    metrics.add_to(app)
    dashboard.add_to(app)
    health.add_to(app)
    # Each added one wraps the ones before: FinishReading runs first (it reads what is left
    # of any body refused below it), then CrossSiteWrites and BearerAuth, both before any
    # body is read, then BodyLimit and JsonBodies.
    app.add_middleware(Measure, metrics=state.metrics, routes=app.router.routes)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=settings.body_limit())
    app.add_middleware(BearerAuth, tokens=settings.tokens)
    app.add_middleware(CrossSiteWrites)
    app.add_middleware(FinishReading)
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory pgqueue.api:app_from_env`` (what ``pgqueue serve`` runs)."""
    settings = ApiSettings.from_env()
    url = os.environ.get("PGQUEUE_DATABASE_URL") or None
    return create_app(dataclasses.replace(settings, database_url=url))
