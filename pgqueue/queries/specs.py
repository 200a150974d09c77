"""What a task to insert is, and what every insert sends for it.

A :class:`TaskSpec` is a validated task (built by ``pgqueue.enqueue.prepare``); the defaults
here stand in for what neither the caller nor the task's type declared. A room of its own
because two rooms insert tasks, ``submitting`` and ``dependencies`` (tasks with parents),
which send the same columns and build the same Task, and each of which calls the other.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from pgqueue.config import DEFAULT_QUEUE
from pgqueue.models import Priority, RetryPolicy, Task, TaskStatus, built


class TaskSpec(NamedTuple):
    """A validated task, ready to insert (built by pgqueue.enqueue.prepare).

    A named tuple rather than a frozen dataclass: just as immutable, and built in a fifth of
    the time, which counts when a bulk enqueue prepares tens of thousands a second.
    """

    id: uuid.UUID
    type: str
    payload: dict[str, Any]  # what the caller gave; payload_json is what gets stored
    payload_json: str
    # None: not given; the insert takes the type's declared priority and queue (task_types),
    # else DEFAULT_PRIORITY and DEFAULT_QUEUE, as it does for the retry policy.
    priority: Priority | None
    queue: str | None
    # The caller's retry policy, None where the caller gave none: the insert then takes the
    # type's declaration (pgqueue.task_types), else DEFAULT_RETRY, field by field.
    max_attempts: int | None
    backoff_base: float | None
    backoff_factor: float | None
    backoff_cap: float | None
    idempotency_key: str | None
    run_at: datetime | None
    delay_seconds: float
    # The expiry, an aware time or seconds from the server's clock at the insert
    # (at most one of the two; neither: never expires).
    expires_at: datetime | None = None
    expires_in: float | None = None
    # The parents (task ids, in the caller's order), whether the task runs even
    # when a parent failed or was cancelled (on_parent_failure="run"), and its workflow.
    depends_on: tuple[uuid.UUID, ...] = ()
    run_anyway: bool = False
    workflow_id: uuid.UUID | None = None
    # The tenant it works for (None: no key): the fair claim's turns and per-key limits.
    concurrency_key: str | None = None


# The retry policy of a task whose caller and type declared none.
DEFAULT_RETRY = RetryPolicy()
# The priority of a task whose caller and type gave none; the queue is
# config.DEFAULT_QUEUE.
DEFAULT_PRIORITY = Priority.NORMAL


def _defaults() -> dict[str, Any]:
    return {
        "default_queue": DEFAULT_QUEUE,
        "default_priority": int(DEFAULT_PRIORITY),
        "default_max_attempts": DEFAULT_RETRY.max_attempts,
        "default_backoff_base": DEFAULT_RETRY.base,
        "default_backoff_factor": DEFAULT_RETRY.factor,
        "default_backoff_cap": DEFAULT_RETRY.cap,
    }


def _explicit(spec: TaskSpec) -> bool:
    """Whether the caller gave any part of a retry policy (else the task may be marked
    policy_default, for its type's declaration to apply at its first claim)."""
    return spec.max_attempts is not None or spec.backoff_base is not None


def _inserted(
    spec: TaskSpec,
    created_at: datetime,
    visible_after: datetime,
    max_attempts: int,
    queue: str,
    priority: int,
    expires_at: datetime | None = None,
) -> Task:
    """The Task a fresh insert created, built from what was sent rather than read back: the
    statement returns only what the server decided (times, the resolved max_attempts, queue
    and priority), which keeps enqueue cheap."""
    return built(
        Task,
        {
            "id": spec.id,
            "queue": queue,
            "type": spec.type,
            "payload": spec.payload,
            "priority": spec.priority if spec.priority is not None else _PRIORITIES[priority],
            "status": TaskStatus.QUEUED,
            "attempts": 0,
            "max_attempts": max_attempts,
            "visible_after": visible_after,
            "idempotency_key": spec.idempotency_key,
            "result": None,
            "last_error": None,
            "cancel_requested": False,
            "lease_owner": None,
            "lease_expires_at": None,
            "created_at": created_at,
            "started_at": None,
            "finished_at": None,
            "submitted_priority": None,
            "ready_since": visible_after,
            "snoozes": 0,
            "expires_at": expires_at,
            "workflow_id": None,
            "parents_pending": None,
            "cancelled_by": None,
            "concurrency_key": spec.concurrency_key,
            "progress": None,
        },
    )


# Priority(n) by lookup (an enum's call is slow); a Priority is its own key (an IntEnum).
_PRIORITIES: dict[int, Priority] = {int(p): p for p in Priority}


def _trace_json(trace_context: Mapping[str, str] | None) -> Jsonb | None:
    return Jsonb(dict(trace_context)) if trace_context else None


def _spec_columns(specs: Sequence[TaskSpec]) -> dict[str, list[Any]]:
    """The array-insert statements' task columns, one array per column (task_insert_many's
    keyed part, task_insert_dependent), built in one place so both insert the same fields."""
    return {
        "ids": [s.id for s in specs],
        "queues": [s.queue for s in specs],
        "types": [s.type for s in specs],
        "payloads": [s.payload_json for s in specs],
        "priorities": [None if s.priority is None else int(s.priority) for s in specs],
        "max_attempts": [s.max_attempts for s in specs],
        "backoff_bases": [s.backoff_base for s in specs],
        "backoff_factors": [s.backoff_factor for s in specs],
        "backoff_caps": [s.backoff_cap for s in specs],
        "run_ats": [s.run_at for s in specs],
        "delays": [s.delay_seconds for s in specs],
        "explicits": [_explicit(s) for s in specs],
        "expires_ats": [s.expires_at for s in specs],
        "expires_ins": [s.expires_in for s in specs],
        "concurrency_keys": [s.concurrency_key for s in specs],
    }


def _in_graph(spec: TaskSpec) -> bool:
    """Whether a task goes in by task_insert_dependent: it has parents or a workflow (and no
    idempotency key, which prepare refuses with parents)."""
    return bool(spec.depends_on) or (spec.workflow_id is not None and spec.idempotency_key is None)
