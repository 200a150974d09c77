"""What the holder of a lease records about its task: completed, failed, cancelled,
snoozed, kept alive, given back. Each raises LeaseLost (or leaves the task out of its
result) once the lease is no longer held.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from pgqueue import config
from pgqueue.errors import ValidationError
from pgqueue.models import FailResult, Lease, RetryPolicy, SnoozeResult
from pgqueue.operations.checks import (
    DEFAULT_LEASE_SECONDS,
    check_lease,
    check_retry_after,
    check_seconds,
)
from pgqueue.queries import leased
from pgqueue.queries.driver import Op, operation
from pgqueue.queries.leased import HeartbeatResult
from pgqueue.result_encoding import encode_result


def _results(results: Iterable[tuple[Lease, Any]]) -> list[tuple[Lease, str | None]]:
    """Every result encoded by the worker's rule (InvalidResult, ResultTooLarge) before
    anything is written."""
    limit = config.max_result_bytes()
    return [(lease, encode_result(value, lease.task_id, limit=limit)) for lease, value in results]


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
