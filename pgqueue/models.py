"""The task and its vocabulary: statuses, priorities, retry policy and outcomes.

This module imports nothing else from pgqueue except errors and error_text; everything else
builds on it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pgqueue.error_text import ErrorText, split_error
from pgqueue.errors import InvalidPriority, ValidationError

MAX_ATTEMPTS = 1_000_000
MAX_BACKOFF_SECONDS = 365 * 24 * 3600.0
MIN_BACKOFF_SECONDS = 1e-6  # smaller but non-zero would underflow the real columns


class TaskStatus(enum.StrEnum):
    """Where a task is in its life, and who moves it on.

    - ``queued``: waiting until ``visible_after``; a worker's claim moves it to running,
      a cancel to cancelled.
    - ``running``: a worker holds its lease; that worker completes, fails or releases it,
      and the expired-lease sweep takes it back if the worker disappears.
    - ``completed``: the handler returned; final until pruned.
    - ``failed``: attempts spent; this is the dead-letter queue. An operator replays
      (back to queued, fresh attempts) or discards it.
    - ``cancelled``: cancelled before it ran (or cooperatively while running); final.
    - ``waiting``: enqueued with ``depends_on`` and at least one parent not final yet.
      No claim reads it; the statement that finishes its last parent moves it to queued
      (or, when a parent failed and it was not declared to run anyway, to cancelled); an
      operator's cancel cancels it.
    """

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"

    @property
    def is_final(self) -> bool:
        return self in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class Priority(enum.IntEnum):
    """Named priorities stored as numbers: lower runs first, and levels can be added between."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, value: object) -> Priority:
        """Accept a Priority, its name (any case) or its number; anything else is an error."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            name = value.strip()
            # Only the names themselves: a dotless i (U+0131) upper-cases to "I".
            if not name.isascii():
                raise InvalidPriority(value)
            try:
                return cls[name.upper()]
            except KeyError:
                raise InvalidPriority(value) from None
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise InvalidPriority(value) from None
        raise InvalidPriority(value)

    @property
    def label(self) -> str:
        return self.name.lower()


class KeyReuse(enum.StrEnum):
    """What a submit does when its idempotency key is already held by another task.

    - ``return`` (the default): insert nothing and return the original task, whatever was
      submitted this time.
    - ``refuse``: return the original only when this submit has its type, queue, payload
      (JSON equality) and concurrency key (a queue or concurrency key left out is not
      compared); otherwise raise IdempotencyConflict, as payment APIs refuse a key reused
      with other parameters. Other options (priority, run time, attempts) are not compared:
      a retry may well compute another delay.
    """

    RETURN = "return"
    REFUSE = "refuse"

    @classmethod
    def parse(cls, value: object) -> KeyReuse:
        """Accept a KeyReuse or its value (any case, surrounding spaces ignored), as a
        priority is accepted; anything else is a ValidationError naming ``key_reuse``."""
        if isinstance(value, KeyReuse):
            return value
        if isinstance(value, str) and value.strip().lower() in ("return", "refuse"):
            return cls(value.strip().lower())
        raise ValidationError("key_reuse", f"must be 'return' or 'refuse', not {value!r}")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter and a cap.

    The n-th retry waits ``min(cap, base * factor ** (n - 1))`` seconds, of which a random part
    (up to half) is taken off so that tasks failing together do not retry together.
    The defaults (3 attempts, 1 s, x2, capped at 300 s) suit transient failures of a
    downstream service; raise ``max_attempts`` and ``cap`` for longer outages.
    """

    max_attempts: int = 3
    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValidationError("max_attempts", f"must be an integer, not {self.max_attempts!r}")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValidationError(
                "max_attempts", f"must be from 1 to {MAX_ATTEMPTS}, not {self.max_attempts}"
            )
        for name, value, low, high in (
            ("backoff_base", self.base, 0.0, MAX_BACKOFF_SECONDS),
            ("backoff_factor", self.factor, 1.0, 100.0),
            ("backoff_cap", self.cap, 0.0, MAX_BACKOFF_SECONDS),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(name, f"must be a number, not {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValidationError(name, f"must be from {low:g} to {high:g}, not {value}")
            if not low <= value <= high:
                raise ValidationError(name, f"must be from {low:g} to {high:g}, not {value}")
            if 0 < value < MIN_BACKOFF_SECONDS:  # stored as real: would underflow to an error
                raise ValidationError(
                    name, f"must be 0 or at least {MIN_BACKOFF_SECONDS:g}, not {value}"
                )

    def max_delay(self, attempt: int) -> float:
        """The longest wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.cap, self.base * self.factor ** max(attempt - 1, 0)))


_T = TypeVar("_T")


def built(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` whose fields are ``fields`` (every one of
    them, by name), built without its __init__: that sets each field through
    object.__setattr__, which for a Task's 25 fields cost as much as validating its payload.
    For the hot paths that make one per task (a bulk enqueue); a test checks they give every
    field."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    return obj


@dataclasses.dataclass(frozen=True)
class Task:
    """A snapshot of one row of ``pgqueue.tasks``."""

    id: uuid.UUID
    queue: str
    type: str
    payload: dict[str, Any]
    priority: Priority
    status: TaskStatus
    attempts: int
    max_attempts: int
    visible_after: datetime
    idempotency_key: str | None
    result: Any
    last_error: str | None
    cancel_requested: bool
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # The priority the task was submitted with when the starvation policy has since promoted
    # it (priority is then the current one); None while never promoted.
    submitted_priority: Priority | None = None
    # When the task first became ready: a promotion, a retry or a release moves visible_after
    # but not this (a replay starts a new wait). The age of waiting work counts from it.
    ready_since: datetime | None = None
    # How many times a handler snoozed it (Snooze: no attempt spent), and when it
    # expires if no attempt has been spent by then (None: never).
    snoozes: int = 0
    expires_at: datetime | None = None
    # The workflow the task belongs to (None: a plain task), how many groups of its
    # parents are not final yet (None: it never had parents; 0: all final), and the parent
    # whose failure or cancellation cancelled it (None otherwise).
    workflow_id: uuid.UUID | None = None
    parents_pending: int | None = None
    cancelled_by: uuid.UUID | None = None
    # The tenant it works for (account, customer): workers claim the keys of a queue in
    # turns, and per-key limits count by it. None: no key.
    concurrency_key: str | None = None
    # The handler's last progress report (ctx.set_progress), kept after the task finishes
    # and across retries until the next attempt reports; None: none yet, or a read that
    # leaves it out (a list's summary).
    progress: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        return cls(
            id=row["id"],
            queue=row["queue"],
            type=row["type"],
            payload=row["payload"],
            priority=Priority(row["priority"]),
            status=TaskStatus(row["status"]),
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            visible_after=row["visible_after"],
            idempotency_key=row["idempotency_key"],
            result=row["result"],
            last_error=row["last_error"],
            cancel_requested=row["cancel_requested"],
            lease_owner=row["lease_owner"],
            lease_expires_at=row["lease_expires_at"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            submitted_priority=(
                None
                if row.get("submitted_priority") is None
                else Priority(row["submitted_priority"])
            ),
            ready_since=row.get("ready_since") or row["visible_after"],
            snoozes=row.get("snoozes") or 0,
            expires_at=row.get("expires_at"),
            workflow_id=row.get("workflow_id"),
            parents_pending=row.get("parents_pending"),
            cancelled_by=row.get("cancelled_by"),
            concurrency_key=row.get("concurrency_key"),
            progress=row.get("progress"),
        )

    @property
    def error(self) -> ErrorText | None:
        """The last error split into its summary (the exception) and its traceback."""
        return None if self.last_error is None else split_error(self.last_error)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (ids and times as strings, priority and status by name), with the
        last error's summary and traceback beside it (``last_error_summary``, ``_traceback``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, Priority):
                value = value.label
            elif isinstance(value, TaskStatus):
                value = value.value
            out["task_id" if f.name == "id" else f.name] = value
        error = self.error
        out["last_error_summary"] = None if error is None else error.summary
        out["last_error_traceback"] = None if error is None else error.traceback
        return out


@dataclasses.dataclass(frozen=True)
class EnqueueResult:
    """What an enqueue returns: the task, and whether this call created it.

    ``created`` is False when the idempotency key was already used; ``task`` is then the
    original task, with its current status and, once finished, its result.
    """

    task: Task
    created: bool

    @property
    def id(self) -> uuid.UUID:
        return self.task.id


@dataclasses.dataclass(frozen=True)
class Lease:
    """Proof that a worker holds a task: the fence every outcome write checks."""

    task_id: uuid.UUID
    token: uuid.UUID


@dataclasses.dataclass(frozen=True)
class ClaimedTask:
    """A task handed to a worker by a claim, with the lease that lets it record an outcome."""

    id: uuid.UUID
    queue: str
    type: str
    payload: dict[str, Any]
    priority: Priority
    attempts: int
    max_attempts: int
    lease_token: uuid.UUID
    lease_expires_at: datetime
    created_at: datetime
    # The submitting span's W3C context when tracing was on (see pgqueue.tracing).
    trace_context: dict[str, str] | None = None
    # Whether it was enqueued with depends_on (the worker then reads its parents,
    # for ctx.parents, in one query per claimed batch), and its workflow.
    has_parents: bool = False
    workflow_id: uuid.UUID | None = None
    # Its parents in depends_on order, read by the worker after the claim (ctx.parents).
    parents: tuple[Parent, ...] = ()
    # The tenant it works for: the fair claim's turns and per-key limits (None: no key).
    concurrency_key: str | None = None

    @property
    def lease(self) -> Lease:
        # Made once (the runner, the completer and each heartbeat ask for it), kept in the
        # instance's dict beside the fields; not functools.cached_property, whose first read
        # takes a lock on Python 3.11 (7 % of a no-op drain's worker CPU in a profile).
        lease: Lease | None = self.__dict__.get("_lease")
        if lease is None:
            lease = self.__dict__["_lease"] = Lease(self.id, self.lease_token)
        return lease

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


@dataclasses.dataclass(frozen=True)
class Parent:
    """One end of a dependency: a parent of a task (``pgqueue.parents``,
    ``ctx.parents``) or a dependant (``pgqueue.children``), with its status now, its place in
    the child's depends_on, whether the child runs anyway if it fails, its result (decoded
    JSON, None until completed) and its last error. ``status`` and ``type`` are None for a
    task since pruned."""

    task_id: uuid.UUID
    type: str | None
    status: TaskStatus | None
    position: int
    run_anyway: bool
    result: Any = None
    error: str | None = None


class WorkflowStatus(enum.StrEnum):
    """A workflow's status, derived from its tasks (the view pgqueue.workflows uses
    the same rule): ``running`` while any task is not final; then ``completed`` if all
    completed; else ``failed`` if any was dead-lettered; else ``cancelled``."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self is not WorkflowStatus.RUNNING

    @classmethod
    def of(cls, statuses: Iterable[TaskStatus]) -> WorkflowStatus:
        seen = set(statuses)
        if any(not s.is_final for s in seen):
            return cls.RUNNING
        if seen <= {TaskStatus.COMPLETED}:
            return cls.COMPLETED
        if TaskStatus.FAILED in seen:
            return cls.FAILED
        return cls.CANCELLED


