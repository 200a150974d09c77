"""The API's wire format: request bodies, responses and the shared query parameters.

Apart from the routes because these classes *are* the OpenAPI document's schemas: a class
name is a schema name and a class docstring is its description, so renaming a class or
giving one a docstring changes the published document (tests/unit/test_public_surface.py).
The limits here are the library's own (pgqueue.enqueue, pgqueue.models,
pgqueue.operations), so that the API refuses with a 422 what the library would refuse.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, Strict

from pgqueue import models
from pgqueue.enqueue import (
    MAX_CONCURRENCY_KEY_LENGTH,
    MAX_DELAY_SECONDS,
    MAX_IDEMPOTENCY_KEY_LENGTH,
)
from pgqueue.models import MAX_ATTEMPTS, Parent, Task, WorkflowInfo
from pgqueue.operations import DAY as _DAY
from pgqueue.operations import MAX_RATE, MAX_RUNNING
from pgqueue.queries.tasks import TaskSummary

MAX_PAGE = 500
MAX_RETENTION = 10 * 365 * _DAY  # as the library's check_seconds


def _none_as_empty(value: Any) -> Any:
    return {} if value is None else value


def _fold_name(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _datetime_text(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string with a time zone offset")
    return value


# --- tasks -----------------------------------------------------------------------------------


class SubmitTask(BaseModel):
    """A task to submit. ``run_at`` (with a time zone) or ``delay_seconds`` schedules it."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, max_length=200, examples=["send_email"])
    # null means "no payload" ({}), as None does in the library and no --payload in the CLI.
    payload: Annotated[dict[str, Any], BeforeValidator(_none_as_empty)] = Field(
        default_factory=dict, examples=[{"to": "a@example.com"}]
    )
    # The library's rule: a name in any case, surrounding spaces ignored. Left out (or null):
    # the type's declared priority and queue (recorded by workers at start), else normal and
    # 'default'.
    priority: Annotated[Literal["high", "normal", "low"], BeforeValidator(_fold_name)] | None = (
        Field(None, description="null: the type's declared priority, else normal.")
    )
    queue: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="null: the type's declared queue, else 'default'.",
    )
    idempotency_key: str | None = Field(None, min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LENGTH)
    key_reuse: Annotated[Literal["return", "refuse"], BeforeValidator(_fold_name)] = Field(
        "return",
        description="When the idempotency key is already used: 'return' answers 200 with the "
        "original task, whatever this request submits; 'refuse' does so only when this request "
        "has the original's type, queue, payload (JSON equality: key order does not matter) "
        "and concurrency key (a queue or concurrency key left out is not compared), and "
        "otherwise answers 409 idempotency_conflict with the original's task_id and the "
        "differing_fields. Other fields (priority, run time, attempts) are not compared. "
        "Without an idempotency key it changes nothing.",
    )
    # Strict, as the library is: a date-time string with an offset (not a Unix number), and an
    # integer (not "3", 2.0 or true).
    run_at: Annotated[AwareDatetime, BeforeValidator(_datetime_text)] | None = None
    delay_seconds: Annotated[float, Strict()] | None = Field(None, ge=0, le=MAX_DELAY_SECONDS)
    max_attempts: Annotated[int, Strict()] | None = Field(
        None,
        ge=1,
        le=MAX_ATTEMPTS,
        description="Attempts before dead-lettering; null: the type's declaration (recorded by "
        "workers at start), else 3.",
    )
    # The expiry, one of the two at most, after the run time, in the future.
    expires_in: Annotated[float, Strict()] | None = Field(
        None,
        gt=0,
        le=MAX_DELAY_SECONDS,
        description="Seconds from now: if no attempt has been spent by then, the task is never "
        "run and ends cancelled, reason 'expired'.",
    )
    expires_at: Annotated[AwareDatetime, BeforeValidator(_datetime_text)] | None = Field(
        None, description="As expires_in, an ISO 8601 date-time with a time zone offset."
    )
    concurrency_key: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CONCURRENCY_KEY_LENGTH,
        examples=["account-42"],
        description="The tenant (account, customer) the task works for: workers take the keys "
        "of a queue in turns, and a limit's per_key_max_running caps how many tasks of one key "
        "run at once. null: no key.",
    )


class IdempotencyConflictOut(BaseModel):
    """The idempotency key is held by a task that differs from this request (``key_reuse``
    'refuse'): nothing was submitted. ``task_id`` is the original; ``differing_fields`` names
    what differs, of type, queue, payload and concurrency key."""

    error: Literal["idempotency_conflict"]
    message: str
    idempotency_key: str
    task_id: uuid.UUID
    differing_fields: list[Literal["type", "queue", "payload", "concurrency_key"]]


