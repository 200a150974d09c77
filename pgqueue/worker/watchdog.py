"""The event loop's watchdog: notices when the loop stops running, and names the async handler
that held it.

An async handler that calls blocking code (``time.sleep``, a sync HTTP client, a long CPU
loop) holds the worker's one event loop: no other task, heartbeat, claim or completion runs
until it yields, and its own timeout cannot fire (the timer runs on the loop). Python cannot
interrupt it; what the worker can do is see it and say which handler it was.

A plain thread looks at the loop's thread every half threshold, and costs the loop nothing:
the loop runs every callback (a task's step among them) in ``Handle._run``, so the same
``Handle._run`` frame on the loop thread's stack (``sys._current_frames()``) at two looks is
one callback that has not returned in between. Once that has lasted the threshold, the
thread notes the asyncio task being stepped (``asyncio.current_task(loop)``), maps it to the
runner's task, and when the callback returns logs ``worker.loop_blocked`` with the task's id,
type and attempt and how long the loop was held (at least; to within half a threshold), and
counts it in the metrics (logged at most every ``REPORT_EVERY_SECONDS`` for each handler type;
counted every time). A block that lasts (``ONGOING_SECONDS``) is logged once while it
lasts too (``worker.loop_blocking``), for a loop that might never come back. A block of
1.5 thresholds or more is always seen; a shorter one past the threshold, sometimes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from asyncio.events import Handle
from types import FrameType
from typing import Any

from pgqueue.log import event
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.state import Running, Slots

# A block still going on after this long (or ten thresholds, if more) is logged while it
# lasts, by the watchdog's thread.
ONGOING_SECONDS = 1.0
# At most one worker.loop_blocked line this often for each handler type (the metrics count
# every block): a handler that blocks the loop on every call must not flood the log.
REPORT_EVERY_SECONDS = 10.0
UNKNOWN = {"held_by": "unknown (no asyncio task was being stepped)"}
_CALLBACK = Handle._run.__code__
_ITERATION = asyncio.BaseEventLoop._run_once.__code__  # type: ignore[attr-defined]


class LoopWatchdog:
    """``start`` on the loop, ``stop`` when the worker stops; ``stalled()``, on the loop,
    says how long the callback running now has held it (0: not long enough to be seen)."""

    def __init__(self, threshold: float | None, *, slots: Slots, metrics: WorkerMetrics) -> None:
        self.threshold = threshold or 0.0
        self._running = slots.running
        self._metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stopped = False
        # The callback seen holding the loop (its Handle._run frame) and since when.
        self._held: tuple[FrameType, float] | None = None
        # By handler type ("": not a handler): when last logged, and how many since.
        self._reported_at: dict[str, float] = {}
        self._unreported: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def start(self) -> None:
        if not self.enabled:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        threading.Thread(target=self._watch, name="pgqueue-loop-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped = True  # the thread ends at its next look

    def stalled(self) -> float:
        """How long the callback running now (the caller's) has held the loop, as far as
        the watchdog has seen: at least this long; 0 when it has not seen it."""
        held = self._held
        if held is None or _callback_frame(sys._getframe()) is not held[0]:
            return 0.0
        return time.monotonic() - held[1]

    # --- on the watchdog's thread --------------------------------------------------------

    def _watch(self) -> None:
        interval = self.threshold / 2
        ongoing_after = max(ONGOING_SECONDS, 10 * self.threshold)
        culprit: dict[str, Any] | None = None
        last_seen = 0.0
        logged_ongoing = False
        while not self._stopped:
            time.sleep(interval)
            frame = sys._current_frames().get(self._loop_thread)
            callback = _callback_frame(frame) if frame is not None else None
            now = time.monotonic()
            held = self._held
            if callback is not None and held is not None and callback is held[0]:
                last_seen = now
                blocked = now - held[1]
                if culprit is None and blocked >= self.threshold:
                    culprit = self._holder()
                if culprit is not None and blocked >= ongoing_after and not logged_ongoing:
                    logged_ongoing = True
                    self._log("worker.loop_blocking", culprit, blocked, ongoing=True)
                continue
            if culprit is not None and held is not None:  # the blocking callback returned
                self._report(culprit, last_seen - held[1])
            culprit, logged_ongoing = None, False
            self._held = (callback, now) if callback is not None else None

    def _holder(self) -> dict[str, Any]:
        """The runner's task whose step holds the loop now, or the asyncio task's name."""
        assert self._loop is not None
        current = asyncio.current_task(self._loop)
        if current is None:
            return UNKNOWN
        for running in list(self._running.values()):
            if running.job is current:
                return _task_fields(running)
        return {"held_by": f"asyncio task {current.get_name()!r}"}

    def _report(self, culprit: dict[str, Any], blocked: float) -> None:
        type_ = str(culprit.get("type", ""))
        self._metrics.loop_blocked(type_, blocked)
        now = time.monotonic()
        last = self._reported_at.get(type_)
        if last is not None and now - last < REPORT_EVERY_SECONDS:
            self._unreported[type_] = self._unreported.get(type_, 0) + 1
            return
        self._reported_at[type_] = now
        unreported = self._unreported.pop(type_, 0)
        extra = {"not_logged_before": unreported} if unreported else {}
        self._log("worker.loop_blocked", culprit, blocked, **extra)

    def _log(self, name: str, culprit: dict[str, Any], blocked: float, **extra: Any) -> None:
        ongoing = extra.pop("ongoing", False)
        event(
            name,
            logging.WARNING,
            **culprit,
            blocked_s=round(blocked, 3),
            threshold_s=self.threshold,
            **extra,
            note=(
                "the event loop has run nothing else for this long, and still runs this"
                if ongoing
                else "the event loop ran nothing else meanwhile (an async handler calling "
                "blocking code?)"
            )
            + ": no other task, heartbeat, claim or completion",
        )


def _callback_frame(frame: FrameType | None) -> FrameType | None:
    """The frame of the loop callback (``Handle._run``) running in this stack, if any: none
    while the loop waits for I/O or timers. The walk stops at the loop's iteration."""
    while frame is not None:
        code = frame.f_code
        if code is _CALLBACK:
            return frame
        if code is _ITERATION:
            return None
        frame = frame.f_back
    return None


def _task_fields(running: Running) -> dict[str, Any]:
    task = running.task
    return {"task_id": task.id, "type": task.type, "attempt": task.attempts}
