"""Sync handlers that ran past their timeout and whose threads still run.

A thread cannot be killed. When a sync handler's timeout passes, the executor tells it to stop
(``ctx.should_stop()``, ``ctx.timed_out``) and waits for its thread to return before the
runner records the attempt failed ("timed out after N s"). Meanwhile the task keeps its slot
and its lease (the heartbeat renews it), so that no retry, sweep or replay can start a second
execution of it while this one runs. This module keeps the count of such threads, says so in
the log and the metrics, and, past ``WorkerConfig.max_overrunning``, asks the worker to
recycle: stop claiming and exit with ``pgqueue.config.EXIT_RECYCLE``, so that its supervisor
starts a fresh process (the exit ends the threads).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from pgqueue.log import event
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.state import Running


class Overruns:
    """``started`` when a handler's timeout passes with its thread still running; ``ended``
    once the thread returned; ``abandoned`` when the worker exits before it did."""

    def __init__(
        self,
        max_overrunning: int | None,
        *,
        metrics: WorkerMetrics,
        recycle: Callable[[str], None],
    ) -> None:
        self._max = max_overrunning
        self._metrics = metrics
        self._recycle = recycle
        self._recycling = False
        # task id -> (its timeout, when it passed: time.monotonic())
        self.running: dict[uuid.UUID, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self.running)

    def timeout_of(self, task_id: uuid.UUID) -> float | None:
        entry = self.running.get(task_id)
        return entry[0] if entry is not None else None

    def started(self, running: Running, timeout: float) -> None:
        task = running.task
        self.running[task.id] = (timeout, time.monotonic())
        overrunning = len(self.running)
        self._metrics.handler_overrun(task, overrunning)
        event(
            "task.handler_overrun",
            logging.WARNING,
            task_id=task.id,
            type=task.type,
            attempt=task.attempts,
            timeout_s=timeout,
            over_s=0.0,
            overrunning=overrunning,
            note="timed out, but its thread runs on: the task keeps its slot and lease, and "
            "the timeout is recorded when the thread returns",
        )
        if self._max is not None and overrunning > self._max and not self._recycling:
            self._recycling = True
            self._recycle(
                f"{overrunning} handler threads are running past their timeouts "
                f"(max_overrunning={self._max})"
            )

    def ended(self, running: Running) -> None:
        """The thread returned: its outcome (the timeout) is recorded next."""
        self._end(running, "task.handler_overrun_ended", "its thread returned")

    def abandoned(self, running: Running) -> None:
        """The worker exits with the thread still running (the exit ends it)."""
        self._end(running, "task.abandoned", "its thread is still running; the exit ends it")

    def _end(self, running: Running, name: str, note: str) -> None:
        task = running.task
        entry = self.running.pop(task.id, None)
        if entry is None:
            return
        timeout, since = entry
        self._metrics.handler_overrun_ended(task, len(self.running))
        event(
            name,
            logging.WARNING,
            task_id=task.id,
            type=task.type,
            attempt=task.attempts,
            timeout_s=timeout,
            over_s=round(time.monotonic() - since, 2),
            note=note,
        )
