"""A parent's completion racing a cancel of its dependant, in two transactions on
two connections, against real PostgreSQL, with the interleaving forced: the first writer's
transaction stays open, holding its row locks, while the second writer's statement runs in a
thread until PostgreSQL shows it waiting for a lock the first holds (or it has finished, for an
implementation where the two share no row); then the first commits.

Whichever goes first, neither deadlocks nor fails, and the child ends cancelled, once: never
released after it was cancelled, never left waiting with its parent final.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.models import TaskStatus

Connect = Callable[..., psycopg.Connection[Any]]


def writer(connect: Connect) -> psycopg.Connection[Any]:
    """A connection for one side of the race: in a transaction (the caller commits), a lock
    wait bounded so a bug fails the test instead of hanging it, and a deadlock found at once."""
    conn = connect(autocommit=True)
    conn.execute("SET lock_timeout = '30s'")
    conn.execute("SET deadlock_timeout = '50ms'")
    conn.autocommit = False
    return conn


def wait_until_blocked_or_done(
    observer: psycopg.Connection[Any], waiter_pid: int, holder_pid: int, thread: threading.Thread
) -> bool:
    """Whether the waiter's statement waits for a lock the holder's transaction holds; False
    if it finished without waiting. Fails the test after 30 s of neither."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = observer.execute("SELECT pg_blocking_pids(%s)", [waiter_pid]).fetchone()
        if row is not None and holder_pid in row[0]:
            return True
        if not thread.is_alive():
            return False
        time.sleep(0.01)
    pytest.fail("the second writer neither waited for the first nor finished")


def race(
    connect: Connect,
    first: tuple[psycopg.Connection[Any], Callable[[], None]],
    second: tuple[psycopg.Connection[Any], Callable[[], None]],
) -> None:
    """Run ``first``'s write and keep its transaction open; run ``second``'s in a thread until
    it waits for a lock the first holds (or has finished); then commit the first. Neither may
    fail or deadlock."""
    (holder, hold), (waiter, wait) = first, second
    hold()  # its transaction stays open, its locks held
    errors: list[BaseException] = []

    def run_second() -> None:
        try:
            wait()
            waiter.commit()
        except BaseException as exc:
            errors.append(exc)
            waiter.rollback()

    thread = threading.Thread(target=run_second)
    thread.start()
    try:
        wait_until_blocked_or_done(
            connect(), waiter.info.backend_pid, holder.info.backend_pid, thread
        )
    finally:
        holder.commit()
        thread.join(60)
    assert not thread.is_alive()
    assert errors == []


@pytest.mark.parametrize("first", ["completion", "cancel"])
@pytest.mark.parametrize("cancelled", ["child", "workflow", "other_parent"])
def test_a_parents_completion_and_a_cancel_in_concurrent_transactions_end_the_child_once(
    connect: Connect, first: str, cancelled: str
) -> None:
    setup = connect()
    wf = uuid.uuid4()
    parent = pgqueue.enqueue(setup, "p", {}, workflow_id=wf)
    other = pgqueue.enqueue(setup, "o", {}, workflow_id=wf, delay=3600)  # never claimed here
    parents = [parent, other] if cancelled == "other_parent" else [parent]
    child = pgqueue.enqueue(setup, "c", {}, depends_on=parents, workflow_id=wf)
    (running,) = pgqueue.claim(setup, ["default"], limit=10, worker_id="w")
    assert running.id == parent.id

    completer, canceller = writer(connect), writer(connect)

    def complete() -> None:
        pgqueue.complete(completer, running.lease, "done")

    def cancel() -> None:
        if cancelled == "child":
            pgqueue.cancel(canceller, child.id)
        elif cancelled == "workflow":
            pgqueue.cancel_workflow(canceller, wf)
        else:
            pgqueue.cancel(canceller, other.id)

    sides = [(completer, complete), (canceller, cancel)]
    race(connect, *(sides if first == "completion" else sides[::-1]))

    task = pgqueue.get_task(setup, child.id)
    assert task.status is TaskStatus.CANCELLED
    assert task.finished_at is not None
    # Cancelled by the operator, or by the other parent's cancel; never by the parent, which
    # completed.
    assert task.cancelled_by == (other.id if cancelled == "other_parent" else None)
    done = pgqueue.get_task(setup, parent.id)
    assert (done.status, done.result) == (TaskStatus.COMPLETED, "done")
    assert pgqueue.list_tasks(setup, status="waiting") == []
    # Not claimable: it was not released after it was cancelled.
    later = pgqueue.claim(setup, ["default"], limit=10, worker_id="w2")
    assert child.id not in {t.id for t in later}


@pytest.mark.parametrize("first", ["completion", "replay"])
def test_a_replay_and_another_parents_completion_in_concurrent_transactions(
    connect: Connect, first: str
) -> None:
    """A child of two parents, one dead-lettered (which cancelled the child) and one running:
    the replay of the dead one (which revives the child) and the completion of the running one
    share the child's bucket and row. Whichever goes first, no deadlock, and the child ends
    waiting for the replayed parent alone, then runs once after it."""
    setup = connect()
    dead = pgqueue.enqueue(setup, "d", {}, max_attempts=1)
    (claimed,) = pgqueue.claim(setup, ["default"], limit=1, worker_id="w")
    pgqueue.fail(setup, claimed.lease, "boom")
    running = pgqueue.enqueue(setup, "r", {})
    child = pgqueue.enqueue(setup, "c", {}, depends_on=[running, dead])  # doomed at insert
    (claimed,) = pgqueue.claim(setup, ["default"], limit=1, worker_id="w")
    assert claimed.id == running.id
    assert pgqueue.get_task(setup, child.id).cancelled_by == dead.id
    completer, replayer = writer(connect), writer(connect)

    def complete() -> None:
        pgqueue.complete(completer, claimed.lease, "done")

    def replay() -> None:
        assert pgqueue.replay(replayer, [dead.id]) == [dead.id]

    sides = [(completer, complete), (replayer, replay)]
    race(connect, *(sides if first == "completion" else sides[::-1]))
    task = pgqueue.get_task(setup, child.id)
    assert (task.status, task.cancelled_by, task.parents_pending) == (TaskStatus.WAITING, None, 1)
    (again,) = pgqueue.claim(setup, ["default"], limit=10, worker_id="w")
    assert again.id == dead.id
    pgqueue.complete(setup, again.lease, "ok")
    (last,) = pgqueue.claim(setup, ["default"], limit=10, worker_id="w")
    assert last.id == child.id
