"""The waiter hub: every ``GET /api/v1/tasks/{id}?wait=`` of one app on one LISTEN connection.

A request that waits for a task holds no database connection while it waits. The hub keeps
one connection per app (``application_name`` ``pgqueue-api-waiters``) listening on
``pgqueue_done`` and hands each notification to the requests waiting on that task; the pool
lends a connection only for the requests' reads (register and read, re-read when woken or at
a poll, unregister), and the reads of the requests that arrive or wake together run as one
statement (:class:`Coalescer`): 1,000 tasks finishing at once are a few statements on one or
two pooled connections, not 2,000 loans of one. So 1,000 waiting requests cost one
connection, not 1,000.

The requests run the same wait loop as ``pgqueue.wait`` (:mod:`pgqueue.waiting`); this module
is its third driver. While the hub's connection is down (a restart, a failover) notifications
are lost: the hub reconnects with backoff and, once listening again, wakes every waiter to
read its task, and the poll covers the rest. The number of waiters is bounded
(``PGQUEUE_API_MAX_WAITERS``): beyond it a request is refused with 503 and ``Retry-After``
rather than queueing without limit.

Behind a transaction-mode pooler a LISTEN through the pool hears nothing: the hub listens on
``PGQUEUE_LISTEN_URL`` (a direct URL, for LISTEN only) when it is set, and otherwise polls:
one statement reads the status of every task waited on, soon after a request arrives and then
less often, every :data:`~pgqueue.waiting.POLL_LONGEST` seconds at most, and wakes the
requests whose task is final (:meth:`WaiterHub._poll`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import psycopg

from pgqueue import log
from pgqueue.errors import PgQueueError
from pgqueue.models import Task, TaskStatus
from pgqueue.queries import driver, waiting
from pgqueue.queries.driver import AwaitNotify, Copy, Listen, Op, Query, WaitOp, WaitStep
from pgqueue.queries.waiting import DONE_CHANNEL
from pgqueue.waiting import POLL_FIRST, POLL_GROWTH, POLL_LONGEST, wait_loop

APPLICATION_NAME = "pgqueue-api-waiters"
RECONNECT_MAX_SECONDS = 10.0
# How long a request waits for the hub to be listening before it carries on with the poll.
LISTEN_READY_SECONDS = 5.0


class TooManyWaiters(PgQueueError):
    """This API process holds as many waiting requests as it allows (503, ``Retry-After``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this API process already holds {limit} waiting requests "
            "(PGQUEUE_API_MAX_WAITERS); retry later, or ask without ?wait="
        )
        self.limit = limit


Connection = Callable[[], contextlib.AbstractAsyncContextManager[Any]]
MAX_BATCH = 1000