class SubmitOut(BaseModel):
    """The answer to a submit: the task's id, status and times, without its payload (the
    client has it, and echoing it costs as much again as the request), result or errors.
    ``GET`` the ``Location`` for the whole task (TaskOut: these fields and the rest)."""

    task_id: uuid.UUID
    status: Literal["queued", "running", "completed", "failed", "cancelled", "waiting"]
    created_at: datetime
    type: str
    queue: str
    priority: str
    submitted_priority: str | None = Field(
        None,
        description="The priority the task was submitted with, once the starvation policy has "
        "promoted it (priority is then the current one); null while never promoted.",
    )
    ready_since: datetime | None = Field(
        None,
        description="When the task first became ready: promotions, retries and releases move "
        "run_at but not this (a replay starts a new wait). Waiting ages count from it.",
    )
    idempotency_key: str | None
    attempts: int
    max_attempts: int = Field(
        description="The task's attempts in all: the caller's, else its type's declaration "
        "(recorded by workers at start), else the default, 3."
    )
    cancel_requested: bool
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None = Field(None, description="While running: the worker holding the lease.")
    lease_expires_at: datetime | None = Field(
        None, description="While running: when the lease runs out unless the worker renews it."
    )
    expires_at: datetime | None = Field(
        None,
        description="If no attempt has been spent by then, it is never run: cancelled with "
        "last_error 'expired'. null: never expires.",
    )
    concurrency_key: str | None = Field(
        None, description="The tenant the task works for, as submitted; null: no key."
    )

    @staticmethod
    def fields_of(task: Task | TaskSummary) -> dict[str, Any]:
        """The short fields of ``task``, as both answers carry them."""
        return {
            "task_id": task.id,
            "status": task.status.value,
            "created_at": task.created_at,
            "type": task.type,
            "queue": task.queue,
            "priority": task.priority.label,
            "submitted_priority": (
                task.submitted_priority.label if task.submitted_priority else None
            ),
            "ready_since": task.ready_since,
            "idempotency_key": task.idempotency_key,
            "attempts": task.attempts,
            "max_attempts": task.max_attempts,
            "cancel_requested": task.cancel_requested,
            "run_at": task.visible_after,
            "started_at": task.started_at,
            "finished_at": task.finished_at,
            "worker": task.lease_owner,
            "lease_expires_at": task.lease_expires_at,
            "expires_at": task.expires_at,
            "concurrency_key": task.concurrency_key,
        }

    @classmethod
    def of(cls, task: Task) -> SubmitOut:
        return cls(**cls.fields_of(task))


TaskStatusName = Literal["queued", "running", "completed", "failed", "cancelled", "waiting"]


class EdgeOut(BaseModel):
    """A parent or child of a task: its id, type and status now (type and status
    null for a task since pruned)."""

    task_id: uuid.UUID
    type: str | None
    status: TaskStatusName | None

    @classmethod
    def of(cls, edge: Parent) -> EdgeOut:
        status = None if edge.status is None else edge.status.value
        return cls(task_id=edge.task_id, type=edge.type, status=status)  # type: ignore[arg-type]


