"""The core API on a caller's connection, written once for sync and async code.

Every function takes the connection first: a psycopg 3 ``Connection`` or a SQLAlchemy 2
``Session``/``Connection``. None of them commits: the caller's transaction decides. Pass
``now=`` only in tests, to control the clock instead of sleeping.

Each operation below is a builder: it validates its arguments and returns the sans-IO op
(:mod:`pgqueue.queries`). ``@operation`` binds it to the sync driver, which is the function
this module exports, and to the async one, its ``.aio``, which :mod:`pgqueue.aio` exports
under the same name; so an operation is written, documented and validated in one place.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pgqueue import arguments, config, tracing
from pgqueue.cron import Schedule
from pgqueue.enqueue import (
    PLAIN_KEYS,
    check_name,
    encode_payload,
    new_task_ids,
    prepare,
    prepare_plain,
)
from pgqueue.errors import (
    QueueNotFound,
    TaskNotFound,
    ValidationError,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
)
from pgqueue.models import (
    ClaimedTask,
    EnqueueResult,
    FailResult,
    Failure,
    KeyReuse,
    Lease,
    Limit,
    LimitKind,
    OldestSnapshot,
    Parent,
    Priority,
    QueueBacklog,
    QueueState,
    QueueStats,
    QueueThroughput,
    RetryPolicy,
    SnoozeResult,
    SweepResult,
    Task,
    TaskStatus,
    ThroughputPoint,
    WorkflowInfo,
    WorkflowStatus,
    built,
)
from pgqueue.queries import (
    claiming,
    dependencies,
    leased,
    queues,
    schedules,
    stats,
    submitting,
    task_types,
    tasks,
)
from pgqueue.queries.driver import (
    Op,
    WaitOp,
    atomic_operation,
    mapped,
    operation,
    waiting_operation,
)
from pgqueue.queries.leased import HeartbeatResult
from pgqueue.queries.specs import TaskSpec
from pgqueue.result_encoding import encode_result
from pgqueue.waiting import DEFAULT_POLL_INTERVAL, wait_loop, workflow_wait_loop

DAY = 24 * 3600.0
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_COMPLETED_RETENTION = DAY
DEFAULT_DEAD_RETENTION = 14 * DAY
MAX_BATCH = config.MAX_BATCH


def parse_task_id(task_id: uuid.UUID | str) -> uuid.UUID:
    """A task id from a UUID or its text; anything else is an unknown task."""
    if isinstance(task_id, uuid.UUID):
        return task_id
    try:
        return uuid.UUID(str(task_id).strip())
    except ValueError:
        raise TaskNotFound(task_id) from None


def parse_status(status: TaskStatus | str | None) -> TaskStatus | None:
    if status is None or isinstance(status, TaskStatus):
        return status
    try:
        return TaskStatus(str(status).strip().lower())
    except ValueError:
        choices = ", ".join(s.value for s in TaskStatus)
        raise ValidationError(
            "status", f"unknown status {status!r}; expected one of {choices}"
        ) from None


def check_limit(limit: int, field: str = "limit", maximum: int = MAX_BATCH) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(field, f"must be an integer from 1 to {maximum}, not {limit!r}")
    return limit


def check_seconds(
    field: str, value: float, *, zero_ok: bool = False, maximum: float = 10 * 365 * DAY
) -> float:
    """A duration in seconds: a finite number, positive (or zero when allowed), bounded."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
        or value < 0
        or (value == 0 and not zero_ok)
        or value > maximum
    ):
        low = "0" if zero_ok else "more than 0"
        raise ValidationError(field, f"must be seconds from {low} to {maximum:g}, not {value!r}")
    return float(value)


def check_window(window_seconds: float) -> float:
    return check_seconds("window_seconds", window_seconds)


MAX_LEASE_SECONDS = 7 * DAY


def check_lease(lease_seconds: float) -> float:
    return check_seconds("lease_seconds", lease_seconds, maximum=MAX_LEASE_SECONDS)


def check_retry_after(retry_after: float | None) -> float | None:
    return None if retry_after is None else check_seconds("retry_after", retry_after, zero_ok=True)


MAX_RUNNING = 1_000_000
MAX_RATE = 10_000  # the sliding log keeps one timestamp per start in the window


def limit_target(type: str | None, queue: str | None) -> tuple[LimitKind, str]:
    """A limit is on one task type or one queue: exactly one of the two names."""
    if (type is None) == (queue is None):
        raise ValidationError("type", "give exactly one: a task type or a queue")
    if type is not None:
        return LimitKind.TYPE, check_name("type", type)
    assert queue is not None
    return LimitKind.QUEUE, check_name("queue", queue)


