"""The API's ASGI middlewares: finishing the read of refused uploads, authentication,
cross-site writes, the body limit, the JSON content type and request metrics.

Plain ASGI classes rather than Starlette's BaseHTTPMiddleware, which costs more per request
than the whole submit's SQL; and middlewares rather than dependencies, because the token, the
body size and the content type are checked before FastAPI reads or parses the body.
``create_app`` adds them so that FinishReading runs first, then CrossSiteWrites, BearerAuth,
BodyLimit, JsonBodies and Measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

from pgqueue.api.errors import error
from pgqueue.api.metrics import ApiMetrics

ASGIApp = Callable[..., Awaitable[None]]

# How much of a refused request's body is read and thrown away, at most, before the
# connection is closed (see FinishReading).
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 10.0


def _header(scope: MutableMapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


def _has_body(scope: MutableMapping[str, Any]) -> bool:
    """Whether the request's framing announces a body (a Content-Length above 0, or a
    Transfer-Encoding); a request without either has none (RFC 9112, section 6.3)."""
    if _header(scope, b"transfer-encoding") is not None:
        return True
    length = _header(scope, b"content-length")
    return length is not None and length.strip() not in (b"", b"0")


class FinishReading:
    """Never leave a refused upload half-read on a connection that stays open: when a
    response starts before the request body has been read to its end (a 401, 403, 413 or 415
    from the middlewares below, a 404 or 405 from the router), say ``Connection: close``, send
    the response, then read and discard the rest of the body (at most DRAIN_BYTES, for at
    most DRAIN_SECONDS) before the response is complete.

    Why: a response sent before the body was read leaves the rest of the upload to the
    server. uvicorn reads and throws it away on a connection it keeps open, but closes that
    connection at shutdown, after its keep-alive timeout, or when a response says so; and
    closing a socket with data unread makes the kernel send a reset, in which a client that
    is still sending (most write the whole request before reading) loses the answer it had
    not read yet. Here the refused request's connection ends, and the close comes after the
    upload, as a clean one. A client that sent ``Expect: 100-continue`` and no body yet is
    not asked for it: reading would tell it to send; the close alone ends the request.
    """

    def __init__(
        self, app: ASGIApp, limit: int = DRAIN_BYTES, seconds: float = DRAIN_SECONDS
    ) -> None:
        self.app = app
        self.limit = limit
        self.seconds = seconds

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        finished = False  # the body has been read to its end, or the client has gone
        started = False  # some of the body has been asked for
        unread = False  # the response started before the body was read to its end

        async def tracked() -> Any:
            nonlocal finished, started
            started = True
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                finished = True
            return message

        async def finishing(message: Any) -> None:
            nonlocal unread
            if message["type"] == "http.response.start" and not finished:
                unread = True
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            elif (
                message["type"] == "http.response.body"
                and unread
                and not message.get("more_body", False)
            ):
                await send({**message, "more_body": True})
                await self._drain(scope, tracked, lambda: finished, lambda: started)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app(scope, tracked, finishing)

    async def _drain(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        finished: Callable[[], bool],
        started: Callable[[], bool],
    ) -> None:
        if not started() and (_header(scope, b"expect") or b"").lower() == b"100-continue":
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return  # too much to read: the close ends it
        read = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.seconds):
                while not finished() and read <= self.limit:
                    read += len((await receive()).get("body", b""))


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before the application parses them: by
    Content-Length when given, and otherwise by reading at most ``limit`` bytes of the stream
    (chunked uploads) and stopping there. A body within the limit is handed on whole.
    (FinishReading, around it, reads what is left of a refused body.)"""

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


class JsonBodies:
    """Refuse a POST, PUT or PATCH whose body is not declared JSON with 415, naming the
    header to send: without it FastAPI reads such a body as bytes and answers a 422 that
    blames the fields ("Input should be a valid dictionary"), not the header. Accepted:
    ``application/json`` and ``application/*+json``, any case, with any parameters but a
    charset other than UTF-8 (JSON is UTF-8, RFC 8259). A write without a body (pause a queue)
    needs no Content-Type."""

    WRITES = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in self.WRITES:
            await self.app(scope, receive, send)
            return
        problem = _not_json(_header(scope, b"content-type")) if _has_body(scope) else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        # Chunked framing may still carry nothing: such a request has no body to declare.
        first = await receive()
        if first["type"] == "http.request" and not first.get("body") and not first.get("more_body"):
            delivered = False

            async def replay() -> Any:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return first
                return await receive()

            await self.app(scope, replay, send)
            return
        await _send_error(send, error(415, "unsupported_media_type", problem))


def _not_json(value: bytes | None) -> str | None:
    """Why a Content-Type is not one of JSON, or None when it is."""
    send = "send the body as JSON with Content-Type: application/json"
    if value is None or not value.strip():
        return f"the request has a body but no Content-Type header; {send}"
    media, *parameters = value.decode("latin-1").split(";")
    media = media.strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        return f"the request body is declared {media!r}, not JSON; {send}"
    for parameter in parameters:
        name, _, given = parameter.partition("=")
        charset = given.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return f"the charset {charset!r} is not supported: JSON is UTF-8; {send}"
    return None


class Measure:
    """Request count and latency by route template (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs more per request than the whole submit's SQL).

    The label is always a route's template or "unmatched", so that its values are as many as
    the app's routes, whatever paths clients ask for."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, routes: Sequence[Any] = ()) -> None:
        self.app = app
        self.metrics = metrics
        # The app's own route list (not a copy): FastAPI's router puts an APIRoute in the
        # scope, but for the plain Starlette routes FastAPI adds itself (/openapi.json, /docs,
        # /docs/oauth2-redirect, /redoc) only their endpoint; their template is found here.
        self.routes = routes
        self._templates: dict[Any, str] = {}

    def template(self, scope: MutableMapping[str, Any]) -> str:
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        endpoint = scope.get("endpoint")
        if endpoint is None:
            return "unmatched"
        if endpoint not in self._templates:  # learnt once per endpoint; routes can be added
            for candidate in self.routes:
                if getattr(candidate, "endpoint", None) is endpoint:
                    self._templates[endpoint] = str(candidate.path)
                    break
        return self._templates.get(endpoint, "unmatched")

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
            route = self.template(scope)
            method = scope.get("method", "")
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
            self.metrics.requests.labels(method, route, str(status)).inc()


def _too_large(limit: int) -> JSONResponse:
    return error(
        413,
        "body_too_large",
        f"the request body exceeds {limit} bytes (PGQUEUE_API_MAX_BODY_BYTES; by default the "
        "payload limit, PGQUEUE_MAX_PAYLOAD_BYTES, plus 64 KiB for the rest of the request)",
    )


async def _send_error(send: Any, response: JSONResponse) -> None:
    headers = [(k.encode(), v.encode()) for k, v in response.headers.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
