"""Test helpers shared by several test modules (importable because tests/conftest.py puts
this folder on sys.path)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

import pgqueue


def make_dead_letters(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    type: str = "boom",
    queue: str = "default",
    error: str = "ValueError: boom",
) -> list[uuid.UUID]:
    """``count`` dead letters, made fast: one insert, one claim, then fail with 1 attempt."""
    created = pgqueue.enqueue_many(
        conn,
        [
            {"type": type, "queue": queue, "payload": {"n": i}, "max_attempts": 1}
            for i in range(count)
        ],
    )
    with conn.transaction():
        claimed = pgqueue.claim(conn, [queue], limit=count, worker_id="test")
        assert {t.id for t in claimed} == {r.id for r in created}
        for task in claimed:
            pgqueue.fail(conn, task.lease, error)
    return [r.id for r in created]


def run_worker_until(
    database_url: str,
    registry: pgqueue.TaskRegistry,
    done: Callable[[], bool],
    *,
    queues: list[str] | None = None,
    timeout: float = 60,
) -> None:
    """A real worker in this process until ``done()`` holds, then a graceful stop. ``done``
    is polled against a deadline, so a busy machine only makes the wait longer."""
    config = pgqueue.WorkerConfig(concurrency=2, poll_interval=0.1, queues=queues or ["default"])
    worker = pgqueue.Worker(registry, database_url, config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run_async(),))
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker did not finish within {timeout} s")
            time.sleep(0.05)
    finally:
        loop.call_soon_threadsafe(worker.request_stop)
        thread.join(30)
        loop.close()
    assert not thread.is_alive()