class Coalescer:
    """One statement for the same read of many waits: the items submitted while a batch runs
    (or in the same turn of the event loop) go in the next one. ``run`` maps a batch of items
    to a result, ``pick`` one item's part of it; an error of the batch is each item's error."""

    def __init__(
        self,
        run: Callable[[list[Any]], Awaitable[Any]],
        pick: Callable[[Any, Any], Any],
    ) -> None:
        self._run = run
        self._pick = pick
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def submit(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((item, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the requests of this turn of the loop join the first batch
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            live = [(item, future) for item, future in batch if not future.done()]
            if not live:
                continue
            try:
                result = await self._run([item for item, _ in live])
            except Exception as exc:
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for item, future in live:
                if not future.done():
                    future.set_result(self._pick(result, item))


def _one(step: Query | Copy) -> Op[list[dict[str, Any]]]:
    """One query of a wait loop as an op of its own, for a pooled connection to run."""
    return (yield step)


class WaiterHub:
    def __init__(self, *, max_waiters: int, poll_interval: float, connection: Connection) -> None:
        self.max_waiters = max_waiters
        self.poll_interval = poll_interval
        self._connection = connection
        # The wait loop's three reads, each batched across requests.
        self._batched: dict[str, tuple[Coalescer, Callable[[Mapping[str, Any]], Any]]] = {
            "task_waiter_add": (
                Coalescer(self._batch(waiting.task_waiter_add_many), _rows_of),
                lambda p: (p["id"], p["waiter"], p["seconds"]),
            ),
            "task_get": (
                Coalescer(self._batch(waiting.task_get_many), _rows_of),
                lambda p: p["id"],
            ),
            "task_waiter_remove": (
                Coalescer(self._batch(waiting.task_waiter_remove_many), lambda _r, _i: []),
                lambda p: (p["id"], p["waiter"]),
            ),
        }
        self._events: dict[str, set[asyncio.Event]] = {}
        self._waiting = 0
        self._listening = asyncio.Event()
        # Polling (no LISTEN URL behind a pooler): set when a request starts waiting.
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return self._waiting

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def start(self, url: str | None) -> None:
        """Start listening on ``url`` (the app's lifespan, or its first use); once. None:
        nothing can be heard (a transaction pooler, no LISTEN URL), so poll instead."""
        if self._task is None:
            self._listening = asyncio.Event()  # of this loop (an app may be run again)
            self._arrived = asyncio.Event()
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._listen(url) if url else self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._listening.clear()

    async def _listen(self, url: str) -> None:
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    url, autocommit=True, application_name=APPLICATION_NAME, connect_timeout=5
                )
                async with conn:
                    await conn.execute(f"LISTEN {DONE_CHANNEL}")
                    self._listening.set()
                    delay = 0.5
                    # Whatever finished while nobody listened: every waiter reads its task.
                    self._wake_all()
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.event(
                    "api.waiters_listen_lost",
                    logging.WARNING,
                    error=f"{type(exc).__name__}: {exc}",
                    waiting=self._waiting,
                    retry_in=delay,
                )
            finally:
                self._listening.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_SECONDS)

    async def _poll(self) -> None:
        """Wake the requests whose task is final, read in one statement for all of them: soon
        after a request arrives (most waits are short), then less often, up to every
        POLL_LONGEST seconds; idle while nobody waits. Stands in for the LISTEN connection,
        so requests are answered as promptly as the poll (their own reads are the
        fallback, every ``poll_interval``)."""
        self._listening.set()  # nothing to wait for: the poll is ready at once
        interval = POLL_FIRST
        failures = 0
        while True:
            if not self._events:
                self._arrived.clear()
                await self._arrived.wait()
                interval = POLL_FIRST
            await asyncio.sleep(interval)
            if self._arrived.is_set():  # a new request: its task may well be a short one
                self._arrived.clear()
                interval = POLL_FIRST
            else:
                interval = min(interval * POLL_GROWTH, POLL_LONGEST)
            keys = list(self._events)
            if not keys:
                continue
            try:
                statuses = await self._statuses([uuid.UUID(k) for k in keys])
                failures = 0
            except Exception as exc:
                failures += 1
                log.event(
                    "api.waiters_poll_failed",
                    logging.WARNING,
                    error=f"{type(exc).__name__}: {exc}",
                    waiting=self._waiting,
                )
                await asyncio.sleep(min(0.5 * 2**failures, RECONNECT_MAX_SECONDS))
                continue
            for task_id, status in statuses.items():
                if TaskStatus(status).is_final:
                    self._wake(str(task_id))

    async def _statuses(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
        async with self._connection() as conn:
            return await driver.arun(conn, waiting.task_statuses(ids))

    def _wake(self, key: str) -> None:
        for event in self._events.get(key, ()):
            event.set()

    def _wake_all(self) -> None:
        for events in self._events.values():
            for event in events:
                event.set()

    @contextlib.asynccontextmanager
    async def _registered(self, key: str) -> AsyncIterator[asyncio.Event]:
        if self._waiting >= self.max_waiters:
            raise TooManyWaiters(self.max_waiters)
        event = asyncio.Event()
        self._waiting += 1
        self._events.setdefault(key, set()).add(event)
        self._arrived.set()
        try:
            yield event
        finally:
            self._waiting -= 1
            events = self._events[key]
            events.discard(event)
            if not events:
                del self._events[key]

    def _batch(self, build: Callable[[list[Any]], Op[Any]]) -> Callable[[list[Any]], Any]:
        async def run(items: list[Any]) -> Any:
            async with self._connection() as conn:
                return await driver.arun(conn, build(items))

        return run

    async def wait(self, task_id: uuid.UUID, timeout: float) -> Task:
        """The task once final, or WaitTimeout after ``timeout`` seconds (validated by the
        route)."""
        async with self._registered(str(task_id)) as event:
            op = wait_loop(task_id, timeout, self.poll_interval)
            return await self._drive(op, str(task_id), event)

    async def _drive(self, op: WaitOp[Task], key: str, event: asyncio.Event) -> Task:
        try:
            step = next(op)
            while True:
                try:
                    reply = await self._step(step, key, event)
                except BaseException as exc:  # cancellation too: the loop unregisters
                    step = op.throw(exc)
                else:
                    step = op.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _step(self, step: WaitStep, key: str, event: asyncio.Event) -> Any:
        if isinstance(step, Listen):
            if step.listen and not self._listening.is_set():
                # Just started, or reconnecting: give it a moment, then rely on the poll.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._listening.wait(), LISTEN_READY_SECONDS)
            # The hub's LISTEN connection or its poll wakes this request: its own loop
            # reads every poll_interval only in case that missed something.
            return True
        if isinstance(step, AwaitNotify):
            try:
                await asyncio.wait_for(event.wait(), max(step.seconds, 0.0))
            except TimeoutError:
                return []
            event.clear()
            return [key]  # only this task's notification sets this request's event
        if isinstance(step, Query) and step.name in self._batched:
            coalescer, item = self._batched[step.name]
            return await coalescer.submit(item(step.params))
        async with self._connection() as conn:
            return await driver.arun(conn, _one(step))


def _rows_of(rows: dict[Any, list[Any]], item: Any) -> list[Any]:
    """One task's rows from a batch's, by its id (the item's first part for a registration)."""
    task_id = item[0] if isinstance(item, tuple) else item
    return rows.get(task_id, [])