def limit_values(
    max_running: int | None, rate: int | None, per: float
) -> tuple[int | None, int | None, float | None]:
    """Validated (max_running, rate_limit, rate_period); at least one limit must be given."""
    for field, value, top in (("max_running", max_running, MAX_RUNNING), ("rate", rate, MAX_RATE)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top
        ):
            raise ValidationError(field, f"must be an integer from 0 to {top}, not {value!r}")
    if max_running is None and rate is None:
        raise ValidationError("max_running", "give max_running, rate, or both")
    period = check_seconds("per", per) if rate is not None else None
    return max_running, rate, period


def retention_value(field: str, seconds: float | None) -> float | None:
    return None if seconds is None else check_seconds(field, seconds)


def as_specs(items: Iterable[TaskSpec | Mapping[str, Any]]) -> list[TaskSpec]:
    """Validate a batch: prepared TaskSpecs or dicts of enqueue's keyword arguments.

    The same prepared task twice is refused (it would collide with itself). The payload
    limit is read once for the batch rather than once per task, and the batch's ids are made
    at once, in the order of its items (a prepared task keeps its own).
    """
    limit = config.max_payload_bytes()
    batch = items if isinstance(items, list | tuple) else list(items)
    ids = iter(new_task_ids(len(batch)))
    names: set[str] = set()
    prepared = False
    out: list[TaskSpec] = []
    for item in batch:
        if isinstance(item, TaskSpec):
            out.append(item)
            prepared = True
        elif item.__class__ is dict and "type" in item and item.keys() <= PLAIN_KEYS:
            out.append(prepare_plain(next(ids), item, limit, names))
        elif isinstance(item, Mapping):
            if "type" not in item:
                raise ValidationError("type", "is required")
            if "key_reuse" in item:
                raise ValidationError(
                    "key_reuse", "is an option of the batch: enqueue_many(..., key_reuse=...)"
                )
            if "max_payload_bytes" in item:
                spec = prepare(**item)
            else:
                spec = prepare(**item, max_payload_bytes=limit)
            # The batch's next id, for the batch's order (none of its items can name this
            # one's fresh id in depends_on: only prepared tasks are known before).
            out.append(spec._replace(id=next(ids)))
        else:
            raise ValidationError(
                "tasks", f"items must be dicts or pgqueue.prepare(...), not {type(item).__name__}"
            )
    # Ids made here are new, so only a prepared task can appear twice.
    if prepared and len({s.id for s in out}) != len(out):
        raise ValidationError(
            "tasks", "the same prepared task appears twice; call pgqueue.prepare() once per task"
        )
    return out


def check_filters(**filters: str | None) -> None:
    """Filter values are names: refuse what no task can have (NUL, over-long) up front."""
    for field, value in filters.items():
        if value is not None:
            check_name(field, value)


def list_args(
    status: TaskStatus | str | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: Task | tuple[datetime, uuid.UUID] | None,
) -> dict[str, Any]:
    cursor = (before.created_at, before.id) if isinstance(before, Task) else before
    check_filters(type=type, queue=queue)
    return {
        "status": parse_status(status),
        "type": type,
        "queue": queue,
        "limit": check_limit(limit),
        "before": cursor,
    }


def _results(results: Iterable[tuple[Lease, Any]]) -> list[tuple[Lease, str | None]]:
    """Every result encoded by the worker's rule (InvalidResult, ResultTooLarge) before
    anything is written."""
    limit = config.max_result_bytes()
    return [(lease, encode_result(value, lease.task_id, limit=limit)) for lease, value in results]


# --- producing -------------------------------------------------------------------------------


@operation
def enqueue(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    key_reuse: KeyReuse | str = "return",
    **options: Any,
) -> Op[EnqueueResult]:
    """Submit one task in the caller's transaction.

    Options: ``priority`` ('high', 'normal', 'low'), ``queue``, ``idempotency_key``,
    ``run_at`` (aware datetime) or ``delay`` (seconds), ``max_attempts``, ``retry`` (a
    RetryPolicy), ``expires_in`` (seconds) or ``expires_at`` (aware datetime): if no attempt
    has been spent by then, the task never runs and ends cancelled, reason ``expired``. Left
    out (or None), the priority, queue and retry policy are the type's declaration (recorded
    by workers at start), else 'normal', 'default' and 3 attempts. With an idempotency key
    that was already used, nothing is inserted and the original task comes back with
    ``created=False``, whatever was submitted this time; with ``key_reuse="refuse"``, only if
    this submit has the original's type, queue (when given) and payload (JSON equality), else
    IdempotencyConflict is raised, naming the original and the fields that differ. Nothing is
    written then, and the transaction is still usable.
    """
    now = options.pop("now", None)
    reuse = KeyReuse.parse(key_reuse)
    return _insert(prepare(type, payload, **options), now, reuse)


