"""The batched completion writer.

A completion's cost is mostly per statement (its commit, the round trip), so the completions
that finished while one write was in flight go out together in the next, up to 1000 a
statement, each fenced by its lease token. Only completions are batched: failures,
cancellations and retries are rare and are written where they happen (see runner.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pgqueue.log import event, logger
from pgqueue.queries.driver import arun
from pgqueue.queries.leased import task_complete_many
from pgqueue.worker.database import Database
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.state import PendingCompletion, Slots

BATCH_SIZE = 1000


class Completer:
    """Items leave ``pending`` only once their write is done, so the heartbeat keeps their
    leases alive meanwhile, and the lock makes shutdown's final flush wait for a write in
    flight instead of finding the list empty and letting the process exit under it."""

    def __init__(self, db: Database, metrics: WorkerMetrics, slots: Slots) -> None:
        self.processed = 0  # completions recorded
        self._db = db
        self._metrics = metrics
        self._slots = slots
        self._pending = slots.pending
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()

    def add(self, completion: PendingCompletion) -> None:
        self._pending.append(completion)
        self._ready.set()

    async def run(self) -> None:
        """Until cancelled: shutdown cancels it, then writes what is left with ``flush``."""
        while True:
            await self._ready.wait()
            await self.flush()

    async def flush(self, final: bool = False) -> None:
        """Write pending completions, a batch per statement (``final``: at shutdown, where a
        database that stays unreachable must not hold the process forever)."""
        async with self._lock:
            while self._pending:
                batch = self._pending[:BATCH_SIZE]
                done = await self._write(batch, final)
                del self._pending[: len(batch)]  # appends only ever go to the end
                self.processed += len(done or ())
                self._metrics.tasks_completed(p.task for p in batch if done and p.task.id in done)
                all_recorded = done is not None and len(done) == len(batch)
                if all_recorded and not logger.isEnabledFor(logging.INFO):
                    continue  # nothing to log: skip the per-task loop
                _log_outcomes(batch, done)
            self._ready.clear()
            self._slots.changed()  # the claimer may be waiting for completions to drain

    async def _write(self, batch: list[PendingCompletion], final: bool) -> set[Any] | None:
        """The ids of the batch's tasks whose completion was recorded (the others had lost
        their lease), or None if the write gave up (at shutdown, or at a forced stop).

        A database error is retried (Database.call) with the same lease tokens: a retry
        records only the completions whose lease is still this worker's, exactly as the first
        try would have, since the statement is fenced by the lease and an error rolls it back
        whole. Meanwhile the batch stays pending and the heartbeat keeps its leases alive."""
        items = [(p.task.lease, p.result_json) for p in batch]
        return await self._db.call(
            "completer",
            lambda c: arun(c, task_complete_many(items)),
            attempts=5 if final else None,
        )


def _log_outcomes(batch: list[PendingCompletion], done: set[Any] | None) -> None:
    for p in batch:
        fields: dict[str, Any] = {
            "task_id": p.task.id,
            "type": p.task.type,
            "attempt": p.task.attempts,
            "duration_ms": round(p.duration * 1000, 1),
        }
        if done is None:
            event(
                "task.outcome_unrecorded",
                logging.ERROR,
                **fields,
                note="completed, but the completion could not be written at shutdown "
                "(see worker.database_error); the task will run again when its lease expires",
            )
        elif p.task.id in done:
            event("task.completed", **fields)
        else:
            event(
                "task.lease_lost",
                logging.WARNING,
                **fields,
                note="completed, but the lease was lost first; the task runs again",
            )
