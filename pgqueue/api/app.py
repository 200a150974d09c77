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
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgqueue.api import scopes
from pgqueue.api.dependencies import attach_state, authentication, state_of
from pgqueue.api.errors import on_http_error, on_pgqueue_error, on_validation
from pgqueue.api.middleware import (
    AllowedHosts,
    BearerAuth,
    BodyLimit,
    CrossSiteWrites,
    FinishReading,
    JsonBodies,
    LocalOnly,
    Measure,
)
from pgqueue.api.routes import (
    dashboard,
    dead_letters,
    docs,
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
        # FastAPI's own pages load their scripts from a CDN: routes.docs serves them whole.
        docs_url=None,
        redoc_url=None,
    )
    attach_state(app, state)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(PgQueueError, on_pgqueue_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.include_router(_v1(settings))
    metrics.add_to(app)
    dashboard.add_to(app)
    docs.add_to(app)
    health.add_to(app)
    app.openapi = _with_scopes(app, app.openapi)  # type: ignore[method-assign]
    # Each added one wraps the ones before: FinishReading runs first (it reads what is left
    # of any body refused below it), then AllowedHosts, LocalOnly, CrossSiteWrites and
    # BearerAuth, all before any body is read, then BodyLimit and JsonBodies.
    app.add_middleware(Measure, metrics=state.metrics, routes=app.router.routes)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=settings.body_limit(), seconds=settings.body_timeout)
    app.add_middleware(BearerAuth, tokens=settings.token_scopes(), routes=app.router.routes)
    app.add_middleware(CrossSiteWrites)
    if not settings.tokens and not settings.allow_unauthenticated:
        app.add_middleware(LocalOnly)
    app.add_middleware(AllowedHosts, check=settings.host_check())
    app.add_middleware(FinishReading)
    return app


REFUSED = {
    "400": "Malformed JSON, or the Host header not a name the API answers to "
    "(host_not_allowed: PGQUEUE_API_ALLOWED_HOSTS)",
    "403": "The token's scopes do not allow this (insufficient_scope); a write sent by a page "
    "of another site (cross_site_request); or, without tokens, a request from another machine "
    "(unauthenticated_remote)",
}


def _with_scopes(app: FastAPI, build: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document, with each operation's scope (``x-pgqueue-scope``, and a
    line of its description) from the one table in pgqueue.api.scopes, and the refusals
    every operation can answer (400 for the Host, 403)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        paths = document.get("paths", {})
        for context in iter_route_contexts(list(app.routes)):
            path = getattr(context, "path_format", None)
            for method in getattr(context, "methods", None) or ():
                operation = paths.get(path, {}).get(method.lower())
                if operation is None:
                    continue
                name = getattr(context, "name", None)
                operation["x-pgqueue-scope"] = list(scopes.needed(name))
                scope_line = f"Scope: {scopes.describe(name)}."
                text = operation.get("description")
                operation["description"] = f"{text}\n\n{scope_line}" if text else scope_line
                if scopes.OPEN in scopes.needed(name):
                    continue  # the probes: answered whatever the host, the peer, the token
                responses = operation.setdefault("responses", {})
                for code, description in REFUSED.items():
                    responses.setdefault(code, {"description": description})
                    responses[code]["description"] = description
                    responses[code].setdefault(
                        "content",
                        {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
                    )
        app.openapi_schema = document
        return document

    return openapi


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory pgqueue.api:app_from_env`` (what ``pgqueue serve`` runs)."""
    settings = ApiSettings.from_env()
    url = os.environ.get("PGQUEUE_DATABASE_URL") or None
    return create_app(dataclasses.replace(settings, database_url=url))
