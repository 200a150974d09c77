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

from pgqueue.models import ClaimedTask, Priority, SweepResult, TaskStatus, built
from pgqueue.queries.driver import Op, Query, Row

# Where a walk of the claim index starts when it starts at the beginning.
FROM_THE_START = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
ClaimStarts = Mapping[tuple[str, int], tuple[datetime, uuid.UUID]]
# Where the fair claim's rotation of each queue and priority got to: the last key served
# ('' for the unkeyed tasks' turn, which is also where a rotation starts).
KeyRotation = Mapping[tuple[str, int], str]
# How many keys one fair claim visits per queue and priority, at most: the batch (one task of
# each in the first round) and this many more, for the keys at their limit or whose tasks
# are not due yet, which the walk steps over.
ROTATION_SLACK = 8
# A fair claim that found nothing to claim may have visited only keys with nothing due or
# at their limit, with a ready key further on: it looks again, visiting this many times
# more keys each time, this many times at most (8 more keys, 128, 2,048, 32,768).
VISIT_GROWTH = 16
VISIT_TRIES = 4


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
    keyed: bool = False  # a task with a concurrency key may be waiting in them
    locked: bool = False  # this transaction holds the limits lock (lock=True only)
    buckets: bool = False  # some rate limit spaces its starts (a token bucket)
    # After a claim round: seconds until an empty bucket holds a start again (None: none is
    # empty, or no bucket); the claimer sleeps no longer than this.
    rate_wait: float | None = None


def limits_probe(queues: Sequence[str], *, lock: bool = False) -> Op[LimitsProbe]:
    """What the claim must honour in ``queues``; with ``lock``, in the claim's transaction,
    the limits lock too (waited for if keyed tasks wait, tried if limited ones do)."""
    rows = yield Query("limits_probe", {"queues": list(queues), "lock": lock})
    row = rows[0]
    return LimitsProbe(row["limited"], row["waiting"], row["keyed"], row["locked"], row["buckets"])


def task_claim_keyed(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    rotation: KeyRotation | None = None,
    slack: int = ROTATION_SLACK,
) -> Op[list[ClaimedTask]]:
    """The fair claim (see claim_round): keys in turn within each queue and priority, each
    within its per-key limits; the unkeyed tasks of the same queues take one turn among them.
    It visits at most ``limit`` + ``slack`` keys per queue and priority. Run it in the
    transaction that holds the limits lock."""
    rotation = rotation or {}
    params: dict[str, Any] = {"queues": list(queues)}
    for level in Priority:
        params[f"{level.name.lower()}_after"] = [rotation.get((q, level), "") for q in queues]
    rows = yield Query(
        "task_claim_keyed",
        {
            **params,
            "limit": limit,
            "visit": limit + slack,
            "owner": owner,
            "lease_seconds": lease_seconds,
            "now": now,
        },
        tuples=True,
    )
    return _claimed(rows)


def claim_round(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    probed: LimitsProbe | None = None,
    starts: ClaimStarts | None = None,
    rotation: KeyRotation | None = None,
) -> Op[tuple[list[ClaimedTask], LimitsProbe]]:
    """Claim up to ``limit`` tasks, those under a limit (pgqueue.limits) and those with a
    concurrency key included, and what the probe found (whether the next claim should probe
    again: a limit exists, or keyed tasks wait). Run it atomic: the limits lock lasts until commit.
    ``probed``: the caller already ran limits_probe for these queues, outside this
    transaction. ``rotation``: where the caller's previous fair claims got to.

    Limited tasks go first: they are rationed, so they take few of the slots, and claiming
    them after the ordinary ones would starve them whenever ordinary work fills every batch.
    Where keyed tasks wait, the fair claim (task_claim_keyed) takes the rest, the unkeyed
    tasks included as one more key; it waits for the limits lock, since a claimer that
    skipped keyed work whenever another held the lock would leave slots idle. Otherwise the
    ordinary claim takes the rest.
    A caller that starts what it claims at once (pgqueue.claim) writes no start mark, so a
    lost lease of its always counts; a worker marks its claims itself, just before its
    handlers (lease_starts_mark).
    """
    params: dict[str, Any] = {
        "queues": list(queues),
        "owner": owner,
        "lease_seconds": lease_seconds,
        "now": now,
    }
    probe = probed or (yield from limits_probe(queues, lock=True))
    limited: list[Any] = []
    locked = probe.locked
    if not locked and (probe.keyed or probe.waiting):  # probed outside this transaction
        lock = yield Query("limits_lock" if probe.keyed else "limits_try_lock", {})
        locked = lock[0]["locked"]
    if locked and probe.waiting:
        limited = yield Query("task_claim_limited", {**params, "limit": limit}, tuples=True)
    if probe.buckets and probe.waiting:
        wait = yield Query("limits_rate_wait", {"now": now, "locked": locked})
        probe = probe._replace(rate_wait=wait[0]["seconds"])
    claimed = _claimed(limited)
    if len(limited) < limit and probe.keyed:
        slack = ROTATION_SLACK
        for _ in range(VISIT_TRIES):
            keyed = yield from task_claim_keyed(
                **params, limit=limit - len(limited), rotation=rotation, slack=slack
            )
            if keyed:
                break
            slack *= VISIT_GROWTH  # every key visited had nothing to give: look further
        claimed += keyed
    elif len(limited) < limit:
        claimed += yield from task_claim(**params, limit=limit - len(limited), starts=starts)
    return claimed, probe


_PRIORITIES = {int(p): p for p in Priority}  # Priority(n), without the enum call's cost


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    """Tuples of task_claim's and task_claim_limited's RETURNING, in its column order."""
    priorities = _PRIORITIES
    # (built: ClaimedTask's frozen __init__ sets its 15 fields one by one through
    # object.__setattr__, for every task a worker runs)
    tasks = [
        built(
            ClaimedTask,
            {
                "id": id,
                "queue": queue,
                "type": type,
                "payload": payload,
                "priority": priorities[priority]
                if priority in priorities
                else Priority(priority),
                "attempts": attempts,
                "max_attempts": max_attempts,
                "lease_token": lease_token,
                "lease_expires_at": lease_expires_at,
                "created_at": created_at,
                "trace_context": trace_context,
                "has_parents": bool(has_parents),
                "workflow_id": workflow_id,
                "parents": (),
                "concurrency_key": concurrency_key,
            },
        )
        for (
            id, queue, type, payload, priority, attempts, max_attempts, lease_token,
            lease_expires_at, created_at, trace_context, has_parents, workflow_id,
            concurrency_key,
        ) in rows
    ]  # fmt: skip
    # UPDATE ... RETURNING does not keep the CTE's order; restore it for the caller (the
    # fair claim's rounds matter only for which tasks it took, not for their start order).
    tasks.sort(key=lambda t: (t.priority, t.created_at))
    return tasks


def lease_starts_mark(
    owner: str, *, started: bool = True, durable: bool = False, now: datetime | None = None
) -> Op[None]:
    """Mark everything ``owner`` has claimed so far as started (its handlers run next), or,
    with ``started=False`` (a worker's start-up), give the owner a mark before its first
    claim, so that those claims are refundable too. ``durable``: wait for the WAL flush (the
    claim took keyed tasks, whose per-key limit a forgotten claim could break)."""
    yield Query(
        "lease_starts_mark",
        {"owner": owner, "started": started, "durable": durable, "now": now},
    )


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
