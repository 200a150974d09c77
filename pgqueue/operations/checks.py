"""What the operations check their arguments against before anything is built: ids,
statuses, limits, durations, names; the bounds and defaults those checks and the operations
share. Bad input is refused here, before a connection is touched, in the sync and the async
form alike.
"""

from __future__ import annotations

import math
import uuid

from pgqueue import config
from pgqueue.enqueue import check_name
from pgqueue.errors import TaskNotFound, ValidationError, WorkflowNotFound
from pgqueue.models import LimitKind, TaskStatus

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
    max_running: int | None,
    rate: int | None,
    per: float,
    per_key_max_running: int | None = None,
    burst: int | None = None,
) -> tuple[int | None, int | None, float | None, int | None, int | None]:
    """Validated (max_running, rate_limit, rate_period, per_key_max_running, rate_burst); at
    least one limit must be given, and a burst only with a rate."""
    for field, value, top in (
        ("max_running", max_running, MAX_RUNNING),
        ("rate", rate, MAX_RATE),
        ("per_key_max_running", per_key_max_running, MAX_RUNNING),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top
        ):
            raise ValidationError(field, f"must be an integer from 0 to {top}, not {value!r}")
    if burst is not None:
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_RATE:
            raise ValidationError(
                "burst", f"must be an integer from 1 to {MAX_RATE} (starts at once), not {burst!r}"
            )
        if rate is None:
            raise ValidationError("burst", "a burst spaces a rate's starts: give rate (and per)")
    if max_running is None and rate is None and per_key_max_running is None:
        raise ValidationError(
            "max_running", "give max_running, rate, per_key_max_running, or several"
        )
    period = check_seconds("per", per) if rate is not None else None
    return max_running, rate, period, per_key_max_running, burst


def retention_value(field: str, seconds: float | None) -> float | None:
    return None if seconds is None else check_seconds(field, seconds)


def check_filters(**filters: str | None) -> None:
    """Filter values are names: refuse what no task can have (NUL, over-long) up front."""
    for field, value in filters.items():
        if value is not None:
            check_name(field, value)


def _kind(value: object) -> str:
    return value.__class__.__name__


def parse_workflow_id(workflow_id: uuid.UUID | str) -> uuid.UUID:
    """A workflow id from a UUID or its text; a malformed one is WorkflowNotFound, as a
    malformed task id is TaskNotFound."""
    if isinstance(workflow_id, uuid.UUID):
        return workflow_id
    try:
        return uuid.UUID(str(workflow_id))
    except ValueError:
        raise WorkflowNotFound(workflow_id) from None
