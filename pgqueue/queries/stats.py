"""Reads for people and monitors: depth per queue, backlog, throughput, recent failures,
the dashboard's series, and the oldest snapshot holding back cleanup. None of them writes.
Statements: sql/stats.sql.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue.models import (
    Failure,
    KeyStats,
    OldestSnapshot,
    Priority,
    QueueBacklog,
    QueueStats,
    QueueThroughput,
    ThroughputPoint,
)
from pgqueue.queries.driver import Op, Query

# How many queued tasks of a key (at one priority) are counted: past it, a key costs no more.
KEY_COUNT_CAP = 1000


def key_busiest(
    limit: int, now: datetime | None = None, cap: int = KEY_COUNT_CAP
) -> Op[list[KeyStats]]:
    """The ``limit`` busiest concurrency keys (running + ready), busiest first."""
    rows = yield Query("key_busiest", {"limit": limit, "cap": cap, "now": now})
    return [KeyStats(**r) for r in rows]


def queue_backlog(queues: Sequence[str] | None = None) -> Op[list[QueueBacklog]]:
    rows = yield Query("queue_backlog", {"queues": list(queues) if queues is not None else None})
    return [QueueBacklog(**r) for r in rows]


def oldest_snapshot() -> Op[OldestSnapshot | None]:
    rows = yield Query("oldest_snapshot", {})
    return OldestSnapshot(**rows[0]) if rows else None


def queue_overview() -> Op[list[QueueStats]]:
    rows = yield Query("queue_overview", {})
    return [QueueStats(**r) for r in rows]


def queue_depth() -> Op[list[QueueStats]]:
    rows = yield Query("queue_depth", {})
    return [QueueStats(**r) for r in rows]


def queue_throughput(
    window_seconds: float, now: datetime | None = None
) -> Op[list[QueueThroughput]]:
    rows = yield Query("queue_throughput", {"window_seconds": window_seconds, "now": now})
    return [QueueThroughput(**r) for r in rows]


def throughput_series(
    minutes: int, queue: str | None = None, now: datetime | None = None
) -> Op[list[ThroughputPoint]]:
    """Per minute, oldest first, every minute present: completed and dead-lettered tasks of
    ``queue`` (or of every queue) in the last ``minutes`` minutes, the current one included."""
    rows = yield Query("throughput_series", {"minutes": minutes, "queue": queue, "now": now})
    return [ThroughputPoint(r["minute"], int(r["completed"]), int(r["failed"])) for r in rows]


def task_failures(limit: int) -> Op[list[Failure]]:
    """Up to ``limit`` tasks waiting for a retry (latest next attempt first), then up to
    ``limit`` dead letters (newest first)."""
    rows = yield Query("task_failures", {"limit": limit})
    return [
        Failure(
            task_id=r["id"],
            dead=r["kind"] == "dead",
            type=r["type"],
            queue=r["queue"],
            priority=Priority(r["priority"]),
            attempts=r["attempts"],
            max_attempts=r["max_attempts"],
            last_error=r["last_error"],
            started_at=r["started_at"],
            retry_at=None if r["kind"] == "dead" else r["visible_after"],
            finished_at=r["finished_at"] if r["kind"] == "dead" else None,
        )
        for r in rows
    ]
