"""The worker's own connections, and the retry every statement of its services goes through.

Database errors never crash the worker: every statement is retried with backoff, and the
lease fence decides afterwards whose outcome counts. Shared by all the services so that one
pool serves them (a worker holds 2 to 4 connections whatever its concurrency) and an outage
is ridden out, and logged, the same way everywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue.errors import DatabaseUnavailable
from pgqueue.log import event
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.state import StopRequest

T = TypeVar("T")

# A worker holds 2 to 4 connections whatever its concurrency.
POOL_MIN, POOL_MAX = 2, 4

RETRYABLE = (psycopg.OperationalError, psycopg.errors.AdminShutdown, DatabaseUnavailable)


class Database:
    """The pool is made by ``open``, once the worker has seen the database up, not when the
    worker is built: a worker may be built long before it runs, or never run."""

    def __init__(self, database_url: str, config: WorkerConfig, stop: StopRequest) -> None:
        self.database_url = database_url
        self.pool: AsyncConnectionPool[Any] | None = None
        self._config = config
        self._stop = stop

    async def open(self) -> AsyncConnectionPool[Any]:
        """The pool, opening: with one connection first (what the first claim needs), the
        second once :meth:`started` (a server process fewer to start beside the claim)."""
        self.pool = AsyncConnectionPool(
            self.database_url,
            min_size=1,
            max_size=POOL_MAX,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": 10, **self._config.connection_kwargs},
            name="pgqueue-worker",
        )
        await self.pool.open(wait=False)
        return self.pool

    async def started(self) -> None:
        """The first claim is done: the pool's own size from now on."""
        if self.pool is not None:
            await self.pool.resize(POOL_MIN, POOL_MAX)

    async def call(
        self, fn: Callable[[Any], Awaitable[T]], *, attempts: int | None = None
    ) -> T | None:
        """Run ``fn(conn)`` on a pooled connection, retrying connection failures with backoff.

        Returns None if it gave up (only with ``attempts``, or when forced to stop).
        """
        assert self.pool is not None
        delay = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                async with self.pool.connection(timeout=10) as conn:
                    return await fn(conn)
            except RETRYABLE as exc:
                event(
                    "worker.database_error",
                    logging.WARNING,
                    worker=self._config.worker_id,
                    error=str(exc).strip().splitlines()[0]
                    if str(exc).strip()
                    else type(exc).__name__,
                    retry_in_s=round(delay, 2),
                )
            except Exception as exc:  # PoolTimeout and friends: the database is unreachable
                if type(exc).__name__ != "PoolTimeout":
                    raise
                event(
                    "worker.database_unreachable",
                    logging.WARNING,
                    worker=self._config.worker_id,
                    retry_in_s=round(delay, 2),
                )
            if (attempts is not None and tries >= attempts) or self._stop.force:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
