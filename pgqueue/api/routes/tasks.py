"""/api/v1/tasks: submit a task, look at it, cancel it, and list tasks."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from pgqueue import aio, tracing
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.pagination import PAGE_DESCRIPTION, declared_timeouts, task_page, timeout_of
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import (
    CancelOut,
    Cursor,
    IdempotencyConflictOut,
    Limit,
    ListFields,
    Name,
    SubmitOut,
    SubmitTask,
    TaskOut,
    TaskPage,
    TaskStatusName,
    TaskSummaryPage,
)
from pgqueue.enqueue import MAX_IDEMPOTENCY_KEY_LENGTH, check_name
from pgqueue.errors import IdempotencyConflict, ValidationError, WaitTimeout
from pgqueue.models import Parent, Task, TaskStatus
from pgqueue.operations import parse_task_id

router = APIRouter(prefix=V1, route_class=Route)

# Where a submitted task can be read whole (the submit answer leaves its payload out).
LOCATION = {
    "Location": {
        "description": "The task's URL path, GET /api/v1/tasks/{task_id} (under the app's "
        "mount prefix, if any)",
        "schema": {"type": "string"},
    }
}


IDEMPOTENCY_HEADER = "Idempotency-Key"


def _header_text(value: str, header: str) -> str:
    """A header's value as the UTF-8 its client sent. ASGI servers hand headers over as
    bytes and Starlette decodes them as Latin-1, which would store a non-ASCII key garbled,
    and unequal to the same key sent in the body (a second task)."""
    try:
        text = value.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError(header, "is not valid UTF-8: send the key as UTF-8") from None
    return check_name(header, text, max_length=MAX_IDEMPOTENCY_KEY_LENGTH)


@router.post(
    "/tasks",
    status_code=202,
    response_model=SubmitOut,
    responses={
        202: {"description": "Accepted: the new task", "headers": LOCATION},
        200: {
            "model": SubmitOut,
            "description": "The idempotency key was used before: the original task, unchanged",
            "headers": LOCATION,
        },
        409: {
            "model": IdempotencyConflictOut,
            "description": "key_reuse 'refuse' and the idempotency key is held by a task with "
            "another type, queue, payload or concurrency key: nothing submitted",
        },
        **responses(400, *COMMON),
    },
)
async def submit(
    body: SubmitTask,
    request: Request,
    response: Response,
    state: AppState,
    idempotency_key: Annotated[
        str | None,
        # The length is checked once the key is decoded (a character may be several bytes):
        # declared here only for the OpenAPI document.
        Header(min_length=1, json_schema_extra={"maxLength": MAX_IDEMPOTENCY_KEY_LENGTH}),
    ] = None,
) -> SubmitOut | JSONResponse:
    """Submit a task: 202 with the new task, or 200 with the original one when its
    idempotency key (body field or ``Idempotency-Key`` header) was used before; either
    without the payload, and with the task's URL in ``Location``. With
    ``"key_reuse": "refuse"``, a used key answers 200 only for the same type, queue,
    payload and concurrency key, and 409 ``idempotency_conflict`` (the original's ``task_id``
    and the ``differing_fields``) otherwise."""
    if idempotency_key is not None:
        idempotency_key = _header_text(idempotency_key, IDEMPOTENCY_HEADER)
    key = body.idempotency_key or idempotency_key
    if body.idempotency_key and idempotency_key and body.idempotency_key != idempotency_key:
        raise ValidationError("idempotency_key", "the header and the body field differ")
    # The caller's traceparent parents the submit span (when tracing is on and no
    # request span already does), so its trace reaches the worker that runs the task.
    try:
        with tracing.remote_parent(request.headers):
            async with state.connection() as conn:
                # A function task's payload is its arguments: checked against the parameters
                # its workers recorded (422 naming the argument) before anything is written.
                await aio.check_arguments(conn, body.type, body.payload)
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
                    key_reuse=body.key_reuse,
                    expires_in=body.expires_in,
                    expires_at=body.expires_at,
                    concurrency_key=body.concurrency_key,
                )
    except IdempotencyConflict as exc:
        # Answered here rather than by the shared handlers: this body carries what only
        # this refusal has (the original task and the differing fields).
        state.metrics.count_submitted(body.queue or exc.original_queue, "refused")
        conflict = IdempotencyConflictOut(
            error="idempotency_conflict",
            message=str(exc),
            idempotency_key=exc.idempotency_key,
            task_id=exc.task_id,
            differing_fields=list(exc.differing_fields),
        )
        return JSONResponse(conflict.model_dump(mode="json"), status_code=409)
    submitted = result.task.queue  # the declared queue when the body gave none
    state.metrics.count_submitted(submitted, "created" if result.created else "replayed")
    if not result.created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    # A path, under the app's mount prefix or root_path when it has one. Looked up in this
    # app's own routes: request.url_for starts from the outermost router, which cannot see
    # them through a named mount or one wrapped in the host app's middleware (its login).
    path = request.app.url_path_for("get_task", task_id=str(result.task.id))
    response.headers["Location"] = request.scope.get("root_path", "").rstrip("/") + path
    return SubmitOut.of(result.task)


MAX_WAIT_SECONDS = 60  # a request held longer is more often cut by a proxy than answered


@router.get("/tasks/{task_id}", response_model=TaskOut, responses=responses(404, *COMMON))
async def get_task(
    task_id: str,
    state: AppState,
    response: Response,
    wait: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_WAIT_SECONDS,
            description="Seconds to wait for the task to finish (at most 60): the answer "
            "comes as soon as it is completed, failed or cancelled, or after this long with "
            "the task as it is then. `Pgqueue-Wait` says which: `finished` or `timeout`.",
        ),
    ] = None,
) -> TaskOut:
    """A task's status, result, attempts, last error and timestamps; with ``?wait=``, once it
    has finished (or the wait is up: the status is then still queued or running)."""
    if wait is None:
        async with state.connection() as conn:
            task = await aio.get_task(conn, task_id)
            return await _task_out(conn, task)
    try:
        task = await state.waiters.wait(parse_task_id(task_id), wait)
    except WaitTimeout as exc:
        response.headers["Pgqueue-Wait"] = "timeout"
        task = exc.task
    else:
        response.headers["Pgqueue-Wait"] = "finished"
    async with state.connection() as conn:
        return await _task_out(conn, task)


async def _task_out(conn: Any, task: Task) -> TaskOut:
    timeout = timeout_of(task, await declared_timeouts(conn, [task]))
    return TaskOut.of(task, *await _edges(conn, task), timeout_seconds=timeout)


async def _edges(conn: Any, task: Task) -> tuple[list[Parent], list[Parent]]:
    """The task's parents and children. Its parents are read only if it ever had
    some (parents_pending is set then); any task may have children (one probe of the
    dependencies' parent index)."""
    parents = [] if task.parents_pending is None else await aio.parents(conn, task.id)
    return parents, await aio.children(conn, task.id)


@router.delete(
    "/tasks/{task_id}",
    response_model=CancelOut,
    responses={
        202: {
            "model": CancelOut,
            "description": "Running: cancellation requested; the handler decides",
        },
        **responses(404, 409, *COMMON),
    },
)
async def cancel_task(task_id: str, response: Response, state: AppState) -> CancelOut:
    """Cancel a task: 200 when it was queued (it will never run); 202 when it is running
    (its handler is asked to stop); 409 when it has already finished."""
    async with state.connection() as conn:
        task = await aio.cancel(conn, task_id)
    if task.status is TaskStatus.RUNNING:
        response.status_code = 202
        return CancelOut(task_id=task.id, status="running", cancel_requested=True)
    return CancelOut(task_id=task.id, status="cancelled", cancel_requested=True)


@router.get(
    "/tasks",
    response_model=TaskPage | TaskSummaryPage,
    responses={200: PAGE_DESCRIPTION, **responses(*COMMON)},
)
async def list_tasks(
    state: AppState,
    status: TaskStatusName | None = None,
    type: Name = None,
    queue: Name = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    fields: ListFields = "full",
) -> TaskPage | TaskSummaryPage:
    """Tasks newest first, filtered; follow ``next_cursor`` for more. Whole tasks (TaskPage),
    or with ``fields=summary`` without their payloads and results (TaskSummaryPage)."""
    return await task_page(state, status, type, queue, limit, cursor, fields)
