"""Handlers that outlive their timeouts, and async handlers that block the event loop, in real
worker processes against PostgreSQL.

A thread cannot be killed: a sync handler past its timeout runs on. The worker must then keep
the task (its slot, its lease, renewed) until the thread returns, and only then record the
attempt failed as timed out, so that no retry can run beside it; say so in its log and
metrics; recycle itself when too many threads are stuck like that; and not wait for them past
its grace period at shutdown. An async handler that blocks the loop cannot be interrupted
either: the worker must see it (a watchdog thread names the task) and must not record it
completed when it returns past its deadline.

The handlers (``overrun_handlers.py``) record each execution's start and end in the side table
``runs`` from the server's clock. Every wait polls for a condition with a deadline; no test
assumes an idle machine: the handlers block for several seconds more than the timeouts they
are measured against.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from overrun_handlers import RUNS
from prometheus_client.parser import text_string_to_metric_families
from test_worker_processes import FAST, WorkerProcess, Workers, wait_for_exit, wait_until

import pgqueue
from pgqueue.config import EXIT_RECYCLE

pytestmark = [pytest.mark.timeout(180)]

REGISTRY = "overrun_handlers:tasks"
JSON = ("--log-format", "json")


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(RUNS)
    return conn


def runs(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> list[dict[str, Any]]:
    """The task's executions, in the order they started."""
    rows = conn.execute(
        "SELECT attempt, pid, started_at, ended_at, timed_out FROM runs"
        " WHERE task_id = %s ORDER BY seq",
        (task_id,),
    ).fetchall()
    keys = ("attempt", "pid", "started_at", "ended_at", "timed_out")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def run_of(conn: psycopg.Connection[Any], task_id: uuid.UUID, attempt: int) -> dict[str, Any]:
    found = [r for r in runs(conn, task_id) if r["attempt"] == attempt]
    return found[0] if found else {}


