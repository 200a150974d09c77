"""A worker stopped between its claim and its start mark (SIGSTOP, a starved process) must not
start the task once it runs again if the sweep took the lease back meanwhile: the sweep gave
that attempt back as never started, so a late start would be an execution no attempt counts,
beside the one another claim makes (bench.chaos's sigstop scenario found it: "two executions
on one lease"). The stop is made exact here by holding a lock on the worker's start-mark row,
which its mark statement waits for.

Only the stopped worker has a short lease (1 s, the least it takes): the lock holds its mark
until the sweep has taken that lease back, so no timing decides whether it expires. The task's
real run is another worker's, with a lease no pause of a busy machine outlasts, so that run
cannot be swept and repeated either: any second execution is the late worker's."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest
from test_worker_processes import (
    FAST,
    Workers,
    count,
    db,  # noqa: F401 (a fixture)
    enqueue,
    executions,
    status_of,
    task,
    wait_for_exit,
    wait_until,
)

pytestmark = [pytest.mark.timeout(120)]


def claimed_then_swept_back(
    db: psycopg.Connection[Any],  # noqa: F811
    task_id: Any,
    workers: Workers,
    late: Any,
) -> None:
    """The late worker claims the task, and (its start mark held) the sweep takes that claim
    back with the attempt given back and no execution recorded."""
    wait_until(
        lambda: task(db, task_id).started_at is not None,
        timeout=30,
        what="the claim",
        workers=workers,
        alive=[late],
    )
    wait_until(
        lambda: status_of(db, task_id) == "queued",
        timeout=30,
        what="the sweep to take the lease back",
        workers=workers,
        alive=[late],
    )
    assert task(db, task_id).attempts == 0
    assert executions(db, task_id) == []


def test_a_claim_swept_before_its_start_mark_is_not_started_by_the_late_worker(
    db: psycopg.Connection[Any],  # noqa: F811
    database_url: str,
    workers: Workers,
) -> None:
    late = workers.start(
        database_url, "--concurrency", "1", "--lease-seconds", "1", *FAST, "--log-format", "json"
    )
    # The worker writes its row of start marks before its first claim.
    wait_until(
        lambda: count(db, "SELECT count(*) FROM pgqueue.lease_starts") == 1,
        timeout=30,
        what="the worker's first claim",
        workers=workers,
        alive=[late],
    )
    with psycopg.connect(database_url) as locker:
        locker.execute("SELECT owner FROM pgqueue.lease_starts FOR UPDATE")
        (task_id,) = enqueue(db, {"type": "noop"})
        # Claimed, and then its mark waits on our lock while the 1 s lease runs out and the
        # sweep takes the task back, the attempt given back.
        claimed_then_swept_back(db, task_id, workers, late)
        # Another worker claims the task again and runs it, the late one still held.
        other = workers.start(
            database_url, "--concurrency", "1", "--lease-seconds", "300", *FAST, name="other"
        )
        wait_until(
            lambda: status_of(db, task_id) == "completed",
            timeout=60,
            what="the other worker to run the task",
            workers=workers,
            alive=[late, other],
        )
        assert executions(db, task_id) == [(1, other.pid)]
        locker.rollback()  # the mark goes through: the late worker resumes

    # It either says it lost the claim, or starts the task a second time; then a graceful stop
    # waits for whatever it started, so that every start it made is in `executions`.
    wait_until(
        lambda: (
            [e for e in late.events() if e.get("event") == "task.lease_lost"]
            or len(executions(db, task_id)) > 1
        ),
        timeout=30,
        what="the late worker to resume after its start mark",
        workers=workers,
        alive=[late],
    )
    late.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(late, timeout=60)[0] == 0, late.describe()
    assert executions(db, task_id) == [(1, other.pid)], (
        "the late worker started the swept claim as well as the other worker's"
    )
    assert task(db, task_id).attempts == 1
    notes = [e for e in late.events() if e.get("event") == "task.lease_lost"]
    assert [e.get("task_id") for e in notes] == [str(task_id)]


# Every update of a start mark waits for advisory lock 7 (the first mark of an owner is an
# insert, and goes through): a worker's very first claim can then be held at its mark.
MARK_WAITS_FOR_LOCK = """
CREATE FUNCTION mark_waits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock(7); RETURN NEW; END $$;
CREATE TRIGGER mark_waits BEFORE UPDATE ON pgqueue.lease_starts
   FOR EACH ROW EXECUTE FUNCTION mark_waits();
"""


def test_the_sweep_runs_while_the_first_claims_start_mark_waits(
    db: psycopg.Connection[Any],  # noqa: F811
    database_url: str,
    workers: Workers,
) -> None:
    """The worker's maintenance starts once its first claim statement has returned, not once
    that claim's start mark has: a mark held by a lock must not hold back the sweep that takes
    the unstarted claim back (the task waiting before the worker starts makes the first claim
    the one that takes it)."""
    db.execute(MARK_WAITS_FOR_LOCK)
    (task_id,) = enqueue(db, {"type": "noop"})
    with psycopg.connect(database_url) as locker:
        locker.execute("SELECT pg_advisory_xact_lock(7)")
        late = workers.start(
            database_url,
            "--concurrency",
            "1",
            "--lease-seconds",
            "1",
            *FAST,
            "--log-format",
            "json",
        )
        claimed_then_swept_back(db, task_id, workers, late)
        locker.rollback()
    # Released, the mark goes through; the late worker finds its claim gone and says so, and
    # then claims and runs the task again itself, as its first attempt.
    wait_until(
        lambda: status_of(db, task_id) == "completed",
        timeout=60,
        what="the task to run once the mark is released",
        workers=workers,
        alive=[late],
    )
    assert executions(db, task_id) == [(1, late.pid)]
    notes = [e for e in late.events() if e.get("event") == "task.lease_lost"]
    assert [e.get("task_id") for e in notes] == [str(task_id)]
