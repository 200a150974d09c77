"""The API's ASGI middlewares: finishing the read of refused uploads, the Host allow-list,
the local-only rule of a tokenless API, cross-site writes, authentication and scopes, the
body limit, the JSON content type and request metrics.

Plain ASGI classes rather than Starlette's BaseHTTPMiddleware, which costs more per request
than the whole submit's SQL; and middlewares rather than dependencies, because the host, the
token, the body size and the content type are checked before FastAPI reads or parses the
body. ``create_app`` adds them so that FinishReading runs first, then AllowedHosts,
LocalOnly, CrossSiteWrites, BearerAuth, BodyLimit, JsonBodies and Measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.routing import compile_path

from pgqueue.api import scopes
from pgqueue.api.errors import error
from pgqueue.api.metrics import ApiMetrics
from pgqueue.api.settings import ENV_ALLOW_UNAUTHENTICATED, ENV_ALLOWED_HOSTS, host_name

ASGIApp = Callable[..., Awaitable[None]]

# How much of a refused request's body is read and thrown away, at most, before the
# connection is closed (see FinishReading).
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 10.0
# Set in the scope by BodyLimit when a body did not arrive in time.
SLOW_BODY = "pgqueue.slow_body"
# The methods request metrics are labelled with; any other is counted as "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _header(scope: MutableMapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


def _route_path(scope: MutableMapping[str, Any]) -> str:
    """The path within the app, without the prefix it is mounted under."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path


# Liveness and readiness probes: answered whatever the Host and wherever the request comes
# from. A kubelet probes the pod's IP (Host: 10.1.2.3:8000), which no allow-list names, and
# the answer holds no data: alive, whether the database answers, the schema revision.
PROBES = ("/healthz", "/readyz")


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
        if scope.get(SLOW_BODY):
            return  # refused for arriving too slowly: waiting for the rest is what it wants
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
    (chunked uploads) and stopping there. A body within the limit is handed on whole, if it
    arrives within ``seconds`` (else 408: a client that sends its head and then dribbles the
    body must not hold a connection and a buffer for as long as it likes). (FinishReading,
    around it, reads what is left of a refused body.)"""

    def __init__(self, app: ASGIApp, limit: int, seconds: float = 60.0) -> None:
        self.app = app
        self.limit = limit
        self.seconds = seconds

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
        try:
            async with asyncio.timeout(self.seconds):
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
        except TimeoutError:
            scope[SLOW_BODY] = True  # FinishReading: do not wait for the rest of it
            problem = (
                f"the request body did not arrive within {self.seconds:g} s "
                f"({size} bytes received; PGQUEUE_API_BODY_TIMEOUT)"
            )
            await _send_error(send, error(408, "body_timeout", problem))
            return
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


class AllowedHosts:
    """Answer only requests sent to a host name the API is known by: others get 400
    ``host_not_allowed``, before anything else is looked at (but the probes, PROBES).

    Why: a page of another site can make a browser send requests to this API by DNS
    rebinding (its name, first its own server's address, is made to resolve to 127.0.0.1):
    the browser then takes the API for that site, sends ``Host: rebind.example``, and lets
    the page read the answers. Without a token to present, only the Host header tells such a
    request apart. ``check`` is ApiSettings.host_check's: None lets any host through."""

    def __init__(self, app: ASGIApp, check: Callable[[str], bool] | None) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.check is None or _route_path(scope) in PROBES:
            await self.app(scope, receive, send)
            return
        raw = _header(scope, b"host")
        host = host_name(raw.decode("latin-1")) if raw is not None else None
        if host is not None and self.check(host):
            await self.app(scope, receive, send)
            return
        shown = "no Host header" if raw is None else f"the Host {raw.decode('latin-1')[:100]!r}"
        problem = (
            f"{shown} is not a name this API answers to: list the names it is reached by in "
            f"{ENV_ALLOWED_HOSTS} (comma-separated; by default, without tokens, only "
            "localhost, 127.0.0.1 and ::1)"
        )
        await _send_error(send, error(400, "host_not_allowed", problem))


class LocalOnly:
    """Without tokens, answer only requests from this machine: a loopback peer, or none (a
    Unix socket, an in-process caller), and not forwarded by a proxy (``Forwarded``,
    ``X-Forwarded-For``, ``X-Real-IP``: a proxy on this machine may be passing on anyone's
    request). Others get 403 ``unauthenticated_remote`` (the probes, PROBES, excepted).

    Why here and not only in ``pgqueue serve``: an app mounted in another server, or run by
    uvicorn directly on 0.0.0.0, would otherwise serve every route to the network without
    authentication. Added only when the settings have no token and do not allow
    unauthenticated use."""

    FORWARDING = (b"forwarded", b"x-forwarded-for", b"x-real-ip")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _is_local(scope) or _route_path(scope) in PROBES:
            await self.app(scope, receive, send)
            return
        problem = (
            "this API has no tokens, and so answers only requests from its own machine: set "
            "PGQUEUE_API_TOKENS (or PGQUEUE_API_TOKENS_FILE), or, where something in front of "
            f"the API authenticates, {ENV_ALLOW_UNAUTHENTICATED}=1 "
            "(pgqueue serve --allow-unauthenticated)"
        )
        await _send_error(send, error(403, "unauthenticated_remote", problem))


def _is_local(scope: MutableMapping[str, Any]) -> bool:
    if any(_header(scope, name) is not None for name in LocalOnly.FORWARDING):
        return False
    client = scope.get("client")
    if client is None:  # no network peer: a Unix socket, or a caller in this process
        return True
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return False  # not an address: nothing says where it came from
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclasses.dataclass(frozen=True)
class _Route:
    name: str | None
    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str] | None


