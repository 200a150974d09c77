"""How errors become HTTP responses: one JSON shape (``ErrorOut``) for every refusal.

The library raises its own exceptions (pgqueue.errors) and FastAPI and Starlette raise theirs;
the handlers here map each to the fixed status codes the package docstring promises, so that
no route has to catch anything. The middlewares use :func:`error` too, so that a 401 or a 413
sent before the application runs has the same body as one sent by a route.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgqueue import log
from pgqueue.api.schemas import ErrorOut, FieldError
from pgqueue.api.waiters import TooManyWaiters
from pgqueue.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    InvalidTaskState,
    PayloadTooLarge,
    QueueNotFound,
    SchemaNotReady,
    TaskNotFound,
    ValidationError,
)
from pgqueue.roles import PrivilegeMissing

# The errors most endpoints can answer with, for their OpenAPI ``responses``.
COMMON = (401, 413, 422, 503)


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` for these error codes, so each route documents its refusals
    with one shared schema and wording.

    A route that lists 400 (malformed JSON) takes a JSON body, and so can also answer 415
    (JsonBodies, pgqueue.api.middleware): listed with it here, so that no route that takes a
    body can forget it and none without one claims it."""
    text = {
        400: "Malformed JSON",
        401: "Missing or invalid bearer token",
        404: "No such task (or queue)",
        409: "The task's status does not allow this",
        413: "Body too large (body_too_large), or the payload over PGQUEUE_MAX_PAYLOAD_BYTES "
        "(payload_too_large)",
        415: "The body is not sent as JSON: send Content-Type: application/json",
        422: "Invalid fields",
        503: "Database unavailable",
    }
    if 400 in codes and 415 not in codes:
        codes = (*codes, 415)
    return {c: {"model": ErrorOut, "description": text[c]} for c in codes}


def error(code: int, error: str, message: str, **extra: Any) -> JSONResponse:
    body = ErrorOut(error=error, message=message, **extra).model_dump(exclude_none=True)
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse(body, status_code=code, headers=headers)


def _field_name(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error(400, "malformed_json", "the request body is not valid JSON")
    fields = [
        FieldError(field=_field_name(tuple(e.get("loc", ()))), message=str(e.get("msg", "")))
        for e in errors
    ]
    return error(
        422, "invalid_request", "; ".join(f"{f.field}: {f.message}" for f in fields), errors=fields
    )


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI could not decode the body (bad UTF-8, too deep, ...)
        return error(400, "malformed_json", f"the request body is not valid JSON: {exc.detail}")
    names = {404: "not_found", 405: "method_not_allowed"}
    response = error(exc.status_code, names.get(exc.status_code, "http_error"), str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def on_pgqueue_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, PayloadTooLarge):  # the payload rule's 413, apart from the body's
        return error(
            413,
            "payload_too_large",
            f"{exc} (PGQUEUE_MAX_PAYLOAD_BYTES)",
            errors=[FieldError(field=exc.field, message=exc.reason)],
        )
    if isinstance(exc, ValidationError):
        # A function task's argument is a field of the payload: payload.order_id.
        field = f"{exc.field}.{exc.argument}" if isinstance(exc, InvalidArgument) else exc.field
        return error(
            422,
            "invalid_request",
            str(exc),
            errors=[FieldError(field=field, message=exc.reason)],
        )
    if isinstance(exc, TaskNotFound | QueueNotFound):
        return error(404, "not_found", str(exc))
    if isinstance(exc, InvalidTaskState):
        return error(409, "conflict", str(exc), status=exc.status)
    if isinstance(exc, PrivilegeMissing):  # like the schema: someone must run the grants
        log.event("api.database_permission_denied", logging.ERROR, detail=exc.detail)
        return error(503, "database_permission_denied", str(exc))
    if isinstance(exc, SchemaNotReady):  # not a retry-later: someone must run the migrations
        return error(503, "schema_not_ready", str(exc))
    if isinstance(exc, DatabaseUnavailable):
        return error(503, "unavailable", str(exc))
    if isinstance(exc, TooManyWaiters):  # ?wait= beyond PGQUEUE_API_MAX_WAITERS
        response = error(503, "too_many_waiters", str(exc))
        response.headers["Retry-After"] = "1"
        return response
    return error(500, "internal_error", "unexpected error")
