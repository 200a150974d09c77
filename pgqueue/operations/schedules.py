"""Periodic tasks driven from outside a worker: a schedule's due ticks, once across every
caller, and the schedules workers declared.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pgqueue.cron import Schedule
from pgqueue.enqueue import prepare
from pgqueue.models import EnqueueResult, Task, built
from pgqueue.queries import schedules
from pgqueue.queries.driver import Op, atomic_operation, mapped, operation
from pgqueue.queries.specs import TaskSpec


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
