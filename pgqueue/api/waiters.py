"""The waiter hub: every ``GET /api/v1/tasks/{id}?wait=`` of one app on one LISTEN connection.

A request that waits for a task holds no database connection while it waits. The hub keeps
one connection per app (``application_name`` ``pgqueue-api-waiters``) listening on
``pgqueue_done`` and hands each notification to the requests waiting on that task; the pool
lends a connection only for a request's reads (register and read, re-read when woken or at a
poll, unregister). So 1,000 waiting requests cost one connection, not 1,000.

The requests run the same wait loop as ``pgqueue.wait`` (:mod:`pgqueue.waiting`); this module
is its third driver. While the hub's connection is down (a restart, a failover) notifications
are lost: the hub reconnects with backoff and, once listening again, wakes every waiter to
read its task, and the poll covers the rest. The number of waiters is bounded
(``PGQUEUE_API_MAX_WAITERS``): beyond it a request is refused with 503 and ``Retry-After``
rather than queueing without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

from pgqueue import log, queries
from pgqueue.errors import PgQueueError
from pgqueue.models import Task
from pgqueue.queries import DONE_CHANNEL, AwaitNotify, Copy, Listen, Op, Query, WaitOp, WaitStep
from pgqueue.waiting import wait_loop

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


def _one(step: Query | Copy) -> Op[list[dict[str, Any]]]:
    """One query of a wait loop as an op of its own, for a pooled connection to run."""
    return (yield step)


class WaiterHub:
    def __init__(self, *, max_waiters: int, poll_interval: float) -> None:
        self.max_waiters = max_waiters
        self.poll_interval = poll_interval
        self._events: dict[str, set[asyncio.Event]] = {}
        self._waiting = 0
        self._listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return self._waiting

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def start(self, url: str) -> None:
        """Start listening (the app's lifespan, or its first use); once."""
        if self._task is None:
            self._listening = asyncio.Event()  # of this loop (an app may be run again)
            self._task = asyncio.get_running_loop().create_task(self._listen(url))

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
        try:
            yield event
        finally:
            self._waiting -= 1
            events = self._events[key]
            events.discard(event)
            if not events:
                del self._events[key]

    async def wait(
        self,
        task_id: uuid.UUID,
        timeout: float,
        connection: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    ) -> Task:
        """The task once final, or WaitTimeout after ``timeout`` seconds (validated by the
        route); ``connection`` lends a pooled connection for each read."""
        async with self._registered(str(task_id)) as event:
            op = wait_loop(task_id, timeout, self.poll_interval)
            return await self._drive(op, str(task_id), event, connection)

    async def _drive(
        self,
        op: WaitOp[Task],
        key: str,
        event: asyncio.Event,
        connection: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    ) -> Task:
        try:
            step = next(op)
            while True:
                try:
                    reply = await self._step(step, key, event, connection)
                except BaseException as exc:  # cancellation too: the loop unregisters
                    step = op.throw(exc)
                else:
                    step = op.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _step(
        self,
        step: WaitStep,
        key: str,
        event: asyncio.Event,
        connection: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    ) -> Any:
        if isinstance(step, Listen):
            if step.listen and not self._listening.is_set():
                # Just started, or reconnecting: give it a moment, then rely on the poll.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._listening.wait(), LISTEN_READY_SECONDS)
            return []
        if isinstance(step, AwaitNotify):
            try:
                await asyncio.wait_for(event.wait(), max(step.seconds, 0.0))
            except TimeoutError:
                return []
            event.clear()
            return [key]  # only this task's notification sets this request's event
        async with connection() as conn:
            return await queries.arun(conn, _one(step))
