"""Concurrency keys with real `pgqueue worker` processes: a per-key limit holds across
processes, a hot key's backlog does not hold back the other keys, and a killed worker's
keyed task counts against its key until it is taken back, then runs elsewhere.

As in test_worker_processes.py, the handlers (handlers.py) record their own runs: ``spans``
(start and end, the server's clock) and ``executions`` (each start); the checks are made on
those records, joined with the tasks' keys, not on pgqueue's counts.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime
from typing import Any

import psycopg
import pytest
from test_worker_processes import (
    FAST,
    SIDE_TABLES,
    Workers,
    all_in_status,
    enqueue,
    executions,
    has_started,
    wait_for_exit,
    wait_until,
)

import pgqueue

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SIDE_TABLES)
    return conn


def most_at_once_per_key(
    conn: psycopg.Connection[Any], killed: tuple[int, datetime] | None = None
) -> dict[str, int]:
    """Per key, the most of its spans that overlapped (+1 at each start, -1 at each end, ends
    first on ties: a slot freed and taken in the same microsecond is not an overlap).
    ``killed``: (pid, when) of a worker killed mid-span; its spans ended then (the handler's
    end mark of a rerun marks every open span of its task, the killed one's too)."""
    pid, killed_at = killed or (0, None)
    rows = conn.execute(
        """
        SELECT key, max(open) FROM (
            SELECT key, sum(step) OVER (PARTITION BY key ORDER BY at, step) AS open
              FROM (SELECT t.concurrency_key AS key, s.started_at AS at, 1 AS step
                      FROM spans AS s JOIN pgqueue.tasks AS t ON t.id = s.task_id
                    UNION ALL
                    SELECT t.concurrency_key,
                           CASE WHEN s.pid = %s THEN %s ELSE s.ended_at END, -1
                      FROM spans AS s JOIN pgqueue.tasks AS t ON t.id = s.task_id) AS e
        ) AS s
        GROUP BY key
        """,
        (pid, killed_at),
    ).fetchall()
    return {key: int(n) for key, n in rows}


def span_starts(conn: psycopg.Connection[Any], key: str) -> list[datetime]:
    rows = conn.execute(
        "SELECT s.started_at FROM spans AS s JOIN pgqueue.tasks AS t ON t.id = s.task_id"
        " WHERE t.concurrency_key = %s ORDER BY s.started_at",
        (key,),
    ).fetchall()
    return [r[0] for r in rows]


def test_a_per_key_limit_holds_across_two_worker_processes_and_cold_keys_go_first(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """per_key_max_running=2 on a type, two processes with 4 slots each, a hot key's 16 tasks
    enqueued before six other keys' one each: together the processes never run more than 2
    of a key at once (as the handlers' spans show), the hot key does reach 2, and each cold
    key's task starts before the hot key's third, although enqueued after all of them."""
    pgqueue.set_limit(db, type="span", per_key_max_running=2)
    hot = enqueue(
        db, *({"type": "span", "concurrency_key": "hot", "payload": {"seconds": 0.3}},) * 16
    )
    cold = enqueue(
        db,
        *(
            {"type": "span", "concurrency_key": f"cold-{n}", "payload": {"seconds": 0.3}}
            for n in range(6)
        ),
    )
    started = [workers.start(database_url, "--concurrency", "4", *FAST, name=name) for name in "ab"]

    wait_until(
        lambda: all_in_status(db, hot + cold, "completed"),
        timeout=60,
        what="every keyed task to complete",
        workers=workers,
        alive=started,
    )
    most = most_at_once_per_key(db)
    assert most["hot"] == 2, most
    assert max(most.values()) <= 2, most
    third_hot = span_starts(db, "hot")[2]
    for n in range(6):
        (cold_start,) = span_starts(db, f"cold-{n}")
        assert cold_start < third_hot, f"cold-{n} waited behind the hot key's backlog"


def test_a_killed_workers_keyed_task_holds_its_key_until_taken_back_then_runs_elsewhere(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """per_key_max_running=1 on a queue. Worker A runs key a's first task (it blocks) and is
    killed with SIGKILL; worker B starts at once. The killed run's lease still counts for key
    a until it expires and is taken back: B starts none of key a's other tasks before then,
    runs the killed task again, and never two of a key at once (as the spans show); key b's
    tasks, cut short with A or not, all complete."""
    settings = ("--queue", "tenants", "--lease-seconds", "2", *FAST)
    pgqueue.set_limit(db, queue="tenants", per_key_max_running=1)
    (blocked,) = enqueue(
        db,
        {"type": "block", "queue": "tenants", "concurrency_key": "a", "priority": "high"},
    )
    span = {"type": "span", "queue": "tenants", "payload": {"seconds": 0.1}}
    a_spans = enqueue(db, *({**span, "concurrency_key": "a"} for _ in range(3)))
    b_spans = enqueue(db, *({**span, "concurrency_key": "b"} for _ in range(3)))

    a = workers.start(database_url, "--concurrency", "2", *settings, name="a")
    wait_until(
        lambda: has_started(db, blocked),
        timeout=30,
        what="worker A to start the blocking task of key a",
        workers=workers,
        alive=[a],
    )
    os.kill(a.pid, signal.SIGKILL)
    assert wait_for_exit(a, 10)[0] == -signal.SIGKILL
    killed = db.execute(
        "SELECT clock_timestamp(), lease_expires_at FROM pgqueue.tasks WHERE id = %s", (blocked,)
    ).fetchone()
    assert killed is not None and killed[1] is not None, "the killed run holds its lease"
    killed_at, lease_expired = killed
    b = workers.start(database_url, "--concurrency", "4", *settings, name="b")

    wait_until(
        lambda: all_in_status(db, [blocked, *a_spans, *b_spans], "completed"),
        timeout=60,
        what="every task to complete on worker B",
        workers=workers,
        alive=[b],
    )
    assert [attempt for attempt, _ in executions(db, blocked)] == [1, 2]
    assert min(span_starts(db, "a")) > lease_expired, "key a ran a task beside the killed one"
    assert most_at_once_per_key(db, (a.pid, killed_at)) == {"a": 1, "b": 1}
