"""The routes' dependencies: the app's state, and the bearer scheme the OpenAPI document
declares.

The routers are module-level, shared by every app built in the process, so a route cannot
close over its app's state as it did inside ``create_app``: it asks for ``AppState``, which
reads the state this request's app carries. (There is no per-request connection dependency
on purpose: a route takes a connection for its database work only, after FastAPI has
validated its input, so a malformed request is refused with 422 even while the database is
down, and a connection is never held while a response is written.)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.params import Depends as DependsParam
from fastapi.security import HTTPBearer
from starlette.applications import Starlette

from pgqueue.api.settings import ApiSettings
from pgqueue.api.state import ApiState

# Authentication is enforced by the BearerAuth middleware (before any body is read); this
# scheme only declares it in the OpenAPI document.
bearer = HTTPBearer(auto_error=False, description="A token from PGQUEUE_API_TOKENS")


def authentication(settings: ApiSettings) -> list[DependsParam]:
    """The dependencies of the /api/v1 routes: the bearer scheme when tokens are configured
    (without tokens the document declares no security, as the API asks for none)."""
    return [Security(bearer)] if settings.tokens else []


def attach_state(app: Starlette, state: ApiState) -> None:
    app.state.pgqueue = state


def state_of(app: Starlette) -> ApiState:
    state = app.state.pgqueue
    assert isinstance(state, ApiState)
    return state


async def get_state(request: Request) -> ApiState:
    # Async: FastAPI would run a plain function in its thread pool, on every request.
    return state_of(request.app)


AppState = Annotated[ApiState, Depends(get_state)]
