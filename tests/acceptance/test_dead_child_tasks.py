"""A supervised child that dies gives its tasks back at once, as real processes.

``pgqueue worker --processes 2`` with a long lease (60 s): a handler ends its process with
``os._exit(3)`` while tasks claimed with it run beside it in the same child. The supervisor
gave that child its worker id, so it fails everything still running under it the moment it
sees the child exit: the poison task's attempt is recorded within seconds, naming the exit
code, instead of a lease later; the innocent tasks that shared its process are retried at
once (they lose an attempt too: a thread executor child's crash takes its whole process) and
complete; and the poison task is dead-lettered after its attempts in less than one lease.
The helpers and the handlers are test_worker_processes.py's.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import psycopg
import pytest
from test_worker_processes import (
    FAST,
    SIDE_TABLES,
    Workers,
    all_in_status,
    enqueue,
    executions,
    has_started,
    status_of,
    task,
    wait_for_exit,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(sys.platform != "linux", reason="children are forked on Linux only"),
]

LEASE = 60.0


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test database's autocommit connection, with the handlers' side tables."""
    conn.execute(SIDE_TABLES)
    return conn


@pytest.mark.slow
def test_a_dead_childs_tasks_fail_at_once_and_its_poison_is_dead_lettered_within_a_lease(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--concurrency", "3", "--lease-seconds", str(LEASE)),
        *("--log-format", "json", *FAST),
        name="supervisor",
    )
    wait_until(
        lambda: sum(e["event"] == "worker.started" for e in supervisor.events()) >= 2,
        timeout=60,
        what="both children to start their worker",
        workers=workers,
        alive=[supervisor],
    )
    # One commit: the first child to claim takes the poison (high) and two innocents. An
    # innocent that shares a process with the poison's retry dies with it again: attempts
    # enough that it outlives the poison.
    poison, *innocents = enqueue(
        db,
        {"type": "crash", "payload": {"code": 3, "after": 1}, "priority": "high"},
        *({"type": "sleep", "payload": {"seconds": 3}, "max_attempts": 10} for _ in range(5)),
    )
    assert task(db, poison).max_attempts == 3
    wait_until(
        lambda: has_started(db, poison),
        timeout=30,
        what="a child to start the poison task",
        workers=workers,
        alive=[supervisor],
    )
    started = time.monotonic()
    [(_, dead_pid)] = executions(db, poison)

    # Recorded within seconds of the death, not when the 60 s lease expires.
    first = wait_until(
        lambda: "exited with code 3" in ((row := task(db, poison)).last_error or "") and row,
        timeout=15,
        what="the poison task's first attempt to be recorded failed",
        workers=workers,
        alive=[supervisor],
    )
    assert time.monotonic() - started < LEASE / 4
    assert first.last_error is not None
    assert first.last_error.startswith("worker process exited with code 3 on attempt 1 of 3")
    assert f"pid {dead_pid}" in first.last_error

    shared = [t for t in innocents if (1, dead_pid) in executions(db, t)]
    assert shared, "no innocent task ran beside the poison task in its child"
    wait_until(
        lambda: all_in_status(db, innocents, "completed"),
        timeout=30,
        what="the innocent tasks to complete, the dead child's retried at once",
        workers=workers,
        alive=[supervisor],
    )
    for task_id in shared:
        done = task(db, task_id)
        assert done.attempts >= 2, task_id  # the crash of its process cost it an attempt
        assert "worker process exited with code 3 on attempt" in (done.last_error or "")
        assert executions(db, task_id)[0] == (1, dead_pid)

    wait_until(
        lambda: status_of(db, poison) == "failed",
        timeout=60,
        what="the poison task to be dead-lettered",
        workers=workers,
        alive=[supervisor],
    )
    assert time.monotonic() - started < LEASE, "three deaths took longer than one lease"
    dead = task(db, poison)
    assert dead.attempts == 3
    assert (dead.last_error or "").startswith("worker process exited with code 3 on attempt 3 of 3")
    assert [attempt for attempt, _ in executions(db, poison)] == [1, 2, 3]

    events = supervisor.events()
    [exited] = [e for e in events if e["event"] == "worker.process_exited" and e["pid"] == dead_pid]
    assert exited["exit_code"] == 3
    assert exited["tasks_given_back"] == 1 + len(shared)
    assert set(exited["task_ids"].split(",")) == {str(t) for t in [poison, *shared]}
    deaths = [e for e in events if e["event"] == "task.failed_by_child_death"]
    assert {(e["task_id"], e["type"], e["attempt"]) for e in deaths if e["pid"] == dead_pid} == {
        (str(poison), "crash", 1),
        *((str(t), "sleep", 1) for t in shared),
    }
    [dead_event] = [e for e in events if e["event"] == "task.dead"]
    assert (dead_event["task_id"], dead_event["attempt"]) == (str(poison), 3)

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 30)[0] == 0
