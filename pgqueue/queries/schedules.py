"""Periodic tasks: each schedule's due ticks enqueued exactly once, however many workers
run its scheduler. Statements: sql/schedules.sql.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pgqueue.cron import Schedule
from pgqueue.models import Task
from pgqueue.queries.driver import Op, Query
from pgqueue.queries.specs import TaskSpec
from pgqueue.queries.submitting import task_insert


def schedule_run(
    schedule: Schedule, make_spec: Callable[[datetime], TaskSpec], now: datetime
) -> Op[list[tuple[Task, bool]]]:
    """Enqueue a schedule's due ticks exactly once, however many schedulers run: the row lock
    taken by the upsert queues them up, and each enqueues only the ticks after the last one
    recorded. Run it in a transaction (atomic), so the ticks and the fence commit together."""
    rows = yield Query(
        "schedule_lock",
        {
            "name": schedule.name,
            "cron": schedule.text,
            "timezone": schedule.timezone,
            "type": schedule.type,
            "queue": schedule.queue,
        },
    )
    last_tick = rows[0]["last_tick"]
    ticks = schedule.due(last_tick, now)
    enqueued = []
    for tick in ticks:
        enqueued.append((yield from task_insert(make_spec(tick))))
    fence = ticks[-1] if ticks else (last_tick or now)
    yield Query(
        "schedule_advance",
        {
            "name": schedule.name,
            "last_tick": fence,
            "next_tick": schedule.next_after(max(fence, now)),
        },
    )
    return enqueued


def schedule_list() -> Op[list[dict[str, Any]]]:
    rows = yield Query("schedule_list", {})
    return [dict(r) for r in rows]
