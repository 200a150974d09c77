"""What the holder of a lease writes about its task: completed, failed, cancelled,
snoozed, kept alive (heartbeat), given back (release) or its progress; and whether a cancel
was asked.

Every statement here is fenced by the lease (the task's id and its lease token): a worker
that lost its lease gets LeaseLost, or its task left out of the result, never a silent
overwrite. Statements: sql/leases.sql.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgqueue.errors import LeaseLost
from pgqueue.models import FailOutcome, FailResult, Lease, RetryPolicy, SnoozeResult, TaskStatus
from pgqueue.queries.driver import Op, Query


def task_complete_many(
    results: Sequence[tuple[Lease, str | None]], now: datetime | None = None
) -> Op[set[uuid.UUID]]:
    """Complete many tasks; returns the ids whose lease was still held (the others are lost)."""
    if not results:
        return set()
    rows: Any = yield Query(  # tuples: (id, has_dependants)
        "task_complete",
        {
            "ids": [lease.task_id for lease, _ in results],
            "tokens": [lease.token for lease, _ in results],
            "results": [result for _, result in results],
            "now": now,
        },
        prepare=False,
        tuples=True,
    )
    return {r[0] for r in rows}


def task_complete(lease: Lease, result_json: str | None, now: datetime | None = None) -> Op[None]:
    done = yield from task_complete_many([(lease, result_json)], now)
    if lease.task_id not in done:
        raise LeaseLost(lease.task_id)


def task_fail(
    lease: Lease,
    error: str,
    delay: float | None = None,
    now: datetime | None = None,
    policy: RetryPolicy | None = None,
    *,
    dead: bool = False,
) -> Op[FailResult]:
    """A failed attempt: retried after backoff, or dead-lettered when attempts are spent
    (``dead``: at once, attempts left or not)."""
    rows = yield Query(
        "task_fail",
        {
            "id": lease.task_id,
            "token": lease.token,
            "error": error,
            "dead": dead,
            "delay": delay,
            "now": now,
            "max_attempts": policy.max_attempts if policy else None,
            "backoff_base": policy.base if policy else None,
            "backoff_factor": policy.factor if policy else None,
            "backoff_cap": policy.cap if policy else None,
        },
    )
    if not rows:
        raise LeaseLost(lease.task_id)
    row = rows[0]
    outcome = {
        TaskStatus.FAILED: FailOutcome.DEAD,
        TaskStatus.CANCELLED: FailOutcome.CANCELLED,
    }.get(TaskStatus(row["status"]), FailOutcome.RETRYING)
    return FailResult(
        task_id=row["id"],
        outcome=outcome,
        attempts=row["attempts"],
        retry_at=row["visible_after"] if outcome is FailOutcome.RETRYING else None,
    )


def task_cancel_leased(lease: Lease, reason: str, now: datetime | None = None) -> Op[None]:
    rows = yield Query(
        "task_cancel_leased",
        {"id": lease.task_id, "token": lease.token, "reason": reason, "now": now},
    )
    if not rows:
        raise LeaseLost(lease.task_id)


def task_snooze(
    lease: Lease,
    after: float,
    *,
    max_snoozes: int,
    reason: str = "snoozed",
    now: datetime | None = None,
) -> Op[SnoozeResult]:
    """Put a running task back to queued for ``after`` seconds without spending its attempt;
    at ``max_snoozes`` snoozes already, a failed attempt instead, whose error names the bound.
    Raises LeaseLost if the lease is no longer held."""
    rows = yield Query(
        "task_snooze",
        {
            "id": lease.task_id,
            "token": lease.token,
            "after": after,
            "max_snoozes": max_snoozes,
            "now": now,
        },
    )
    if rows:
        row = rows[0]
        cancelled = row["status"] == TaskStatus.CANCELLED
        return SnoozeResult(
            task_id=row["id"],
            snoozed=True,
            snoozes=row["snoozes"],
            run_at=None if cancelled else row["visible_after"],
            cancelled=cancelled,
        )
    error = (
        f"Snooze: snoozed {max_snoozes} times already, the bound (max_snoozes={max_snoozes}, "
        f"PGQUEUE_MAX_SNOOZES); this snooze ({reason}) counts as a failed attempt"
    )
    failed = yield from task_fail(lease, error, delay=after, now=now)  # raises LeaseLost
    return SnoozeResult(lease.task_id, False, max_snoozes, failed.retry_at, failed=failed)


@dataclasses.dataclass(frozen=True)
class HeartbeatResult:
    """Leases still held (with their new expiry) and tasks whose cancellation was requested."""

    held: dict[uuid.UUID, datetime]
    cancel_requested: set[uuid.UUID]


def task_heartbeat(
    leases: Sequence[Lease], lease_seconds: float, now: datetime | None = None
) -> Op[HeartbeatResult]:
    if not leases:
        return HeartbeatResult({}, set())
    rows = yield Query(
        "task_heartbeat",
        {
            "ids": [lease.task_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "lease_seconds": lease_seconds,
            "now": now,
        },
        prepare=False,
    )
    return HeartbeatResult(
        held={r["id"]: r["lease_expires_at"] for r in rows},
        cancel_requested={r["id"] for r in rows if r["cancel_requested"]},
    )


def task_progress(lease: Lease, progress_json: str) -> Op[bool]:
    """Store a handler's progress report (JSON text, encoded and bounded by
    pgqueue.progress.encode_progress); False when the lease is no longer held (nothing
    written)."""
    rows = yield Query(
        "task_progress", {"id": lease.task_id, "token": lease.token, "progress": progress_json}
    )
    return bool(rows)


def task_cancel_requested(leases: Sequence[Lease]) -> Op[set[uuid.UUID]]:
    """The tasks of ``leases``, still held, whose cancellation someone requested."""
    if not leases:
        return set()
    rows = yield Query(
        "task_cancel_requested",
        {"ids": [lease.task_id for lease in leases], "tokens": [lease.token for lease in leases]},
        prepare=False,
    )
    return {r["id"] for r in rows}


def task_release(leases: Sequence[Lease], now: datetime | None = None) -> Op[set[uuid.UUID]]:
    if not leases:
        return set()
    rows = yield Query(
        "task_release",
        {
            "ids": [lease.task_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "now": now,
        },
        prepare=False,
    )
    queues = sorted({r["queue"] for r in rows if r["status"] == TaskStatus.QUEUED})
    if queues:
        yield Query("queue_notify", {"queues": queues})
    return {r["id"] for r in rows}
