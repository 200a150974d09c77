"""A running task's progress report (``ctx.set_progress``): its bound, and the worker's
coalescing writer.

A report is a small JSON object stored on the task (``tasks.progress``) for whoever watches
it: ``pgqueue status``, the HTTP task view, a waiter's Task, the dashboard. It is bounded
(``MAX_PROGRESS_BYTES`` of the text PostgreSQL gives back, measured as payloads are), since
every read of the task reads it whole. A handler may report in a tight loop: the worker
writes at most one report per ``PROGRESS_INTERVAL`` per task, always the latest, and the
last one before the task's outcome is written. Every write is fenced by the lease
(``leased.task_progress``): a worker that lost its task writes nothing more about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from pgqueue.enqueue import encode_payload
from pgqueue.errors import InvalidPayload, PayloadTooLarge, ValidationError
from pgqueue.log import event
from pgqueue.models import Lease
from pgqueue.queries.driver import arun
from pgqueue.queries.leased import task_progress

MAX_PROGRESS_BYTES = 4096
# At most one write per task this often (seconds): a handler reporting every item of a
# million-item loop costs the database two updates a second, not a million.
PROGRESS_INTERVAL = 0.5
# How long the last report may hold up the task's outcome when the database is slow to
# lend a connection: it is a report, not the outcome, and is dropped past this.
FLUSH_TIMEOUT = 5.0
# How many reports one worker writes at once, whatever number of tasks it runs: each write
# borrows a handler connection for a moment, and the pool must not grow a connection per
# running task for them. Two writers of ~1 ms each keep up with a thousand tasks' reports.
CONCURRENT_WRITES = 2

_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _gate(loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
    """The worker's (its event loop's) bound on progress writes at once."""
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(CONCURRENT_WRITES)
    return gate


def encode_progress(value: object) -> str:
    """The report as the JSON text to store, or a ValidationError naming ``progress`` and why
    (not a JSON object, not JSON, more than MAX_PROGRESS_BYTES as stored)."""
    try:
        return encode_payload(value, limit=MAX_PROGRESS_BYTES)
    except PayloadTooLarge as exc:
        raise ValidationError(
            "progress",
            f"is {exc.size} bytes as stored (the JSON text PostgreSQL gives back); the limit "
            f"is {MAX_PROGRESS_BYTES} bytes: report counts and a short message, and return "
            "the rest as the task's result",
        ) from None
    except InvalidPayload as exc:
        reason = exc.reason.replace("the payload", "the report")
        raise ValidationError("progress", reason) from None


class ProgressSink(Protocol):
    """Where a context's reports go: the worker's writer, or a child's channel to it."""

    def report(self, progress_json: str) -> None: ...


class ProgressWriter:
    """Writes one task's reports on the worker's event loop, coalesced: the first at once,
    then at most one per ``interval``, always the latest. ``report`` may be called from any
    thread (a sync handler's) and never blocks; ``flush`` (on the loop, once the handler has
    ended) writes what is left before the outcome is. A write the lease refuses ends the
    writing (the heartbeat reports the lost lease); a database error drops that report (the
    next one, or the flush, writes again)."""

    def __init__(
        self,
        lease: Lease,
        pool: Callable[[], Awaitable[AsyncConnectionPool[Any]]],
        loop: asyncio.AbstractEventLoop,
        *,
        interval: float = PROGRESS_INTERVAL,
    ) -> None:
        self._lease = lease
        self._pool = pool
        self._loop = loop
        self._interval = interval
        self._lock = threading.Lock()  # _pending, _scheduled, _closed: handler threads too
        self._pending: str | None = None
        self._scheduled = False
        self._closed = False
        self._written_at = -math.inf  # loop time of the last write's start
        self._job: asyncio.Task[None] | None = None
        self._inflight: asyncio.Task[None] | None = None
        self.writes = 0
        self.refused = False

    def report(self, progress_json: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending = progress_json
            if self._scheduled:
                return  # the job takes the latest when its turn comes
            self._scheduled = True
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._start()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                self._loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._job = self._loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                wait = self._written_at + self._interval - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                with self._lock:
                    text, self._pending = self._pending, None
                    if text is None or self._closed:
                        self._scheduled = False
                        return
                # Shielded: a flush that stops this job waits for the write instead, so
                # that an older report cannot land after the newer one the flush writes.
                self._inflight = self._loop.create_task(self._write(text))
                await asyncio.shield(self._inflight)
        finally:
            with self._lock:
                self._scheduled = False

    async def _write(self, text: str) -> None:
        if self.refused:
            return
        self._written_at = self._loop.time()
        try:
            async with _gate(self._loop):
                pool = await self._pool()
                async with pool.connection(timeout=FLUSH_TIMEOUT) as conn:
                    held = await arun(conn, task_progress(self._lease, text))
        except Exception as exc:  # a report is not worth failing the task for
            event(
                "task.progress_not_written",
                logging.WARNING,
                task_id=self._lease.task_id,
                error=repr(exc),
            )
            return
        self.writes += 1
        if not held:
            self.refused = True
            event("task.progress_refused", logging.DEBUG, task_id=self._lease.task_id)

    async def _stop(self) -> str | None:
        with self._lock:
            self._closed = True
            text, self._pending = self._pending, None
        if self._job is not None and not self._job.done():
            self._job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._job
        if self._inflight is not None:
            with contextlib.suppress(Exception):
                await self._inflight
        return text

    async def flush(self) -> None:
        """The handler has ended: write its last report now (if not written yet), and no
        more after it."""
        text = await self._stop()
        if text is not None:
            await self._write(text)

    async def discard(self) -> None:
        """The outcome needs no report written after it: it wrote the last one itself (in
        the handler's transaction), or the lease is gone."""
        await self._stop()
