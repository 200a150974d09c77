"""Test helpers shared by several test modules (importable because tests/conftest.py puts
this folder on sys.path)."""

from __future__ import annotations

import uuid
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
