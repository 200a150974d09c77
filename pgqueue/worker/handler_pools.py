"""The connections handlers write on in their task's transaction (``ctx.connection``,
``await ctx.aconnection()``).

Separate from the worker's own pool so that handlers holding transactions open cannot starve
claims, completions and heartbeats, and created on first use so that workers whose handlers
never ask hold no extra connections. Behind a transaction pooler their connections prepare
nothing (WorkerConfig.connection_kwargs): a handler's statements and the completion written
in its transaction are the same few statements again and again, which psycopg would prepare.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue.worker.config import WorkerConfig


class HandlerPools:
    def __init__(self, database_url: str, config: WorkerConfig) -> None:
        self.database_url = database_url
        self._config = config
        self.async_pool: AsyncConnectionPool[Any] | None = None
        self.sync_pool: ConnectionPool[Any] | None = None
        self._async_lock = asyncio.Lock()
        self._sync_lock = threading.Lock()

    async def get_async(self) -> AsyncConnectionPool[Any]:
        async with self._async_lock:
            if self.async_pool is None:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.database_url,
                    min_size=0,
                    max_size=self._config.concurrency,
                    open=False,
                    kwargs={"connect_timeout": 10, **self._config.connection_kwargs},
                    # Checked before each loan: a connection the server dropped while it sat
                    # in the pool (a restart, pg_terminate_backend) would otherwise fail the
                    # next handler's transaction and cost its task an attempt.
                    check=AsyncConnectionPool.check_connection,
                    name="pgqueue-handlers",
                )
                await pool.open(wait=False)
                self.async_pool = pool
            return self.async_pool

    def get_sync(self) -> ConnectionPool[Any]:
        with self._sync_lock:  # called from handler threads
            if self.sync_pool is None:
                self.sync_pool = ConnectionPool(
                    self.database_url,
                    min_size=0,
                    max_size=self._config.concurrency,
                    kwargs={"connect_timeout": 10, **self._config.connection_kwargs},
                    check=ConnectionPool.check_connection,  # as for the async pool above
                    name="pgqueue-sync-handlers",
                    open=True,
                )
            return self.sync_pool
