"""Taking tasks to run: the claim (ordinary, and under limits), the lease start marks
that decide whether a lost lease spent its attempt, and the take-back of what no worker
holds any more (expired leases, a dead worker process's tasks, expired tasks). The
worker's hottest statements. Statements: sql/claiming.sql.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pgqueue.models import ClaimedTask, Priority, SweepResult, TaskStatus
from pgqueue.queries.driver import Op, Query, Row

# Where a walk of the claim index starts when it starts at the beginning.
FROM_THE_START = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
ClaimStarts = Mapping[tuple[str, int], tuple[datetime, uuid.UUID]]


def task_claim(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    starts: ClaimStarts | None = None,
) -> Op[list[ClaimedTask]]:
    """The ordinary claim: tasks no limit covers (see claim_round for the rest).

    One walk of the claim index per queue and priority, each from the start of its range or,
    for the pairs in ``starts``, after the (created_at, id) given there. Should the lease be
    lost, the attempt counts only once the owner has marked its claims started
    (:func:`lease_starts_mark`)."""
    starts = starts or {}
    params: dict[str, Any] = {"queues": list(queues)}
    for level in Priority:
        after = [starts.get((q, level), FROM_THE_START) for q in queues]
        name = level.name.lower()
        params[f"{name}_after"] = [created for created, _ in after]
        params[f"{name}_after_id"] = [task_id for _, task_id in after]
    rows = yield Query(
        "task_claim",
        {
            **params,
            "limit": limit,
            "owner": owner,
            "lease_seconds": lease_seconds,
            "now": now,
        },
        tuples=True,
    )
    return _claimed(rows)


class LimitsProbe(NamedTuple):
    limited: bool  # some limit exists
    waiting: bool  # a task under one may be waiting in the probed queues


def limits_probe(queues: Sequence[str]) -> Op[LimitsProbe]:
    rows = yield Query("limits_probe", {"queues": list(queues)})
    return LimitsProbe(rows[0]["limited"], rows[0]["waiting"])


def claim_round(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    probed: LimitsProbe | None = None,
    starts: ClaimStarts | None = None,
) -> Op[tuple[list[ClaimedTask], bool]]:
    """Claim up to ``limit`` tasks, those under a limit (pgqueue.limits) included, and say
    whether any limit exists. Run it atomic: the limits lock lasts until commit. ``probed``:
    the caller already ran limits_probe for these queues.

    Limited tasks go first: they are rationed, so they take few of the slots, and claiming
    them after the ordinary ones would starve them whenever ordinary work fills every batch.
    A caller that starts what it claims at once (pgqueue.claim) writes no start mark, so a
    lost lease of its always counts; a worker marks its claims itself, just before its
    handlers (lease_starts_mark).
    """
    params = {"queues": list(queues), "owner": owner, "lease_seconds": lease_seconds, "now": now}
    probe = probed or (yield from limits_probe(queues))
    limited: list[Any] = []
    if probe.waiting:
        lock = yield Query("limits_try_lock", {})
        if lock[0]["locked"]:
            limited = yield Query("task_claim_limited", {**params, "limit": limit}, tuples=True)
    claimed = _claimed(limited)
    if len(limited) < limit:
        claimed += yield from task_claim(
            queues=queues,
            limit=limit - len(limited),
            owner=owner,
            lease_seconds=lease_seconds,
            now=now,
            starts=starts,
        )
    return claimed, probe.limited


_PRIORITIES = {int(p): p for p in Priority}  # Priority(n), without the enum call's cost


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    """Tuples of task_claim's and task_claim_limited's RETURNING, in its column order."""
    priorities = _PRIORITIES
    tasks = [
        ClaimedTask(
            id=id,
            queue=queue,
            type=type,
            payload=payload,
            priority=priorities[priority] if priority in priorities else Priority(priority),
            attempts=attempts,
            max_attempts=max_attempts,
            lease_token=lease_token,
            lease_expires_at=lease_expires_at,
            created_at=created_at,
            trace_context=trace_context,
            has_parents=bool(has_parents),
            workflow_id=workflow_id,
        )
        for (
            id, queue, type, payload, priority, attempts, max_attempts, lease_token,
            lease_expires_at, created_at, trace_context, has_parents, workflow_id,
        ) in rows
    ]  # fmt: skip
    # UPDATE ... RETURNING does not keep the CTE's order; restore it for the caller.
    tasks.sort(key=lambda t: (t.priority, t.created_at))
    return tasks


def lease_starts_mark(owner: str, *, started: bool = True, now: datetime | None = None) -> Op[None]:
    """Mark everything ``owner`` has claimed so far as started (its handlers run next), or,
    with ``started=False`` (a worker's start-up), give the owner a mark before its first
    claim, so that those claims are refundable too."""
    yield Query("lease_starts_mark", {"owner": owner, "started": started, "now": now})


def lease_starts_prune(now: datetime | None = None) -> Op[int]:
    """Forget the start marks of owners gone for an hour; how many."""
    rows = yield Query("lease_starts_prune", {"now": now})
    return len(rows)


def task_fail_owner(
    owner: str, cause: str, *, pid: int, now: datetime | None = None
) -> Op[list[Row]]:
    """Fail every task still running under ``owner``, a worker process that died (``pid``):
    each a spent attempt (retried after its backoff, dead-lettered when attempts are spent,
    cancelled if that was asked), its error ``cause`` with the attempt, pid and owner; a
    claim whose handlers never started is queued again with its attempt given back. Their
    id, type, status, attempts, max_attempts and never_started, in id order."""
    return (
        yield Query("task_fail_owner", {"owner": owner, "cause": cause, "pid": pid, "now": now})
    )


def task_expire(limit: int, now: datetime | None = None) -> Op[list[Row]]:
    """Cancel (reason 'expired') up to ``limit`` waiting tasks whose expiry has passed with
    no attempt spent; their id, type, queue, attempts and expiry."""
    return (yield Query("task_expire", {"limit": limit, "now": now}))


def task_sweep_expired(limit: int, now: datetime | None = None) -> Op[SweepResult]:
    rows = yield Query("task_sweep_expired", {"limit": limit, "now": now})
    return SweepResult(
        requeued=[r["id"] for r in rows if r["status"] == TaskStatus.QUEUED],
        dead=[r["id"] for r in rows if r["status"] == TaskStatus.FAILED],
        cancelled=[r["id"] for r in rows if r["status"] == TaskStatus.CANCELLED],
        details={r["id"]: (r["type"], r["attempts"]) for r in rows},
    )
