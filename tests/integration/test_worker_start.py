"""How a worker starts (issue 20): its schema check's connection becomes its LISTEN
connection, so that starting opens one server process fewer (it competes with the first
claim for the cores, and with --processes N, N times)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from helpers import run_worker_until

import pgqueue
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.listener import Listener


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


def test_the_pool_opens_its_second_connection_once_the_first_claim_is_done(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The pool opens with one connection (what the first claim needs: a server process fewer
    to start beside it) and keeps its minimum of two afterwards: the worker then holds the
    listener's connection and two of the pool's, as before."""
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("noop")
    def noop(payload: Any, ctx: Any) -> None:
        return None

    task_id = pgqueue.enqueue(conn, "noop", {}).task.id

    def backends() -> list[str]:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        ).fetchall()
        return sorted(str(r[0]) for r in rows)

    def done() -> bool:
        finished = pgqueue.get_task(conn, task_id).status == pgqueue.TaskStatus.COMPLETED
        return finished and len(backends()) >= 3

    run_worker_until(database_url, tasks, done)
