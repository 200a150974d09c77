"""Run one task and turn what happened into exactly one outcome.

The executor knows nothing about claiming or batching: it calls the handler with a
:class:`TaskContext` and returns an outcome (:class:`Completed`, :class:`Failed`,
:class:`Cancelled`, or :class:`Recorded` when the handler's own transaction already wrote the
completion). The worker writes the outcome, fenced by the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import queue
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue.arguments import UndecodableArgument
from pgqueue.error_text import format_exception
from pgqueue.errors import Fail, InvalidResult, LeaseLost
from pgqueue.hooks import NotRetried
from pgqueue.models import ClaimedTask, Parent
from pgqueue.progress import ProgressSink, ProgressWriter, encode_progress
from pgqueue.queries.driver import arun, run
from pgqueue.queries.leased import task_complete, task_progress
from pgqueue.registry import Cancel, Handler, Retry, Snooze
from pgqueue.result_encoding import encode_result

_WRITER_MADE = threading.Lock()


class TaskContext:
    """What a handler knows about its task and the worker running it.

    ``should_stop()`` turns true when the worker is shutting down, someone asked to cancel
    the task, its timeout passed, or its lease was lost; long handlers should check it and
    return or raise early. A cancellation reaches it within milliseconds of the cancel's
    commit (the worker is notified), or at the next heartbeat if the notification was lost.
    An async handler may instead ``await ctx.stopped()``, which returns when it turns true
    (race it against its work with ``asyncio.wait``). ``connection`` (sync handlers) and
    ``await aconnection()`` (async handlers) give a connection in a transaction that also
    records the task's completion: the handler's writes and the completion commit together
    or not at all.

    A thread cannot be killed: a sync handler past its timeout (``timed_out``) runs on until
    it returns, holding its task (slot, lease) meanwhile; whatever it returns then, the
    attempt is recorded failed as timed out and its transaction rolled back.

    ``set_progress({...})`` stores a small JSON object on the task for whoever watches it
    (pgqueue.progress: bounded, coalesced, fenced by the lease).
    """

    @property
    def parent_results(self) -> list[Any]:
        """The parents' results, in depends_on order (None for one that did not complete)."""
        return [p.result for p in self.parents]

    def __init__(
        self,
        task: ClaimedTask,
        *,
        worker_id: str,
        sync_pool: Callable[[], ConnectionPool[Any]] | None = None,
        async_pool: Callable[[], Awaitable[AsyncConnectionPool[Any]]] | None = None,
    ) -> None:
        self.task_id: uuid.UUID = task.id
        self.type = task.type
        self.queue = task.queue
        self.attempt = task.attempts
        # Celery's name for the count of earlier attempts (``attempt - 1``).
        self.retries = task.attempts - 1
        self.max_attempts = task.max_attempts
        self.lease = task.lease
        self.lease_expires_at: datetime = task.lease_expires_at
        self.worker_id = worker_id
        # The task's parents in depends_on order (status, result, error each), and
        # its workflow. A run-anyway step sees here which parents failed.
        self.parents: tuple[Parent, ...] = task.parents
        self.workflow_id: uuid.UUID | None = task.workflow_id
        # The tenant the task works for, as submitted (None: no key).
        self.concurrency_key: str | None = task.concurrency_key
        self.cancel_requested = False
        self.lease_lost = False
        self.timed_out = False
        self._stopped = False  # a plain flag: set once, read from handler threads (atomic)
        self._stop_event: asyncio.Event | None = None  # made by the first stopped() only
        self._sync_pool = sync_pool
        self._async_pool = async_pool
        self._conn: psycopg.Connection[Any] | None = None
        self._aconn: psycopg.AsyncConnection[Any] | None = None
        self._conn_return: Callable[[], Any] | None = None
        # Set (loop time) when the timeout passed while a sync handler's thread ran on: the
        # worker records the timeout only once the thread returns, and keeps the task's slot
        # and lease meanwhile (executor.Executor._run_sync_timed).
        self.overrunning_since: float | None = None
        # The last report set_progress accepted (decoded, and as the JSON text to store), and
        # where reports go: the worker's writer, made on the first report, or a child's
        # channel to its worker (set by the child). The loop is the worker's, where the
        # writer writes (None: made outside a loop, as a child and a test make it).
        self.progress: dict[str, Any] | None = None
        self._progress_json: str | None = None
        self._progress_sink: ProgressSink | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def set_progress(self, progress: dict[str, Any]) -> None:
        """Report how far the task has got: a JSON object of at most 4 KiB as stored
        (``pgqueue.progress.MAX_PROGRESS_BYTES``), shown by ``pgqueue status``, the HTTP task
        view, a waiter's Task and the dashboard. Never blocks, from a sync or an async
        handler: the worker writes at most one report per 0.5 s per task, always the
        latest, and the last one before the task's outcome. Kept on the task after it
        finishes, and on a retry until the next attempt reports. A report that is not a
        JSON object, or is too large, raises ValidationError here and stores nothing; a
        report after the lease was lost is not written. ``ctx.progress`` holds the last
        report accepted."""
        text = encode_progress(progress)
        self.progress = dict(progress)
        self._progress_json = text
        sink = self._progress_sink
        if sink is None:
            if self._loop is None or self._async_pool is None:
                return  # no worker to write it (a context made in a test): kept here only
            with _WRITER_MADE:  # two handler threads' first reports: one writer
                if self._progress_sink is None:
                    self._progress_sink = ProgressWriter(self.lease, self._async_pool, self._loop)
                sink = self._progress_sink
        sink.report(text)

    def should_stop(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """Called on the worker's event loop (a cancellation, a timeout, a lost lease, the
        shutdown), which is where stopped()'s waiters are."""
        self._stopped = True
        if self._stop_event is not None:
            self._stop_event.set()

    async def stopped(self) -> None:
        """Return once ``should_stop()`` is true (async handlers, on the worker's loop)."""
        if self._stopped:
            return
        if self._stop_event is None:
            self._stop_event = asyncio.Event()
        await self._stop_event.wait()

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """A connection whose transaction commits with this task's completion (sync handlers)."""
        if self._conn is None:
            if self._sync_pool is None:
                raise RuntimeError("this context has no database connection to offer")
            pool = self._sync_pool()
            conn = pool.getconn()
            self._conn = conn
            self._conn_return = lambda: pool.putconn(conn)
        return self._conn

    async def aconnection(self) -> psycopg.AsyncConnection[Any]:
        """A connection whose transaction commits with this task's completion (async handlers)."""
        if self._aconn is None:
            if self._async_pool is None:
                raise RuntimeError("this context has no database connection to offer")
            pool = await self._async_pool()
            self._aconn = await pool.getconn()
        return self._aconn


@dataclasses.dataclass(frozen=True)
class Completed:
    result_json: str | None


@dataclasses.dataclass(frozen=True)
class Recorded:
    """Completed, and already written in the handler's own transaction."""

    result_json: str | None


@dataclasses.dataclass(frozen=True)
class Failed:
    """A failed attempt: retried (after ``retry_after`` seconds, else the backoff) or
    dead-lettered when attempts are spent; ``dead`` dead-letters it at once, for a failure
    that would only repeat (a result that cannot be stored, ``Fail``, an exception the
    type's ``retry_on``/``no_retry_on`` do not retry). ``exception`` is what the handler
    raised, for the worker's hooks (None: the attempt failed without one, a timeout)."""

    error: str
    retry_after: float | None = None
    dead: bool = False
    exception: BaseException | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Cancelled:
    reason: str


@dataclasses.dataclass(frozen=True)
class Snoozed:
    """The handler raised Snooze: run again ``after`` seconds from now, no attempt spent."""

    after: float
    reason: str


@dataclasses.dataclass(frozen=True)
class Lost:
    """The lease was lost before the outcome could be written: nothing is recorded."""


Outcome = Completed | Recorded | Failed | Cancelled | Snoozed | Lost


def describe(exc: BaseException) -> str:
    """The error text stored as last_error: the exception's type and message first, then the
    traceback's innermost frames (pgqueue.error_text, where readers split it again)."""
    return format_exception(exc)


def _encode_result(value: Any, task: ClaimedTask, limit: int | None) -> Completed | Failed:
    """A handler's return value as an outcome: a result that cannot be stored fails the
    attempt and dead-letters the task at once, since the handler would only return the same
    again (the stored error says why, exception first, as error_text lays errors out)."""
    try:
        subject = f"task {task.id} ({task.type}, attempt {task.attempts})"
        return Completed(encode_result(value, task.id, subject=subject, limit=limit))
    except InvalidResult as exc:
        return Failed(f"{type(exc).__name__}: {exc.reason}", dead=True)


def _from_exception(exc: BaseException) -> Outcome:
    if isinstance(exc, Retry):
        return Failed(f"Retry: {exc}", retry_after=exc.after, exception=exc)
    if isinstance(exc, Cancel):
        return Cancelled(str(exc) or "cancelled by handler")
    if isinstance(exc, Snooze):
        return Snoozed(exc.after, str(exc) or "snoozed")
    if isinstance(exc, UndecodableArgument):  # the payload never changes: no retry can work
        return Failed(f"{type(exc).__name__}: {exc}", dead=True, exception=exc)
    if isinstance(exc, NotRetried):  # the handler's own error, noted with why: stored as usual
        return Failed(describe(exc.error), dead=True, exception=exc.error)
    if isinstance(exc, Fail):
        return Failed(f"Fail: {exc.reason}", dead=True, exception=exc)
    return Failed(describe(exc), exception=exc)


class DaemonThreadPool:
    """A pool of up to ``size`` daemon threads for sync handlers, started as needed.

    Daemon threads, unlike concurrent.futures', do not keep the process alive: a sync handler
    that ignores ``should_stop()`` cannot block a worker's shutdown past its grace period
    (its lease is released, so the task runs again elsewhere). Threads start only when a job
    finds none idle, so a worker whose handlers are all async holds none.
    """

    def __init__(self, size: int, name: str = "pgqueue-handler") -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            job()
            with self._lock:
                self._idle += 1

    def _dispatch(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._loop, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            # else: every thread is busy; the job waits in the queue for the first free one
        self._queue.put(job)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn`` on a pool thread in a copy of the caller's context (contextvars), as
        asyncio.to_thread does: the execution's trace span, and any context the application
        keeps, reach sync handlers too."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        context = contextvars.copy_context()

        def deliver(ok: bool, value: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def job() -> None:
            try:
                value = context.run(fn)
            except BaseException as exc:  # delivered to the awaiting coroutine
                loop.call_soon_threadsafe(deliver, False, exc)
            else:
                loop.call_soon_threadsafe(deliver, True, value)

        self._dispatch(job)
        return future

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


class ElsewhereRunner(Protocol):
    """Runs the handlers it ``takes`` somewhere other than this process: the process
    executor (pgqueue/worker/processes.py)."""

    def takes(self, handler: Handler) -> bool: ...

    async def run(self, task: ClaimedTask, ctx: TaskContext, handler: Handler) -> Outcome: ...


class Executor:
    """Calls handlers: async ones on the loop, sync ones on the daemon thread pool, and those
    ``elsewhere`` takes there. ``max_result_bytes`` bounds what a handler may return (None:
    read from the environment for each task; a worker passes the value it read once when it
    was built).

    ``on_overrun(ctx, timeout)`` is called on the loop when a sync handler's timeout passes
    while its thread runs on; ``stalled()`` (the worker's watchdog) says how long the loop
    callback running now has held the loop, to say how long an async handler that returned
    past its deadline blocked it."""

    def __init__(
        self,
        threads: DaemonThreadPool,
        *,
        max_result_bytes: int | None = None,
        on_overrun: Callable[[TaskContext, float], None] | None = None,
        stalled: Callable[[], float] | None = None,
        elsewhere: ElsewhereRunner | None = None,
    ) -> None:
        self.threads = threads
        self.max_result_bytes = max_result_bytes
        self.on_overrun = on_overrun
        self.stalled = stalled
        self.elsewhere = elsewhere

    async def run(self, task: ClaimedTask, ctx: TaskContext, handler: Handler | None) -> Outcome:
        if handler is None:
            return Failed(
                f"no handler is registered for task type {task.type!r} in this worker "
                f"(queue {task.queue!r})"
            )
        outcome: Outcome | None = None
        try:
            if self.elsewhere is not None and self.elsewhere.takes(handler):
                outcome = await self.elsewhere.run(task, ctx, handler)
            elif handler.is_async:
                outcome = await self._run_async(task, ctx, handler)
            else:
                outcome = await self._run_sync(task, ctx, handler)
        finally:
            await _progress_after(ctx, outcome)
        return outcome

    async def _run_async(self, task: ClaimedTask, ctx: TaskContext, handler: Handler) -> Outcome:
        scope: asyncio.Timeout | None = None
        try:
            if handler.timeout is None:  # the common case; a timeout scope costs a timer
                value = await handler.fn(task.payload, ctx)
            else:
                async with asyncio.timeout(handler.timeout) as scope:
                    value = await handler.fn(task.payload, ctx)
        except Exception as exc:
            # Only our own scope's expiry is a timeout; a TimeoutError the handler raised
            # itself (a client library's) is an ordinary failure with its own message.
            if scope is not None and scope.expired():
                ctx.timed_out = True
                ctx.stop()
                await _rollback_async(ctx)
                return Failed(f"timed out after {handler.timeout} s")
            if scope is not None and (late := self._past_deadline(scope)) is not None:
                return await self._blocked_past_deadline(ctx, handler, late)
            await _rollback_async(ctx)
            return _from_exception(exc)
        if scope is not None and (late := self._past_deadline(scope)) is not None:
            return await self._blocked_past_deadline(ctx, handler, late)
        outcome = _encode_result(value, task, self.max_result_bytes)
        if ctx._aconn is not None and isinstance(outcome, Completed):
            return await _commit_async(ctx, outcome)
        await _rollback_async(ctx)
        return outcome

    def _past_deadline(self, scope: asyncio.Timeout) -> float | None:
        """How long the loop has been blocked by a handler that ended (returned or raised)
        after its deadline without the timeout firing, or None when it ended in time. The
        timeout's timer runs on the loop: a handler that blocks the loop (a blocking call
        in an ``async def``) cannot be interrupted, and is only caught here, when it ends."""
        when = scope.when()
        if when is None:
            return None
        now = asyncio.get_running_loop().time()
        if now < when:
            return None
        # Blocked at least since the deadline; the watchdog knows since when exactly.
        return max(now - when, self.stalled() if self.stalled is not None else 0.0)

    async def _blocked_past_deadline(
        self, ctx: TaskContext, handler: Handler, blocked: float
    ) -> Outcome:
        ctx.timed_out = True
        ctx.stop()
        await _rollback_async(ctx)
        return Failed(
            f"timed out after {handler.timeout} s (blocked the event loop for {blocked:.1f} s)"
        )

    async def _run_sync(self, task: ClaimedTask, ctx: TaskContext, handler: Handler) -> Outcome:
        if handler.timeout is not None:
            return await self._run_sync_timed(task, ctx, handler, handler.timeout)

        def call() -> Outcome:
            try:
                value = handler.fn(task.payload, ctx)
            except Exception as exc:
                _rollback_sync(ctx)
                return _from_exception(exc)
            outcome = _encode_result(value, task, self.max_result_bytes)
            if ctx._conn is not None and isinstance(outcome, Completed):
                return _commit_sync(ctx, outcome)
            _rollback_sync(ctx)
            return outcome

        result: Outcome = await self.threads.submit(call)
        return result

    async def _run_sync_timed(
        self, task: ClaimedTask, ctx: TaskContext, handler: Handler, timeout: float
    ) -> Outcome:
        """A sync handler with a timeout. A thread cannot be killed: past the timeout the
        handler is told to stop (``ctx.should_stop()``, ``ctx.timed_out``) and the worker
        waits for its thread to return before it records anything, so that the task cannot
        run again (a retry) while this execution still runs. Whatever the handler returns
        after its timeout, the outcome is the timeout's failure and its ``ctx.connection``
        transaction is rolled back. Which of the two came first, the handler's return or
        the timeout, is decided once, under a lock: a handler that returned in time commits
        its own transaction even if the loop notices the timeout meanwhile."""
        decided = threading.Lock()
        returned = False

        def call() -> Outcome | None:
            nonlocal returned
            error: Exception | None = None
            try:
                value = handler.fn(task.payload, ctx)
            except Exception as exc:
                value, error = None, exc
            with decided:
                returned = not ctx.timed_out
            if not returned:
                _rollback_sync(ctx)
                return None  # too late: the worker records the timeout, whatever this was
            if error is not None:
                _rollback_sync(ctx)
                return _from_exception(error)
            outcome = _encode_result(value, task, self.max_result_bytes)
            if ctx._conn is not None and isinstance(outcome, Completed):
                return _commit_sync(ctx, outcome)
            _rollback_sync(ctx)
            return outcome

        future = self.threads.submit(call)
        done, _ = await asyncio.wait({future}, timeout=timeout)
        if not done:
            with decided:
                if not returned:
                    ctx.timed_out = True
        if not ctx.timed_out:  # in time (if only just: its outcome is on its way)
            result: Outcome | None = await future
            assert result is not None
            return result
        ctx.stop()
        ctx.overrunning_since = asyncio.get_running_loop().time()
        if self.on_overrun is not None:
            self.on_overrun(ctx, timeout)
        with contextlib.suppress(Exception):  # whatever it raised: it ran out of time
            await future
        return Failed(f"timed out after {timeout} s")


async def _progress_after(ctx: TaskContext, outcome: Outcome | None) -> None:
    """The handler has ended: its last progress report is written before its outcome is
    (the worker writes that next), unless the outcome wrote it in the handler's own
    transaction (Recorded), or there is no lease to write it under (Lost, or released at
    shutdown: None)."""
    writer = ctx._progress_sink
    if not isinstance(writer, ProgressWriter):
        return
    if outcome is None or isinstance(outcome, Recorded | Lost):
        await writer.discard()
    else:
        await writer.flush()


def _commit_sync(ctx: TaskContext, outcome: Completed) -> Outcome:
    conn = ctx._conn
    assert conn is not None
    try:
        if ctx._progress_json is not None:  # the last report, committed with the outcome
            run(conn, task_progress(ctx.lease, ctx._progress_json))
        run(conn, task_complete(ctx.lease, outcome.result_json))
        conn.commit()
        return Recorded(outcome.result_json)
    except LeaseLost:
        conn.rollback()
        return Lost()
    except Exception as exc:
        _rollback_sync(ctx)
        return Failed(f"could not commit the handler's transaction: {describe(exc)}")
    finally:
        _release_sync(ctx)


def _rollback_sync(ctx: TaskContext) -> None:
    if ctx._conn is not None:
        with contextlib.suppress(psycopg.Error):
            ctx._conn.rollback()
        _release_sync(ctx)


def _release_sync(ctx: TaskContext) -> None:
    if ctx._conn is not None and ctx._conn_return is not None:
        ctx._conn_return()
    ctx._conn = None
    ctx._conn_return = None


async def _commit_async(ctx: TaskContext, outcome: Completed) -> Outcome:
    conn = ctx._aconn
    assert conn is not None
    try:
        if ctx._progress_json is not None:  # the last report, committed with the outcome
            await arun(conn, task_progress(ctx.lease, ctx._progress_json))
        await arun(conn, task_complete(ctx.lease, outcome.result_json))
        await conn.commit()
        return Recorded(outcome.result_json)
    except LeaseLost:
        await conn.rollback()
        return Lost()
    except Exception as exc:
        await _rollback_async(ctx)
        return Failed(f"could not commit the handler's transaction: {describe(exc)}")
    finally:
        await _release_async(ctx)


async def _rollback_async(ctx: TaskContext) -> None:
    if ctx._aconn is not None:
        with contextlib.suppress(psycopg.Error):
            await ctx._aconn.rollback()
        await _release_async(ctx)


async def _release_async(ctx: TaskContext) -> None:
    if ctx._aconn is not None and ctx._async_pool is not None:
        await (await ctx._async_pool()).putconn(ctx._aconn)
    ctx._aconn = None