def _insert(spec: TaskSpec, now: datetime | None, key_reuse: KeyReuse) -> Op[EnqueueResult]:
    # A queue left out is the type's declared one, known only once inserted.
    with tracing.submit_span(spec.type, spec.queue or "(declared)") as trace_context:
        task, created = yield from submitting.task_insert(spec, now, trace_context, key_reuse)
    return EnqueueResult(task, created)


@atomic_operation
def enqueue_many(
    tasks: Iterable[TaskSpec | Mapping[str, Any]],
    *,
    key_reuse: KeyReuse | str = "return",
    now: datetime | None = None,
) -> Op[list[EnqueueResult]]:
    """Submit many tasks in one statement; results come back in the order given.

    Items are ``pgqueue.prepare(...)`` results or dicts of enqueue's arguments. Every item is
    validated before anything is written, so one bad item rejects the whole batch.
    ``key_reuse`` is enqueue's, for the whole batch. Of two items with the same idempotency
    key, the first is created and the second gets it back; with ``key_reuse="refuse"``, an
    item that differs from its key's holder (an older task or an earlier item) raises
    IdempotencyConflict (``.index`` says which item) and none of the batch is written.
    """
    reuse = KeyReuse.parse(key_reuse)
    return _insert_many(as_specs(tasks), now, reuse)


def _insert_many(
    specs: list[TaskSpec], now: datetime | None, key_reuse: KeyReuse
) -> Op[list[EnqueueResult]]:
    queues = {s.queue or "(declared)" for s in specs}
    type_, queue = tracing.batch_names({s.type for s in specs}, queues)
    with tracing.submit_span(type_, queue, count=len(specs)) as trace_context:
        rows = yield from submitting.task_insert_many(specs, now, trace_context, key_reuse)
    # (built: an EnqueueResult's __init__ is a fifth of a task's own)
    return [built(EnqueueResult, {"task": t, "created": c}) for t, c in rows]


@atomic_operation
def enqueue_columns(
    type: str,
    payloads: Iterable[Mapping[str, Any] | None],
    *,
    queue: str | None = None,
    priority: Priority | str | int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    expires_in: float | None = None,
    expires_at: datetime | None = None,
    now: datetime | None = None,
) -> Op[list[uuid.UUID]]:
    """Submit one task of ``type`` per payload, with the same options for all; returns their
    ids, in the order of ``payloads``.

    The columnar form of enqueue_many, for large batches of one type: the options are checked
    once, each payload as enqueue checks it (a JSON object within the size limit, None for
    ``{}``), all before anything is written, and the batch goes in by one binary COPY in the
    caller's transaction (all or nothing even on an autocommit connection). No Task objects
    are made: a fraction of enqueue_many's cost per task. The options are enqueue's (left
    out, the type's declaration applies); an idempotency key or parents need enqueue_many.
    """
    template = prepare(
        type,
        None,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        retry=retry,
        expires_in=expires_in,
        expires_at=expires_at,
    )
    if isinstance(payloads, str | bytes | Mapping) or not isinstance(payloads, Iterable):
        raise ValidationError(
            "payloads", f"must be a list of payloads (dicts), not {_kind(payloads)}"
        )
    limit = config.max_payload_bytes()
    encoded = [encode_payload({} if p is None else p, limit) for p in payloads]
    return _insert_columns(template, encoded, now)


def _insert_columns(
    template: TaskSpec, payloads: list[str], now: datetime | None
) -> Op[list[uuid.UUID]]:
    if not payloads:
        return []
    ids = new_task_ids(len(payloads))
    queue = template.queue or "(declared)"
    with tracing.submit_span(template.type, queue, count=len(ids)) as trace_context:
        yield from submitting.task_copy_columns(template, ids, payloads, now, trace_context)
    return ids


# --- function tasks (issue 15): a prepared task's insert, arguments checked by name -----------


def insert_prepared(
    spec: TaskSpec, now: datetime | None = None, key_reuse: KeyReuse = KeyReuse.RETURN
) -> Op[EnqueueResult]:
    """The op of one prepared task's insert (``pgqueue.enqueue`` after its ``prepare``): what a
    function task's ``enqueue`` drives, having bound and checked its arguments itself."""
    return _insert(spec, now, key_reuse)


