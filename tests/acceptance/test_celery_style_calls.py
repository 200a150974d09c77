"""Calls without a connection, and a result that can be asked, as Celery teams use them:
``fn.delay(...)`` / ``fn.apply_async(...)`` through the default client (``pgqueue.configure``,
else ``PGQUEUE_DATABASE_URL``), ``fn.enqueue(client, ...)``, and the handle's (or
``pgqueue.AsyncResult(task_id)``'s) ``get``, ``status``, ``ready``, ``successful``, ``failed``,
against a real worker process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery_style_handlers import QUEUE, add, declined, fan_out, gated, payment
from processes import clean_env
from session_databases import database_name
from test_worker_processes import FAST, WorkerProcess, Workers, _url_with_database, wait_until

import pgqueue
from pgqueue import defaults

pytestmark = [pytest.mark.timeout(180)]

REGISTRY = "celery_style_handlers:tasks"


@pytest.fixture
def configured(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The default client on the test database (``pgqueue.configure``), no environment URL;
    forgotten after the test."""
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    pgqueue.configure(database_url=database_url)
    yield database_url
    defaults.reset()


@pytest.fixture
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No default database: neither ``configure`` nor ``PGQUEUE_DATABASE_URL``."""
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    defaults.reset()
    yield
    defaults.reset()


@pytest.fixture
def other_database_url(server_url: str, template_db: str) -> Iterator[str]:
    """A second fresh database migrated to head, reached directly."""
    name = database_name("t")
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield _url_with_database(server_url, name)  # keeps the query string (the embedded server's)
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_worker(database_url: str, workers: Workers) -> WorkerProcess:
    return workers.start(database_url, "--queue", QUEUE, *FAST, registry=REGISTRY)


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


# --- delay, then get ---------------------------------------------------------------------------


def test_delay_commits_on_its_own_and_get_returns_the_result(
    configured: str, conn: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start_worker(configured, workers)
    handle = add.delay(2, 3)
    # Committed on return: visible on another connection before any worker touched it.
    assert pgqueue.get_task(conn, handle.id).payload == {"x": 2, "y": 3}
    assert handle.client is not None and handle.created
    assert handle.get(timeout=60) == 5
    assert worker.alive()
    # The same questions from the id alone, through the default client.
    result = pgqueue.AsyncResult(str(handle.id))
    assert result.get(timeout=5) == 5
    assert result.status is pgqueue.TaskStatus.COMPLETED
    assert result.ready() and result.successful() and not result.failed()


def test_a_failed_tasks_get_raises_task_failed_with_the_exception_type_and_message(
    configured: str, workers: Workers
) -> None:
    start_worker(configured, workers)
    handle = declined.apply_async(args=(7,))
    with pytest.raises(pgqueue.TaskFailed) as caught:
        handle.get(timeout=60)
    err = caught.value
    assert err.task_id == handle.id and err.type == "celery_style.declined"
    assert err.attempts == 1
    assert err.exception_type == "ValueError"
    assert err.exception_message == "card declined for order 7"
    assert err.traceback is not None and "card declined" in err.traceback
    assert "ValueError: card declined for order 7" in str(err)
    # An exception of the application's own is named as it was raised: module and class.
    with pytest.raises(pgqueue.TaskFailed) as caught:
        payment.delay(order_id=8).get(timeout=60)
    assert caught.value.exception_type == "celery_style_handlers.PaymentDeclined"
    assert caught.value.exception_message == "insufficient funds: order 8"
    assert handle.failed() and handle.ready() and not handle.successful()


def test_get_with_propagate_false_returns_the_finished_task_instead_of_raising(
    configured: str, workers: Workers
) -> None:
    start_worker(configured, workers)
    failed = declined.delay(9).get(timeout=60, propagate=False)
    assert isinstance(failed, pgqueue.Task)
    assert failed.status is pgqueue.TaskStatus.FAILED
    assert failed.last_error is not None and failed.last_error.startswith("ValueError")
    assert add.delay(1, 1).get(timeout=60, propagate=False) == 2  # a result is still a result


def test_get_of_a_cancelled_task_raises_task_was_cancelled(configured: str) -> None:
    handle = add.apply_async((1, 2), countdown=3600)  # no worker: it would wait an hour
    assert handle.client is not None
    handle.client.cancel(handle.id)
    with pytest.raises(pgqueue.TaskWasCancelled) as caught:
        handle.get(timeout=10)
    assert caught.value.task_id == handle.id
    task = handle.get(timeout=10, propagate=False)
    assert task.status is pgqueue.TaskStatus.CANCELLED
    assert handle.ready() and not handle.successful() and not handle.failed()


def test_status_and_ready_follow_the_task_from_queued_to_running_to_completed(
    configured: str, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    handle = gated.delay(str(gate))
    assert handle.status is pgqueue.TaskStatus.QUEUED and not handle.ready()
    worker = start_worker(configured, workers)
    wait_until(
        lambda: handle.status is pgqueue.TaskStatus.RUNNING,
        timeout=60,
        what="the gated task to run",
        alive=[worker],
    )
    assert not handle.ready() and not handle.successful()
    with pytest.raises(pgqueue.WaitTimeout):
        handle.get(timeout=0.2)  # still running: the wait gives up, the task goes on
    gate.touch()
    assert handle.get(timeout=60) == "opened"
    assert handle.status is pgqueue.TaskStatus.COMPLETED
    assert handle.ready() and handle.successful()


def test_a_task_submits_others_with_delay_through_the_workers_own_database_url(
    configured: str, workers: Workers
) -> None:
    start_worker(configured, workers)
    ids = fan_out.delay(3).get(timeout=60)
    assert [pgqueue.AsyncResult(i).get(timeout=60) for i in ids] == [0, 2, 4]


# --- apply_async's options ---------------------------------------------------------------------


def test_apply_async_countdown_keeps_the_task_from_running_before_it_passes(
    configured: str, workers: Workers
) -> None:
    worker = start_worker(configured, workers)
    later = add.apply_async((10, 20), countdown=3)
    # A task submitted after it runs first: the worker was free, and did not take the other.
    assert add.delay(1, 2).get(timeout=60) == 3
    assert later.status is pgqueue.TaskStatus.QUEUED
    assert later.get(timeout=60) == 30
    task = later.refresh()
    assert task.started_at is not None
    assert task.started_at >= task.created_at + timedelta(seconds=3)
    assert worker.alive()


def test_apply_async_maps_celerys_options_to_pgqueues(configured: str) -> None:
    eta = datetime.now(UTC) + timedelta(hours=1)
    expires = eta + timedelta(minutes=30)
    task = add.apply_async((1, 2), eta=eta, expires=expires, queue="other", priority="high").task
    assert task.visible_after == eta and task.expires_at == expires
    assert task.queue == "other" and task.priority is pgqueue.Priority.HIGH
    task = add.apply_async(kwargs={"x": 1, "y": 2}, countdown=60, expires=120).task
    assert task.queue == QUEUE and task.priority is pgqueue.Priority.NORMAL  # the declared ones
    assert task.expires_at is not None
    assert timedelta(seconds=119) < task.expires_at - task.created_at <= timedelta(seconds=121)
    assert timedelta(seconds=59) < task.visible_after - task.created_at <= timedelta(seconds=61)
    task = add.apply_async((1, 2), expires=timedelta(minutes=5)).task
    assert task.expires_at is not None
    assert task.expires_at - task.created_at == timedelta(minutes=5)


def test_apply_async_refuses_what_it_would_have_to_guess_and_writes_nothing(
    configured: str, conn: psycopg.Connection[Any]
) -> None:
    naive = datetime.now() + timedelta(minutes=5)  # naive: the mistake under test
    with pytest.raises(pgqueue.ValidationError, match="eta: must be timezone-aware") as caught:
        add.apply_async((1, 2), eta=naive)
    assert caught.value.field == "eta" and "refused rather than guessed" in str(caught.value)
    with pytest.raises(pgqueue.ValidationError, match="expires: a datetime must be timezone-aware"):
        add.apply_async((1, 2), expires=naive)
    with pytest.raises(pgqueue.ValidationError, match="not the number 5") as caught:
        add.apply_async((1, 2), priority=5)  # type: ignore[arg-type]
    assert caught.value.field == "priority"
    with pytest.raises(pgqueue.ValidationError, match="either countdown or eta"):
        add.apply_async((1, 2), countdown=5, eta=datetime.now(UTC))
    with pytest.raises(pgqueue.ValidationError, match=r"^countdown: ") as caught:
        add.apply_async((1, 2), countdown=-1)
    with pytest.raises(pgqueue.ValidationError, match=r"^expires: expires before its delay"):
        add.apply_async((1, 2), countdown=60, expires=30)
    with pytest.raises(pgqueue.ValidationError, match=r"^task_id: must be a UUID"):
        add.apply_async((1, 2), task_id="order-42")
    with pytest.raises(pgqueue.InvalidArgument, match="'y' is missing"):
        add.apply_async((1,))
    with pytest.raises(pgqueue.InvalidArgument, match="tuple or list of positional") as bad:
        add.apply_async(7)  # type: ignore[arg-type]
    assert bad.value.argument == "args"
    with pytest.raises(pgqueue.InvalidArgument, match="dict of keyword arguments"):
        add.apply_async((1,), [("y", 2)])  # type: ignore[arg-type]
    assert count_tasks(conn) == 0


def test_a_chosen_task_id_is_the_tasks_id_and_reusing_it_creates_no_second_task(
    configured: str, conn: psycopg.Connection[Any], workers: Workers
) -> None:
    chosen = uuid.uuid4()
    first = add.apply_async((2, 2), task_id=str(chosen))
    assert first.id == chosen and first.created
    again = add.apply_async((2, 2), task_id=chosen)
    assert again.id == chosen and not again.created
    assert count_tasks(conn) == 1
    start_worker(configured, workers)
    assert pgqueue.AsyncResult(chosen).get(timeout=60) == 4
    # Re-sent after it ran (a redelivered message): still the one task, its result kept.
    assert add.apply_async((2, 2), task_id=chosen).get(timeout=5) == 4
    assert count_tasks(conn) == 1
    # Under key_reuse="refuse", a different call under the same id is an error.
    with pytest.raises(pgqueue.IdempotencyConflict, match="payload"):
        add.options(key_reuse="refuse").apply_async((2, 3), task_id=chosen)
    with pytest.raises(pgqueue.ValidationError, match="either task_id or an idempotency key"):
        add.options(idempotency_key="k").apply_async((2, 2), task_id=uuid.uuid4())
    assert count_tasks(conn) == 1


def test_a_task_id_taken_by_a_task_submitted_without_it_is_refused(
    configured: str, conn: psycopg.Connection[Any]
) -> None:
    taken = add.delay(1, 1).id
    with pytest.raises(pgqueue.ValidationError, match=f"task_id: task {taken} already exists"):
        add.apply_async((1, 1), task_id=taken)
    assert count_tasks(conn) == 1


# --- which database ----------------------------------------------------------------------------


def test_delay_without_a_configured_database_names_both_ways_to_give_one(
    unconfigured: None,
) -> None:
    with pytest.raises(pgqueue.ConfigurationError) as caught:
        add.delay(1, 2)
    message = str(caught.value)
    assert "add.delay()" in message
    assert "pgqueue.configure(database_url=...)" in message and "PGQUEUE_DATABASE_URL" in message
    assert "embedded" in message
    with pytest.raises(pgqueue.ConfigurationError, match="apply_async"):
        add.apply_async((1, 2))
    with pytest.raises(pgqueue.ConfigurationError, match="pass conn="):
        pgqueue.AsyncResult(uuid.uuid4()).get(timeout=1)


def test_a_process_with_no_database_configured_is_told_and_starts_no_embedded_server(
    tmp_path: Path,
) -> None:
    script = (
        "import sys\n"
        "import pgqueue\n"
        "from celery_style_handlers import add\n"
        "try:\n"
        "    add.delay(1, 2)\n"
        "except pgqueue.ConfigurationError as exc:\n"
        "    print(exc)\n"
        "print('embedded loaded:', 'pgqueue.embedded' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "no database for add.delay(): call pgqueue.configure(database_url=...) at start-up, "
        "or set PGQUEUE_DATABASE_URL (the default client never uses the embedded server)",
        "embedded loaded: False",
    ]


def test_delay_uses_pgqueue_database_url_when_nothing_is_configured(
    unconfigured: None,
    database_url: str,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", database_url)
    handle = add.delay(4, 5)
    assert pgqueue.get_task(conn, handle.id).payload == {"x": 4, "y": 5}


def test_configure_again_switches_the_database_delay_submits_to(
    configured: str, other_database_url: str, conn: psycopg.Connection[Any]
) -> None:
    first = add.delay(1, 1)
    pgqueue.configure(database_url=other_database_url)
    second = add.delay(2, 2)
    assert count_tasks(conn) == 1
    with psycopg.connect(other_database_url, autocommit=True) as other:
        assert count_tasks(other) == 1
        assert pgqueue.get_task(other, second.id).payload == {"x": 2, "y": 2}
    # The first handle still asks the database its task is in.
    assert first.status is pgqueue.TaskStatus.QUEUED
    assert pgqueue.AsyncResult(second.id).status is pgqueue.TaskStatus.QUEUED
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.AsyncResult(first.id).refresh()  # the default client is on the other one now


def test_configure_refuses_a_url_that_is_not_postgresql_at_once(unconfigured: None) -> None:
    with pytest.raises(pgqueue.InvalidDatabaseURL):
        pgqueue.configure(database_url="mysql://db/app")


# --- enqueue with a Client, and a handle from a connection -------------------------------------


def test_enqueue_with_a_client_commits_and_its_handle_asks_that_client(
    database_url: str, unconfigured: None, conn: psycopg.Connection[Any], workers: Workers
) -> None:
    with pgqueue.Client(database_url) as client:
        handle = add.enqueue(client, 6, 7)
        assert pgqueue.get_task(conn, handle.id).status is pgqueue.TaskStatus.QUEUED
        handles = add.enqueue_many(client, [{"x": 1, "y": 1}, add.bind(2, 2)])
        assert count_tasks(conn) == 3
        start_worker(database_url, workers)
        assert handle.get(timeout=60) == 13  # no default client: the handle's own
        assert [h.get(timeout=60) for h in handles] == [2, 4]


def test_a_handle_from_a_connection_asks_the_connection_given_or_explains(
    database_url: str, unconfigured: None, conn: psycopg.Connection[Any], workers: Workers
) -> None:
    handle = add.enqueue(conn, 3, 4)  # autocommit: committed
    with pytest.raises(pgqueue.ConfigurationError, match="pass conn="):
        handle.get(timeout=1)
    assert handle.refresh(conn).status is pgqueue.TaskStatus.QUEUED
    assert not handle.ready(conn)
    start_worker(database_url, workers)
    assert handle.get(timeout=60, conn=conn) == 7
    assert handle.successful(conn)
    with pgqueue.Client(database_url) as client:
        assert handle.wait(client, timeout=5).result == 7


def test_aenqueue_with_a_client_says_to_use_enqueue_and_aget_waits_on_an_async_connection(
    database_url: str, workers: Workers
) -> None:
    async def main() -> None:
        with (
            pgqueue.Client(database_url) as client,
            pytest.raises(pgqueue.UnsupportedConnection, match=r"fn.enqueue\(client"),
        ):
            await add.aenqueue(client, 1, 2)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            handle = await add.aenqueue(aconn, 20, 22)
            assert await handle.aget(60, conn=aconn) == 42
            failing = await declined.aenqueue(aconn, 1)
            with pytest.raises(pgqueue.TaskFailed, match="card declined for order 1"):
                await pgqueue.AsyncResult(failing.id).aget(60, conn=aconn)

    start_worker(database_url, workers)
    asyncio.run(main())
