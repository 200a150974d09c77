"""LISTEN wake-ups: an enqueue's NOTIFY wakes the claimer at once instead of at its next poll,
and a cancel's NOTIFY (``pgqueue_cancel``) stops the handler of a task this worker runs at once
instead of at its next heartbeat (see worker/cancels.py), and a release's NOTIFY
(``pgqueue_released``: a dependant or a replayed dead letter, older than where this worker's
claims got to) makes the next claim of that queue walk its index from the start.

A connection of its own, outside the pool: it sits in LISTEN for the worker's whole life. It is
re-established after any disconnect, and every (re)connection wakes the claimer, since the
notifications sent while it was deaf are gone.

Its URL is the worker's ``listen_url`` (pgqueue/pooling.py: ``resolve_listen_url``): the
database URL, or a direct URL that bypasses a transaction-mode pooler, through which a LISTEN
would hear nothing. Behind such a pooler without one, the worker has no listener at all: it
polls adaptively (claimer.py), and reads its running tasks' cancel flags (cancels.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg

from pgqueue.queries.waiting import RELEASED_CHANNEL
from pgqueue.worker.cancels import CANCEL_CHANNEL
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database_errors import PROGRAMMING_ERRORS, ErrorStreak
from pgqueue.worker.metrics import NO_METRICS, WorkerMetrics


class Listener:
    """``run`` listens until cancelled and sets ``wake`` for a notification about one of the
    worker's queues (or ``*``: any queue); a cancellation's payload goes to ``on_cancel``."""

    def __init__(
        self,
        database_url: str,  # the URL to LISTEN on: the worker's listen_url
        config: WorkerConfig,
        *,
        wake: asyncio.Event,
        on_cancel: Callable[[str], object] | None = None,
        on_connect: Callable[[], object] | None = None,
        on_released: Callable[[str], object] | None = None,
        metrics: WorkerMetrics = NO_METRICS,
    ) -> None:
        self.database_url = database_url
        self._config = config
        self._queues = set(config.queues)
        self._wake = wake
        self._on_cancel = on_cancel
        self._on_connect = on_connect
        self._on_released = on_released
        self._adopted: psycopg.AsyncConnection[Any] | None = None
        self._metrics = metrics

    def adopt(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Listen first on ``conn`` (autocommit), an open connection the worker has no more
        use for (its start-up check's), instead of opening one."""
        self._adopted = conn

    async def close(self) -> None:
        """Close an adopted connection ``run`` never took (it was cancelled first)."""
        conn, self._adopted = self._adopted, None
        if conn is not None:
            await conn.close()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn, self._adopted = self._adopted, None
        if conn is not None and not conn.closed:
            return conn
        return await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, connect_timeout=10
        )

    async def run(self) -> None:
        """Any error but PROGRAMMING_ERRORS (see worker/database_errors.py) is logged as
        ``worker.listen_lost`` (the first of a streak, then summaries), counted
        (``service=listener``), and the listener listens again after the backoff."""
        errors = ErrorStreak(
            "listener",
            worker=self._config.worker_id,
            metrics=self._metrics,
            event_name="worker.listen_lost",
        )
        while True:
            delay = 0.2  # the connection ended without an error
            try:
                conn = await self._connect()
                async with conn:
                    if self._on_cancel is not None:
                        await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                    if self._on_released is not None:
                        await conn.execute(f"LISTEN {RELEASED_CHANNEL}")
                    # Last, so that pg_stat_activity shows a listening worker as it always
                    # has: query 'LISTEN pgqueue' (what operators and the tests look for).
                    await conn.execute("LISTEN pgqueue")
                    if self._on_connect is not None:
                        # Cancels sent while we were deaf are lost: a heartbeat now brings them.
                        self._on_connect()
                    self._wake.set()  # anything sent while we were deaf is lost: look now
                    errors.recovered()
                    async for note in conn.notifies():
                        if note.channel == CANCEL_CHANNEL:
                            if self._on_cancel is not None:
                                self._on_cancel(note.payload)
                        elif note.channel == RELEASED_CHANNEL:
                            # Followed by the wake-up on 'pgqueue' from the same commit.
                            if self._on_released is not None and note.payload in self._queues:
                                self._on_released(note.payload)
                        elif note.payload in self._queues or note.payload == "*":
                            self._wake.set()
            except PROGRAMMING_ERRORS:
                raise
            except Exception as exc:
                delay = errors.failed(exc)
            await asyncio.sleep(delay)