class RouteNames:
    """The name of the route a request will reach, found as the router will find it (the
    first route whose path and method match), before the router runs."""

    def __init__(self, routes: Sequence[Any]) -> None:
        # The app's own list, read on the first request: routes added after create_app
        # (before serving) are found too.
        self.routes = routes
        self._table: list[_Route] | None = None

    def table(self) -> list[_Route]:
        if self._table is None:
            table = []
            for context in iter_route_contexts(list(self.routes)):
                path = getattr(context, "path", None)
                if not isinstance(path, str):
                    continue
                methods = getattr(context, "methods", None)
                table.append(
                    _Route(
                        name=getattr(context, "name", None),
                        template=path,
                        pattern=compile_path(path)[0],
                        methods=frozenset(methods) if methods else None,
                    )
                )
            self._table = table
        return self._table

    def find(self, scope: MutableMapping[str, Any]) -> tuple[_Route | None, bool]:
        """The route the request reaches, and whether its method matches too (False: the
        router answers 405); (None, False) when no path matches (404)."""
        path = _route_path(scope)
        method = scope.get("method", "")
        partial = None
        for route in self.table():
            if route.pattern.match(path):
                if route.methods is None or method in route.methods:
                    return route, True
                partial = partial or route
        return partial, False


class BearerAuth:
    """With tokens configured, every request but the open routes (scopes.OPEN: the probes and
    the dashboard's static files, which hold no data) needs ``Authorization: Bearer TOKEN``,
    and a token whose scopes allow the route it reaches (scopes.ROUTE_SCOPES); checked before
    the body is read or parsed. A path no route has (404, 405) needs a valid token of any
    scope, so that probing paths tells nothing without one."""

    def __init__(
        self, app: ASGIApp, tokens: Mapping[str, frozenset[str]], routes: Sequence[Any]
    ) -> None:
        self.app = app
        self.tokens = [(t.encode(), s) for t, s in tokens.items()]
        self.routes = RouteNames(routes)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.tokens:
            await self.app(scope, receive, send)
            return
        route, full = self.routes.find(scope)
        name = route.name if route is not None else None
        if route is not None and scopes.OPEN in scopes.needed(name):
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"authorization") or b""
        scheme, _, given = header.partition(b" ")
        given = given.strip()
        granted: frozenset[str] | None = None
        for token, token_scopes in self.tokens:  # every one compared: the time tells nothing
            if hmac.compare_digest(given, token):
                granted = token_scopes
        if scheme.lower() != b"bearer" or not given:
            problem = "a bearer token is required (Authorization: Bearer TOKEN)"
        elif granted is None:
            problem = "the bearer token is not valid"
        elif route is None or not full or scopes.allows(granted, name):
            await self.app(scope, receive, send)
            return
        else:
            await _send_error(send, _insufficient_scope(scope, route, granted))
            return
        await _send_error(send, error(401, "unauthorized", problem))


def _insufficient_scope(
    scope: MutableMapping[str, Any], route: _Route, granted: frozenset[str]
) -> JSONResponse:
    needed = scopes.needed(route.name)
    problem = (
        f"{scope.get('method', '')} {route.template} needs a token with the scope "
        f"{scopes.describe(route.name)}; this token has {'+'.join(sorted(granted))}"
    )
    response = error(403, "insufficient_scope", problem)
    # RFC 6750, section 3: the narrowest scope that would do.
    response.headers["WWW-Authenticate"] = f'Bearer error="insufficient_scope", scope="{needed[0]}"'
    return response


class CrossSiteWrites:
    """Refuse a write (POST, PUT, PATCH, DELETE) that a browser sent from another site, with
    403, whatever the token setting: without tokens (loopback use) any page the operator has
    open could otherwise post a form to pause a queue or discard dead letters, since the
    browser would send it to 127.0.0.1. A bearer token stops such posts already (a form
    cannot set the header), so this is the rule for tokenless servers and a second lock for
    the others. The browser says where a request comes from: ``Sec-Fetch-Site`` (every
    current browser), else ``Origin`` compared with ``Host`` (the rule of Go's
    CrossOriginProtection): AllowedHosts, before this, has made sure that Host is a name
    the API is known by, so a page whose own name was rebound to the API cannot pass as its
    origin. Clients that are not browsers send neither and pass."""

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
        route = scope.get("route")
        # path_format: the template without converters ("/api/v1/queues/{name}/pause").
        path = getattr(route, "path_format", None) or getattr(route, "path", None)
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
            if method not in METHODS:  # a client's invented method is not a new series
                method = "other"
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
            self.metrics.requests.labels(method, route, str(status)).inc()


def _too_large(limit: int) -> JSONResponse:
    return error(
        413,
        "body_too_large",
        f"the request body exceeds {limit} bytes (PGQUEUE_API_MAX_BODY_BYTES; by default three "
        "times the payload limit, PGQUEUE_MAX_PAYLOAD_BYTES, for a client's escaping, plus "
        "64 KiB for the rest of the request)",
    )


async def _send_error(send: Any, response: JSONResponse) -> None:
    headers = [(k.encode(), v.encode()) for k, v in response.headers.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
