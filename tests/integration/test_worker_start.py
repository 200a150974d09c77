"""How a worker starts: its schema check's connection becomes its LISTEN
connection, so that starting opens one server process fewer (it competes with the first
claim for the cores, and with --processes N, N times)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from helpers import run_worker_until

import pgqueue
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.listener import Listener

T = TypeVar("T")


def test_the_worker_listens_on_the_connection_it_checked_the_schema_on(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("noop")
    def noop(payload: Any, ctx: Any) -> None:
        return None

    task_id = pgqueue.enqueue(conn, "noop", {}).task.id
    seen: list[tuple[Any, ...]] = []

    def done() -> bool:
        if pgqueue.get_task(conn, task_id).status != pgqueue.TaskStatus.COMPLETED:
            return False
        rows = conn.execute(
            "SELECT pid, backend_start, query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' ORDER BY backend_start, pid"
        ).fetchall()
        seen[:] = rows
        return any(r[2] == "LISTEN pgqueue" for r in rows)

    run_worker_until(database_url, tasks, done)
    # The oldest of the worker's connections, opened before its pool: the check's.
    assert seen[0][2] == "LISTEN pgqueue", seen
    assert sum(r[2] == "LISTEN pgqueue" for r in seen) == 1, seen


def test_a_connection_the_listener_never_took_is_closed_with_it(database_url: str) -> None:
    async def scenario() -> bool:
        conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        listener = Listener(database_url, WorkerConfig(), wake=asyncio.Event())
        listener.adopt(conn)
        await listener.close()
        return conn.closed

    assert asyncio.run(scenario())


def test_the_listener_listens_on_the_connection_it_was_given(database_url: str) -> None:
    async def scenario() -> str:
        conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        backend = conn.info.backend_pid
        wake = asyncio.Event()
        listener = Listener(database_url, WorkerConfig(), wake=wake)
        listener.adopt(conn)
        task = asyncio.create_task(listener.run())
        await asyncio.wait_for(wake.wait(), 30)  # set once it listens
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as probe:
            cur = await probe.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", (backend,)
            )
            row = await cur.fetchone()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return str(row[0]) if row else ""

    assert asyncio.run(scenario()) == "LISTEN pgqueue"


@contextlib.contextmanager
def worker_running(
    database_url: str, registry: pgqueue.TaskRegistry, config: WorkerConfig
) -> Iterator[tuple[pgqueue.Worker, asyncio.AbstractEventLoop]]:
    """A real worker on its own event loop in a thread, stopped gracefully on the way out."""
    worker = pgqueue.Worker(registry, database_url, config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run_async(),))
    thread.start()
    try:
        yield worker, loop
    finally:
        loop.call_soon_threadsafe(worker.request_stop)
        thread.join(30)
        if not thread.is_alive():
            loop.close()
    assert not thread.is_alive(), "the worker did not stop within 30 s"


def poll(predicate: Callable[[], T], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


def test_the_pool_opens_at_one_connection_and_keeps_two_to_four_once_the_first_claim_is_done(
    database_url: str, conn: psycopg.Connection[Any], connect: Any
) -> None:
    """The worker's pool opens at a minimum of one connection (what the first claim needs: a
    server process fewer to start beside it) and a maximum of four; once the first claim is
    done it keeps two and grows to four at most, whatever the concurrency (3 here, neither
    bound, so that a pool sized from it shows). Seen from the server, the worker holds the
    listener's connection and its pool's, and nothing else: handlers that never ask for a
    connection open no pool of theirs. The first claim is held on a lock (the table of its
    start mark) so that the worker can be looked at before it is done."""
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("noop")
    def noop(payload: Any, ctx: Any) -> None:
        return None

    task_id = pgqueue.enqueue(conn, "noop", {}).task.id
    blocker = connect(autocommit=False)
    blocker.execute("LOCK TABLE pgqueue.lease_starts IN ACCESS EXCLUSIVE MODE")

    def backends() -> list[tuple[str, str | None]]:
        """(query, wait_event_type) of the worker's connections: every client of the test
        database but the test's own two (the worker's pool sets no application name)."""
        rows = conn.execute(
            "SELECT query, wait_event_type FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> ALL(%s)"
            " AND backend_type = 'client backend' ORDER BY query",
            ([conn.info.backend_pid, blocker.info.backend_pid],),
        ).fetchall()
        return [(str(r[0]), r[1]) for r in rows]

    config = WorkerConfig(concurrency=3, poll_interval=0.1, queues=["default"])
    with worker_running(database_url, tasks, config) as (worker, loop):

        def pool_stats() -> dict[str, int]:
            async def read() -> dict[str, int]:
                pool = worker._db.pool
                assert pool is not None
                return {"min": pool.min_size, "max": pool.max_size, **pool.get_stats()}

            return asyncio.run_coroutine_threadsafe(read(), loop).result(10)

        def all_open(stats: dict[str, int]) -> dict[str, int] | None:
            """The stats, once the server shows every connection the pool counts (a
            connection being opened counts in its size before)."""
            return stats if len(backends()) >= 1 + stats["pool_size"] else None

        try:
            poll(
                lambda: any(wait == "Lock" for _, wait in backends()),
                "the worker's first claim to wait for the lock",
            )
            opening = poll(lambda: all_open(pool_stats()), "the pool's connections to open")
            waiting = backends()
        finally:
            blocker.rollback()
        assert (opening["min"], opening["max"]) == (1, 4), opening
        # One is what the first claim needs. The claim asks before that one is ready, and
        # psycopg_pool then opens another (it grows while a request waits): so far, two.
        assert opening["pool_size"] in (1, 2), opening
        assert len(waiting) == 1 + opening["pool_size"], f"the listener and the pool: {waiting}"
        assert [wait for query, wait in waiting if query == "LISTEN pgqueue"] == ["Client"]
        assert sum(wait == "Lock" for _, wait in waiting) == 1, waiting

        poll(
            lambda: pgqueue.get_task(conn, task_id).status == pgqueue.TaskStatus.COMPLETED,
            "the task to complete",
        )
        resized = poll(
            lambda: (s := pool_stats())["min"] != 1 and all_open(s),
            "the pool to be resized after the first claim, its connections open",
        )
        seen = backends()
        assert (resized["min"], resized["max"]) == (2, 4), resized
        assert 2 <= resized["pool_size"] <= 4, resized
        assert [q for q, _ in seen].count("LISTEN pgqueue") == 1, seen
        assert len(seen) == 1 + resized["pool_size"], f"the listener and the pool only: {seen}"
        assert (worker._pools.async_pool, worker._pools.sync_pool) == (None, None)
