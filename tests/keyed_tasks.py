"""Tasks with a concurrency key, written straight into pgqueue.tasks, for the tests of what
reads and limits them (per-key limits, the busiest keys, promotion, the queue list): the rows
a keyed enqueue writes, without depending on it. Shared like helpers.py (tests/conftest.py's
folder is on sys.path)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg


def add_keyed(
    conn: psycopg.Connection[Any],
    key: str,
    count: int,
    *,
    queue: str = "default",
    type: str = "job",
    priority: int = 1,
    at: datetime | None = None,
    visible_after: datetime | None = None,
) -> list[uuid.UUID]:
    """``count`` queued tasks of ``key``, created at ``at`` (default now) a microsecond apart
    in order, due at ``visible_after`` (default: when created)."""
    rows = conn.execute(
        """
        INSERT INTO pgqueue.tasks (queue, type, payload, priority, concurrency_key, created_at,
                                   visible_after)
        SELECT %(queue)s, %(type)s, jsonb_build_object('n', i), %(priority)s, %(key)s, c.at,
               coalesce(%(visible_after)s::timestamptz, c.at)
          FROM generate_series(1, %(count)s) AS i,
               LATERAL (SELECT coalesce(%(at)s::timestamptz, now())
                               + i * interval '1 microsecond' AS at) AS c
         ORDER BY i
        RETURNING id
        """,
        {
            "queue": queue,
            "type": type,
            "priority": priority,
            "key": key,
            "count": count,
            "at": at,
            "visible_after": visible_after,
        },
    ).fetchall()
    return [r[0] for r in rows]
