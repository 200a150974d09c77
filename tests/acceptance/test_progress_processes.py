"""Progress reports from handlers run by the process executor, in a real ``pgqueue worker``
process: a child's reports reach the worker, which writes them (coalesced, fenced by the
lease) where a concurrent reader sees them before the task completes.

The handlers are in ``progress_handlers.py`` beside this file. Writes are counted by a
trigger on the test database's tasks table; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, wait_until

import pgqueue
from pgqueue.progress import PROGRESS_INTERVAL

pytestmark = [pytest.mark.timeout(240)]

HANDLERS = "progress_handlers:tasks"

SIDE_TABLES = """
CREATE TABLE go (task_id uuid NOT NULL);
CREATE TABLE progress_writes (task_id uuid NOT NULL, progress jsonb,
                              at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes (task_id, progress) VALUES (NEW.id, NEW.progress);
    RETURN NEW;
END $$;
CREATE TRIGGER count_progress_write AFTER UPDATE OF progress ON pgqueue.tasks
    FOR EACH ROW EXECUTE FUNCTION count_progress_write();
"""


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SIDE_TABLES)
    return conn


def writes(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> list[Any]:
    rows = conn.execute(
        "SELECT progress FROM progress_writes WHERE task_id = %s ORDER BY at", (task_id,)
    ).fetchall()
    return [r[0] for r in rows]


def final(conn: psycopg.Connection[Any], task_id: uuid.UUID, workers: Workers) -> pgqueue.Task:
    task: pgqueue.Task = wait_until(
        lambda: (t := pgqueue.get_task(conn, task_id)).status.is_final and t,
        timeout=60,
        what=f"task {task_id} to finish",
        workers=workers,
        alive=workers.started,
    )
    return task


@pytest.mark.parametrize("type_", ["report", "areport"])
def test_a_child_handlers_reports_are_seen_while_it_runs_and_the_last_is_kept(
    type_: str, database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = workers.start(database_url, *FAST, registry=HANDLERS)
    task_id = pgqueue.enqueue(db, type_, {}).id

    seen = wait_until(
        lambda: pgqueue.get_task(db, task_id).progress,
        timeout=60,
        what="the child's first report",
        workers=workers,
        alive=[worker],
    )
    assert seen["stage"] == "waiting" and seen["pid"] != worker.pid  # from the child
    assert pgqueue.get_task(db, task_id).status is pgqueue.TaskStatus.RUNNING

    db.execute("INSERT INTO go (task_id) VALUES (%s)", (task_id,))
    task = final(db, task_id, workers)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.progress == {"n": task.result}  # the last report, written before completion
    stored = writes(db, task_id)
    # A flood of reports in 1.2 s: the first at once, then at most one per interval (both
    # the child's sends and the worker's writes are coalesced), and the last.
    assert task.result > 1000
    assert 2 <= len(stored) <= 2 + math.ceil(1.2 / PROGRESS_INTERVAL) + 1, stored
    assert stored[-1] == {"n": task.result}
    print(f"\n{type_} in a child: {task.result} reports in 1.2 s, {len(stored)} writes")


def test_a_child_handlers_last_report_commits_with_its_transactions_completion(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    workers.start(database_url, *FAST, registry=HANDLERS)
    task_id = pgqueue.enqueue(db, "report_in_transaction", {}).id
    task = final(db, task_id, workers)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "shipped")
    assert task.progress == {"shipped": 1}
    assert db.execute("SELECT count(*) FROM go WHERE task_id = %s", (task_id,)).fetchone() == (1,)


def test_an_oversized_report_in_a_child_raises_in_the_handler_and_keeps_the_stored_one(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    workers.start(database_url, *FAST, registry=HANDLERS)
    task_id = pgqueue.enqueue(db, "report_too_much", {}).id
    task = final(db, task_id, workers)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.last_error is not None
    assert task.last_error.startswith(
        "pgqueue.errors.ValidationError: progress: is 5011 bytes as stored"
    )
    assert task.progress == {"done": 1}


def test_a_child_reporting_when_its_time_limit_strikes_is_recorded_timed_out_with_its_report(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = workers.start(database_url, *FAST, "--log-format", "json", registry=HANDLERS)
    task_id = pgqueue.enqueue(db, "report_until_limit", {}).id
    task = final(db, task_id, workers)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.last_error is not None and task.last_error.startswith("timed out after 1")
    assert task.progress is not None and task.progress["n"] > 0
    # The limit was raised in the handler's code, never inside a message to the worker: the
    # child finished its task and was not killed for a broken stream.
    names = {e["event"] for e in worker.events()}
    assert "worker.internal_error" not in names and "worker.child_died" not in names