def events(worker: WorkerProcess, name: str, task_id: uuid.UUID | None = None) -> list[Any]:
    return [
        e
        for e in worker.events()
        if e["event"] == name and (task_id is None or e.get("task_id") == str(task_id))
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, str], float] | None:
    """Each sample of the worker's /metrics by (name, its type label or ""), or None while it
    is not serving yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, s.labels.get("type", "")] = s.value
    return out


def metrics_options(port: int) -> Sequence[str]:
    return ("--metrics-port", str(port), "--metrics-host", "127.0.0.1")


# --- a sync handler past its timeout ---------------------------------------------------------


def test_a_timed_out_sync_handler_holds_its_task_until_its_thread_returns_and_no_retry_overlaps(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """timeout 2 s, 8 s of blocking, a 3 s lease, max_attempts 2: attempt 1 stays running
    (lease renewed, never swept) until its thread returns; only then is the timeout recorded,
    and attempt 2 starts after attempt 1 ended."""
    task_id = pgqueue.enqueue(db, "stuck", {"seconds": 8, "attempts": [1]}).task.id
    port = free_port()
    worker = workers.start(
        database_url,
        *("--lease-seconds", "3", *FAST, *JSON, *metrics_options(port)),
        registry=REGISTRY,
    )
    wait_until(
        lambda: run_of(db, task_id, 1),
        timeout=60,
        what="attempt 1 to start",
        workers=workers,
        alive=[worker],
    )
    wait_until(
        lambda: events(worker, "task.handler_overrun", task_id),
        timeout=60,
        what="the overrun to be reported",
        workers=workers,
        alive=[worker],
    )
    # While the thread runs, the task is untouched: still running attempt 1, nothing recorded,
    # its lease renewed past the 3 s it was claimed with (the sweep runs every 0.5 s).
    leases: list[datetime] = []
    metrics = None
    while not run_of(db, task_id, 1)["ended_at"]:
        row = pgqueue.get_task(db, task_id)
        if run_of(db, task_id, 1)["ended_at"]:
            break  # it returned meanwhile: its outcome may be recorded by now
        assert (row.status, row.attempts, row.last_error) == ("running", 1, None), row
        assert row.lease_expires_at is not None
        leases.append(row.lease_expires_at)
        assert worker.alive(), worker.describe()
        if metrics is None and (metrics := scrape(port)) is not None:
            assert metrics["pgqueue_worker_handlers_overrunning", ""] == 1
            assert metrics["pgqueue_worker_handler_overruns_total", "stuck"] == 1
        time.sleep(0.2)  # the next look
    assert metrics is not None, "/metrics never answered while the handler overran"
    first = run_of(db, task_id, 1)
    assert max(leases) > first["started_at"] + timedelta(seconds=3), "the lease was not renewed"
    assert first["timed_out"] is True, "the handler saw ctx.timed_out"

    done = wait_until(
        lambda: (t := pgqueue.get_task(db, task_id)).status == "completed" and t,
        timeout=60,
        what="attempt 2 to complete",
        workers=workers,
        alive=[worker],
    )
    assert done.attempts == 2 and done.last_error == "timed out after 2 s"
    second = run_of(db, task_id, 2)
    assert second["started_at"] >= first["ended_at"], (
        f"attempt 2 started at {second['started_at']}, before attempt 1 ended at "
        f"{first['ended_at']}"
    )
    assert len(runs(db, task_id)) == 2
    (retried,) = events(worker, "task.retried", task_id)
    assert retried["error"] == "timed out after 2 s"
    (overrun,) = events(worker, "task.handler_overrun", task_id)
    assert (overrun["type"], overrun["attempt"], overrun["timeout_s"]) == ("stuck", 1, 2)
    (ended,) = events(worker, "task.handler_overrun_ended", task_id)
    assert ended["attempt"] == 1 and ended["over_s"] >= 5, ended
    assert not events(worker, "task.lease_lost")
    after = wait_until(
        lambda: (m := scrape(port)) and m["pgqueue_worker_handlers_overrunning", ""] == 0 and m,
        timeout=30,
        what="the overrunning gauge to go back to 0",
        workers=workers,
        alive=[worker],
    )
    assert after["pgqueue_worker_handler_overruns_total", "stuck"] == 1


def test_what_a_timed_out_handler_returns_is_ignored_and_its_transaction_rolled_back(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """It writes through ctx.connection and returns a value after its 1 s timeout: the task
    is dead-lettered as timed out (its only attempt), not completed, and the write is gone."""
    task_id = pgqueue.enqueue(db, "stuck_tx", {"seconds": 4}).task.id
    worker = workers.start(database_url, *FAST, *JSON, registry=REGISTRY)
    dead = wait_until(
        lambda: (t := pgqueue.get_task(db, task_id)).status == "failed" and t,
        timeout=60,
        what="the task to be dead-lettered",
        workers=workers,
        alive=[worker],
    )
    assert dead.last_error == "timed out after 1 s" and dead.result is None
    (run,) = runs(db, task_id)
    assert run["ended_at"] is not None and run["timed_out"] is True
    assert db.execute("SELECT count(*) FROM tx_writes").fetchone() == (0,)
    assert not events(worker, "task.completed")


# --- recycling -------------------------------------------------------------------------------


def test_a_worker_with_more_overrunning_handlers_than_allowed_recycles_with_its_exit_code(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """--max-overrunning 0: the first overrun makes the worker stop claiming and exit with
    EXIT_RECYCLE, without waiting its grace period for the stuck thread; the stuck attempt
    is recorded timed out (a retry), not handed back with its attempt refunded."""
    task_id = pgqueue.enqueue(db, "stuck", {"seconds": 600}).task.id
    worker = workers.start(
        database_url,
        *("--max-overrunning", "0", "--grace-period", "120", *FAST, *JSON),
        registry=REGISTRY,
    )
    wait_until(
        lambda: events(worker, "task.handler_overrun", task_id),
        timeout=60,
        what="the overrun",
        workers=workers,
        alive=[worker],
    )
    code, _ = wait_for_exit(worker, 60)  # well within the 120 s grace period

    assert code == EXIT_RECYCLE
    (recycling,) = events(worker, "worker.recycling")
    assert "max_overrunning=0" in recycling["reason"] and recycling["exit_code"] == EXIT_RECYCLE
    (abandoned,) = events(worker, "task.abandoned", task_id)
    assert (abandoned["type"], abandoned["attempt"]) == ("stuck", 1)
    retried = pgqueue.get_task(db, task_id)
    assert (retried.status, retried.attempts) == ("queued", 1)
    assert retried.last_error == "timed out after 2 s"
    assert not events(worker, "task.released")
    (run,) = runs(db, task_id)
    assert run["ended_at"] is None, "the thread was still blocked when the process exited"


@pytest.mark.skipif(
    not hasattr(signal, "SIGKILL"), reason="the supervisor's fleet is tested on POSIX"
)
def test_the_supervisor_replaces_a_recycled_child_at_once_not_as_a_crash(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    task_id = pgqueue.enqueue(db, "stuck", {"seconds": 600, "attempts": [1]}).task.id
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--concurrency", "1", "--max-overrunning", "0", *FAST, *JSON),
        registry=REGISTRY,
    )
    recycled = wait_until(
        lambda: events(supervisor, "worker.process_recycled"),
        timeout=60,
        what="the supervisor to see its child recycle",
        workers=workers,
        alive=[supervisor],
    )
    assert recycled[0]["exit_code"] == EXIT_RECYCLE
    done = wait_until(
        lambda: (t := pgqueue.get_task(db, task_id)).status == "completed" and t,
        timeout=60,
        what="attempt 2 to complete in a child",
        workers=workers,
        alive=[supervisor],
    )
    assert done.attempts == 2
    slot = recycled[0]["slot"]
    starts = [e for e in events(supervisor, "worker.process_started") if e["slot"] == slot]
    assert len(starts) >= 2, "the recycled child's slot was not started again"
    assert not events(supervisor, "worker.process_exited"), "a recycle is not a crash"

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 60)[0] == 0


# --- shutdown with stuck threads --------------------------------------------------------------


def test_sigterm_does_not_wait_past_the_grace_period_for_stuck_threads(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """A handler stuck in time.sleep(1000) without a timeout, and one overrunning its
    timeout: the worker exits at the end of its 2 s grace period (plus its release and
    close), hands the first back with its attempt refunded, records the second timed out,
    and logs both as abandoned."""
    hang = pgqueue.enqueue(db, "hang", {"seconds": 1000}, priority="high").task.id
    stuck = pgqueue.enqueue(db, "stuck", {"seconds": 1000}).task.id
    worker = workers.start(
        database_url,
        *("--concurrency", "2", "--grace-period", "2", *FAST, *JSON),
        registry=REGISTRY,
    )
    wait_until(
        lambda: run_of(db, hang, 1) and events(worker, "task.handler_overrun", stuck),
        timeout=60,
        what="both handlers to be stuck, one of them past its timeout",
        workers=workers,
        alive=[worker],
    )

    worker.proc.send_signal(signal.SIGTERM)
    code, waited = wait_for_exit(worker, 60)

    assert code == 0
    # 2 s of grace, then one release, one failure write, a flush and closing the pools.
    assert waited < 2 + 8, f"exited {waited:.1f} s after SIGTERM with a 2 s grace period"
    released = pgqueue.get_task(db, hang)
    assert (released.status, released.attempts) == ("queued", 0)
    timed_out = pgqueue.get_task(db, stuck)
    assert (timed_out.status, timed_out.attempts) == ("queued", 1)
    assert timed_out.last_error == "timed out after 2 s"
    for task_id, type_ in ((hang, "hang"), (stuck, "stuck")):
        (abandoned,) = events(worker, "task.abandoned", task_id)
        assert (abandoned["type"], abandoned["attempt"]) == (type_, 1)
        assert run_of(db, task_id, 1)["ended_at"] is None


# --- async handlers that block the event loop --------------------------------------------------


def test_the_watchdog_names_the_async_handler_that_blocked_the_event_loop(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    task_id = pgqueue.enqueue(db, "loop_blocker", {"seconds": 2}).task.id
    port = free_port()
    worker = workers.start(database_url, *FAST, *JSON, *metrics_options(port), registry=REGISTRY)
    wait_until(
        lambda: pgqueue.get_task(db, task_id).status == "completed",
        timeout=60,
        what="the blocking task to complete",
        workers=workers,
        alive=[worker],
    )
    blocked = wait_until(
        lambda: events(worker, "worker.loop_blocked", task_id),
        timeout=30,
        what="worker.loop_blocked naming the task",
        workers=workers,
        alive=[worker],
    )
    assert (blocked[0]["type"], blocked[0]["attempt"]) == ("loop_blocker", 1)
    assert blocked[0]["blocked_s"] >= 1.5, blocked
    (ongoing,) = events(worker, "worker.loop_blocking", task_id)  # logged while it lasted
    assert ongoing["type"] == "loop_blocker"
    metrics = wait_until(
        lambda: scrape(port), timeout=30, what="/metrics", workers=workers, alive=[worker]
    )
    assert metrics["pgqueue_worker_loop_blocked_total", "loop_blocker"] >= 1
    assert metrics["pgqueue_worker_loop_blocked_seconds_total", "loop_blocker"] >= 1.5


def test_an_async_handler_that_blocks_the_loop_past_its_timeout_is_not_recorded_completed(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    task_id = pgqueue.enqueue(db, "loop_blocker_timed", {"seconds": 4}).task.id
    worker = workers.start(database_url, *FAST, *JSON, registry=REGISTRY)
    dead = wait_until(
        lambda: (t := pgqueue.get_task(db, task_id)).status in ("failed", "completed") and t,
        timeout=60,
        what="the task to finish",
        workers=workers,
        alive=[worker],
    )
    assert dead.status == "failed", f"recorded {dead.status}: {dead.result}"
    assert dead.last_error is not None
    assert dead.last_error.startswith("timed out after 1 s (blocked the event loop for ")
    blocked_for = float(dead.last_error.rpartition("for ")[2].split(" s)")[0])
    assert blocked_for >= 3.0, dead.last_error  # 4 s of blocking, 1 s of it within the timeout
