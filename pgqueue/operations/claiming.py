"""Taking tasks to run (what a worker calls first), and taking back what nobody runs any
more: expired leases, tasks past their expiry.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from pgqueue.key_rotation import rotation_of
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

    Commit promptly: the claim's row locks (and, when limits exist or keyed tasks wait, the
    limits lock) are held until the transaction ends. Tasks under a limit (:func:`set_limit`)
    are claimed within it; tasks with a concurrency key in turns per key, from where this
    process's previous claim for the same ``worker_id`` stopped.
    The claim's transaction commits without waiting for the WAL flush
    (docs/explanation/guarantees.md, "Durability"), and so does anything else written in it:
    give the claim a transaction of its own, as the worker does.
    """
    rotation = rotation_of(worker_id)
    op = claiming.claim_round(
        queues=list(queues),
        limit=check_limit(limit),
        owner=worker_id,
        lease_seconds=check_lease(lease_seconds),
        now=now,
        rotation=rotation.current(),
    )

    def claimed(round_: tuple[list[ClaimedTask], claiming.LimitsProbe]) -> list[ClaimedTask]:
        rotation.claimed(round_[0])
        return round_[0]

    return mapped(op, claimed)


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
