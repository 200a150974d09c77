"""Cancellation requests reaching running handlers: the stop flag of the task's
context, set at once.

Two paths lead here. The cancel statement (task_cancel) notifies the worker holding the
lease on ``pgqueue_cancel`` with ``OWNER TASK_ID``, and the listener hands the payload to
:meth:`Cancels.notified`, so a handler polling ``ctx.should_stop()`` sees the request
milliseconds after the cancel commits. The heartbeat reads the row's flag every third of the
lease and calls :meth:`Cancels.requested` too: a notification lost while the listener was
disconnected is never missed, and the listener has the heartbeat beat as soon as it is
connected again, so it is late by the reconnection, not by a third of the lease. Whichever
comes first wins; the other finds the flag already set and does nothing.

A worker with no listener (behind a transaction pooler without a LISTEN URL: LISTEN through
the pooler hears nothing) has a third path, :class:`CancelPoll`: every CANCEL_POLL_SECONDS,
while it runs tasks, one read of their cancel flags (task_cancel_requested, by primary key,
no lock), so a handler hears a cancel within about half a second, not a third of the lease
later. An idle worker sends nothing.
"""

from __future__ import annotations

import asyncio
import uuid

from pgqueue.log import event
from pgqueue.queries.driver import arun
from pgqueue.queries.leased import task_cancel_requested
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.state import Slots

# The channel task_cancel notifies (sql/tasks.sql); one for every worker, each keeping the
# payloads that name it: cancels are rare, and a worker id may be longer than a channel name.
CANCEL_CHANNEL = "pgqueue_cancel"
# How often a worker without a listener reads its running tasks' cancel flags.
CANCEL_POLL_SECONDS = 0.5


class Cancels:
    """Sets the stop flag of this worker's running tasks that someone asked to cancel."""

    def __init__(self, config: WorkerConfig, *, slots: Slots) -> None:
        self._worker_id = config.worker_id
        self._running = slots.running

    def notified(self, payload: str) -> None:
        """A ``pgqueue_cancel`` payload: ``OWNER TASK_ID`` (the owner may contain spaces)."""
        owner, _, task_text = payload.rpartition(" ")
        if owner != self._worker_id:
            return  # another worker holds that lease
        try:
            task_id = uuid.UUID(task_text)
        except ValueError:
            return  # not ours to parse: nothing pgqueue sends
        self.requested(task_id, via="notify")

    def requested(self, task_id: uuid.UUID, *, via: str) -> bool:
        """Stop the handler of ``task_id`` if this worker runs it and nobody told it yet;
        whether this call did."""
        running = self._running.get(task_id)
        if running is None or running.released or running.recording:
            return False  # not running here, or its outcome is being written already
        ctx = running.ctx
        if ctx.cancel_requested:
            return False
        ctx.cancel_requested = True
        ctx.stop()
        event(
            "task.cancel_requested",
            task_id=task_id,
            type=running.task.type,
            attempt=running.task.attempts,
            via=via,
        )
        return True


class CancelPoll:
    """``run`` reads the cancel flags of the tasks this worker runs every ``interval``
    seconds until cancelled (nothing while none runs); ``poll_once`` is one read."""

    def __init__(
        self,
        cancels: Cancels,
        *,
        db: Database,
        slots: Slots,
        interval: float = CANCEL_POLL_SECONDS,
    ) -> None:
        self._cancels = cancels
        self._db = db
        self._running = slots.running
        self.interval = interval

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.poll_once()

    async def poll_once(self) -> int:
        """One read; how many handlers it told to stop."""
        leases = [
            r.task.lease
            for r in self._running.values()
            if not (r.released or r.recording or r.ctx.cancel_requested)
        ]
        if not leases:
            return 0
        # One try: the next poll is the retry (after the backoff of the service's streak);
        # database errors are logged and counted by Database.call, as the heartbeat's are.
        requested = await self._db.call(
            "cancel_poll", lambda c: arun(c, task_cancel_requested(leases)), attempts=1
        )
        told = 0
        for task_id in sorted(requested or ()):
            told += self._cancels.requested(task_id, via="poll")
        return told
