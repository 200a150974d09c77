"""The routes, a module per resource: an APIRouter each for tasks, dead letters, schedules,
queues, limits, stats and failures (under /api/v1); and the Prometheus metrics, the
dashboard's files and the health checks outside it, which are the app's own routes (see
:mod:`pgqueue.api.routes.health`).

``pgqueue.api.app`` includes them in a fixed order, which is the order of the paths in the
OpenAPI document. The routers are built once per process and shared by every app; what
differs between apps (the database, the tokens) comes from the app's state and from the
dependencies ``create_app`` gives the /api/v1 routes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response

from pgqueue.roles import privileges_explained


class NameConvertor(Convertor[str]):
    """A queue's or a type's name in a path, ``{name:pgqueue_name}``: any text a submit
    accepts, "/" and newlines included. Starlette decodes %2F before it routes, so the default
    convertor (no "/") would leave such names unreachable, and ``path`` stops at a newline.
    The route's fixed end still decides, as the match is greedy: ``POST
    /queues/a/pause/pause`` pauses the queue "a/pause", and ``DELETE /queues/a/pause``
    removes it. Registered under a name of pgqueue's own: Starlette's registry is the
    process's, shared with the application that mounts the API."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("pgqueue_name", NameConvertor())


class Route(APIRoute):
    """Every route of /api/v1. A statement the database refuses for want of a privilege is
    pgqueue's PrivilegeMissing (a JSON 503 naming the table and the grants to run, through
    the app's handler of pgqueue's errors), not psycopg's error, which no handler knows and
    which Starlette would answer with a plain-text 500."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            with privileges_explained():
                return await handler(request)

        return run


# On each /api/v1 router itself, not given to include_router: the route template in the
# request metrics (and the scope's "route") is the path the route was declared with.
V1 = "/api/v1"