class TaskOut(SubmitOut):
    """A whole task: the short fields of a submit's answer, its payload, result, last error
    and snoozes."""

    payload: dict[str, Any]
    result: Any = None
    last_error: str | None = Field(description="The last error as stored: summary, then traceback.")
    last_error_summary: str | None = Field(
        None,
        description="The last error's first part: the exception's type and message "
        '("ValueError: doomed always fails"), or the whole of an error without a traceback.',
    )
    last_error_traceback: str | None = Field(
        None, description="The last error's traceback, when it has one (shown on demand)."
    )
    # Snoozes: queued again later without spending an attempt.
    snoozes: int = Field(
        0, description="How many times its handler snoozed it (Snooze: no attempt spent)."
    )
    progress: dict[str, Any] | None = Field(
        None,
        description="The handler's last progress report (ctx.set_progress: a JSON object of "
        "at most 4 KiB), written at most every 0.5 s while it runs and kept once it finishes "
        "and across retries until the next attempt reports; null: none yet.",
    )

    # Where the task sits in a workflow.
    workflow_id: uuid.UUID | None = Field(
        None, description="The workflow the task belongs to; null for a plain task."
    )
    cancelled_by: uuid.UUID | None = Field(
        None,
        description="The parent whose failure or cancellation cancelled this task (its "
        "last_error names it); null otherwise.",
    )
    parents: list[EdgeOut] = Field(
        default_factory=list,
        description="The tasks it depends on, in depends_on order, with their statuses now.",
    )
    children: list[EdgeOut] = Field(
        default_factory=list, description="The tasks that depend on it, with their statuses now."
    )
    timeout_seconds: float | None = Field(
        None,
        description="While running: the handler timeout its type declares (as the workers "
        "recorded it at their start; null: none). A task running longer than this since "
        "started_at is overrunning: a sync handler's thread cannot be stopped, so its worker "
        "holds the task until the thread returns, then records the attempt timed out.",
    )

    @classmethod
    def of(
        cls,
        task: Task,
        parents: Sequence[Parent] = (),
        children: Sequence[Parent] = (),
        timeout_seconds: float | None = None,
    ) -> TaskOut:
        error = task.error
        return cls(
            **cls.fields_of(task),
            payload=task.payload,
            result=task.result,
            last_error=task.last_error,
            last_error_summary=error.summary if error else None,
            last_error_traceback=error.traceback if error else None,
            snoozes=task.snoozes,
            progress=task.progress,
            workflow_id=task.workflow_id,
            cancelled_by=task.cancelled_by,
            parents=[EdgeOut.of(p) for p in parents],
            children=[EdgeOut.of(c) for c in children],
            timeout_seconds=timeout_seconds,
        )


