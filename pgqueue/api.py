"""The HTTP API: submit, inspect and cancel tasks, and operate the dead-letter queue.

An ASGI application (FastAPI) over :mod:`pgqueue.aio`; it holds no SQL. Run it with
``pgqueue serve``, or mount it in your own ASGI application::

    from pgqueue.api import ApiSettings, create_app
    app.mount("/queue", create_app(ApiSettings(database_url=URL, tokens={"s3cret"})))

Status codes are fixed: 202 for a new task, 200 with ``Idempotent-Replayed: true`` when an
idempotency key returns an existing task, 400 for malformed JSON, 401 without a valid bearer
token (when tokens are configured), 404 for an unknown or malformed id, 409 for an operation
the task's status does not allow, 413 for a body over the limit, 422 for invalid fields
(the body names each field and the reason), 503 when the database cannot be reached.

``/dashboard/`` serves a web page over this API (static files from ``pgqueue/dashboard``, under
a strict Content-Security-Policy); the page needs no token, the data it reads does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import hmac
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg
from fastapi import APIRouter, FastAPI, Header, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgqueue import aio, models, queries, tracing
from pgqueue.config import resolve_database_url
from pgqueue.enqueue import MAX_DELAY_SECONDS, MAX_IDEMPOTENCY_KEY_LENGTH
from pgqueue.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidTaskState,
    PgQueueError,
    SchemaNotReady,
    TaskNotFound,
    ValidationError,
)
from pgqueue.models import MAX_ATTEMPTS, Task, TaskStatus
from pgqueue.operations import DAY as _DAY
from pgqueue.operations import MAX_RATE, MAX_RUNNING, MAX_SERIES_MINUTES

ENV_TOKENS = "PGQUEUE_API_TOKENS"
ENV_TOKENS_FILE = "PGQUEUE_API_TOKENS_FILE"
ENV_MAX_BODY = "PGQUEUE_API_MAX_BODY_BYTES"
DEFAULT_MAX_BODY = 1024 * 1024
MAX_PAGE = 500
MAX_RETENTION = 10 * 365 * _DAY  # as the library's check_seconds


# --- settings ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """How the API runs. ``tokens`` empty means no authentication (loopback use only)."""

    # Out of repr: settings get printed and logged, and both may hold secrets.
    database_url: str | None = dataclasses.field(default=None, repr=False)
    tokens: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY
    pool_size: int = 10

    @classmethod
    def from_env(cls) -> ApiSettings:
        """Tokens from ``PGQUEUE_API_TOKENS`` (comma-separated) and/or the file named by
        ``PGQUEUE_API_TOKENS_FILE`` (one per line, # comments); the body limit from
        ``PGQUEUE_API_MAX_BODY_BYTES``."""
        tokens = {t.strip() for t in os.environ.get(ENV_TOKENS, "").split(",") if t.strip()}
        path = os.environ.get(ENV_TOKENS_FILE, "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigurationError(f"{ENV_TOKENS_FILE}: cannot read {path}: {exc}") from None
            tokens |= {t for t in (ln.strip() for ln in lines) if t and not t.startswith("#")}
        raw = os.environ.get(ENV_MAX_BODY, "").strip()
        try:
            max_body = int(raw) if raw else DEFAULT_MAX_BODY
        except ValueError:
            raise ConfigurationError(f"{ENV_MAX_BODY} must be an integer, not {raw!r}") from None
        if max_body < 1024:
            raise ConfigurationError(f"{ENV_MAX_BODY} must be at least 1024, not {max_body}")
        return cls(tokens=frozenset(tokens), max_body_bytes=max_body)


# --- wire models -----------------------------------------------------------------------------


def _none_as_empty(value: Any) -> Any:
    return {} if value is None else value


def _fold_name(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _datetime_text(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string with a time zone offset")
    return value


class SubmitTask(BaseModel):
    """A task to submit. ``run_at`` (with a time zone) or ``delay_seconds`` schedules it."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, max_length=200, examples=["send_email"])
    # null means "no payload" ({}), as None does in the library and no --payload in the CLI.
    payload: Annotated[dict[str, Any], BeforeValidator(_none_as_empty)] = Field(
        default_factory=dict, examples=[{"to": "a@example.com"}]
    )
    # The library's rule: a name in any case, surrounding spaces ignored.
    priority: Annotated[Literal["high", "normal", "low"], BeforeValidator(_fold_name)] = "normal"
    queue: str = Field("default", min_length=1, max_length=200)
    idempotency_key: str | None = Field(None, min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LENGTH)
    # Strict, as the library is: a date-time string with an offset (not a Unix number), and an
    # integer (not "3", 2.0 or true).
    run_at: Annotated[AwareDatetime, BeforeValidator(_datetime_text)] | None = None
    delay_seconds: Annotated[float, Strict()] | None = Field(None, ge=0, le=MAX_DELAY_SECONDS)
    max_attempts: Annotated[int, Strict()] | None = Field(None, ge=1, le=MAX_ATTEMPTS)


class TaskOut(BaseModel):
    task_id: uuid.UUID
    status: Literal["queued", "running", "completed", "failed", "cancelled"]
    created_at: datetime
    type: str
    queue: str
    priority: str
    payload: dict[str, Any]
    result: Any = None
    attempts: int
    max_attempts: int
    last_error: str | None
    idempotency_key: str | None
    cancel_requested: bool
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None = Field(None, description="While running: the worker holding the lease.")
    lease_expires_at: datetime | None = Field(
        None, description="While running: when the lease runs out unless the worker renews it."
    )

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return cls(
            task_id=task.id,
            status=task.status.value,
            created_at=task.created_at,
            type=task.type,
            queue=task.queue,
            priority=task.priority.label,
            payload=task.payload,
            result=task.result,
            attempts=task.attempts,
            max_attempts=task.max_attempts,
            last_error=task.last_error,
            idempotency_key=task.idempotency_key,
            cancel_requested=task.cancel_requested,
            run_at=task.visible_after,
            started_at=task.started_at,
            finished_at=task.finished_at,
            worker=task.lease_owner,
            lease_expires_at=task.lease_expires_at,
        )


class TaskPage(BaseModel):
    items: list[TaskOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class CancelOut(BaseModel):
    task_id: uuid.UUID
    status: Literal["cancelled", "running"]
    cancel_requested: bool


class DeadLetterFilter(BaseModel):
    """Which dead letters to act on: by type and/or queue, or ``all``."""

    model_config = ConfigDict(extra="forbid")

    type: str | None = Field(None, min_length=1, max_length=200)
    queue: str | None = Field(None, min_length=1, max_length=200)
    all: bool = False
    limit: int = Field(1000, ge=1, le=10_000, description="At most this many per call.")


class BulkOut(BaseModel):
    count: int
    task_ids: list[uuid.UUID]


class DepthRow(BaseModel):
    queue: str
    priority: str
    status: str
    tasks: int
    ready: int
    scheduled: int
    oldest_ready_age_seconds: float | None


class ThroughputRow(BaseModel):
    queue: str
    completed: int
    failed: int


class ScheduleOut(BaseModel):
    name: str
    cron: str
    timezone: str
    type: str
    queue: str
    last_tick: datetime | None
    next_tick: datetime | None
    updated_at: datetime


class QueueOut(BaseModel):
    name: str
    paused: bool
    paused_at: datetime | None
    updated_at: datetime | None
    completed_retention: float | None = Field(
        None, description="Seconds completed and cancelled tasks are kept (null: the default)."
    )
    dead_retention: float | None = Field(
        None, description="Seconds dead letters are kept (null: the default)."
    )


class RetentionIn(BaseModel):
    """A queue's retention, both at once; null (or left out) is the workers' default."""

    model_config = ConfigDict(extra="forbid")

    completed_seconds: Annotated[float, Strict()] | None = Field(None, gt=0, le=MAX_RETENTION)
    dead_seconds: Annotated[float, Strict()] | None = Field(None, gt=0, le=MAX_RETENTION)


class LimitIn(BaseModel):
    """A limit, set as a whole: a part left null is no limit of that kind."""

    model_config = ConfigDict(extra="forbid")

    max_running: Annotated[int, Strict()] | None = Field(None, ge=0, le=MAX_RUNNING)
    rate: Annotated[int, Strict()] | None = Field(None, ge=0, le=MAX_RATE)
    per_seconds: Annotated[float, Strict()] = Field(1.0, gt=0, le=MAX_RETENTION)


class LimitOut(BaseModel):
    kind: Literal["type", "queue"]
    name: str
    max_running: int | None
    rate: int | None
    per_seconds: float | None
    running: int = Field(description="Tasks running under the limit now.")
    recent_starts: int = Field(description="Starts within the rate window.")
    updated_at: datetime | None

    @classmethod
    def of(cls, limit: models.Limit) -> LimitOut:
        return cls(
            kind=limit.kind.value,
            name=limit.name,
            max_running=limit.max_running,
            rate=limit.rate_limit,
            per_seconds=limit.rate_period,
            running=limit.running,
            recent_starts=limit.recent_starts,
            updated_at=limit.updated_at,
        )


class LimitRemovedOut(BaseModel):
    kind: Literal["type", "queue"]
    name: str
    removed: bool


class ThroughputPointOut(BaseModel):
    minute: datetime = Field(description="The minute's start (UTC).")
    completed: int
    failed: int = Field(description="Dead-lettered (attempts spent) in this minute.")


class ThroughputSeriesOut(BaseModel):
    minutes: int
    queue: str | None = Field(description="The queue counted; null: every queue together.")
    points: list[ThroughputPointOut] = Field(
        description="One per minute, oldest first; the last is the current, partial minute."
    )


class FailureOut(BaseModel):
    task_id: uuid.UUID
    type: str
    queue: str
    priority: str
    attempts: int
    max_attempts: int
    last_error: str | None
    started_at: datetime | None = Field(description="When the failed attempt started.")
    retry_at: datetime | None = Field(description="Retrying: when the next attempt may start.")
    finished_at: datetime | None = Field(description="Dead: when it was dead-lettered.")

    @classmethod
    def of(cls, failure: models.Failure) -> FailureOut:
        return cls(
            task_id=failure.task_id,
            type=failure.type,
            queue=failure.queue,
            priority=failure.priority.label,
            attempts=failure.attempts,
            max_attempts=failure.max_attempts,
            last_error=failure.last_error,
            started_at=failure.started_at,
            retry_at=failure.retry_at,
            finished_at=failure.finished_at,
        )


class FailuresOut(BaseModel):
    retrying: list[FailureOut] = Field(
        description="Queued again after a failed attempt, the latest next attempt first."
    )
    dead: list[FailureOut] = Field(description="Dead letters (attempts spent), newest first.")


class StatsOut(BaseModel):
    depth: list[DepthRow]
    throughput: list[ThroughputRow]
    window_seconds: float
    paused_queues: list[str] = Field(
        default_factory=list, description="Queues no worker claims from until resumed."
    )


class FieldError(BaseModel):
    field: str
    message: str


class ErrorOut(BaseModel):
    error: str
    message: str
    status: str | None = None
    errors: list[FieldError] | None = None


class HealthOut(BaseModel):
    status: str
    schema_revision: str | None = None


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Malformed JSON",
        401: "Missing or invalid bearer token",
        404: "No such task",
        409: "The task's status does not allow this",
        413: "Body too large",
        422: "Invalid fields",
        503: "Database unavailable",
    }
    return {c: {"model": ErrorOut, "description": text[c]} for c in codes}


COMMON = (401, 413, 422, 503)


# Query parameters shared by the list endpoints (module level: FastAPI resolves annotations
# by name, and `from __future__ import annotations` makes them names).
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
Name = Annotated[str | None, Query(min_length=1, max_length=200)]
Cursor = Annotated[str | None, Query(max_length=200)]


# --- errors ----------------------------------------------------------------------------------


def _error(code: int, error: str, message: str, **extra: Any) -> JSONResponse:
    body = ErrorOut(error=error, message=message, **extra).model_dump(exclude_none=True)
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse(body, status_code=code, headers=headers)


def _field_name(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error(400, "malformed_json", "the request body is not valid JSON")
    fields = [
        FieldError(field=_field_name(tuple(e.get("loc", ()))), message=str(e.get("msg", "")))
        for e in errors
    ]
    return _error(
        422, "invalid_request", "; ".join(f"{f.field}: {f.message}" for f in fields), errors=fields
    )


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI could not decode the body (bad UTF-8, too deep, ...)
        return _error(400, "malformed_json", f"the request body is not valid JSON: {exc.detail}")
    names = {404: "not_found", 405: "method_not_allowed"}
    response = _error(exc.status_code, names.get(exc.status_code, "http_error"), str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def _on_pgqueue_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ValidationError):
        return _error(
            422,
            "invalid_request",
            str(exc),
            errors=[FieldError(field=exc.field, message=exc.reason)],
        )
    if isinstance(exc, TaskNotFound):
        return _error(404, "not_found", str(exc))
    if isinstance(exc, InvalidTaskState):
        return _error(409, "conflict", str(exc), status=exc.status)
    if isinstance(exc, SchemaNotReady):  # not a retry-later: someone must run the migrations
        return _error(503, "schema_not_ready", str(exc))
    if isinstance(exc, DatabaseUnavailable):
        return _error(503, "unavailable", str(exc))
    return _error(500, "internal_error", "unexpected error")


# --- the body limit (before FastAPI reads the body) -------------------------------------------

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
        await _send_error(send, _error(401, "unauthorized", problem))


class Measure:
    """Request count and latency by route template (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs more per request than the whole submit's SQL)."""

    def __init__(self, app: ASGIApp, state: _State) -> None:
        self.app = app
        self.state = state

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
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope.get("method", "")
            self.state.latency.labels(method, route).observe(time.perf_counter() - started)
            self.state.requests.labels(method, route, str(status)).inc()


def _too_large(limit: int) -> JSONResponse:
    return _error(413, "body_too_large", f"the request body exceeds {limit} bytes")


async def _send_error(send: Any, response: JSONResponse) -> None:
    headers = [(k.encode(), v.encode()) for k, v in response.headers.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


# --- the dashboard ---------------------------------------------------------------------------

# The page is static: files shipped in the package (pgqueue/dashboard), no data in them, no
# build step. Its script reads everything from /api/v1 with the bearer token the user enters.
DASHBOARD_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
# Only this server's files and API: no inline script or style, no eval, no framing, no forms
# posted anywhere. Task payloads and errors are rendered as text; should one ever reach the
# page as markup, it still could not run.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DASHBOARD_HEADERS = {
    "Content-Security-Policy": DASHBOARD_CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: an upgraded pgqueue serves its new script
}


@functools.cache
def _dashboard_file(name: str) -> bytes:
    return resources.files("pgqueue").joinpath("dashboard", name).read_bytes()


def _dashboard_response(name: str) -> Response:
    return Response(
        _dashboard_file(name), media_type=DASHBOARD_FILES[name], headers=DASHBOARD_HEADERS
    )


# --- the application -------------------------------------------------------------------------


class _State:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.pool: AsyncConnectionPool[Any] | None = None
        self.head: str | None = None
        self.schema_ok = False  # the schema was seen at head (see check_schema)
        self._opening = asyncio.Lock()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pgqueue_api_requests_total",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pgqueue_api_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=self.registry,
        )
        self.submitted = Counter(
            "pgqueue_api_tasks_submitted_total",
            "Tasks submitted",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.depth = Gauge(
            "pgqueue_queue_depth",
            "Waiting, running and dead-lettered tasks by queue, priority and status",
            ["queue", "priority", "status"],
            registry=self.registry,
        )
        self.ready = Gauge(
            "pgqueue_queue_ready",
            "Queued tasks that are due now",
            ["queue", "priority"],
            registry=self.registry,
        )
        self.oldest = Gauge(
            "pgqueue_queue_oldest_ready_age_seconds",
            "Age of the oldest ready task",
            ["queue", "priority"],
            registry=self.registry,
        )
        self.paused = Gauge(
            "pgqueue_queue_paused",
            "1 while a queue is paused (no worker claims from it)",
            ["queue"],
            registry=self.registry,
        )
        # Limits (pgqueue limit): what each allows and what it uses now, so that a type held
        # back by its limit shows as such next to its growing backlog.
        self.limit_max_running = Gauge(
            "pgqueue_limit_max_running",
            "A limit's most tasks running at once across the fleet",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_running = Gauge(
            "pgqueue_limit_running_tasks",
            "Tasks running under a limit now (expired leases count until swept)",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_rate = Gauge(
            "pgqueue_limit_rate_starts",
            "A limit's most starts per window",
            ["kind", "name", "per_seconds"],
            registry=self.registry,
        )
        self.limit_recent_starts = Gauge(
            "pgqueue_limit_recent_starts",
            "Starts under a rate limit within its window now",
            ["kind", "name"],
            registry=self.registry,
        )

    async def open(self) -> None:
        """Resolve the URL (maybe starting the embedded server) and open the pool, once.

        Called by the lifespan, and on first use too: an app mounted inside another ASGI app
        does not get lifespan events from Starlette's Mount.
        """
        async with self._opening:
            if self.pool is not None:
                return
            from pgqueue import migrate

            url = await asyncio.to_thread(resolve_database_url, self.settings.database_url)
            self.head = await asyncio.to_thread(migrate.head)
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                url,
                min_size=1,
                max_size=self.settings.pool_size,
                open=False,
                kwargs={"connect_timeout": 5},
                # Checked before each loan: connections the server dropped while idle (a
                # restart, a failover) would otherwise fail one request each.
                check=AsyncConnectionPool.check_connection,
                name="pgqueue-api",
            )
            await pool.open(wait=False)
            self.pool = pool

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    @contextlib.asynccontextmanager
    async def connection(self, *, check_schema: bool = True) -> AsyncIterator[Any]:
        if self.pool is None:
            await self.open()
        assert self.pool is not None
        try:
            async with self.pool.connection(timeout=5) as conn:
                if check_schema and not self.schema_ok:
                    await self.check_schema(conn)
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise DatabaseUnavailable(f"database unavailable: {exc}") from None

    async def check_schema(self, conn: Any) -> str:
        """The schema's revision, or SchemaNotReady unless it is this pgqueue's. Task
        endpoints run it on first use and again after each refusal, not on every request (as
        the worker and the Client check once); /readyz runs it every time."""
        revision = await queries.arun(conn, queries.schema_version())
        if revision != self.head:
            await conn.rollback()
            from pgqueue import migrate

            if revision is not None and not await asyncio.to_thread(migrate.known, revision):
                raise migrate.unknown_revision(revision)
            raise SchemaNotReady(
                f"the pgqueue schema is at revision {revision or 'none'} but this pgqueue "
                f"needs {self.head}; run `pgqueue migrate`"
            )
        self.schema_ok = True
        assert revision is not None  # equal to the head, which open() has set
        return revision


def _encode_cursor(task: Task) -> str:
    raw = f"{task.created_at.isoformat()}|{task.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, task_id = raw.partition("|")
        return datetime.fromisoformat(created), uuid.UUID(task_id)
    except (ValueError, UnicodeDecodeError):
        raise ValidationError("cursor", "is not a cursor this API returned") from None


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """The API as an ASGI app; mount it anywhere."""
    settings = settings or ApiSettings.from_env()
    state = _State(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.open()
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(
        title="pgqueue",
        version="1",
        summary="Submit, inspect and cancel tasks of a PostgreSQL-backed job queue.",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(PgQueueError, _on_pgqueue_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)

    # Authentication is enforced by the BearerAuth middleware (before any body is read);
    # this dependency only declares the scheme in the OpenAPI document.
    bearer = HTTPBearer(auto_error=False, description="A token from PGQUEUE_API_TOKENS")
    api = APIRouter(prefix="/api/v1", dependencies=[Security(bearer)] if settings.tokens else [])

    @api.post(
        "/tasks",
        status_code=202,
        response_model=TaskOut,
        responses={
            200: {
                "model": TaskOut,
                "description": "The idempotency key was used before: the original task, unchanged",
            },
            **_responses(400, *COMMON),
        },
    )
    async def submit(
        body: SubmitTask,
        request: Request,
        response: Response,
        idempotency_key: Annotated[
            str | None, Header(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LENGTH)
        ] = None,
    ) -> TaskOut:
        """Submit a task: 202 with the new task, or 200 with the original one when its
        idempotency key (body field or ``Idempotency-Key`` header) was used before."""
        key = body.idempotency_key or idempotency_key
        if body.idempotency_key and idempotency_key and body.idempotency_key != idempotency_key:
            raise ValidationError("idempotency_key", "the header and the body field differ")
        # The caller's traceparent parents the submit span (when tracing is on and no
        # request span already does), so its trace reaches the worker that runs the task.
        with tracing.remote_parent(request.headers):
            async with state.connection() as conn:
                result = await aio.enqueue(
                    conn,
                    body.type,
                    body.payload,
                    priority=body.priority,
                    queue=body.queue,
                    idempotency_key=key,
                    run_at=body.run_at,
                    delay=body.delay_seconds,
                    max_attempts=body.max_attempts,
                )
        state.submitted.labels(body.queue, "created" if result.created else "replayed").inc()
        if not result.created:
            response.status_code = 200
            response.headers["Idempotent-Replayed"] = "true"
        return TaskOut.of(result.task)

    @api.get("/tasks/{task_id}", response_model=TaskOut, responses=_responses(404, *COMMON))
    async def get_task(task_id: str) -> TaskOut:
        """A task's status, result, attempts, last error and timestamps."""
        async with state.connection() as conn:
            return TaskOut.of(await aio.get_task(conn, task_id))

    @api.delete(
        "/tasks/{task_id}",
        response_model=CancelOut,
        responses={
            202: {
                "model": CancelOut,
                "description": "Running: cancellation requested; the handler decides",
            },
            **_responses(404, 409, *COMMON),
        },
    )
    async def cancel_task(task_id: str, response: Response) -> CancelOut:
        """Cancel a task: 200 when it was queued (it will never run); 202 when it is running
        (its handler is asked to stop); 409 when it has already finished."""
        async with state.connection() as conn:
            task = await aio.cancel(conn, task_id)
        if task.status is TaskStatus.RUNNING:
            response.status_code = 202
            return CancelOut(task_id=task.id, status="running", cancel_requested=True)
        return CancelOut(task_id=task.id, status="cancelled", cancel_requested=True)

    async def _page(
        status: TaskStatus | str | None,
        type: str | None,
        queue: str | None,
        limit: int,
        cursor: str | None,
    ) -> TaskPage:
        before = _decode_cursor(cursor) if cursor else None
        async with state.connection() as conn:
            tasks = await aio.list_tasks(
                conn, status=status, type=type, queue=queue, limit=limit, before=before
            )
        next_cursor = _encode_cursor(tasks[-1]) if len(tasks) == limit else None
        return TaskPage(items=[TaskOut.of(t) for t in tasks], next_cursor=next_cursor)

    @api.get("/tasks", response_model=TaskPage, responses=_responses(*COMMON))
    async def list_tasks(
        status: Literal["queued", "running", "completed", "failed", "cancelled"] | None = None,
        type: Name = None,
        queue: Name = None,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> TaskPage:
        """Tasks newest first, filtered; follow ``next_cursor`` for more."""
        return await _page(status, type, queue, limit, cursor)

    @api.get("/dead-letters", response_model=TaskPage, responses=_responses(*COMMON))
    async def list_dead_letters(
        type: Name = None,
        queue: Name = None,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> TaskPage:
        """The dead-letter queue (status ``failed``), newest first."""
        return await _page(TaskStatus.FAILED, type, queue, limit, cursor)

    @api.post(
        "/dead-letters/{task_id}/replay",
        response_model=TaskOut,
        responses=_responses(404, 409, *COMMON),
    )
    async def replay_one(task_id: str) -> TaskOut:
        """Put one dead letter back in the queue with fresh attempts."""
        async with state.connection() as conn:
            done = await aio.replay(conn, [task_id], limit=1)
            task = await aio.get_task(conn, task_id)
        if not done:
            raise InvalidTaskState(task.id, task.status.value, "is not a dead letter")
        return TaskOut.of(task)

    def _selection(body: DeadLetterFilter) -> None:
        if not (body.all or body.type or body.queue):
            raise ValidationError("all", "give type and/or queue, or all: true")
        if body.all and (body.type or body.queue):
            raise ValidationError("all", "all: true cannot be combined with a filter")

    @api.post("/dead-letters/replay", response_model=BulkOut, responses=_responses(400, *COMMON))
    async def replay_many(body: DeadLetterFilter) -> BulkOut:
        """Replay dead letters matching the filter (at most ``limit`` per call)."""
        _selection(body)
        async with state.connection() as conn:
            ids = await aio.replay(conn, type=body.type, queue=body.queue, limit=body.limit)
        return BulkOut(count=len(ids), task_ids=ids)

    @api.delete(
        "/dead-letters/{task_id}", response_model=BulkOut, responses=_responses(404, 409, *COMMON)
    )
    async def discard_one(task_id: str) -> BulkOut:
        """Delete one dead letter for good."""
        async with state.connection() as conn:
            task = await aio.get_task(conn, task_id)
            ids = await aio.discard(conn, [task.id], limit=1)
        if not ids:
            raise InvalidTaskState(task.id, task.status.value, "is not a dead letter")
        return BulkOut(count=1, task_ids=ids)

    @api.post("/dead-letters/discard", response_model=BulkOut, responses=_responses(400, *COMMON))
    async def discard_many(body: DeadLetterFilter) -> BulkOut:
        """Delete dead letters matching the filter (at most ``limit`` per call)."""
        _selection(body)
        async with state.connection() as conn:
            ids = await aio.discard(conn, type=body.type, queue=body.queue, limit=body.limit)
        return BulkOut(count=len(ids), task_ids=ids)

    @api.get("/schedules", response_model=list[ScheduleOut], responses=_responses(*COMMON))
    async def list_schedules() -> list[ScheduleOut]:
        """Periodic tasks the workers declared: cron, time zone, last tick and next run."""
        async with state.connection() as conn:
            rows = await aio.list_schedules(conn)
        return [ScheduleOut(**r) for r in rows]

    @api.get("/queues", response_model=list[QueueOut], responses=_responses(*COMMON))
    async def list_queues() -> list[QueueOut]:
        """Queues with unfinished tasks or a setting, and whether each is paused."""
        async with state.connection() as conn:
            states = await aio.list_queues(conn)
        return [QueueOut(**dataclasses.asdict(q)) for q in states]

    @api.post("/queues/{name}/pause", response_model=QueueOut, responses=_responses(*COMMON))
    async def pause_queue(name: str) -> QueueOut:
        """Stop every worker from claiming this queue's tasks until it is resumed (running
        tasks finish; submitting still works; it stays paused across restarts)."""
        async with state.connection() as conn:
            paused = await aio.pause_queue(conn, name)
        return QueueOut(**dataclasses.asdict(paused))

    @api.post("/queues/{name}/resume", response_model=QueueOut, responses=_responses(*COMMON))
    async def resume_queue(name: str) -> QueueOut:
        """Let workers claim this queue's tasks again; idle workers are woken at once."""
        async with state.connection() as conn:
            resumed = await aio.resume_queue(conn, name)
        return QueueOut(**dataclasses.asdict(resumed))

    @api.put(
        "/queues/{name}/retention", response_model=QueueOut, responses=_responses(400, *COMMON)
    )
    async def set_queue_retention(name: str, body: RetentionIn) -> QueueOut:
        """How long this queue's finished tasks are kept, in place of the workers' defaults;
        pruning applies it from its next round on."""
        async with state.connection() as conn:
            q = await aio.set_queue_retention(
                conn, name, completed=body.completed_seconds, dead=body.dead_seconds
            )
        return QueueOut(**dataclasses.asdict(q))

    @api.get("/limits", response_model=list[LimitOut], responses=_responses(*COMMON))
    async def list_limits() -> list[LimitOut]:
        """Every limit, with the tasks running under it and its starts in the rate window."""
        async with state.connection() as conn:
            limits = await aio.list_limits(conn)
        return [LimitOut.of(x) for x in limits]

    @api.put("/limits/{kind}/{name}", response_model=LimitOut, responses=_responses(400, *COMMON))
    async def set_limit(kind: Literal["type", "queue"], name: str, body: LimitIn) -> LimitOut:
        """Limit a task type or a queue across every worker: at most ``max_running`` at once
        and at most ``rate`` starts in any ``per_seconds`` window."""
        type_, queue = (name, None) if kind == "type" else (None, name)
        async with state.connection() as conn:
            limit = await aio.set_limit(
                conn,
                type=type_,
                queue=queue,
                max_running=body.max_running,
                rate=body.rate,
                per=body.per_seconds,
            )
        return LimitOut.of(limit)

    @api.delete(
        "/limits/{kind}/{name}", response_model=LimitRemovedOut, responses=_responses(*COMMON)
    )
    async def clear_limit(kind: Literal["type", "queue"], name: str) -> LimitRemovedOut:
        """Remove a limit (``removed`` says whether there was one)."""
        type_, queue = (name, None) if kind == "type" else (None, name)
        async with state.connection() as conn:
            removed = await aio.clear_limit(conn, type=type_, queue=queue)
        return LimitRemovedOut(kind=kind, name=name, removed=removed)

    @api.get("/stats", response_model=StatsOut, responses=_responses(*COMMON))
    async def stats(
        window_seconds: Annotated[float, Query(gt=0, le=86400)] = 60.0,
    ) -> StatsOut:
        """Waiting, running and dead-lettered tasks per queue, priority and status, with the
        oldest ready task's age (the autoscaling signal), and tasks finished per queue in the
        last ``window_seconds``. Completed and cancelled tasks are counted only there: counting
        every one kept would read the whole table on each call."""
        async with state.connection() as conn:
            depth = await aio.overview(conn)
            done = await aio.throughput(conn, window_seconds=window_seconds)
            queues = await aio.list_queues(conn)
        return StatsOut(
            depth=[DepthRow(**dataclasses.asdict(d)) for d in depth],
            throughput=[ThroughputRow(**dataclasses.asdict(t)) for t in done],
            window_seconds=window_seconds,
            paused_queues=sorted(q.name for q in queues if q.paused),
        )

    @api.get(
        "/throughput/series", response_model=ThroughputSeriesOut, responses=_responses(*COMMON)
    )
    async def throughput_series(
        minutes: Annotated[int, Query(ge=1, le=MAX_SERIES_MINUTES)] = 60,
        queue: Name = None,
    ) -> ThroughputSeriesOut:
        """Tasks completed and dead-lettered per minute over the last ``minutes`` (at most
        1440), of one ``queue`` or of every queue; every minute has a point."""
        async with state.connection() as conn:
            points = await aio.throughput_series(conn, minutes=minutes, queue=queue)
        return ThroughputSeriesOut(
            minutes=minutes,
            queue=queue,
            points=[ThroughputPointOut(**dataclasses.asdict(p)) for p in points],
        )

    @api.get("/failures", response_model=FailuresOut, responses=_responses(*COMMON))
    async def failures(limit: Limit = 20) -> FailuresOut:
        """Recent failures with their errors: up to ``limit`` tasks waiting for a retry after a
        failed attempt, and up to ``limit`` of the newest dead letters."""
        async with state.connection() as conn:
            found = await aio.recent_failures(conn, limit=limit)
        return FailuresOut(
            retrying=[FailureOut.of(f) for f in found if not f.dead],
            dead=[FailureOut.of(f) for f in found if f.dead],
        )

    async def metrics() -> Response:
        with contextlib.suppress(PgQueueError):
            async with state.connection() as conn:
                depth = await aio.overview(conn)
                queues = await aio.list_queues(conn)
                limits = await aio.list_limits(conn)
            state.depth.clear()
            state.ready.clear()
            state.oldest.clear()
            state.paused.clear()
            for gauge in (
                state.limit_max_running,
                state.limit_running,
                state.limit_rate,
                state.limit_recent_starts,
            ):
                gauge.clear()
            for x in limits:
                target = (x.kind.value, x.name)
                state.limit_running.labels(*target).set(x.running)
                if x.max_running is not None:
                    state.limit_max_running.labels(*target).set(x.max_running)
                if x.rate_limit is not None and x.rate_period is not None:
                    state.limit_rate.labels(*target, f"{x.rate_period:g}").set(x.rate_limit)
                    state.limit_recent_starts.labels(*target).set(x.recent_starts)
            for q in queues:
                state.paused.labels(q.name).set(1 if q.paused else 0)
            for d in depth:
                state.depth.labels(d.queue, d.priority, d.status).set(d.tasks)
                if d.status == TaskStatus.QUEUED:
                    state.ready.labels(d.queue, d.priority).set(d.ready)
                    state.oldest.labels(d.queue, d.priority).set(d.oldest_ready_age_seconds or 0)
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(api)
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard_redirect() -> Response:
        # A relative Location, so it also works where the app is mounted under a prefix; the
        # page's relative links (app.js, ../api/v1/...) need the trailing slash.
        return Response(status_code=307, headers={**DASHBOARD_HEADERS, "Location": "dashboard/"})

    @app.get("/dashboard/", include_in_schema=False)
    async def dashboard() -> Response:
        """The dashboard (no token needed for the page; its data needs one)."""
        return _dashboard_response("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def dashboard_file(name: str) -> Response:
        if name not in DASHBOARD_FILES or name == "index.html":
            raise StarletteHTTPException(404, "no such dashboard file")
        return _dashboard_response(name)

    @app.get("/healthz", response_model=HealthOut)
    async def healthz() -> HealthOut:
        """The process is alive (no database access, no authentication)."""
        return HealthOut(status="ok")

    @app.get("/readyz", response_model=HealthOut, responses={503: {"model": ErrorOut}})
    async def readyz() -> Any:
        """The database is reachable and its schema is at this pgqueue's revision."""
        try:
            async with state.connection(check_schema=False) as conn:
                revision = await state.check_schema(conn)
        except PgQueueError as exc:
            return _error(503, "not_ready", str(exc))
        return HealthOut(status="ready", schema_revision=revision)

    app.add_middleware(Measure, state=state)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(BearerAuth, tokens=settings.tokens)  # outermost: before any body
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory pgqueue.api:app_from_env`` (what ``pgqueue serve`` runs)."""
    settings = ApiSettings.from_env()
    url = os.environ.get("PGQUEUE_DATABASE_URL") or None
    return create_app(dataclasses.replace(settings, database_url=url))
