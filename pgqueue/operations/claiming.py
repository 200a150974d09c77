"""Taking tasks to run (what a worker calls first), and taking back what nobody runs any
more: expired leases, tasks past their expiry.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from pgqueue.models import ClaimedTask, SweepResult
from pgqueue.operations.checks import DEFAULT_LEASE_SECONDS, check_lease, check_limit
from pgqueue.queries import claiming
from pgqueue.queries.driver import Op, atomic_operation, mapped, operation


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
def expire(*, limit: int = 1000, now: datetime | None = None) -> Op[list[uuid.UUID]]:
    """Cancel, with the reason ``expired``, up to ``limit`` waiting tasks whose expiry passed
    before any attempt was spent; their ids. Workers do this in their maintenance (every
    sweep); claims never start such a task meanwhile."""
    op = claiming.task_expire(check_limit(limit), now)
    return mapped(op, lambda rows: [row["id"] for row in rows])


@operation
def sweep_expired(*, limit: int = 1000, now: datetime | None = None) -> Op[SweepResult]:
    """Requeue (or dead-letter) running tasks whose lease expired; one batch per call."""
    return claiming.task_sweep_expired(check_limit(limit), now)
