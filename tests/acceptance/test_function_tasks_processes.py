"""Function tasks through real processes: a ``pgqueue worker`` process, a
``pgqueue serve`` process and the ``pgqueue`` command.

The worker runs ``@tasks.task`` functions with their arguments and an injected context; it
records each type's queue, priority, attempts and parameters at its start, and from then on
a task submitted by type name over HTTP or from the CLI with no queue gets the declared one,
and a bad argument is refused naming it (HTTP 422, CLI exit 2) with nothing written. The API
and the CLI never import the handler module: they only have what the worker recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from function_handlers import async_sum, receipt
from test_worker_processes import FAST, WorkerProcess, Workers, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(180)]

REGISTRY = "function_handlers:tasks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[httpx.Client]:
    """``pgqueue serve`` as a real process on a free port, without the handler module on its
    path: it knows the task types only from what workers recorded."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "pgqueue", "--database-url", database_url, "serve"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def healthy() -> bool:
        assert process.poll() is None, f"pgqueue serve exited: {log.read_text()}"
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, timeout=60, what="pgqueue serve to answer /healthz")
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def cli(database_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``pgqueue`` command run where the handler module cannot be imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", database_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def declared(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.task_types"
        " WHERE type IN ('receipt', 'async_sum') AND parameters IS NOT NULL"
    ).fetchone()
    return row is not None and row[0] == 2


def start_worker(database_url: str, conn: Any, workers: Workers) -> WorkerProcess:
    worker = workers.start(database_url, "--queue", "mail", *FAST, registry=REGISTRY)
    wait_until(lambda: declared(conn), timeout=60, what="the types recorded", alive=[worker])
    return worker


def completed(conn: psycopg.Connection[Any], *ids: Any) -> bool:
    return all(pgqueue.get_task(conn, i).status is pgqueue.TaskStatus.COMPLETED for i in ids)


