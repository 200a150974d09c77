"""/api/v1/tasks: submit a task, look at it, cancel it, and list tasks."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request, Response

from pgqueue import aio, tracing
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.pagination import task_page
from pgqueue.api.routes import V1
from pgqueue.api.schemas import CancelOut, Cursor, Limit, Name, SubmitTask, TaskOut, TaskPage
from pgqueue.enqueue import MAX_IDEMPOTENCY_KEY_LENGTH
from pgqueue.errors import ValidationError
from pgqueue.models import TaskStatus

router = APIRouter(prefix=V1)


@router.post(
    "/tasks",
    status_code=202,
    response_model=TaskOut,
    responses={
        200: {
            "model": TaskOut,
            "description": "The idempotency key was used before: the original task, unchanged",
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
            # A function task's payload is its arguments: checked against the parameters its
            # workers recorded (422 naming the argument) before anything is written.
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
            )
    submitted = result.task.queue  # the declared queue when the body gave none
    state.metrics.submitted.labels(submitted, "created" if result.created else "replayed").inc()
    if not result.created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return TaskOut.of(result.task)


@router.get("/tasks/{task_id}", response_model=TaskOut, responses=responses(404, *COMMON))
async def get_task(task_id: str, state: AppState) -> TaskOut:
    """A task's status, result, attempts, last error and timestamps."""
    async with state.connection() as conn:
        return TaskOut.of(await aio.get_task(conn, task_id))


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


@router.get("/tasks", response_model=TaskPage, responses=responses(*COMMON))
async def list_tasks(
    state: AppState,
    status: Literal["queued", "running", "completed", "failed", "cancelled"] | None = None,
    type: Name = None,
    queue: Name = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> TaskPage:
    """Tasks newest first, filtered; follow ``next_cursor`` for more."""
    return await task_page(state, status, type, queue, limit, cursor)
