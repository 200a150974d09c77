"""Handler timeouts in the executor, without a database: a sync handler past its timeout is
recorded only once its thread returned, and an async one that blocked the loop past its
deadline is not a completion. The worker processes are tested in
tests/acceptance/test_handler_overrun.py."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

import pgqueue
from pgqueue.errors import ValidationError
from pgqueue.executor import Completed, DaemonThreadPool, Executor, Failed, TaskContext
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.overruns import Overruns
from pgqueue.worker.state import Running


def _claimed(type_: str = "t") -> pgqueue.models.ClaimedTask:
    now = datetime.now(UTC)
    return pgqueue.models.ClaimedTask(
        id=uuid.uuid4(),
        queue="default",
        type=type_,
        payload={},
        priority=pgqueue.Priority.NORMAL,
        attempts=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        lease_expires_at=now,
        created_at=now,
    )


def _run(fn: Any, timeout: float, **executor: Any) -> tuple[Any, TaskContext]:
    registry = pgqueue.TaskRegistry()
    registry.handler("t", timeout=timeout)(fn)
    task = _claimed()
    ctx = TaskContext(task, worker_id="w")

    async def go() -> Any:
        threads = DaemonThreadPool(1)
        try:
            return await Executor(threads, **executor).run(task, ctx, registry.get("t"))
        finally:
            threads.shutdown()

    return asyncio.run(go()), ctx


def test_a_sync_handler_past_its_timeout_is_failed_only_after_its_thread_returned() -> None:
    returned = threading.Event()
    overruns: list[tuple[TaskContext, float]] = []

    def slow(payload: Any, ctx: TaskContext) -> dict[str, Any]:
        time.sleep(1.0)  # never looks at should_stop(), as a stuck library call would not
        returned.set()
        return {"late": True}

    outcome, ctx = _run(slow, 0.05, on_overrun=lambda c, t: overruns.append((c, t)))

    assert returned.is_set(), "the outcome came before the thread returned"
    assert outcome == Failed("timed out after 0.05 s")  # not the value it returned
    assert ctx.timed_out and ctx.should_stop()
    assert ctx.overrunning_since is not None
    assert overruns == [(ctx, 0.05)]


def test_a_sync_handler_that_raises_after_its_timeout_is_still_timed_out() -> None:
    def slow(payload: Any, ctx: TaskContext) -> None:
        time.sleep(0.5)
        raise RuntimeError("woke up to an error")

    outcome, _ = _run(slow, 0.05)

    assert outcome == Failed("timed out after 0.05 s")


def test_a_sync_handler_within_its_timeout_completes_and_is_not_overrunning() -> None:
    outcome, ctx = _run(lambda payload, ctx: {"ok": 1}, 30)

    assert isinstance(outcome, Completed)
    assert not ctx.timed_out and ctx.overrunning_since is None


def test_an_async_handler_that_blocks_the_loop_past_its_deadline_is_failed_not_completed() -> None:
    async def blocking(payload: Any, ctx: TaskContext) -> dict[str, Any]:
        time.sleep(0.5)  # blocks the loop: the timeout's timer cannot fire meanwhile
        return {"done": True}

    outcome, ctx = _run(blocking, 0.05)

    assert isinstance(outcome, Failed)
    assert outcome.error.startswith("timed out after 0.05 s (blocked the event loop for ")
    assert ctx.timed_out


def test_the_watchdogs_measure_says_how_long_the_loop_was_blocked() -> None:
    async def blocking(payload: Any, ctx: TaskContext) -> None:
        time.sleep(0.3)

    outcome, _ = _run(blocking, 0.05, stalled=lambda: 7.25)

    assert outcome == Failed("timed out after 0.05 s (blocked the event loop for 7.2 s)")


class _Recorded(WorkerMetrics):
    def __init__(self) -> None:
        self.overrunning: list[int] = []

    def handler_overrun(self, task: Any, overrunning: int) -> None:
        self.overrunning.append(overrunning)

    def handler_overrun_ended(self, task: Any, overrunning: int) -> None:
        self.overrunning.append(overrunning)


def _running() -> Running:
    task = _claimed()
    return Running(task, TaskContext(task, worker_id="w"), time.monotonic())


def test_the_worker_recycles_once_more_handlers_overrun_than_allowed() -> None:
    reasons: list[str] = []
    metrics = _Recorded()
    overruns = Overruns(1, metrics=metrics, recycle=reasons.append)
    first, second, third = _running(), _running(), _running()

    overruns.started(first, 2.0)
    assert reasons == []  # one is allowed
    overruns.ended(first)
    overruns.started(second, 2.0)
    assert reasons == []  # one at a time, still
    overruns.started(third, 2.0)
    assert len(reasons) == 1 and "max_overrunning=1" in reasons[0]
    overruns.abandoned(second)
    overruns.started(first, 2.0)
    assert len(reasons) == 1, "asked once"
    assert metrics.overrunning == [1, 0, 1, 2, 1, 2]
    assert overruns.timeout_of(third.task.id) == 2.0 and len(overruns) == 2


def test_no_recycling_without_a_limit() -> None:
    reasons: list[str] = []
    overruns = Overruns(None, metrics=WorkerMetrics(), recycle=reasons.append)
    for _ in range(50):
        overruns.started(_running(), 1.0)
    assert reasons == []


@pytest.mark.parametrize(
    ("field", "value"), [("max_overrunning", -1), ("loop_block_threshold", -0.1)]
)
def test_negative_overrun_and_watchdog_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        WorkerConfig(**{field: value})


def test_zero_or_none_turns_the_watchdog_off() -> None:
    from pgqueue.worker.state import Slots
    from pgqueue.worker.watchdog import LoopWatchdog

    for off in (0, None):
        config = WorkerConfig(loop_block_threshold=off)
        watchdog = LoopWatchdog(config.loop_block_threshold, slots=Slots(), metrics=WorkerMetrics())
        assert not watchdog.enabled and watchdog.stalled() == 0.0


class _Blocks(WorkerMetrics):
    def __init__(self) -> None:
        self.blocks: list[tuple[str, float]] = []

    def loop_blocked(self, type: str, seconds: float) -> None:
        self.blocks.append((type, seconds))


def test_the_watchdog_sees_a_step_that_blocks_the_loop_and_names_its_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pgqueue.worker.state import Slots
    from pgqueue.worker.watchdog import LoopWatchdog

    metrics = _Blocks()

    async def go() -> None:
        watchdog = LoopWatchdog(0.05, slots=Slots(), metrics=metrics)
        watchdog.start()

        async def stuck() -> None:
            time.sleep(0.6)  # the whole loop stops here

        await asyncio.create_task(stuck(), name="stuck-step")
        for _ in range(200):  # the watchdog's thread reports once it sees the loop again
            if metrics.blocks:
                break
            await asyncio.sleep(0.01)
        watchdog.stop()

    with caplog.at_level("WARNING", logger="pgqueue"):
        asyncio.run(go())

    # Only the step that slept: on a busy machine a tiny step may be held up long enough too.
    ((type_, seconds),) = [b for b in metrics.blocks if b[1] >= 0.3]
    assert type_ == "" and seconds >= 0.4
    held_by = [
        r.pgqueue_fields.get("held_by")
        for r in caplog.records
        if getattr(r, "pgqueue_event", "") == "worker.loop_blocked"
    ]
    assert "asyncio task 'stuck-step'" in held_by