class TaskPage(BaseModel):
    items: list[TaskOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class TaskSummaryOut(SubmitOut):
    """A task in a list asked for with ``fields=summary``: every field of TaskOut but the
    payload and the result, which the server does not read, and the sizes they take as
    stored. ``GET /api/v1/tasks/{task_id}`` for the whole task."""

    last_error: str | None = Field(
        description="The last error as stored: summary, then traceback (at most 8,000 "
        "characters, as every write keeps it)."
    )
    last_error_summary: str | None = Field(
        None,
        description="The last error's first part: the exception's type and message "
        '("ValueError: doomed always fails"), or the whole of an error without a traceback.',
    )
    last_error_traceback: str | None = Field(
        None, description="The last error's traceback, when it has one (shown on demand)."
    )
    snoozes: int = Field(
        0, description="How many times its handler snoozed it (Snooze: no attempt spent)."
    )
    progress: dict[str, Any] | None = Field(
        None,
        description="The handler's last progress report (ctx.set_progress: a JSON object of "
        "at most 4 KiB), written at most every 0.5 s while it runs and kept once it finishes "
        "and across retries until the next attempt reports; null: none yet.",
    )
    workflow_id: uuid.UUID | None = Field(
        None, description="The workflow the task belongs to; null for a plain task."
    )
    cancelled_by: uuid.UUID | None = Field(
        None,
        description="The parent whose failure or cancellation cancelled this task (its "
        "last_error names it); null otherwise.",
    )
    parents: list[EdgeOut] = Field(
        default_factory=list,
        description="Empty in a list, as in the full form's: GET the task for its parents.",
    )
    children: list[EdgeOut] = Field(
        default_factory=list,
        description="Empty in a list, as in the full form's: GET the task for its children.",
    )
    timeout_seconds: float | None = Field(
        None,
        description="While running: the handler timeout its type declares (as the workers "
        "recorded it at their start; null: none). A task running longer than this since "
        "started_at is overrunning.",
    )
    payload_stored_bytes: int = Field(
        description="The bytes the payload takes as stored (PostgreSQL's pg_column_size: "
        "jsonb, after compression), read without reading the payload. Not the size of its "
        "JSON text, which the payload limit counts: a guide to which tasks are large."
    )
    result_stored_bytes: int | None = Field(
        description="As payload_stored_bytes, for the result; null while there is none."
    )

    @classmethod
    def of_summary(cls, task: TaskSummary, timeout_seconds: float | None = None) -> TaskSummaryOut:
        error = task.error
        return cls(
            **cls.fields_of(task),
            last_error=task.last_error,
            last_error_summary=error.summary if error else None,
            last_error_traceback=error.traceback if error else None,
            snoozes=task.snoozes,
            progress=task.progress,
            workflow_id=task.workflow_id,
            cancelled_by=task.cancelled_by,
            timeout_seconds=timeout_seconds,
            payload_stored_bytes=task.payload_stored_bytes,
            result_stored_bytes=task.result_stored_bytes,
        )


class TaskSummaryPage(BaseModel):
    """A page of tasks asked for with ``fields=summary``: no payloads, no results."""

    items: list[TaskSummaryOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class CancelOut(BaseModel):
    task_id: uuid.UUID
    status: Literal["cancelled", "running"]
    cancel_requested: bool


# --- dead letters ----------------------------------------------------------------------------


# --- workflows --------------------------------------------------------------------


class WorkflowTaskOut(BaseModel):
    """One task of a workflow, with the ids of its parents and children."""

    task_id: uuid.UUID
    type: str
    status: TaskStatusName
    attempts: int
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    finished_at: datetime | None
    result: Any = None
    last_error_summary: str | None = None
    parents: list[uuid.UUID]
    children: list[uuid.UUID]


class WorkflowOut(BaseModel):
    """A workflow: its status derived from its tasks (running, completed, failed,
    cancelled), counts by task status, its tasks in build order, and its final result (the
    sink's result, or the list of the sinks' results in build order)."""

    workflow_id: uuid.UUID
    status: Literal["running", "completed", "failed", "cancelled"]
    counts: dict[str, int]
    created_at: datetime
    finished_at: datetime | None
    result: Any = None
    tasks: list[WorkflowTaskOut]

    @classmethod
    def of(cls, info: WorkflowInfo) -> WorkflowOut:
        tasks = []
        for t in info.tasks:
            error = t.task.error
            tasks.append(
                WorkflowTaskOut(
                    task_id=t.id,
                    type=t.type,
                    status=t.status.value,
                    attempts=t.task.attempts,
                    max_attempts=t.task.max_attempts,
                    cancel_requested=t.task.cancel_requested,
                    created_at=t.task.created_at,
                    finished_at=t.task.finished_at,
                    result=t.task.result,
                    last_error_summary=error.summary if error else None,
                    parents=list(t.parents),
                    children=list(t.children),
                )
            )
        return cls(
            workflow_id=info.id,
            status=info.status.value,
            counts=dict(info.counts),
            created_at=info.created_at,
            finished_at=info.finished_at,
            result=info.result,
            tasks=tasks,
        )


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


class DeadLetterCount(BaseModel):
    """How many dead letters match a filter: what a bulk replay or discard would take."""

    count: int


# --- stats -----------------------------------------------------------------------------------


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


class OldestSnapshotOut(BaseModel):
    """What holds back the cleanup of finished tasks longest (pgqueue.oldest_snapshot)."""

    kind: str = Field(description="'session', 'replication slot' or 'prepared transaction'.")
    holder: str
    pid: int | None
    state: str | None
    seconds: float | None = Field(description="How long it has been open, when known.")
    xid_age: int = Field(description="How many transactions ago its snapshot was taken.")


class KeyStatsRow(BaseModel):
    """A concurrency key in a queue: its tasks running and ready (queued and due) now."""

    queue: str
    key: str
    running: int
    ready: int
    ready_capped: bool = Field(
        description="The key has 1,000 or more queued tasks, counted no further: ready counts "
        "those due among its first 1,000 in claim order, so at least that many are ready."
    )


class StatsOut(BaseModel):
    depth: list[DepthRow]
    throughput: list[ThroughputRow]
    window_seconds: float
    paused_queues: list[str] = Field(
        default_factory=list, description="Queues no worker claims from until resumed."
    )
    oldest_snapshot: OldestSnapshotOut | None = Field(
        default=None,
        description="The oldest snapshot holding back vacuum of pgqueue.tasks, if any.",
    )
    oldest_snapshot_warning: bool = Field(
        default=False,
        description="It has been open longer than PGQUEUE_SNAPSHOT_WARN_SECONDS.",
    )
    oldest_snapshot_warn_seconds: float = Field(
        default=60.0, description="The threshold of oldest_snapshot_warning."
    )
    busiest_keys: list[KeyStatsRow] = Field(
        default_factory=list,
        description="The busiest concurrency keys (running + ready), busiest first, at most "
        "`keys` of them.",
    )


# --- schedules and queues --------------------------------------------------------------------


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


# --- limits ----------------------------------------------------------------------------------


class LimitIn(BaseModel):
    """A limit, set as a whole: a part left null is no limit of that kind."""

    model_config = ConfigDict(extra="forbid")

    max_running: Annotated[int, Strict()] | None = Field(None, ge=0, le=MAX_RUNNING)
    rate: Annotated[int, Strict()] | None = Field(None, ge=0, le=MAX_RATE)
    per_seconds: Annotated[float, Strict()] = Field(1.0, gt=0, le=MAX_RETENTION)
    per_key_max_running: Annotated[int, Strict()] | None = Field(
        None,
        ge=0,
        le=MAX_RUNNING,
        description="At most this many running at once per concurrency key (tasks without a "
        "key are not held by it).",
    )
    burst: Annotated[int, Strict()] | None = Field(
        None,
        ge=1,
        le=MAX_RATE,
        description="With rate: starts spaced evenly, one every per_seconds / rate, and at "
        "most this many at once (a token bucket). Null: a sliding window, at most rate starts "
        "in any per_seconds window, all at once if they wait.",
    )


class LimitOut(BaseModel):
    kind: Literal["type", "queue"]
    name: str
    max_running: int | None
    rate: int | None
    per_seconds: float | None
    per_key_max_running: int | None = None
    running: int = Field(description="Tasks running under the limit now.")
    recent_starts: int = Field(description="Starts within the rate window.")
    keys_running: int = Field(
        0, description="Concurrency keys with tasks running under the limit now."
    )
    keys_at_cap: int = Field(
        0,
        description="Of those, the keys with per_key_max_running running (their next tasks "
        "wait); 0 without a per-key part.",
    )
    updated_at: datetime | None
    burst: int | None = Field(
        None, description="The rate's burst (starts spaced evenly); null: a sliding window."
    )
    declared_by: str | None = Field(
        None,
        description="The worker that declared this limit from its code (a rate_limit on the "
        "task type's decorator); null: set by an operator, which declarations never overwrite.",
    )

    @classmethod
    def of(cls, limit: models.Limit) -> LimitOut:
        return cls(
            kind=limit.kind.value,
            name=limit.name,
            max_running=limit.max_running,
            rate=limit.rate_limit,
            per_seconds=limit.rate_period,
            per_key_max_running=limit.per_key_max_running,
            running=limit.running,
            recent_starts=limit.recent_starts,
            keys_running=limit.keys_running,
            keys_at_cap=limit.keys_at_cap,
            updated_at=limit.updated_at,
            burst=limit.rate_burst,
            declared_by=limit.declared_by,
        )


class QueueRemovedOut(BaseModel):
    name: str
    removed: bool = Field(description="Whether the queue had settings to remove.")


class LimitRemovedOut(BaseModel):
    kind: Literal["type", "queue"]
    name: str
    removed: bool


# --- the dashboard's series and failures -----------------------------------------------------


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
    last_error: str | None = Field(description="The last error as stored: summary, then traceback.")
    last_error_summary: str | None = Field(
        None,
        description="The last error's first part: the exception's type and message "
        '("ValueError: doomed always fails"), or the whole of an error without a traceback.',
    )
    last_error_traceback: str | None = Field(
        None, description="The last error's traceback, when it has one (shown on demand)."
    )
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
            last_error_summary=error.summary if (error := failure.error) else None,
            last_error_traceback=error.traceback if error else None,
            started_at=failure.started_at,
            retry_at=failure.retry_at,
            finished_at=failure.finished_at,
        )


class FailuresOut(BaseModel):
    retrying: list[FailureOut] = Field(
        description="Queued again after a failed attempt, the latest next attempt first."
    )
    dead: list[FailureOut] = Field(description="Dead letters (attempts spent), newest first.")


# --- errors and health -----------------------------------------------------------------------


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


class LivenessOut(BaseModel):
    """/healthz: the process is alive (always 200), and what it saw of the database on the
    way: an operator reads here, without failing the probe, that the schema is behind."""

    status: Literal["ok"]
    database: Literal["reachable", "unreachable"]
    schema_revision: str | None = Field(
        description="The pgqueue revision applied in the database; null when none is (or "
        "the database could not be asked)."
    )
    expected_schema_revision: str = Field(description="The revision this pgqueue needs.")
    schema_current: bool = Field(description="schema_revision is expected_schema_revision.")


# --- query parameters ------------------------------------------------------------------------

# Shared by the list endpoints. Module level, and imported by name into each routes module:
# FastAPI resolves a route's annotations in its module's globals, and `from __future__ import
# annotations` makes them names.
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
Name = Annotated[str | None, Query(min_length=1, max_length=200)]
Cursor = Annotated[str | None, Query(max_length=200)]
ListFields = Annotated[
    Literal["full", "summary"],
    Query(
        description="`full` (the default): whole tasks, payload and result included. "
        "`summary`: every field but the payload and the result, which the server then does "
        "not read, with `payload_stored_bytes` and `result_stored_bytes` (TaskSummaryOut): "
        "what a list that shows neither should ask for, since each may be large (up to "
        "PGQUEUE_MAX_PAYLOAD_BYTES and PGQUEUE_MAX_RESULT_BYTES of JSON, 1 MiB by default)."
    ),
]
