"""What one app holds while it runs: its settings, its connection pool and its metrics.

An object per app, not module globals, so that two apps in one process (two mounts, or a
test suite) each have their own database and counts. Routes reach it through the
``AppState`` dependency (pgqueue.api.dependencies).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgqueue import pooling
from pgqueue.api.metrics import ApiMetrics
from pgqueue.api.settings import ApiSettings
from pgqueue.api.waiters import WaiterHub
from pgqueue.config import resolve_database_url
from pgqueue.errors import DatabaseUnavailable, SchemaNotReady
from pgqueue.queries import driver, maintenance


class ApiState:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.pool: AsyncConnectionPool[Any] | None = None
        self.head: str | None = None
        self.schema_ok = False  # the schema was seen at head (see check_schema)
        self._opening = asyncio.Lock()
        self.metrics = ApiMetrics()
        # Requests waiting for a result share one LISTEN connection (api/waiters.py).
        self.waiters = WaiterHub(
            max_waiters=settings.max_waiters,
            poll_interval=settings.wait_poll_seconds,
            connection=self.connection,
        )

    async def open(self) -> None:
        """Resolve the URL (maybe starting the embedded server) and open the pool, once.

        Called by the lifespan, and on first use too: an app mounted inside another ASGI app
        does not get lifespan events from Starlette's Mount.
        """
        async with self._opening:
            if self.pool is not None:
                return
            from pgqueue import migrate

            url = await asyncio.to_thread(resolve_database_url, self.settings.database_url)
            self.head = await asyncio.to_thread(migrate.head)
            # Behind a transaction pooler: no prepared statements on the pool's connections,
            # and the waiter hub listens on the LISTEN URL or, without one, polls.
            mode = pooling.resolve_pooler(self.settings.pooler)
            listen_url = pooling.resolve_listen_url(
                url, listen_url=self.settings.listen_url, pooler=mode
            )
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                url,
                min_size=1,
                max_size=self.settings.pool_size,
                open=False,
                kwargs={"connect_timeout": 5, **pooling.connection_kwargs(mode)},
                # Checked before each loan: connections the server dropped while idle (a
                # restart, a failover) would otherwise fail one request each.
                check=AsyncConnectionPool.check_connection,
                name="pgqueue-api",
            )
            await pool.open(wait=False)
            self.pool = pool
            self.waiters.start(listen_url)

    async def close(self) -> None:
        await self.waiters.stop()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    @contextlib.asynccontextmanager
    async def connection(
        self, *, check_schema: bool = True, timeout: float = 5
    ) -> AsyncIterator[Any]:
        """A pooled connection for the span of a route's database work (not of the whole
        request: a route validates its input first, and gives the connection back before
        its response is serialised); DatabaseUnavailable (503) when none comes within
        ``timeout`` seconds."""
        if self.pool is None:
            await self.open()
        assert self.pool is not None
        try:
            async with self.pool.connection(timeout=timeout) as conn:
                if check_schema and not self.schema_ok:
                    await self.check_schema(conn)
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise DatabaseUnavailable(f"database unavailable: {exc}") from None

    async def schema_revision(self, conn: Any) -> str | None:
        """The revision the database's pgqueue schema is at; None when it has none."""
        try:
            return await driver.arun(conn, maintenance.schema_version())
        except SchemaNotReady:  # no version table: never migrated
            await conn.rollback()
            return None

    async def check_schema(self, conn: Any) -> str:
        """The schema's revision, or SchemaNotReady unless it is this pgqueue's. Task
        endpoints run it on first use and again after each refusal, not on every request (as
        the worker and the Client check once); /readyz runs it every time."""
        revision = await driver.arun(conn, maintenance.schema_version())
        if revision != self.head:
            await conn.rollback()
            from pgqueue import migrate

            if revision is not None and not await asyncio.to_thread(migrate.known, revision):
                raise migrate.unknown_revision(revision)
            raise SchemaNotReady(
                f"the pgqueue schema is at revision {revision or 'none'} but this pgqueue "
                f"needs {self.head}; run `pgqueue migrate`"
            )
        self.schema_ok = True
        assert revision is not None  # equal to the head, which open() has set
        return revision
