"""The API's ASGI middlewares: authentication, cross-site writes, the body limit and request
metrics.

Plain ASGI classes rather than Starlette's BaseHTTPMiddleware, which costs more per request
than the whole submit's SQL; and middlewares rather than dependencies, because the token and
the body size are checked before FastAPI reads or parses the body. ``create_app`` adds them so
that CrossSiteWrites runs first, then BearerAuth, then BodyLimit, then Measure.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from pgqueue.api.errors import error
from pgqueue.api.metrics import ApiMetrics

ASGIApp = Callable[..., Awaitable[None]]


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before the application parses them: by
    Content-Length when given, and otherwise by reading at most ``limit`` bytes of the stream
    (chunked uploads) and stopping there. A body within the limit is handed on whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_error(send, _too_large(self.limit))
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _send_error(send, _too_large(self.limit))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


class BearerAuth:
    """With tokens configured, every request but /healthz, /readyz and the dashboard's static
    files needs ``Authorization: Bearer TOKEN``; checked before the body is read or parsed.
    (The dashboard's files hold no data: its script asks the API for everything, with a
    token.)"""

    OPEN = ("/healthz", "/readyz", "/dashboard")
    OPEN_PREFIXES = ("/dashboard/",)

    def __init__(self, app: ASGIApp, tokens: frozenset[str]) -> None:
        self.app = app
        self.tokens = [t.encode() for t in tokens]

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.tokens:
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path in self.OPEN or path.startswith(self.OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers", [])).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            problem = "a bearer token is required (Authorization: Bearer TOKEN)"
        elif not any(hmac.compare_digest(token.strip(), t) for t in self.tokens):
            problem = "the bearer token is not valid"
        else:
            await self.app(scope, receive, send)
            return
        await _send_error(send, error(401, "unauthorized", problem))


class CrossSiteWrites:
    """Refuse a write (POST, PUT, PATCH, DELETE) that a browser sent from another site, with
    403, whatever the token setting: without tokens (loopback use) any page the operator has
    open could otherwise post a form to pause a queue or discard dead letters, since the
    browser would send it to 127.0.0.1. A bearer token stops such posts already (a form
    cannot set the header), so this is the rule for tokenless servers and a second lock for
    the others. The browser says where a request comes from: ``Sec-Fetch-Site`` (every
    current browser), else ``Origin`` compared with ``Host`` (the rule of Go's
    CrossOriginProtection). Clients that are not browsers send neither and pass."""

    UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in self.UNSAFE:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        site = headers.get(b"sec-fetch-site")
        origin = headers.get(b"origin")
        if site is not None:
            cross = site not in (b"same-origin", b"none")
        elif origin is not None:
            host = origin.partition(b"://")[2]
            cross = origin == b"null" or host != headers.get(b"host", b"")
        else:
            cross = False
        if not cross:
            await self.app(scope, receive, send)
            return
        problem = "a write sent by a page of another site is refused (cross-site request)"
        await _send_error(send, error(403, "cross_site_request", problem))


class Measure:
    """Request count and latency by route template (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs more per request than the whole submit's SQL)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # The template of the route the router chose ("/api/v1/tasks/{task_id}"), which
            # is why each router carries the /api/v1 prefix itself: FastAPI puts the route as
            # declared on its router in the scope, not as prefixed by include_router.
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope.get("method", "")
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
            self.metrics.requests.labels(method, route, str(status)).inc()


def _too_large(limit: int) -> JSONResponse:
    return error(413, "body_too_large", f"the request body exceeds {limit} bytes")


async def _send_error(send: Any, response: JSONResponse) -> None:
    headers = [(k.encode(), v.encode()) for k, v in response.headers.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
