"""Waiting for a result against real `pgqueue worker` processes.

The library's wait, the HTTP ``?wait=`` and `pgqueue status --wait` each return when a real
worker finishes the task: completed, dead-lettered (by the handler's last failure, and by
the sweep after the worker was killed) or cancelled (cooperatively, while it runs); and a
wait on a task nobody runs times out. Waits poll once an hour unless said otherwise, so a
wait that returns before its timeout (two minutes; a wait at its deadline reads the task once
more, taking the whole timeout) was woken by the notification: ``woken_wait`` checks that.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from processes import Worker, run_cli, wait_until

import pgqueue
from pgqueue.api import ApiSettings, create_app
from pgqueue.models import TaskStatus

pytestmark = [pytest.mark.timeout(180)]

NO_POLL = 3600.0
LONG = 120.0

HANDLERS = """
import os
import time

import pgqueue
from pgqueue.registry import Cancel

tasks = pgqueue.TaskRegistry()


@tasks.handler("double")
def double(payload, ctx):
    return payload["n"] * 2


@tasks.handler("boom", max_attempts=1)
def boom(payload, ctx):
    raise RuntimeError("boom")


@tasks.handler("until_cancelled")
def until_cancelled(payload, ctx):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ctx.should_stop():
            raise Cancel("asked to stop")
        time.sleep(0.05)
    return "never cancelled"


@tasks.handler("crash", max_attempts=1)
def crash(payload, ctx):
    os._exit(9)
"""

# A short lease: heartbeats (and with them cancellation requests) every second or so, and a
# killed worker's task is swept within seconds.
OPTIONS = ("--poll-interval", "0.2", "--sweep-interval", "0.5", "--lease-seconds", "3")


def woken_wait(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.Task:
    """pgqueue.wait without polling, which must return before its deadline."""
    began = time.monotonic()
    task = pgqueue.wait(conn, task_id, timeout=LONG, poll_interval=NO_POLL)
    assert time.monotonic() - began < LONG, "returned only at its deadline"
    return task


@pytest.fixture
def start_worker(database_url: str, tmp_path: Path) -> Iterator[Any]:
    (tmp_path / "wait_handlers.py").write_text(HANDLERS)
    started: list[Worker] = []

    def start(*options: str) -> Worker:
        log = tmp_path / f"worker{len(started)}.log"
        worker = Worker(database_url, tmp_path, "wait_handlers:tasks", *OPTIONS, *options, log=log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_wait_returns_what_a_real_worker_did_completed_dead_or_cancelled(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    worker = start_worker()
    done = pgqueue.enqueue(conn, "double", {"n": 21}).id
    task = woken_wait(conn, done)
    assert (task.status, task.result, task.attempts) == (TaskStatus.COMPLETED, 42, 1)

    dead = pgqueue.enqueue(conn, "boom", {}).id
    task = woken_wait(conn, dead)
    assert task.status is TaskStatus.FAILED and task.attempts == 1
    assert task.last_error is not None and "RuntimeError: boom" in task.last_error

    running = pgqueue.enqueue(conn, "until_cancelled", {}).id
    wait_until(
        lambda: pgqueue.get_task(conn, running).status is TaskStatus.RUNNING,
        60,
        "the task to run",
    )
    pgqueue.cancel(conn, running)
    task = woken_wait(conn, running)
    assert task.status is TaskStatus.CANCELLED
    assert worker.alive()


def test_wait_returns_when_the_sweep_dead_letters_the_task_of_a_killed_worker(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    crasher = start_worker("--no-maintenance")
    task_id = pgqueue.enqueue(conn, "crash", {}).id
    wait_until(lambda: crasher.proc.poll() is not None, 60, "the worker to die in the handler")
    start_worker("--queue", "elsewhere")  # runs the sweep; claims nothing of 'default'
    task = woken_wait(conn, task_id)
    assert task.status is TaskStatus.FAILED
    assert task.last_error is not None and "lease expired" in task.last_error


def test_wait_on_a_task_nobody_runs_times_out_naming_it(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    start_worker()
    task_id = pgqueue.enqueue(conn, "double", {"n": 1}, queue="nobody-serves-it").id
    with pytest.raises(pgqueue.WaitTimeout, match=str(task_id)) as caught:
        pgqueue.wait(conn, task_id, timeout=1)
    assert caught.value.task.status is TaskStatus.QUEUED


def test_cli_status_wait_shows_the_finished_task_or_exits_3(
    database_url: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    start_worker()
    task_id = pgqueue.enqueue(conn, "double", {"n": 5}).id
    proc = run_cli(database_url, "--json", "status", str(task_id), "--wait", "60")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["status"], shown["result"]) == ("completed", 10)

    table = run_cli(database_url, "status", str(task_id), "--wait", "60")
    assert table.returncode == 0 and "completed" in table.stdout

    idle = pgqueue.enqueue(conn, "double", {"n": 5}, queue="nobody-serves-it").id
    late = run_cli(database_url, "--json", "status", str(idle), "--wait", "0.5")
    assert late.returncode == 3, (late.stdout, late.stderr)
    assert json.loads(late.stdout)["status"] == "queued"  # the task as it is, on stdout
    error = json.loads(late.stderr)
    assert (error["error"], error["task_id"], error["status"], error["exit_code"]) == (
        "timeout",
        str(idle),
        "queued",
        3,
    )
    human = run_cli(database_url, "status", str(idle), "--wait", "0.5")
    assert human.returncode == 3
    assert f"error: task {idle} (double) did not finish within 0.5 s" in human.stderr

    bad = run_cli(database_url, "--json", "status", str(idle), "--wait", "0")
    assert bad.returncode == 2 and json.loads(bad.stderr)["field"] == "--wait"
    unknown = run_cli(database_url, "status", str(uuid.uuid4()), "--wait", "5")
    assert unknown.returncode == 1 and "no task with id" in unknown.stderr


def test_http_wait_returns_when_a_real_worker_completes_the_task(
    database_url: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    app = create_app(ApiSettings(database_url=database_url, wait_poll_seconds=NO_POLL))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "the API to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        start_worker()
        task_id = pgqueue.enqueue(conn, "double", {"n": 4}).id
        began = time.monotonic()
        response = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/tasks/{task_id}", params={"wait": 60}, timeout=90
        )
        assert time.monotonic() - began < 60, "answered only at the end of the wait"
        assert response.status_code == 200, response.text
        assert response.headers["Pgqueue-Wait"] == "finished"
        assert (response.json()["status"], response.json()["result"]) == ("completed", 8)
    finally:
        server.should_exit = True
        thread.join(30)
