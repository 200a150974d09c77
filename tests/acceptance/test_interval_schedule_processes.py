"""An interval schedule run by real ``pgqueue worker`` processes: two workers schedule the
same ``every=2 s``; each tick is enqueued once, on the grid, and a worker killed and started
again enqueues no tick a second time."""

from __future__ import annotations

import itertools
import os
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, wait_until

pytestmark = [pytest.mark.timeout(180)]

REGISTRY = "interval_handlers:tasks"
EVERY = timedelta(seconds=2)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ticks(conn: psycopg.Connection[Any]) -> list[tuple[datetime, int, datetime]]:
    """Each tick of the schedule in the database: when it was due, how many tasks it has, and
    when the first of them was enqueued."""
    return [
        (r[0], r[1], r[2])
        for r in conn.execute(
            "SELECT visible_after, count(*), min(created_at) FROM pgqueue.tasks"
            " WHERE type = 'pulse' GROUP BY visible_after ORDER BY visible_after"
        ).fetchall()
    ]


def in_a_row(conn: psycopg.Connection[Any], since: datetime | None = None) -> int:
    """The longest run of ticks one interval apart (after ``since``)."""
    times = [t for t, _, _ in ticks(conn) if since is None or t > since]
    longest = run = min(len(times), 1)
    for a, b in itertools.pairwise(times):
        run = run + 1 if b - a == EVERY else 1
        longest = max(longest, run)
    return longest


def enqueued_by(worker: Any) -> list[str]:
    return [e["tick"] for e in worker.events() if e["event"] == "schedule.enqueued"]


def test_two_workers_enqueue_each_interval_tick_once_on_the_grid_across_a_restart(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    options = ("--queue", "interval", "--log-format", "json", *FAST)
    a = workers.start(database_url, *options, name="a", registry=REGISTRY)
    b = workers.start(database_url, *options, name="b", registry=REGISTRY)
    wait_until(lambda: in_a_row(conn) >= 3, timeout=60, what="three ticks in a row", alive=[a, b])

    os.kill(a.pid, signal.SIGKILL)  # no goodbye: its scheduler may have been mid-tick
    a.proc.wait(timeout=10)
    restarted_at = datetime.now(UTC)
    a2 = workers.start(database_url, *options, name="a2", registry=REGISTRY)
    wait_until(
        lambda: in_a_row(conn, since=restarted_at) >= 3 and enqueued_by(a2),
        timeout=90,
        what="three more ticks in a row, one of them enqueued by the restarted worker",
        alive=[a2, b],
    )
    for proc in (a2, b):
        proc.proc.send_signal(signal.SIGTERM)
    for proc in (a2, b):
        proc.proc.wait(timeout=30)

    got = ticks(conn)
    assert all(count == 1 for _, count, _ in got), f"a tick enqueued twice: {got}"
    # On the grid: whole multiples of the interval from the epoch, however late a worker woke.
    assert all((due - EPOCH) % EVERY == timedelta(0) for due, _, _ in got), got
    # No drift: each tick enqueued after its time and before the next one's.
    late = [created - due for due, _, created in got]
    assert all(timedelta(0) <= lag < EVERY for lag in late), late
    events = [t for w in (a, b, a2) for t in enqueued_by(w)]
    assert len(events) == len(set(events)), events  # (a kill may cut a log line, not a tick)
