"""Cancelling a running task is prompt: the handler of a real worker process sees
``ctx.should_stop()`` (or ``await ctx.stopped()`` returns) well within a heartbeat interval.

The worker's lease is 120 s, so it beats every 40 s: a stop seen within 5 s of the DELETE can
only come from the cancel's notification, which the worker's log confirms (``via=notify``).
The bound is generous, for a busy machine; bench/cancel_latency.py measures the latency.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api
from test_worker_processes import Workers, wait_until

import pgqueue
from pgqueue.api import ApiSettings

pytestmark = [pytest.mark.timeout(180)]

LEASE = ("--lease-seconds", "120", "--poll-interval", "0.2")
PROMPT = 5.0  # seconds; the heartbeat path needs up to 40 with this lease


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


def running(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> bool:
    return pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING


def seen_at(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> float | None:
    """When the handler saw the stop (its Cancel reason), once the task is cancelled."""
    task = pgqueue.get_task(conn, task_id)
    if task.status is not pgqueue.TaskStatus.CANCELLED:
        return None
    assert task.last_error is not None and task.last_error.startswith("saw stop at "), task
    return float(task.last_error.removeprefix("saw stop at "))


@pytest.mark.parametrize("handler", ["poll", "wait"])
def test_a_delete_reaches_the_running_handler_within_a_fraction_of_the_heartbeat(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers, api: Api, handler: str
):
    by_http, by_library = (pgqueue.enqueue(conn, handler, {}).id for _ in range(2))
    worker = workers.start(
        database_url, *LEASE, "--log-format", "json", registry="cancel_handlers:tasks"
    )
    for task_id in (by_http, by_library):
        wait_until(
            lambda t=task_id: running(conn, t),  # type: ignore[misc]
            timeout=60,
            what="the task to run",
            alive=[worker],
        )
    time.sleep(0.3)  # not an assertion: lets the handlers reach their polling loops

    asked_http = time.time()
    response = api.request("DELETE", f"/api/v1/tasks/{by_http}")
    assert response.status_code == 202, response.text
    asked_library = time.time()
    assert pgqueue.cancel(conn, by_library).cancel_requested

    for task_id, asked in ((by_http, asked_http), (by_library, asked_library)):
        seen = wait_until(
            lambda t=task_id: seen_at(conn, t),  # type: ignore[misc]
            timeout=60,
            what="the handler to see the stop",
            alive=[worker],
        )
        assert seen - asked < PROMPT, f"the handler saw the stop {seen - asked:.2f} s later"
        # Cancelled, not completed; the attempt was spent.
        task = pgqueue.get_task(conn, task_id)
        assert (task.status, task.attempts) == (pgqueue.TaskStatus.CANCELLED, 1)

    told = [
        e
        for e in worker.events()
        if e["event"] == "task.cancel_requested"
        and e.get("task_id") in (str(by_http), str(by_library))
    ]
    assert sorted(e["via"] for e in told) == ["notify", "notify"], told
    assert {e["type"] for e in told} == {handler} and {e["attempt"] for e in told} == {1}


def test_a_cancel_of_another_workers_task_does_not_stop_this_ones(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    """Every worker hears every cancel; each keeps only those naming its own leases."""
    first, second = (pgqueue.enqueue(conn, "poll", {}).id for _ in range(2))
    a = workers.start(
        database_url, *LEASE, "--concurrency", "1", "--log-format", "json",
        registry="cancel_handlers:tasks", name="a",
    )  # fmt: skip
    b = workers.start(
        database_url, *LEASE, "--concurrency", "1", "--log-format", "json",
        registry="cancel_handlers:tasks", name="b",
    )  # fmt: skip
    for task_id in (first, second):
        wait_until(
            lambda t=task_id: running(conn, t),  # type: ignore[misc]
            timeout=60,
            what="both tasks to run",
            alive=[a, b],
        )
    pgqueue.cancel(conn, first)
    wait_until(lambda: seen_at(conn, first), timeout=60, what="the first to stop", alive=[a, b])
    assert running(conn, second), "a cancel of one task stopped another"
    told = [e for w in (a, b) for e in w.events() if e["event"] == "task.cancel_requested"]
    assert [e["task_id"] for e in told] == [str(first)]


def test_a_cancel_notified_while_the_listener_was_cut_off_arrives_when_it_reconnects(
    database_url: str, server_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    """The notification is lost while the worker's LISTEN connection is down; on reconnecting
    the listener has the heartbeat beat at once, which brings the request (not 40 s later)."""
    task_id = pgqueue.enqueue(conn, "poll", {}).id
    worker = workers.start(
        database_url, *LEASE, "--log-format", "json", registry="cancel_handlers:tasks"
    )
    wait_until(lambda: running(conn, task_id), timeout=60, what="the task to run", alive=[worker])
    database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    with psycopg.connect(server_url, autocommit=True) as admin:
        # No new connection to the database (existing ones, the worker's pool included, go
        # on), then the listener's is cut: it retries with backoff and cannot LISTEN again.
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND query LIKE 'LISTEN %%'",
                (database,),
            ).fetchone()
            assert cut == (1,), cut
            assert pgqueue.cancel(conn, task_id).cancel_requested  # its NOTIFY reaches nobody
            time.sleep(1.0)  # not an assertion: the listener is down for a while
            assert running(conn, task_id)
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    allowed = time.time()
    seen = wait_until(
        lambda: seen_at(conn, task_id), timeout=60, what="the handler to stop", alive=[worker]
    )
    assert seen - allowed < PROMPT, f"the handler saw the stop {seen - allowed:.2f} s later"
    (told,) = [e for e in worker.events() if e["event"] == "task.cancel_requested"]
    assert told["via"] == "heartbeat"
