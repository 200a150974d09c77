"""Where each walk of the claim index starts, so that a claim does not step over the tasks
this worker has already claimed.

A claimed task leaves an entry in the claim index that only vacuum removes. While an old
snapshot is open (a session idle in a transaction, a report, ``pg_dump``), vacuum cannot, and
a claim that walks from the start of a queue's range steps over every task claimed since:
3 buffers per claim became 1,100 after 32,000 tasks, and throughput fell to a third. So the
claimer remembers, per queue and priority, the newest task (created_at, id) its claims took,
and starts the next walk right after it.

Not quite right after it: ``created_at`` is when the submitting transaction began, and one
that began earlier may commit later. A task created in the last ``MARGIN`` may still be on
its way, so a walk never starts later than the database's clock at the last claim less the
margin. Tasks older than that are either claimed, or became claimable since in a way that no
start can see: a retry or a scheduled task come due, a promoted one, one committed by a
transaction open for longer than the margin, one another claimer skipped. (A dependant
released by its last parent, or a replayed dead letter, is announced on ``pgqueue_released``:
the worker forgets that queue's starts, and its next walk there starts at the beginning.)

So every so often a claim walks from the start: at most every ``rescan_seconds`` (the poll
interval: a scheduled task is found as soon as an idle worker's poll would find it), and no
more often than keeps these full walks under a twentieth of the time (a full walk that took
50 ms waits at least a second), so that a snapshot held for hours slows the retries, not the
queue.

A worker that hears no notifications (behind a transaction pooler without a LISTEN URL, or
with NOTIFY off) hears no ``pgqueue_released`` either, so its claimer passes a
``rescan_seconds`` of 0: a claim walks from the start whenever the spacing above allows,
which, while full walks are as cheap as any (a millisecond or two, a round trip through the
pooler included), is every few tens of milliseconds, so a released dependant or a replayed
dead letter waits about as long as a new task does. This is correct for the same reason as
the retries' case: the cursor only ever skips tasks older than it, every full walk sees all
of them, and full walks never stop, only space out (by twenty times their cost) when a
pinned snapshot makes them expensive, which is the one case the cursor exists for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from pgqueue.models import ClaimedTask
from pgqueue.queries.claiming import ClaimStarts as Starts

# How much earlier than the newest task claimed a walk starts: tasks whose transaction began
# up to this long before a later one committed are still found by the next walk.
MARGIN = timedelta(seconds=1)
# A full walk may take at most this share of the time: it waits this many times its cost.
FULL_WALK_SPACING = 20.0
_FIRST = uuid.UUID(int=0)


class ClaimStarts:
    """The starts of one claimer's walks; pure bookkeeping, driven by the claimer."""

    def __init__(
        self,
        rescan_seconds: float,
        lease_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rescan_seconds = rescan_seconds
        self._lease = timedelta(seconds=lease_seconds)
        self._clock = clock
        self._newest: dict[tuple[str, int], tuple[datetime, uuid.UUID]] = {}
        self._db_now: datetime | None = None  # the database's clock at the last claim,
        self._db_now_at = 0.0  # and ours then
        self._last_full: float | None = None
        self._full_cost = 0.0

    def next(self) -> Starts | None:
        """The starts for the next claim, or None: walk every range from its beginning."""
        if self._last_full is None or self._db_now is None:
            return None
        wait = max(self.rescan_seconds, FULL_WALK_SPACING * self._full_cost)
        if self._clock() - self._last_full >= wait:
            return None
        since = timedelta(seconds=self._clock() - self._db_now_at)
        horizon = (self._db_now + since - MARGIN, _FIRST)
        return {level: min(newest, horizon) for level, newest in self._newest.items()}

    def forget(self, queue: str) -> None:
        """The next walk of ``queue`` starts at the beginning of its range (every priority):
        a task older than where this worker's claims got to became ready there (a released
        dependant, a replayed dead letter). The other queues keep their starts."""
        for level in [level for level in self._newest if level[0] == queue]:
            del self._newest[level]

    def claimed(
        self, tasks: Iterable[ClaimedTask], *, starts: Starts | None, seconds: float
    ) -> None:
        """Record a claim made with ``starts`` (None: a full walk) that took ``seconds``."""
        for task in tasks:
            level = (task.queue, int(task.priority))
            key = (task.created_at, task.id)
            if level not in self._newest or key > self._newest[level]:
                self._newest[level] = key
            # The claim stamped the lease from the database's clock.
            db_now = task.lease_expires_at - self._lease
            if self._db_now is None or db_now > self._db_now:
                self._db_now, self._db_now_at = db_now, self._clock()
        if starts is None:
            self._last_full = self._clock()
            self._full_cost = seconds
