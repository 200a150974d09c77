"""How a cancellation reaches a running handler's context: the listener's path
(worker/cancels.py, a pgqueue_cancel payload) and the heartbeat's fallback, driven without a
database (the heartbeat's round trip is a stand-in returning what the statement would)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from pgqueue.executor import TaskContext
from pgqueue.models import ClaimedTask, Priority
from pgqueue.queries.leased import HeartbeatResult
from pgqueue.worker.cancels import Cancels
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.state import Running, Slots

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def running_task(slots: Slots, config: WorkerConfig) -> Running:
    task = ClaimedTask(
        id=uuid.uuid4(),
        queue="default",
        type="crawl",
        payload={},
        priority=Priority.NORMAL,
        attempts=2,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        lease_expires_at=T0,
        created_at=T0,
    )
    running = Running(task, TaskContext(task, worker_id=config.worker_id), time.monotonic())
    slots.running[task.id] = running
    return running


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "pgqueue_fields", {})
        self.seen.append({"event": record.getMessage().split()[0], **fields})

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["event"] == name]


@pytest.fixture
def events() -> Iterator[Events]:
    """pgqueue's events, whatever another test did to the logger's propagation."""
    logger = logging.getLogger("pgqueue")
    handler, level = Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def config() -> WorkerConfig:
    return WorkerConfig(worker_id="host 1:42")  # an id with a space: the payload's last word


def test_a_notification_naming_this_worker_stops_the_handler_once(
    config: WorkerConfig, events: Events
):
    slots = Slots()
    cancels = Cancels(config, slots=slots)
    mine, other = running_task(slots, config), running_task(slots, config)

    cancels.notified(f"host 1:42 {mine.task.id}")
    assert mine.ctx.should_stop() and mine.ctx.cancel_requested
    assert not other.ctx.should_stop()
    (logged,) = events.named("task.cancel_requested")
    assert (logged["task_id"], logged["type"], logged["attempt"]) == (mine.task.id, "crawl", 2)
    assert logged["via"] == "notify"

    cancels.notified(f"host 1:42 {mine.task.id}")  # the heartbeat's or a repeat: nothing more
    assert len(events.named("task.cancel_requested")) == 1


@pytest.mark.parametrize(
    "payload",
    ["host 2:7 {id}", "host 1:4 {id}", "{id}", "host 1:42 not-a-uuid", "host 1:42 " + "0" * 32],
)
def test_a_notification_for_another_worker_or_task_is_ignored(config: WorkerConfig, payload: str):
    slots = Slots()
    mine = running_task(slots, config)
    Cancels(config, slots=slots).notified(payload.format(id=mine.task.id))
    assert not mine.ctx.should_stop()


def test_a_task_whose_outcome_is_being_written_is_left_alone(config: WorkerConfig):
    slots = Slots()
    mine = running_task(slots, config)
    mine.recording = True
    assert not Cancels(config, slots=slots).requested(mine.task.id, via="notify")
    assert not mine.ctx.should_stop()


class OneRoundTrip:
    """Database.call's stand-in: answers with what task_heartbeat would."""

    def __init__(self, result: HeartbeatResult) -> None:
        self.result = result

    async def call(self, service: str, fn: Any, *, attempts: int | None = None) -> HeartbeatResult:
        return self.result


def test_the_heartbeat_still_delivers_a_cancellation_whose_notification_was_lost(
    config: WorkerConfig, events: Events
):
    slots = Slots()
    mine = running_task(slots, config)
    result = HeartbeatResult(held={mine.task.id: T0}, cancel_requested={mine.task.id})
    heartbeat = Heartbeat(config, db=OneRoundTrip(result), slots=slots)  # type: ignore[arg-type]
    asyncio.run(heartbeat.beat_once())
    assert mine.ctx.should_stop() and mine.ctx.cancel_requested
    assert [e["via"] for e in events.named("task.cancel_requested")] == ["heartbeat"]


def test_an_async_handler_can_await_the_stop():
    async def scenario() -> list[str]:
        slots, config = Slots(), WorkerConfig()
        mine = running_task(slots, config)
        seen: list[str] = []

        async def handler() -> None:
            await mine.ctx.stopped()
            seen.append("stopped")

        job = asyncio.ensure_future(handler())
        await asyncio.sleep(0)
        assert seen == []
        Cancels(config, slots=slots).requested(mine.task.id, via="notify")
        await asyncio.wait_for(job, 5)
        await asyncio.wait_for(mine.ctx.stopped(), 5)  # already stopped: returns at once
        return seen

    assert asyncio.run(scenario()) == ["stopped"]
