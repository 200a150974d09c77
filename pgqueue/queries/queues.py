"""Per-queue settings and the housekeeping they govern: pause and resume, retention (and
the prune that applies it), the limits on a type or a queue, and the promotion of tasks
waiting too long. Statements: sql/queues.sql.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from pgqueue.models import Limit, LimitKind, Priority, QueueState, TaskStatus
from pgqueue.queries.driver import Op, Query, Row


def task_promote(
    after_seconds: float, limit: int, now: datetime | None = None
) -> Op[list[tuple[uuid.UUID, str, str, Priority]]]:
    """Move tasks ready for ``after_seconds`` up one priority: (id, queue, type, new priority)."""
    rows = yield Query("task_promote", {"after_seconds": after_seconds, "limit": limit, "now": now})
    return [(r["id"], r["queue"], r["type"], Priority(r["priority"])) for r in rows]


def task_prune(
    statuses: Sequence[TaskStatus],
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> Op[int]:
    """Delete up to ``limit`` finished tasks of these statuses; how many went."""
    pruned = 0
    for status in statuses:
        rows = yield Query(
            "task_prune",
            {
                "status": status.value,
                "older_than_seconds": older_than_seconds,
                "limit": limit - pruned,
                "now": now,
            },
        )
        pruned += len(rows)
        if pruned >= limit:
            break
    return pruned


def queue_pause(name: str, now: datetime | None = None) -> Op[QueueState]:
    rows = yield Query("queue_pause", {"name": name, "now": now})
    return QueueState(**rows[0])


def queue_resume(name: str, now: datetime | None = None) -> Op[QueueState]:
    rows = yield Query("queue_resume", {"name": name, "now": now})
    if not rows:  # no settings row: it was not paused, and stays without a row
        return QueueState(name=name, paused=False, paused_at=None, updated_at=None)
    row = dict(rows[0])
    row.pop("notified")
    return QueueState(**row)


def queue_remove(name: str) -> Op[bool]:
    rows = yield Query("queue_remove", {"name": name})
    return bool(rows)


def queue_known(name: str) -> Op[bool]:
    # Planned each time: asked rarely (before a pause or a retention), and a generic plan of
    # it once read the finished tasks by a sequential scan.
    rows = yield Query("queue_known", {"name": name}, prepare=False)
    return bool(rows[0]["known"])


def queue_list() -> Op[list[QueueState]]:
    rows = yield Query("queue_list", {})
    return [QueueState(**r) for r in rows]


def queue_set_retention(
    name: str,
    completed_retention: float | None,
    dead_retention: float | None,
    now: datetime | None = None,
) -> Op[QueueState]:
    rows = yield Query(
        "queue_set_retention",
        {
            "name": name,
            "completed_retention": completed_retention,
            "dead_retention": dead_retention,
            "now": now,
        },
    )
    return QueueState(**rows[0])


def _limit(row: Row) -> Limit:
    row = dict(row)
    row.pop("notified", None)
    return Limit(**{**row, "kind": LimitKind(row["kind"])})


def limit_set(
    kind: LimitKind,
    name: str,
    max_running: int | None,
    rate_limit: int | None,
    rate_period: float | None,
    rate_burst: int | None = None,
    per_key_max_running: int | None = None,
    now: datetime | None = None,
) -> Op[Limit]:
    rows = yield Query(
        "limit_set",
        {
            "kind": kind.value,
            "name": name,
            "max_running": max_running,
            "rate_limit": rate_limit,
            "rate_period": rate_period,
            "rate_burst": rate_burst,
            "per_key_max_running": per_key_max_running,
            "now": now,
        },
    )
    return _limit(rows[0])


def limit_clear(kind: LimitKind, name: str) -> Op[bool]:
    """Remove a limit; whether there was one."""
    rows = yield Query("limit_clear", {"kind": kind.value, "name": name})
    return bool(rows)


def limit_list(now: datetime | None = None) -> Op[list[Limit]]:
    rows = yield Query("limit_list", {"now": now})
    return [_limit(r) for r in rows]