@operation
def check_arguments(type: str, payload: Mapping[str, Any] | None = None) -> Op[None]:
    """Check a payload against the parameters a worker recorded for ``type`` (a function
    task, ``@tasks.task``): raises InvalidArgument naming the argument that is missing,
    unknown, not JSON or of the wrong JSON type; does nothing for a type that recorded none
    (a ``handler(payload, ctx)`` type, or one no worker declared yet). One primary-key read.

    The CLI and the HTTP API call it before they enqueue, since they never import the user's
    code; ``pgqueue.enqueue`` by type name does not (no extra round trip on the hot path):
    a producer holding the function checks for free with ``fn.enqueue(...)``.
    """
    check_name("type", type)
    given = {} if payload is None else payload
    if not isinstance(given, Mapping):
        raise ValidationError("payload", f"must be a JSON object (a dict), not {_kind(given)}")
    return _check_arguments(type, given)


def _kind(value: object) -> str:
    return value.__class__.__name__


def _check_arguments(type: str, payload: Mapping[str, Any]) -> Op[None]:
    description = yield from task_types.task_type_parameters(type)
    if description is not None:
        arguments.check_arguments(description, payload)


# --- inspecting and operating ----------------------------------------------------------------


@operation
def parents(task_id: uuid.UUID | str) -> Op[list[Parent]]:
    """The parents of a task (its depends_on, in that order) with their statuses and
    results; empty for a task without parents (issue 16)."""
    return dependencies.task_parents(parse_task_id(task_id))


@operation
def children(task_id: uuid.UUID | str) -> Op[list[Parent]]:
    """The tasks that depend on this one, with their statuses (issue 16)."""
    return dependencies.task_children(parse_task_id(task_id))


@operation
def get_task(task_id: uuid.UUID | str) -> Op[Task]:
    """The task with this id; TaskNotFound for an unknown (or malformed) id."""
    return tasks.task_get(parse_task_id(task_id))


@operation
def list_tasks(
    *,
    status: TaskStatus | str | None = None,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    before: Task | tuple[datetime, uuid.UUID] | None = None,
) -> Op[list[Task]]:
    """Tasks newest first; pass the last task of a page as ``before`` for the next page."""
    return tasks.task_list(**list_args(status, type, queue, limit, before))


@operation
def cancel(task_id: uuid.UUID | str, *, now: datetime | None = None) -> Op[Task]:
    """Cancel a task.

    A queued (or scheduled) task becomes ``cancelled`` and will never run. A running task
    cannot be stopped from outside safely, so it is flagged and, when you commit, the worker
    holding its lease is notified: its handler sees ``context.should_stop()`` turn true at
    once (at the next heartbeat if the notification was lost) and may raise ``Cancel``; if
    it completes anyway, the result stands. A finished task raises InvalidTaskState.
    """
    return tasks.task_cancel(parse_task_id(task_id), now)


