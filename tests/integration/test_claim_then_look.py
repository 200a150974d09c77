"""An ordinary claim starts what it took before the worker looks for limits and keyed tasks.

The look (limits_probe, and a claim round if limited or keyed tasks wait) is a statement more;
made before the start, it sat between an idle worker's wake-up and its handler's start on
every claim that came up short. Made after, it costs the pickup nothing, and what it finds is
still claimed in the same claim_once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgqueue
from pgqueue.models import ClaimedTask
from pgqueue.worker import claimer as claimer_module
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.metrics import NO_METRICS
from pgqueue.worker.state import Slots, StopRequest


def _claim_once_recording(database_url: str, monkeypatch: Any) -> tuple[list[str], list[Any]]:
    """One claim_once of a fresh claimer with free slots: the order of its starts and looks
    (the probe's op is built just before it runs), and the ids it returned."""
    order: list[str] = []
    probe = claimer_module.limits_probe

    def recorded_probe(*args: Any, **kwargs: Any) -> Any:
        order.append("look")
        return probe(*args, **kwargs)

    monkeypatch.setattr(claimer_module, "limits_probe", recorded_probe)

    def start(task: ClaimedTask) -> None:
        order.append(f"start {task.concurrency_key or 'plain'}")

    async def main() -> list[Any]:
        config = WorkerConfig(worker_id="claim-then-look", concurrency=10)
        stop = StopRequest()
        db = Database(database_url, config, stop)
        pool = await db.open()
        try:
            claimer = Claimer(
                config, db=db, metrics=NO_METRICS, slots=Slots(), stop=stop, start=start
            )
            claimed = await claimer.claim_once(10)
            assert claimed is not None
            return [t.id for t in claimed]
        finally:
            await pool.close()

    return order, asyncio.run(main())


def test_an_idle_claim_starts_its_task_before_it_looks_for_limits(conn, database_url, monkeypatch):
    task = pgqueue.enqueue(conn, "report", {"n": 1}).task
    order, claimed = _claim_once_recording(database_url, monkeypatch)
    assert claimed == [task.id]
    assert order == ["start plain", "look"]


def test_the_look_after_a_short_claim_still_claims_the_keyed_task_in_the_same_call(
    conn, database_url, monkeypatch
):
    plain = pgqueue.enqueue(conn, "report", {"n": 1}).task
    keyed = pgqueue.enqueue(conn, "report", {"n": 2}, concurrency_key="tenant-a").task
    order, claimed = _claim_once_recording(database_url, monkeypatch)
    assert claimed == [plain.id, keyed.id]
    assert order == ["start plain", "look", "start tenant-a"]