def test_a_worker_process_runs_function_tasks_with_their_arguments_and_context(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    worker = workers.start(database_url, "--queue", "mail", *FAST, registry=REGISTRY)

    sync_handle = receipt.enqueue(conn, 42, "thanks", resend=True)
    plain_handle = receipt.enqueue(conn, 7)
    async_handle = async_sum.enqueue(conn, [1, 2, 3], scale=10)  # type: ignore[call-arg]
    assert pgqueue.get_task(conn, sync_handle.id).payload == {
        "order_id": 42,
        "note": "thanks",
        "resend": True,
    }
    ids = (sync_handle.id, plain_handle.id, async_handle.id)
    wait_until(lambda: completed(conn, *ids), timeout=60, what="the tasks run", alive=[worker])

    assert pgqueue.get_task(conn, sync_handle.id).result == {
        "order_id": 42,
        "note": "thanks",
        "resend": True,
        "task_id": str(sync_handle.id),
        "type": "receipt",
        "attempt": 1,
    }
    plain = pgqueue.get_task(conn, plain_handle.id).result
    assert (plain["order_id"], plain["note"], plain["resend"]) == (7, "", False)  # defaults
    assert pgqueue.get_task(conn, async_handle.id).result == {
        "sum": 60,
        "task_id": str(async_handle.id),
    }


def test_declared_defaults_apply_to_tasks_submitted_by_type_name_over_http_and_the_cli(
    database_url: str,
    conn: psycopg.Connection[Any],
    workers: Workers,
    api: httpx.Client,
    tmp_path: Path,
):
    start_worker(database_url, conn, workers)

    over_http = api.post("/api/v1/tasks", json={"type": "receipt", "payload": {"order_id": 5}})
    assert over_http.status_code == 202, over_http.text
    body = over_http.json()
    assert (body["queue"], body["priority"], body["max_attempts"]) == ("mail", "high", 4)

    given = api.post(
        "/api/v1/tasks",
        json={"type": "receipt", "payload": {"order_id": 6}, "queue": "q2", "priority": "low"},
    )
    assert given.status_code == 202, given.text
    assert (given.json()["queue"], given.json()["priority"]) == ("q2", "low")

    done = cli(database_url, tmp_path, "--json", "enqueue", "receipt", "--arg", "order_id=8",
               "--arg", "note=hello world", "--arg", "resend=true")  # fmt: skip
    assert done.returncode == 0, done.stderr
    from_cli = json.loads(done.stdout)
    assert (from_cli["queue"], from_cli["priority"], from_cli["max_attempts"]) == (
        "mail",
        "high",
        4,
    )
    assert from_cli["payload"] == {"order_id": 8, "note": "hello world", "resend": True}

    done = cli(database_url, tmp_path, "--json", "enqueue", "receipt", "--payload",
               '{"order_id": 9}', "--queue", "q3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["queue"] == "q3"

    for task_id, queue in ((body["task_id"], "mail"), (from_cli["task_id"], "mail")):
        assert pgqueue.get_task(conn, task_id).queue == queue
    # The worker serves "mail": what it was declared for runs there.
    ids = (body["task_id"], from_cli["task_id"])
    wait_until(lambda: completed(conn, *ids), timeout=60, what="the declared-queue tasks run")


@pytest.mark.parametrize(
    ("cli_args", "payload", "message"),
    [
        ((), {}, "payload: argument 'order_id' is missing"),
        (("--arg", "order_id=1", "--arg", "foo=2"), {"order_id": 1, "foo": 2},
         "payload: unexpected argument 'foo'"),
        (("--arg", "order_id=x"), {"order_id": "x"},
         "payload: argument 'order_id' must be integer, not string"),
        (("--arg", "order_id=1", "--arg", "resend=maybe"), {"order_id": 1, "resend": "maybe"},
         "payload: argument 'resend' must be boolean, not string"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_them_by_the_cli_and_http_alike(
    database_url: str,
    conn: psycopg.Connection[Any],
    workers: Workers,
    api: httpx.Client,
    tmp_path: Path,
    cli_args: tuple[str, ...],
    payload: dict[str, Any],
    message: str,
):
    start_worker(database_url, conn, workers)

    refused = cli(database_url, tmp_path, "enqueue", "receipt", *cli_args)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip() == f"error: {message}"

    answer = api.post("/api/v1/tasks", json={"type": "receipt", "payload": payload})
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"] == message
    (field,) = answer.json()["errors"]
    assert field["field"].startswith("payload.")

    # The library holding the function gives the very same message, saying which item.
    with pytest.raises(pgqueue.InvalidArgument) as caught:
        receipt.enqueue_many(conn, [payload])
    assert str(caught.value) == f"item 0 of 1: {message}"
    assert count_tasks(conn) == 0


def test_the_handle_of_a_function_task_waits_for_its_result_from_a_worker_process(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    """``fn.enqueue(...)`` returns a handle whose ``wait`` (and ``wait_async``) returns the
    finished task from a real worker, and raises WaitTimeout naming the task when no worker
    takes it in time."""
    unserved = receipt.options(queue="nobody-serves-this").enqueue(conn, 1)
    with pytest.raises(pgqueue.WaitTimeout) as timed_out:
        unserved.wait(conn, timeout=0.5)
    assert str(unserved.id) in str(timed_out.value) and "receipt" in str(timed_out.value)

    worker = workers.start(database_url, "--queue", "mail", *FAST, registry=REGISTRY)
    handle = receipt.enqueue(conn, 42, resend=True)
    task = handle.wait(conn, timeout=60)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert (task.result["order_id"], task.result["resend"]) == (42, True)
    assert task.attempts == 1

    async def wait_async() -> pgqueue.Task:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            queued = await async_sum.aenqueue(aconn, [2, 3], scale=2)  # type: ignore[call-arg]
            return await queued.wait_async(aconn, timeout=60)

    finished = asyncio.run(wait_async())
    assert finished.status is pgqueue.TaskStatus.COMPLETED and finished.result["sum"] == 10
    assert worker.proc.poll() is None