@operation
def replay(
    ids: Sequence[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
    now: datetime | None = None,
) -> Op[list[uuid.UUID]]:
    """Move dead letters (by id, or all matching the filters) back to queued with fresh attempts.

    Works in batches of at most ``limit``; call again until it returns an empty list to replay
    more. Returns the ids replayed.
    """
    check_filters(type=type, queue=queue)
    parsed = [parse_task_id(i) for i in ids] if ids is not None else None
    return tasks.task_replay(parsed, type, queue, check_limit(limit), now)


@operation
def discard(
    ids: Sequence[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
) -> Op[list[uuid.UUID]]:
    """Delete dead letters by id or filter (at most ``limit`` per call); returns the ids."""
    check_filters(type=type, queue=queue)
    parsed = [parse_task_id(i) for i in ids] if ids is not None else None
    return tasks.task_discard(parsed, type, queue, check_limit(limit))


@operation
def count_dead_letters(*, type: str | None = None, queue: str | None = None) -> Op[int]:
    """How many dead letters match the filters: what a ``replay`` or ``discard`` by the same
    filters would take (less any that change meanwhile), for a confirmation to name."""
    check_filters(type=type, queue=queue)
    return tasks.task_dead_count(type, queue)


@operation
def queue_stats() -> Op[list[QueueStats]]:
    """Depth per queue, priority and status, with the age of the oldest ready task. It counts
    the finished tasks kept too, so it reads the whole table: for something asked every few
    seconds (a scraper, a dashboard, an autoscaler), use :func:`backlog`."""
    return stats.queue_depth()


MAX_SERIES_MINUTES = 1440  # a day of per-minute points


@operation
def throughput_series(
    *, minutes: int = 60, queue: str | None = None, now: datetime | None = None
) -> Op[list[ThroughputPoint]]:
    """Tasks completed and dead-lettered per minute over the last ``minutes`` (at most a day),
    oldest first with every minute present, of ``queue`` or of every queue."""
    check_filters(queue=queue)
    span = check_limit(minutes, "minutes", MAX_SERIES_MINUTES)
    return stats.throughput_series(span, queue, now)


@operation
def recent_failures(*, limit: int = 20) -> Op[list[Failure]]:
    """Recent failures: up to ``limit`` tasks waiting for a retry after a failed attempt
    (latest next attempt first), then up to ``limit`` dead letters (newest first)."""
    return stats.task_failures(check_limit(limit))


@operation
def overview() -> Op[list[QueueStats]]:
    """Depth per queue, priority and status of queued, running, waiting (for their parents)
    and dead-lettered tasks (not completed or cancelled ones): what `pgqueue stats`, the API
    and the dashboard show, read through partial indexes, so it may be asked every few
    seconds."""
    return stats.queue_overview()


@operation
def backlog(queues: Sequence[str] | None = None) -> Op[list[QueueBacklog]]:
    """Per queue (these, or all) and priority: ready, scheduled and running tasks and the age
    of the oldest ready one, read from queued and running tasks only (the autoscaling
    signal; ``pgqueue.backlog`` in SQL)."""
    return stats.queue_backlog(queues)


@operation
def oldest_snapshot() -> Op[OldestSnapshot | None]:
    """The oldest snapshot holding back cleanup of ``pgqueue.tasks`` in this database (a
    session idle in a transaction, a long report or ``pg_dump``, a replication slot, a
    prepared transaction), or None. Workers keep their claims cheap while one is open, but
    the table and its indexes grow until it ends: see the README's "When the database holds
    an old snapshot". Full detail on other roles' sessions needs pg_read_all_stats."""
    return stats.oldest_snapshot()


def _tick_spec(schedule: Schedule, registry: Any = None) -> Callable[[datetime], TaskSpec]:
    """The task for one tick: the schedule's, with its type's retry policy when known."""

    def make(tick: datetime) -> TaskSpec:
        options: dict[str, Any] = {"queue": schedule.queue, "priority": schedule.priority}
        if registry is not None:
            options = registry.enqueue_options(schedule.type, options)
        key = f"periodic:{schedule.name}:{tick.astimezone(UTC).isoformat()}"
        return prepare(schedule.type, schedule.payload, idempotency_key=key, run_at=tick, **options)

    return make


def _enqueue_results(rows: list[tuple[Task, bool]]) -> list[EnqueueResult]:
    # (built: an EnqueueResult's __init__ is a fifth of a task's own)
    return [built(EnqueueResult, {"task": t, "created": c}) for t, c in rows]


@atomic_operation
def run_schedule(
    schedule: Schedule, *, registry: Any = None, now: datetime | None = None
) -> Op[list[EnqueueResult]]:
    """Enqueue the schedule's due ticks, once across every caller (see TaskRegistry.periodic).
    Workers do this on their own; call it to drive a schedule from elsewhere."""
    moment = now or datetime.now(UTC)
    op = schedules.schedule_run(schedule, _tick_spec(schedule, registry), moment)
    return mapped(op, _enqueue_results)


@operation
def list_schedules() -> Op[list[dict[str, Any]]]:
    """Every schedule a worker has declared: cron, time zone, last tick and next run."""
    return schedules.schedule_list()


@operation
def promote_aged(
    *, after_seconds: float, limit: int = 1000, now: datetime | None = None
) -> Op[list[uuid.UUID]]:
    """The starvation policy, one batch: queued tasks ready for ``after_seconds`` move up one
    priority and wait another ``after_seconds`` before the next step. Workers run this in
    their maintenance (``--promote-after``); call it yourself to run it elsewhere."""
    seconds = check_seconds("after_seconds", after_seconds)
    op = queues.task_promote(seconds, check_limit(limit), now)
    return mapped(op, lambda promoted: [task_id for task_id, *_ in promoted])


@operation
def pause_queue(queue: str, *, create: bool = True, now: datetime | None = None) -> Op[QueueState]:
    """Stop every worker from claiming tasks of ``queue`` (from their next claim: within a
    poll interval, across processes and hosts) until it is resumed; it stays paused across
    restarts. Tasks already running finish. Submitting to a paused queue still works.

    ``create=False`` refuses (:class:`~pgqueue.QueueNotFound`) a queue with no tasks and no
    settings, which is most often a typo that would stay paused, unnoticed, for good; the
    CLI and the HTTP API pass it unless told ``--create`` / ``?create=true``. Code names its
    queues itself, and pausing one before its first task is ordinary there."""
    return _pause(check_name("queue", queue), create, now)


def _pause(queue: str, create: bool, now: datetime | None) -> Op[QueueState]:
    yield from _known_unless_created(queue, create, "pause it")
    return (yield from queues.queue_pause(queue, now))


def _known_unless_created(queue: str, create: bool, doing: str) -> Op[None]:
    """Refuse a setting on a queue nobody knows (no tasks, no settings) unless ``create``:
    such a name is most often a typo, and its setting would sit there unnoticed."""
    if not create and not (yield from queues.queue_known(queue)):
        raise QueueNotFound(
            queue,
            f"to {doing} before its first task, say so: create=True (CLI: --create, "
            "HTTP: ?create=true)",
        )


@operation
def resume_queue(queue: str, *, now: datetime | None = None) -> Op[QueueState]:
    """Let workers claim from ``queue`` again; idle workers are woken when you commit."""
    return queues.queue_resume(check_name("queue", queue), now)


@operation
def remove_queue(queue: str) -> Op[bool]:
    """Forget the settings of ``queue`` (paused, retention): a paused one runs again, with
    the workers' retention. Its tasks are not touched. Whether it had any settings."""
    return queues.queue_remove(check_name("queue", queue))


@operation
def list_queues() -> Op[list[QueueState]]:
    """Queues with tasks (in any status) or a setting, and whether each is paused."""
    return queues.queue_list()


@operation
def set_queue_retention(
    queue: str,
    *,
    completed: float | None = None,
    dead: float | None = None,
    create: bool = True,
    now: datetime | None = None,
) -> Op[QueueState]:
    """Keep this queue's completed and cancelled tasks ``completed`` seconds, and its dead
    letters ``dead`` seconds, instead of the workers' defaults (None: the default). Both are
    set at once; pruning applies them from its next round on, to tasks already finished too.

    ``create=False`` refuses (:class:`~pgqueue.QueueNotFound`) a queue with no tasks and no
    settings, as :func:`pause_queue` does, and the CLI and the HTTP API pass it unless told
    ``--create`` / ``?create=true``: a mistyped name would otherwise keep a retention that
    applies to nothing, while the real queue keeps the default."""
    return _set_retention(
        check_name("queue", queue),
        retention_value("completed", completed),
        retention_value("dead", dead),
        create,
        now,
    )


def _set_retention(
    queue: str, completed: float | None, dead: float | None, create: bool, now: datetime | None
) -> Op[QueueState]:
    yield from _known_unless_created(queue, create, "set its retention")
    return (yield from queues.queue_set_retention(queue, completed, dead, now))


@operation
def set_limit(
    *,
    type: str | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    rate: int | None = None,
    per: float = 1.0,
    now: datetime | None = None,
) -> Op[Limit]:
    """Limit the tasks of one ``type`` (or one ``queue``) across every worker: at most
    ``max_running`` at once, at most ``rate`` starts in any ``per``-second window, or both.
    The limit is set as a whole (a part left None is no limit of that kind) and is enforced
    in the database, so it holds however many worker processes and hosts run; claims obey it
    from the next one on. 0 stops the tasks without pausing the queue."""
    kind, name = limit_target(type, queue)
    return queues.limit_set(kind, name, *limit_values(max_running, rate, per), now)


@operation
def clear_limit(*, type: str | None = None, queue: str | None = None) -> Op[bool]:
    """Remove the limit on a type or queue (its tasks are claimed as any others); whether
    there was one."""
    return queues.limit_clear(*limit_target(type, queue))


@operation
def list_limits(*, now: datetime | None = None) -> Op[list[Limit]]:
    """Every limit, with the tasks running under it and its starts in the rate window."""
    return queues.limit_list(now)


@operation
def throughput(
    *, window_seconds: float = 60, now: datetime | None = None
) -> Op[list[QueueThroughput]]:
    """Per queue, the tasks completed and dead-lettered in the last ``window_seconds``."""
    return stats.queue_throughput(check_window(window_seconds), now)


# --- working (what a worker calls) -----------------------------------------------------------


@atomic_operation
def claim(
    queues: Sequence[str],
    *,
    limit: int,
    worker_id: str,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    now: datetime | None = None,
) -> Op[list[ClaimedTask]]:
    """Claim up to ``limit`` ready tasks: marks them running, counts the attempt, sets a lease.

    Commit promptly: the claim's row locks (and, when limits exist, the limits lock) are held
    until the transaction ends. Tasks under a limit (:func:`set_limit`) are claimed within it.
    The claim's transaction commits without waiting for the WAL flush (README, "The delivery
    guarantee"), and so does anything else written in it: give the claim a transaction of
    its own, as the worker does.
    """
    op = claiming.claim_round(
        queues=list(queues),
        limit=check_limit(limit),
        owner=worker_id,
        lease_seconds=check_lease(lease_seconds),
        now=now,
    )
    return mapped(op, lambda round_: round_[0])


@operation
def complete(lease: Lease, result: Any = None, *, now: datetime | None = None) -> Op[None]:
    """Record success; raises LeaseLost (and writes nothing) if the lease is no longer held."""
    return leased.task_complete(lease, _results([(lease, result)])[0][1], now)


@operation
def complete_many(
    results: Iterable[tuple[Lease, Any]], *, now: datetime | None = None
) -> Op[set[uuid.UUID]]:
    """Record many successes in one statement; returns the ids whose lease was still held."""
    return leased.task_complete_many(_results(results), now)


@operation
def fail(
    lease: Lease,
    error: str,
    *,
    retry_after: float | None = None,
    policy: RetryPolicy | None = None,
    now: datetime | None = None,
) -> Op[FailResult]:
    """Record a failed attempt: retried after backoff (or ``retry_after`` seconds), or
    dead-lettered when attempts are spent. Raises LeaseLost if the lease is no longer held.

    ``policy`` (a task type's RetryPolicy) replaces the task's own max attempts and backoff
    from this attempt on."""
    return leased.task_fail(lease, error, check_retry_after(retry_after), now, policy)


@operation
def cancel_leased(lease: Lease, reason: str, *, now: datetime | None = None) -> Op[None]:
    """The holder cancels its own task (a handler raised Cancel): final, not retried."""
    return leased.task_cancel_leased(lease, reason, now)


# --- issue 15: snooze and expiry ------------------------------------------------------------


@operation
def snooze(
    lease: Lease,
    after: float,
    *,
    reason: str = "snoozed",
    max_snoozes: int | None = None,
    now: datetime | None = None,
) -> Op[SnoozeResult]:
    """Record a snooze (a handler raised Snooze): queued again ``after`` seconds from now,
    the attempt given back, the snooze count one higher. A task that has snoozed
    ``max_snoozes`` times (default: ``PGQUEUE_MAX_SNOOZES``, else 100) gets a failed attempt
    instead, whose error names the bound. Raises LeaseLost if the lease is no longer held."""
    seconds = check_seconds("after", after)
    bound = config.max_snoozes() if max_snoozes is None else max_snoozes
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise ValidationError("max_snoozes", f"must be an integer >= 0, not {bound!r}")
    return leased.task_snooze(lease, seconds, max_snoozes=bound, reason=reason, now=now)


@operation
def expire(*, limit: int = 1000, now: datetime | None = None) -> Op[list[uuid.UUID]]:
    """Cancel, with the reason ``expired``, up to ``limit`` waiting tasks whose expiry passed
    before any attempt was spent; their ids. Workers do this in their maintenance (every
    sweep); claims never start such a task meanwhile."""
    op = claiming.task_expire(check_limit(limit), now)
    return mapped(op, lambda rows: [row["id"] for row in rows])


@operation
def heartbeat(
    leases: Sequence[Lease],
    *,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    now: datetime | None = None,
) -> Op[HeartbeatResult]:
    """Extend leases still held; the result lists them and any cancellation requests."""
    return leased.task_heartbeat(leases, check_lease(lease_seconds), now)


@operation
def release(leases: Sequence[Lease], *, now: datetime | None = None) -> Op[set[uuid.UUID]]:
    """Give tasks back without counting the attempt (graceful shutdown)."""
    return leased.task_release(leases, now)


@operation
def sweep_expired(*, limit: int = 1000, now: datetime | None = None) -> Op[SweepResult]:
    """Requeue (or dead-letter) running tasks whose lease expired; one batch per call."""
    return claiming.task_sweep_expired(check_limit(limit), now)


@operation
def prune(
    *,
    completed_after: float = DEFAULT_COMPLETED_RETENTION,
    dead_after: float = DEFAULT_DEAD_RETENTION,
    limit: int = 1000,
    now: datetime | None = None,
) -> Op[int]:
    """Delete completed/cancelled tasks older than ``completed_after`` seconds and dead letters
    older than ``dead_after`` (or their queue's own retention, :func:`set_queue_retention`);
    at most ``limit`` of each per call. Returns how many went."""
    check_limit(limit)
    return _prune(completed_after, dead_after, limit, now)


def _prune(completed_after: float, dead_after: float, limit: int, now: datetime | None) -> Op[int]:
    finished = [TaskStatus.COMPLETED, TaskStatus.CANCELLED]
    done: int = yield from queues.task_prune(finished, completed_after, limit, now)
    dead: int = yield from queues.task_prune([TaskStatus.FAILED], dead_after, limit, now)
    return done + dead


# --- waiting for a result (issue 15) ---------------------------------------------------------


@waiting_operation
def wait(
    task_id: uuid.UUID | str,
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> WaitOp[Task]:
    """Wait until the task is final and return it: completed (read ``.result``), failed
    (dead-lettered: ``.last_error``) or cancelled. It returns rather than raises for the
    last two: the caller reads ``.status``, ``.result`` and ``.attempts`` either way.

    Raises WaitTimeout (a TimeoutError, naming the task, its type and its status, with the
    task as last read in ``.task``) after ``timeout`` seconds; the task goes on. An unknown
    id is TaskNotFound.

    The connection must not be inside a transaction (WaitInTransaction): commit the one that
    enqueued the task first, since workers cannot see it before, and notifications arrive
    only between transactions. An autocommit connection suits best; on another, each read
    runs in a short transaction of its own. The wait holds the connection throughout.

    It is woken by a notification when the task finishes, not by polling; it also reads the
    task every ``poll_interval`` seconds, in case a notification was missed.
    """
    return wait_loop(
        parse_task_id(task_id),
        check_seconds("timeout", timeout),
        check_seconds("poll_interval", poll_interval),
    )


# --- workflows (issue 16) --------------------------------------------------------------------


def parse_workflow_id(workflow_id: uuid.UUID | str) -> uuid.UUID:
    """A workflow id from a UUID or its text; a malformed one is WorkflowNotFound, as a
    malformed task id is TaskNotFound."""
    if isinstance(workflow_id, uuid.UUID):
        return workflow_id
    try:
        return uuid.UUID(str(workflow_id))
    except ValueError:
        raise WorkflowNotFound(workflow_id) from None


@operation
def workflow(workflow_id: uuid.UUID | str) -> Op[WorkflowInfo]:
    """The workflow with this id as it is now: its status (running, completed, failed,
    cancelled: derived from its tasks as the pgqueue.workflows view does), how many tasks are
    in each status, its tasks in build order with their parents and children, and its final
    result (``.result``). WorkflowNotFound if no task belongs to it."""
    return dependencies.workflow_get(parse_workflow_id(workflow_id))


@operation
def cancel_workflow(
    workflow_id: uuid.UUID | str, *, now: datetime | None = None
) -> Op[WorkflowInfo]:
    """Cancel every unfinished task of the workflow and return the workflow as it is then.

    Waiting and queued tasks are cancelled at once; a running one is asked to stop, as
    :func:`cancel` does (cooperative: its handler sees ``should_stop()``; if it completes
    anyway, its result stands), so the workflow may still be running until it ends. Finished
    tasks are left as they are; cancelling a finished workflow changes nothing.
    WorkflowNotFound for an unknown id."""
    return _cancel_workflow(parse_workflow_id(workflow_id), now)


def _cancel_workflow(workflow_id: uuid.UUID, now: datetime | None) -> Op[WorkflowInfo]:
    info: WorkflowInfo = yield from dependencies.workflow_get(workflow_id)  # WorkflowNotFound
    if not info.status.is_final:
        yield from dependencies.workflow_cancel(workflow_id, now)
        info = yield from dependencies.workflow_get(workflow_id)
    return info


def _workflow_outcome(info: WorkflowInfo) -> Any:
    if info.status is WorkflowStatus.FAILED:
        raise WorkflowFailed(info)
    if info.status is WorkflowStatus.CANCELLED:
        raise WorkflowCancelled(info)
    return info.result


def wait_workflow_loop(workflow_id: uuid.UUID, timeout: float, poll_interval: float) -> WaitOp[Any]:
    info = yield from workflow_wait_loop(workflow_id, timeout, poll_interval)
    return _workflow_outcome(info)


@waiting_operation
def wait_workflow(
    workflow_id: uuid.UUID | str,
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> WaitOp[Any]:
    """Wait until every task of the workflow is final and return its final result: the result
    of its sink task (the one nothing depends on), or the list of its sinks' results in build
    order if it has several.

    Raises WorkflowFailed if a task was dead-lettered, WorkflowCancelled if the workflow ended
    cancelled (each with the workflow in ``.info`` and the task in ``.task``), and
    WorkflowWaitTimeout (a WaitTimeout, as a task's wait raises) after ``timeout`` seconds;
    the workflow goes on. WorkflowNotFound for an unknown id. As :func:`wait`, the connection
    must not be inside a transaction, and the wait is woken by notifications when the
    workflow's tasks finish, with a read every ``poll_interval`` seconds as a fallback.
    """
    return wait_workflow_loop(
        parse_workflow_id(workflow_id),
        check_seconds("timeout", timeout),
        check_seconds("poll_interval", poll_interval),
    )