@dataclasses.dataclass(frozen=True)
class WorkflowTask:
    """One task of a workflow with its edges: the ids of its parents (in depends_on order)
    and of its children (tasks that depend on it)."""

    task: Task
    parents: tuple[uuid.UUID, ...] = ()
    children: tuple[uuid.UUID, ...] = ()

    @property
    def id(self) -> uuid.UUID:
        return self.task.id

    @property
    def type(self) -> str:
        return self.task.type

    @property
    def status(self) -> TaskStatus:
        return self.task.status

    def to_dict(self) -> dict[str, Any]:
        out = self.task.to_dict()
        out["parents"] = [str(p) for p in self.parents]
        out["children"] = [str(c) for c in self.children]
        return out


@dataclasses.dataclass(frozen=True)
class WorkflowInfo:
    """A workflow as read now (``pgqueue.workflow``): its status, how many of its tasks are in
    each status, its tasks in build order ((created_at, id)) with their edges, and when it
    started and (once final) finished.

    ``result`` is the workflow's final result: the result of its sink (the one task nothing
    depends on) if it has one, else the list of its sinks' results in build order; a sink that
    has not completed contributes None."""

    id: uuid.UUID
    status: WorkflowStatus
    counts: Mapping[str, int]
    tasks: tuple[WorkflowTask, ...]
    created_at: datetime
    finished_at: datetime | None

    @property
    def sinks(self) -> tuple[WorkflowTask, ...]:
        return tuple(t for t in self.tasks if not t.children)

    @property
    def result(self) -> Any:
        sinks = self.sinks
        if len(sinks) == 1:
            return sinks[0].task.result
        return [t.task.result for t in sinks]

    def task(self, task_id: uuid.UUID) -> WorkflowTask:
        """The workflow's task with this id (KeyError if it is not one of them)."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "status": self.status.value,
            "counts": dict(self.counts),
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "result": self.result,
            "tasks": [t.to_dict() for t in self.tasks],
        }


class FailOutcome(enum.StrEnum):
    """What a recorded failure did to the task."""

    RETRYING = "retrying"
    DEAD = "dead"
    CANCELLED = "cancelled"  # cancellation had been requested: not retried


@dataclasses.dataclass(frozen=True)
class FailResult:
    task_id: uuid.UUID
    outcome: FailOutcome
    attempts: int
    retry_at: datetime | None


@dataclasses.dataclass(frozen=True)
class SnoozeResult:
    """A recorded snooze: ``snoozed`` False when the task had reached its bound
    and the snooze was recorded as a failed attempt instead (``failed`` says what that did)."""

    task_id: uuid.UUID
    snoozed: bool
    snoozes: int
    run_at: datetime | None
    cancelled: bool = False  # a cancellation requested meanwhile won
    failed: FailResult | None = None


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """An expired-lease sweep: tasks requeued, dead-lettered, and cancelled (cancellation had
    been requested while they ran)."""

    requeued: list[uuid.UUID]
    dead: list[uuid.UUID]
    cancelled: list[uuid.UUID] = dataclasses.field(default_factory=list)
    #: task id -> (type, attempts), for logging what was swept
    details: dict[uuid.UUID, tuple[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.dead) + len(self.cancelled)


@dataclasses.dataclass(frozen=True)
class QueueBacklog:
    """A queue's backlog at one priority (the pgqueue.backlog view): ready and scheduled
    tasks, running ones, and the age of the oldest ready task (None: none is ready)."""

    queue: str
    priority: str
    ready: int
    scheduled: int
    running: int
    oldest_ready_age_seconds: float | None


@dataclasses.dataclass(frozen=True)
class OldestSnapshot:
    """What holds back the cleanup of finished tasks longest (``pgqueue.oldest_snapshot``):
    a session's open transaction, a replication slot or a prepared transaction. While it
    stays, vacuum cannot remove what claims and completions leave behind.

    ``seconds`` is how long it has been open (None for a replication slot, which has no
    start time, and for another role's session without pg_read_all_stats); ``xid_age`` how
    many transactions ago its snapshot was taken."""

    kind: str  # 'session', 'replication slot' or 'prepared transaction'
    holder: str
    pid: int | None
    state: str | None
    seconds: float | None
    xid_age: int

    def warns(self, after_seconds: float) -> bool:
        """Open at least ``after_seconds`` (only a known age can warn)."""
        return self.seconds is not None and self.seconds >= after_seconds


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """One row of the depth view: a queue, a priority and a status."""

    queue: str
    priority: str
    status: str
    tasks: int
    ready: int
    scheduled: int
    oldest_ready_age_seconds: float | None


@dataclasses.dataclass(frozen=True)
class QueueState:
    """A queue's settings: ``paused`` queues are skipped by every worker's claim; the
    retentions (seconds) replace the workers' defaults for this queue where not None."""

    name: str
    paused: bool
    paused_at: datetime | None
    updated_at: datetime | None  # None: the queue has never had a setting
    completed_retention: float | None = None
    dead_retention: float | None = None


class LimitKind(enum.StrEnum):
    """What a limit applies to: every task of one type, or every task in one queue."""

    TYPE = "type"
    QUEUE = "queue"


@dataclasses.dataclass(frozen=True)
class Limit:
    """A fleet-wide limit on the tasks of one type or queue, enforced in the database.

    ``max_running``: at most this many run at once across every worker. ``rate_limit`` per
    ``rate_period`` seconds: with ``rate_burst``, starts spaced evenly, one every
    ``rate_period / rate_limit`` seconds and at most ``rate_burst`` at once (a token bucket);
    without, at most ``rate_limit`` start in any window of that length (a sliding window,
    which lets them start all at once). ``per_key_max_running``: at most this many run at once
    per concurrency key (a task without a key is not held by it). ``declared_by``: the worker
    that declared it from its code (a ``rate_limit`` on the task type's decorator); None: an
    operator set it, and declarations leave it alone.

    The current use, as read: ``running`` and ``recent_starts``; ``keys_running``, how many
    keys have tasks running under the limit, and ``keys_at_cap``, how many of them have
    ``per_key_max_running`` running (or more, after the cap was lowered): the keys whose
    next tasks wait for one of theirs to finish (0 without a per-key part).
    """

    kind: LimitKind
    name: str
    max_running: int | None
    rate_limit: int | None
    rate_period: float | None
    updated_at: datetime | None = None
    running: int = 0
    recent_starts: int = 0
    per_key_max_running: int | None = None
    keys_running: int = 0
    keys_at_cap: int = 0
    rate_burst: int | None = None
    declared_by: str | None = None


@dataclasses.dataclass(frozen=True)
class KeyStats:
    """How busy one concurrency key is in one queue now: ``running``, its tasks running
    (expired leases included until swept), and ``ready``, its queued tasks due now. The
    busiest keys are those with the most running + ready: what the key holds and what it
    asks for, its share of the workers (scheduled tasks are not asked for yet).

    ``ready_capped``: the key has 1,000 or more queued tasks, which is as far as pgqueue
    counts a key's, so that one tenant's backlog costs no more than that to look at; ``ready``
    is then those due among its first 1,000 in claim order (priority, then age): at least
    that many are ready.
    """

    queue: str
    key: str
    running: int
    ready: int
    ready_capped: bool = False


@dataclasses.dataclass(frozen=True)
class QueueThroughput:
    """Tasks of one queue that finished within a time window: completed and dead-lettered."""

    queue: str
    completed: int
    failed: int


@dataclasses.dataclass(frozen=True)
class ThroughputPoint:
    """Tasks that finished within one minute (UTC), starting at ``minute``."""

    minute: datetime
    completed: int
    failed: int  # dead-lettered


@dataclasses.dataclass(frozen=True)
class Failure:
    """A task whose last attempt failed: waiting for a retry (``retry_at``) or dead-lettered
    (``finished_at``)."""

    task_id: uuid.UUID
    dead: bool
    type: str
    queue: str
    priority: Priority
    attempts: int
    max_attempts: int
    last_error: str | None
    started_at: datetime | None  # when the failed attempt started
    retry_at: datetime | None
    finished_at: datetime | None

    @property
    def error(self) -> ErrorText | None:
        """The last error split into its summary (the exception) and its traceback."""
        return None if self.last_error is None else split_error(self.last_error)
