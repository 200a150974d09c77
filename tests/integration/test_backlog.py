"""The backlog (``pgqueue.backlog``, ``pgqueue.backlog()``): the autoscaling signal.

It must count what waits and what runs, per queue and priority, and nothing finished: the
finished tasks kept for a day are most of the table, and this is asked every few seconds.
"""

from __future__ import annotations

import asyncio

import psycopg

import pgqueue
from pgqueue import aio


def by_key(rows: list[pgqueue.QueueBacklog]) -> dict[tuple[str, str], pgqueue.QueueBacklog]:
    return {(r.queue, r.priority): r for r in rows}


def test_backlog_counts_ready_scheduled_and_running_and_nothing_finished(conn):
    for _ in range(3):
        pgqueue.enqueue(conn, "t", queue="mail", priority="high")
    pgqueue.enqueue(conn, "t", queue="mail", priority="high", delay=3600)
    pgqueue.enqueue(conn, "t", queue="mail", priority="low")
    (done,) = pgqueue.claim(conn, ["mail"], limit=1, worker_id="w")
    pgqueue.complete(conn, done.lease)
    pgqueue.claim(conn, ["mail"], limit=1, worker_id="w")  # a high one is running now
    for _ in range(2):
        pgqueue.enqueue(conn, "t", queue="reports")

    rows = by_key(pgqueue.backlog(conn))

    high = rows["mail", "high"]
    assert (high.ready, high.scheduled, high.running) == (1, 1, 1)
    assert high.oldest_ready_age_seconds is not None and high.oldest_ready_age_seconds >= 0
    assert (rows["mail", "low"].ready, rows["reports", "normal"].ready) == (1, 2)
    assert set(by_key(pgqueue.backlog(conn, ["reports"]))) == {("reports", "normal")}
    total = conn.execute("SELECT sum(ready) FROM pgqueue.backlog").fetchone()
    assert total == (4,)


def test_a_queue_with_only_finished_tasks_has_no_backlog_row(conn):
    pgqueue.enqueue(conn, "t", queue="quiet")
    (task,) = pgqueue.claim(conn, ["quiet"], limit=1, worker_id="w")
    pgqueue.complete(conn, task.lease)

    assert pgqueue.backlog(conn, ["quiet"]) == []


def test_async_and_client_read_the_same_backlog(database_url, conn):
    pgqueue.enqueue(conn, "t", queue="mail")

    async def read() -> list[pgqueue.QueueBacklog]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            return await aio.backlog(a, ["mail"])

    def counts(rows: list[pgqueue.QueueBacklog]) -> list[tuple[str, str, int, int, int]]:
        return [(r.queue, r.priority, r.ready, r.scheduled, r.running) for r in rows]  # no age

    with pgqueue.Client(database_url) as client:
        assert (
            counts(asyncio.run(read()))
            == counts(client.backlog(["mail"]))
            == [("mail", "normal", 1, 0, 0)]
        )
