"""What the queues look like, for people and monitors: depth, backlog, throughput, recent
failures, the dashboard's series, the busiest concurrency keys, the oldest snapshot holding
back cleanup. Reads only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue.models import (
    Failure,
    KeyStats,
    OldestSnapshot,
    QueueBacklog,
    QueueStats,
    QueueThroughput,
    ThroughputPoint,
)
from pgqueue.operations.checks import check_filters, check_limit, check_window
from pgqueue.queries import stats
from pgqueue.queries.driver import Op, operation


@operation
def queue_stats() -> Op[list[QueueStats]]:
    """Depth per queue, priority and status, with the age of the oldest ready task. It counts
    the finished tasks kept too, so it reads the whole table: for something asked every few
    seconds (a scraper, a dashboard, an autoscaler), use :func:`backlog`."""
    return stats.queue_depth()


MAX_SERIES_MINUTES = 1440  # a day of per-minute points


@operation
def throughput_series(
    *, minutes: int = 60, queue: str | None = None, now: datetime | None = None
) -> Op[list[ThroughputPoint]]:
    """Tasks completed and dead-lettered per minute over the last ``minutes`` (at most a day),
    oldest first with every minute present, of ``queue`` or of every queue."""
    check_filters(queue=queue)
    span = check_limit(minutes, "minutes", MAX_SERIES_MINUTES)
    return stats.throughput_series(span, queue, now)


@operation
def recent_failures(*, limit: int = 20) -> Op[list[Failure]]:
    """Recent failures: up to ``limit`` tasks waiting for a retry after a failed attempt
    (latest next attempt first), then up to ``limit`` dead letters (newest first)."""
    return stats.task_failures(check_limit(limit))


@operation
def overview() -> Op[list[QueueStats]]:
    """Depth per queue, priority and status of queued, running, waiting (for their parents)
    and dead-lettered tasks (not completed or cancelled ones): what `pgqueue stats`, the API
    and the dashboard show, read through partial indexes, so it may be asked every few
    seconds."""
    return stats.queue_overview()


@operation
def backlog(queues: Sequence[str] | None = None) -> Op[list[QueueBacklog]]:
    """Per queue (these, or all) and priority: ready, scheduled and running tasks and the age
    of the oldest ready one, read from queued and running tasks only (the autoscaling
    signal; ``pgqueue.backlog`` in SQL)."""
    return stats.queue_backlog(queues)


@operation
def oldest_snapshot() -> Op[OldestSnapshot | None]:
    """The oldest snapshot holding back cleanup of ``pgqueue.tasks`` in this database (a
    session idle in a transaction, a long report or ``pg_dump``, a replication slot, a
    prepared transaction), or None. Workers keep their claims cheap while one is open, but
    the table and its indexes grow until it ends: see docs/how-to/dba.md, "When the
    database holds an old snapshot". Full detail on other roles' sessions needs
    pg_read_all_stats."""
    return stats.oldest_snapshot()


@operation
def throughput(
    *, window_seconds: float = 60, now: datetime | None = None
) -> Op[list[QueueThroughput]]:
    """Per queue, the tasks completed and dead-lettered in the last ``window_seconds``."""
    return stats.queue_throughput(check_window(window_seconds), now)


DEFAULT_BUSIEST_KEYS = 10
MAX_BUSIEST_KEYS = 100  # a dashboard's table, a bounded set of metric labels


@operation
def busiest_keys(
    *, limit: int = DEFAULT_BUSIEST_KEYS, now: datetime | None = None
) -> Op[list[KeyStats]]:
    """The ``limit`` (at most 100) busiest concurrency keys now, busiest first: per queue and
    key, its tasks running and its tasks ready (queued and due), ranked by running + ready,
    the share of the workers it holds and asks for. A key with 1,000 or more queued tasks is
    counted to 1,000 (``ready_capped``), so this costs about the number of keys with tasks
    waiting, never the length of one key's backlog, and may be asked every few seconds."""
    return stats.key_busiest(check_limit(limit, "limit", MAX_BUSIEST_KEYS), now)
