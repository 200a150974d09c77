"""Periodic schedules (TaskRegistry.periodic): each due tick enqueued as a task.

Safe in every worker at once: the schedule's row lock queues the workers up, and each
enqueues only the ticks after the last one recorded, so a tick is enqueued once between them.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from pgqueue import aio
from pgqueue.cron import Schedule
from pgqueue.log import event
from pgqueue.models import EnqueueResult
from pgqueue.registry import TaskRegistry
from pgqueue.worker.database import Database


class Scheduler:
    """``run`` ticks until cancelled; ``tick_once`` is one pass over the schedules."""

    def __init__(self, registry: TaskRegistry, *, db: Database) -> None:
        self._registry = registry
        self._db = db

    async def run(self) -> None:
        """Enqueue each schedule's due ticks, then sleep until the next tick of any of them."""
        schedules = self._registry.schedules
        while True:
            await self.tick_once(schedules)
            now = datetime.now(UTC)
            wake = min(s.next_after(now) for s in schedules)
            await asyncio.sleep(min(max((wake - now).total_seconds(), 0.005), 5.0))

    async def tick_once(self, schedules: list[Schedule]) -> None:
        """One try of each schedule. A schedule whose statement failed is logged and counted
        (Database.call, ``service=scheduler schedule=NAME``) and skipped until its backoff
        is over, a streak of its own, so that a bad schedule neither stops nor delays the
        others (a per-second schedule kept waiting would miss ticks); its due ticks are
        enqueued once it succeeds again (only the newest, unless ``catch_up``)."""
        for schedule in schedules:

            async def run(conn: Any, s: Schedule = schedule) -> list[EnqueueResult]:
                return await aio.run_schedule(conn, s, registry=self._registry)

            subject = {"schedule": schedule.name}
            if self._db.backing_off("scheduler", subject):
                continue
            results = await self._db.call("scheduler", run, attempts=1, subject=subject)
            for result in results or []:
                if result.created:
                    event(
                        "schedule.enqueued",
                        schedule=schedule.name,
                        task_id=result.task.id,
                        type=result.task.type,
                        tick=result.task.visible_after.isoformat(),
                    )
