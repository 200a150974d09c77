"""Lease renewal: one statement renews every lease the worker holds, both the running tasks'
and those of completions waiting for their batched write.

The same round trip brings back what the handlers must hear about: a cancellation someone
requested, and a lease that is gone (swept, or taken by another worker after a long stall),
after which the task's outcome is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from pgqueue import aio
from pgqueue.log import event
from pgqueue.models import Lease
from pgqueue.queries.leased import HeartbeatResult
from pgqueue.worker.cancels import Cancels
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.state import Running, Slots


class Heartbeat:
    """``run`` beats every third of the lease until cancelled (the worker cancels it only
    once the last completion is written); ``beat_once`` is one round."""

    def __init__(
        self, config: WorkerConfig, *, db: Database, slots: Slots, cancels: Cancels | None = None
    ) -> None:
        self._config = config
        self._db = db
        self._running = slots.running
        self._pending = slots.pending
        # The fallback of the listener's prompt path: see worker/cancels.py.
        self._cancels = cancels or Cancels(config, slots=slots)
        self._soon = asyncio.Event()  # beat now, not at the end of the interval

    def soon(self) -> None:
        """Beat now: the listener (re)connected, and cancellations notified while it was
        deaf are lost; this round brings them."""
        self._soon.set()

    async def run(self) -> None:
        interval = max(self._config.lease_seconds / 3, 0.2)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._soon.wait(), interval)
            self._soon.clear()
            await self.beat_once()

    async def beat_once(self) -> None:
        held = {r.task.id: r for r in self._running.values() if not r.released}
        leases: list[Lease] = [r.task.lease for r in held.values()]
        leases += [p.task.lease for p in self._pending]
        if not leases:
            return
        cfg = self._config
        result = await self._db.call(
            "heartbeat",
            lambda c: aio.heartbeat(c, leases, lease_seconds=cfg.lease_seconds),
            attempts=1,
        )
        if result is None:
            return  # try again next round (after the backoff); the lease is 3 intervals
        self._tell_handlers(held, result)

    def _tell_handlers(self, held: dict[uuid.UUID, Running], result: HeartbeatResult) -> None:
        for task_id, running in held.items():
            if task_id not in self._running or running.recording:
                continue  # its outcome was (being) written while the heartbeat was in flight
            if task_id not in result.held:
                if not running.ctx.lease_lost:
                    running.ctx.lease_lost = True
                    running.ctx.stop()
                    event(
                        "task.lease_lost",
                        logging.WARNING,
                        task_id=task_id,
                        type=running.task.type,
                        attempt=running.task.attempts,
                        note="heartbeat found the lease gone; the outcome will be dropped",
                    )
                continue
            running.ctx.lease_expires_at = result.held[task_id]
            if task_id in result.cancel_requested:
                self._cancels.requested(task_id, via="heartbeat")
