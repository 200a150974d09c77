"""A handler's declared attempts, through a real worker process and the CLI.

``@tasks.handler("once", max_attempts=1)`` and ``RetryPolicy(max_attempts=5)`` must be the
number every reader shows: the worker's task.started and task.dead events, `pgqueue status`
and `pgqueue list` before the first run, and the attempts actually spent. The worker records
its registry at start (pgqueue.task_types); a task enqueued before that takes it at its claim.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(120)]

REGISTRY = "declared_handlers:tasks"


def cli(database_url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", database_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def events_of(worker: Any, task_id: uuid.UUID, name: str) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e["event"] == name and e.get("task_id") == str(task_id)]


def is_dead(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> bool:
    return pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.FAILED


def test_declared_attempts_are_logged_listed_and_spent_alike(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    # Enqueued before any worker declared the type: the global default until its claim.
    early = pgqueue.enqueue(conn, "once", {}).id
    assert pgqueue.get_task(conn, early).max_attempts == 3

    worker = workers.start(database_url, "--log-format", "json", *FAST, registry=REGISTRY)
    wait_until(lambda: is_dead(conn, early), timeout=60, what="the early task dead", alive=[worker])
    five = pgqueue.enqueue(conn, "five", {}).id
    wait_until(lambda: is_dead(conn, five), timeout=60, what="the five task dead", alive=[worker])

    for task_id, declared in ((early, 1), (five, 5)):
        started = events_of(worker, task_id, "task.started")
        assert [e["max_attempts"] for e in started] == [declared] * declared
        (dead,) = events_of(worker, task_id, "task.dead")
        assert dead["max_attempts"] == declared
        task = pgqueue.get_task(conn, task_id)
        assert (task.attempts, task.max_attempts) == (declared, declared)

    # Submitted from the CLI to a queue no worker serves: shown as declared before any run.
    out = cli(database_url, "--json", "enqueue", "once", "--queue", "nobody-serves-it")
    queued = json.loads(out)["task_id"]
    assert json.loads(cli(database_url, "--json", "status", queued))["max_attempts"] == 1
    assert "0/1" in cli(database_url, "status", queued)
    assert "0/1" in cli(database_url, "list", "--queue", "nobody-serves-it")
