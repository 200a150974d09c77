"""The core API for async code: the same functions as :mod:`pgqueue.operations`, awaited.

Pass a psycopg ``AsyncConnection`` or a SQLAlchemy ``AsyncSession``/``AsyncConnection``
(``postgresql+psycopg`` dialect). Nothing here commits. Validation and SQL are shared with
the sync API (see :mod:`pgqueue.queries`); only the driving loop differs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pgqueue import queries, tracing
from pgqueue.cron import Schedule
from pgqueue.enqueue import check_name, prepare
from pgqueue.models import (
    ClaimedTask,
    EnqueueResult,
    FailResult,
    Failure,
    Lease,
    Limit,
    QueueBacklog,
    QueueState,
    QueueStats,
    QueueThroughput,
    RetryPolicy,
    SweepResult,
    Task,
    TaskStatus,
    ThroughputPoint,
)
from pgqueue.operations import (
    DEFAULT_COMPLETED_RETENTION,
    DEFAULT_DEAD_RETENTION,
    DEFAULT_LEASE_SECONDS,
    MAX_SERIES_MINUTES,
    _results,
    _tick_spec,
    as_specs,
    check_filters,
    check_lease,
    check_limit,
    check_retry_after,
    check_window,
    limit_target,
    limit_values,
    list_args,
    parse_task_id,
    retention_value,
)
from pgqueue.queries import HeartbeatResult, TaskSpec, arun


async def enqueue(
    conn: Any, /, type: str, payload: Mapping[str, Any] | None = None, **options: Any
) -> EnqueueResult:
    """See :func:`pgqueue.enqueue`."""
    now = options.pop("now", None)
    spec = prepare(type, payload, **options)
    with tracing.submit_span(spec.type, spec.queue) as trace_context:
        task, created = await arun(conn, queries.task_insert(spec, now, trace_context))
    return EnqueueResult(task, created)


async def enqueue_many(
    conn: Any, /, tasks: Iterable[TaskSpec | Mapping[str, Any]], *, now: datetime | None = None
) -> list[EnqueueResult]:
    """See :func:`pgqueue.enqueue_many`."""
    specs = as_specs(tasks)
    type_, queue = tracing.batch_names({s.type for s in specs}, {s.queue for s in specs})
    with tracing.submit_span(type_, queue, count=len(specs)) as trace_context:
        op = queries.task_insert_many(specs, now, trace_context)
        return [EnqueueResult(t, c) for t, c in await arun(conn, op, atomic=True)]


async def get_task(conn: Any, /, task_id: uuid.UUID | str) -> Task:
    return await arun(conn, queries.task_get(parse_task_id(task_id)))


async def list_tasks(
    conn: Any,
    /,
    *,
    status: TaskStatus | str | None = None,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    before: Task | tuple[datetime, uuid.UUID] | None = None,
) -> list[Task]:
    return await arun(conn, queries.task_list(**list_args(status, type, queue, limit, before)))


async def cancel(conn: Any, /, task_id: uuid.UUID | str, *, now: datetime | None = None) -> Task:
    return await arun(conn, queries.task_cancel(parse_task_id(task_id), now))


async def replay(
    conn: Any,
    /,
    ids: Sequence[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    check_filters(type=type, queue=queue)
    parsed = [parse_task_id(i) for i in ids] if ids is not None else None
    return await arun(conn, queries.task_replay(parsed, type, queue, check_limit(limit), now))


async def discard(
    conn: Any,
    /,
    ids: Sequence[uuid.UUID | str] | None = None,
    *,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 1000,
) -> list[uuid.UUID]:
    check_filters(type=type, queue=queue)
    parsed = [parse_task_id(i) for i in ids] if ids is not None else None
    return await arun(conn, queries.task_discard(parsed, type, queue, check_limit(limit)))


async def queue_stats(conn: Any) -> list[QueueStats]:
    return await arun(conn, queries.queue_depth())


async def overview(conn: Any) -> list[QueueStats]:
    """See :func:`pgqueue.overview`."""
    return await arun(conn, queries.queue_overview())


async def backlog(conn: Any, /, queues: Sequence[str] | None = None) -> list[QueueBacklog]:
    """See :func:`pgqueue.backlog`."""
    return await arun(conn, queries.queue_backlog(queues))


async def run_schedule(
    conn: Any, /, schedule: Schedule, *, registry: Any = None, now: datetime | None = None
) -> list[EnqueueResult]:
    """See :func:`pgqueue.run_schedule`."""
    moment = now or datetime.now(UTC)
    op = queries.schedule_run(schedule, _tick_spec(schedule, registry), moment)
    return [EnqueueResult(t, c) for t, c in await arun(conn, op, atomic=True)]


async def list_schedules(conn: Any) -> list[dict[str, Any]]:
    """See :func:`pgqueue.list_schedules`."""
    return await arun(conn, queries.schedule_list())


async def pause_queue(conn: Any, /, queue: str, *, now: datetime | None = None) -> QueueState:
    """See :func:`pgqueue.pause_queue`."""
    return await arun(conn, queries.queue_pause(check_name("queue", queue), now))


async def resume_queue(conn: Any, /, queue: str, *, now: datetime | None = None) -> QueueState:
    """See :func:`pgqueue.resume_queue`."""
    return await arun(conn, queries.queue_resume(check_name("queue", queue), now))


async def list_queues(conn: Any) -> list[QueueState]:
    """See :func:`pgqueue.list_queues`."""
    return await arun(conn, queries.queue_list())


async def set_queue_retention(
    conn: Any,
    /,
    queue: str,
    *,
    completed: float | None = None,
    dead: float | None = None,
    now: datetime | None = None,
) -> QueueState:
    """See :func:`pgqueue.set_queue_retention`."""
    op = queries.queue_set_retention(
        check_name("queue", queue),
        retention_value("completed", completed),
        retention_value("dead", dead),
        now,
    )
    return await arun(conn, op)


async def set_limit(
    conn: Any,
    /,
    *,
    type: str | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    rate: int | None = None,
    per: float = 1.0,
    now: datetime | None = None,
) -> Limit:
    """See :func:`pgqueue.set_limit`."""
    kind, name = limit_target(type, queue)
    op = queries.limit_set(kind, name, *limit_values(max_running, rate, per), now)
    return await arun(conn, op)


async def clear_limit(conn: Any, /, *, type: str | None = None, queue: str | None = None) -> bool:
    """See :func:`pgqueue.clear_limit`."""
    return await arun(conn, queries.limit_clear(*limit_target(type, queue)))


async def list_limits(conn: Any, /, *, now: datetime | None = None) -> list[Limit]:
    """See :func:`pgqueue.list_limits`."""
    return await arun(conn, queries.limit_list(now))


async def throughput(
    conn: Any, /, *, window_seconds: float = 60, now: datetime | None = None
) -> list[QueueThroughput]:
    """See :func:`pgqueue.throughput`."""
    return await arun(conn, queries.queue_throughput(check_window(window_seconds), now))


async def claim(
    conn: Any,
    /,
    queues: Sequence[str],
    *,
    limit: int,
    worker_id: str,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    now: datetime | None = None,
) -> list[ClaimedTask]:
    """See :func:`pgqueue.claim`."""
    op = queries.claim_round(
        queues=list(queues),
        limit=check_limit(limit),
        owner=worker_id,
        lease_seconds=check_lease(lease_seconds),
        now=now,
    )
    return (await arun(conn, op, atomic=True))[0]


async def complete(
    conn: Any, /, lease: Lease, result: Any = None, *, now: datetime | None = None
) -> None:
    await arun(conn, queries.task_complete(lease, _results([(lease, result)])[0][1], now))


async def complete_many(
    conn: Any, /, results: Iterable[tuple[Lease, Any]], *, now: datetime | None = None
) -> set[uuid.UUID]:
    return await arun(conn, queries.task_complete_many(_results(results), now))


async def fail(
    conn: Any,
    /,
    lease: Lease,
    error: str,
    *,
    retry_after: float | None = None,
    policy: RetryPolicy | None = None,
    now: datetime | None = None,
) -> FailResult:
    return await arun(
        conn, queries.task_fail(lease, error, check_retry_after(retry_after), now, policy)
    )


async def cancel_leased(
    conn: Any, /, lease: Lease, reason: str, *, now: datetime | None = None
) -> None:
    await arun(conn, queries.task_cancel_leased(lease, reason, now))


async def heartbeat(
    conn: Any,
    /,
    leases: Sequence[Lease],
    *,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    now: datetime | None = None,
) -> HeartbeatResult:
    return await arun(conn, queries.task_heartbeat(leases, check_lease(lease_seconds), now))


async def release(
    conn: Any, /, leases: Sequence[Lease], *, now: datetime | None = None
) -> set[uuid.UUID]:
    return await arun(conn, queries.task_release(leases, now))


async def sweep_expired(
    conn: Any, /, *, limit: int = 1000, now: datetime | None = None
) -> SweepResult:
    return await arun(conn, queries.task_sweep_expired(check_limit(limit), now))


async def prune(
    conn: Any,
    /,
    *,
    completed_after: float = DEFAULT_COMPLETED_RETENTION,
    dead_after: float = DEFAULT_DEAD_RETENTION,
    limit: int = 1000,
    now: datetime | None = None,
) -> int:
    check_limit(limit)
    done = await arun(
        conn,
        queries.task_prune(
            [TaskStatus.COMPLETED, TaskStatus.CANCELLED], completed_after, limit, now
        ),
    )
    return done + await arun(conn, queries.task_prune([TaskStatus.FAILED], dead_after, limit, now))


async def throughput_series(
    conn: Any,
    /,
    *,
    minutes: int = 60,
    queue: str | None = None,
    now: datetime | None = None,
) -> list[ThroughputPoint]:
    """Tasks completed and dead-lettered per minute over the last ``minutes`` (at most a day),
    oldest first with every minute present, of ``queue`` or of every queue."""
    check_filters(queue=queue)
    span = check_limit(minutes, "minutes", MAX_SERIES_MINUTES)
    return await arun(conn, queries.throughput_series(span, queue, now))


async def recent_failures(conn: Any, /, *, limit: int = 20) -> list[Failure]:
    """See :func:`pgqueue.recent_failures`."""
    return await arun(conn, queries.task_failures(check_limit(limit)))
