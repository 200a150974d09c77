"""pgqueue.testing against a real database: the in-process worker drains what the test
enqueued (and what those tasks enqueued), and a task called with a context made for it can
write through ctx.connection in the test's transaction."""

from __future__ import annotations

from typing import Any

import pytest

import pgqueue
import pgqueue.testing
from pgqueue.registry import TaskRegistry


def test_the_test_worker_drains_tasks_and_the_tasks_they_enqueue(conn, database_url):
    tasks = TaskRegistry()

    @tasks.task(name="notify", queue="mail")
    def notify(n: int) -> int:
        return n * 10

    @tasks.task(name="fan_out")
    def fan_out(count: int, ctx: pgqueue.TaskContext) -> int:
        for i in range(count):
            notify.enqueue(ctx.connection, i)
        return count

    with pgqueue.testing.worker(tasks, database_url) as w:
        assert sorted(w.queues) == ["default", "mail"]
        fan_out.enqueue(conn, 3)
        conn.commit()
        w.drain(timeout=30)
        assert w.pending() == 0

    rows = conn.execute(
        "SELECT type, status, result FROM pgqueue.tasks ORDER BY type, result"
    ).fetchall()
    assert rows == [
        ("fan_out", "completed", 3),
        ("notify", "completed", 0),
        ("notify", "completed", 10),
        ("notify", "completed", 20),
    ]


def test_drain_says_what_is_left_when_the_queue_does_not_empty_in_time(conn, database_url):
    tasks = TaskRegistry()

    @tasks.task(name="elsewhere", queue="nobody_runs_this")
    def elsewhere() -> None:
        return None

    with pgqueue.testing.worker(tasks, database_url, queues=["nobody_runs_this"]) as w:
        pgqueue.pause_queue(conn, "nobody_runs_this")
        elsewhere.enqueue(conn)
        conn.commit()
        with pytest.raises(TimeoutError, match=r"1 task\(s\) of queues nobody_runs_this"):
            w.drain(timeout=0.5)


def test_call_gives_ctx_connection_in_the_tests_own_transaction(conn):
    tasks = TaskRegistry()

    @tasks.task(name="record")
    def record(note: str, ctx: pgqueue.TaskContext) -> str:
        ctx.connection.execute("CREATE TEMP TABLE notes (note text, attempt int)")
        ctx.connection.execute("INSERT INTO notes VALUES (%s, %s)", (note, ctx.attempt))
        return note

    ctx = pgqueue.testing.context(record, attempt=2, connection=conn)
    assert pgqueue.testing.call_with(ctx, record, "hello") == "hello"
    row: Any = conn.execute("SELECT note, attempt FROM notes").fetchone()
    assert tuple(row) == ("hello", 2)
