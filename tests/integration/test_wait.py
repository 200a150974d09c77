"""pgqueue.wait and pgqueue.aio.wait: the finished task, or WaitTimeout.

Waits in these tests use a poll interval of an hour unless a test is about the poll, and a
wait that reaches its deadline reads the task once more before it gives up; so a wait that
returns before its timeout was woken by the notification the finishing statement sent (the
only other way out, the deadline, takes the whole timeout by construction). That is what
``Waiting.join`` checks; the timeout is two minutes, so a busy machine only makes a test take
longer. ``test_every_path_that_finishes_a_task_notifies_its_waiters`` checks the notification
itself, path by path.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from processes import wait_until

import pgqueue
import pgqueue.aio
from pgqueue.models import Task, TaskStatus
from pgqueue.queries import driver

NO_POLL = 3600.0
LONG = 120.0


def waiters(conn: psycopg.Connection[Any], task_id: uuid.UUID | None = None) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.task_waiters WHERE %(id)s::uuid IS NULL OR task_id = %(id)s",
        {"id": task_id},
    ).fetchone()
    assert row is not None
    return int(row[0])


class Waiting:
    """A wait running in a thread on its own autocommit connection."""

    def __init__(self, url: str, task_id: uuid.UUID, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", LONG)
        kwargs.setdefault("poll_interval", NO_POLL)
        self.result: Task | None = None
        self.error: BaseException | None = None
        self.timeout = kwargs["timeout"]
        self.elapsed: float | None = None
        self._conn = psycopg.connect(url, autocommit=True)
        self._thread = threading.Thread(target=self._run, args=(task_id, kwargs))
        self._thread.start()

    def _run(self, task_id: uuid.UUID, kwargs: dict[str, Any]) -> None:
        began = time.monotonic()
        try:
            self.result = pgqueue.wait(self._conn, task_id, **kwargs)
        except BaseException as exc:
            self.error = exc
        finally:
            self.elapsed = time.monotonic() - began
            self._conn.close()

    def join(self, timeout: float = LONG) -> Task:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the wait did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None and self.elapsed is not None
        # Before the deadline: woken (by the notification, or the poll when a test asks for
        # one), not by the last read at the deadline.
        assert self.elapsed < self.timeout, f"returned only at its deadline ({self.elapsed} s)"
        return self.result


@pytest.fixture
def start_wait(
    database_url: str, conn: psycopg.Connection[Any]
) -> Iterator[Callable[..., Waiting]]:
    """Start a wait in a thread and return once it is registered (its row is there)."""
    started: list[Waiting] = []

    def start(task_id: uuid.UUID, **kwargs: Any) -> Waiting:
        kwargs.setdefault("timeout", LONG)
        kwargs.setdefault("poll_interval", NO_POLL)
        before = waiters(conn, task_id)
        waiting = Waiting(database_url, task_id, **kwargs)
        started.append(waiting)
        wait_until(lambda: waiters(conn, task_id) > before, 30, "the waiter's registration")
        return waiting

    yield start
    for waiting in started:
        waiting._thread.join(LONG)


def claim_one(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.ClaimedTask:
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    assert claimed.id == task_id
    return claimed


# --- it returns when the task is final -------------------------------------------------------


def test_wait_returns_the_completed_task_when_it_completes(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {"w": 1}).id
    waiting = start_wait(task_id)
    claimed = claim_one(conn, task_id)
    pgqueue.complete(conn, claimed.lease, {"ok": True})
    task = waiting.join()
    assert (task.id, task.status, task.result, task.attempts) == (
        task_id,
        TaskStatus.COMPLETED,
        {"ok": True},
        1,
    )
    assert waiters(conn) == 0  # the waiter removed its registration


def test_wait_returns_the_dead_letter_when_the_last_attempt_fails(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "boom", {}, max_attempts=1).id
    waiting = start_wait(task_id)
    pgqueue.fail(conn, claim_one(conn, task_id).lease, "RuntimeError: boom")
    task = waiting.join()
    assert task.status is TaskStatus.FAILED and task.attempts == 1
    assert task.last_error is not None and "boom" in task.last_error


def test_a_failure_that_will_be_retried_does_not_end_the_wait(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "flaky", {}, max_attempts=2).id
    waiting = start_wait(task_id)
    pgqueue.fail(conn, claim_one(conn, task_id).lease, "RuntimeError: once", retry_after=0)
    assert pgqueue.get_task(conn, task_id).status is TaskStatus.QUEUED
    pgqueue.complete(conn, claim_one(conn, task_id).lease, "second time")
    task = waiting.join()
    assert (task.status, task.result, task.attempts) == (TaskStatus.COMPLETED, "second time", 2)


def test_wait_returns_the_cancelled_task_when_a_queued_task_is_cancelled(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    waiting = start_wait(task_id)
    pgqueue.cancel(conn, task_id)
    task = waiting.join()
    assert task.status is TaskStatus.CANCELLED and task.attempts == 0


def test_wait_returns_when_the_handler_cancels_its_task(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    waiting = start_wait(task_id)
    pgqueue.cancel_leased(conn, claim_one(conn, task_id).lease, "not wanted")
    assert waiting.join().status is TaskStatus.CANCELLED


def test_wait_returns_when_a_task_whose_cancellation_was_asked_is_released_or_fails(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    """A running task flagged by cancel() ends cancelled when its worker gives it back
    (release: graceful shutdown) or its attempt fails; both paths wake the waiter."""
    released, failed = (pgqueue.enqueue(conn, "resize", {}).id for _ in range(2))
    leases = {c.id: c.lease for c in pgqueue.claim(conn, ["default"], limit=2, worker_id="t")}
    waits = [start_wait(released), start_wait(failed)]
    for task_id in (released, failed):
        assert pgqueue.cancel(conn, task_id).status is TaskStatus.RUNNING  # flagged only
    pgqueue.release(conn, [leases[released]])
    pgqueue.fail(conn, leases[failed], "RuntimeError: stopped")
    assert [w.join().status for w in waits] == [TaskStatus.CANCELLED, TaskStatus.CANCELLED]


def test_wait_returns_when_the_sweep_dead_letters_an_expired_lease(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}, max_attempts=1).id
    claim_one(conn, task_id)
    waiting = start_wait(task_id)
    later = datetime.now(UTC) + timedelta(hours=1)
    swept = pgqueue.sweep_expired(conn, now=later)
    assert swept.dead == [task_id]
    assert waiting.join().status is TaskStatus.FAILED


def test_wait_on_a_finished_task_returns_it_at_once(conn: psycopg.Connection[Any]) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    pgqueue.cancel(conn, task_id)
    assert pgqueue.wait(conn, task_id, timeout=LONG).status is TaskStatus.CANCELLED
    assert waiters(conn) == 0


# --- timeouts and refusals -------------------------------------------------------------------


def test_wait_times_out_naming_the_task_its_type_and_its_status(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "slow.report", {}).id
    with pytest.raises(pgqueue.WaitTimeout) as caught:
        pgqueue.wait(conn, task_id, timeout=0.3)
    err = caught.value
    assert isinstance(err, TimeoutError) and isinstance(err, pgqueue.PgQueueError)
    assert str(task_id) in str(err) and "slow.report" in str(err) and "queued" in str(err)
    assert err.task.id == task_id and err.task.status is TaskStatus.QUEUED
    assert err.task_id == task_id and err.status == "queued" and err.timeout == 0.3
    assert waiters(conn) == 0  # a timed-out wait leaves nothing behind
    # The connection is usable as before: not listening, not in a transaction.
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pgqueue.get_task(conn, task_id).status is TaskStatus.QUEUED


def test_a_wait_for_a_task_no_worker_claimed_says_which_queue_needs_one(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "send_receipt", {}, queue="mail").id
    with pytest.raises(pgqueue.WaitTimeout) as caught:
        pgqueue.wait(conn, task_id, timeout=0.2)
    assert "no worker has claimed it yet" in str(caught.value)
    assert "--queue mail" in str(caught.value)


def test_a_wait_for_a_task_not_due_yet_says_when_it_is_due_instead(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "send_receipt", {}, delay=3600).id
    with pytest.raises(pgqueue.WaitTimeout) as caught:
        pgqueue.wait(conn, task_id, timeout=0.2)
    assert "not due until" in str(caught.value)
    assert "no worker has claimed" not in str(caught.value)


def test_wait_inside_the_transaction_that_enqueued_the_task_is_refused(
    connect: Callable[..., psycopg.Connection[Any]], conn: psycopg.Connection[Any]
) -> None:
    tx = connect(autocommit=False)
    task_id = pgqueue.enqueue(tx, "resize", {}).id
    with pytest.raises(pgqueue.WaitInTransaction, match="commit first") as caught:
        pgqueue.wait(tx, task_id, timeout=LONG)
    assert str(task_id) in str(caught.value) and caught.value.task_id == task_id
    tx.rollback()
    assert waiters(conn) == 0  # refused before anything was written
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, task_id)


def test_wait_on_a_connection_without_autocommit_works_once_committed(
    connect: Callable[..., psycopg.Connection[Any]], conn: psycopg.Connection[Any]
) -> None:
    tx = connect(autocommit=False)
    task_id = pgqueue.enqueue(tx, "resize", {}).id
    tx.commit()
    pgqueue.cancel(conn, task_id)
    assert pgqueue.wait(tx, task_id, timeout=LONG).status is TaskStatus.CANCELLED
    # Its reads ran in transactions of their own, all ended: the caller's connection is idle.
    assert tx.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_wait_for_an_unknown_task_is_task_not_found(conn: psycopg.Connection[Any]) -> None:
    unknown = uuid.uuid4()
    with pytest.raises(pgqueue.TaskNotFound, match=str(unknown)):
        pgqueue.wait(conn, unknown, timeout=LONG)
    with pytest.raises(pgqueue.TaskNotFound, match="not-a-uuid"):
        pgqueue.wait(conn, "not-a-uuid", timeout=LONG)
    assert waiters(conn) == 0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True, None])
def test_a_bad_timeout_is_refused_naming_the_field(conn: psycopg.Connection[Any], bad: Any) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.wait(conn, task_id, timeout=bad)
    assert caught.value.field == "timeout"
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.wait(conn, task_id, timeout=1, poll_interval=bad)
    assert caught.value.field == "poll_interval"
    assert waiters(conn) == 0


# --- notifications and the poll --------------------------------------------------------------


def test_a_missed_notification_is_covered_by_the_poll(
    conn: psycopg.Connection[Any], start_wait: Callable[..., Waiting]
) -> None:
    """A task made final by a path that sends no wake-up (here a bare UPDATE) is still seen,
    at the next poll."""
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    waiting = start_wait(task_id, poll_interval=0.2)
    conn.execute(
        "UPDATE pgqueue.tasks SET status = 'completed', finished_at = now() WHERE id = %s",
        (task_id,),
    )
    assert waiting.join().status is TaskStatus.COMPLETED


def test_finishing_a_task_nobody_waits_on_sends_no_notification(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue_done")
    ids = [r.id for r in pgqueue.enqueue_many(conn, [{"type": "t"} for _ in range(3)])]
    claimed = pgqueue.claim(conn, ["default"], limit=3, worker_id="test")
    pgqueue.complete_many(conn, [(c.lease, None) for c in claimed])
    pgqueue.cancel(conn, pgqueue.enqueue(conn, "t", {}).id)
    assert [n for n in listener.notifies(timeout=0.5)] == []
    # ...and one somebody waits on does, with its id.
    waited = pgqueue.enqueue(conn, "t", {}).id
    conn.execute(
        "INSERT INTO pgqueue.task_waiters VALUES (%s, gen_random_uuid(), now() + interval '1 h')",
        (waited,),
    )
    pgqueue.cancel(conn, waited)
    (note,) = list(listener.notifies(timeout=30, stop_after=1))
    assert (note.channel, note.payload) == ("pgqueue_done", str(waited))
    assert len(ids) == 3


def _finish(conn: psycopg.Connection[Any], path: str, task_id: uuid.UUID) -> TaskStatus:
    """Make ``task_id`` (queued, type 'resize', max_attempts 1) final by ``path``."""
    if path == "cancel queued":
        return pgqueue.cancel(conn, task_id).status
    if path == "expiry":
        conn.execute(
            "UPDATE pgqueue.tasks SET expires_at = now() + interval '1 minute' WHERE id = %s",
            (task_id,),
        )
        assert pgqueue.expire(conn, now=datetime.now(UTC) + timedelta(hours=1)) == [task_id]
        return pgqueue.get_task(conn, task_id).status
    claimed = claim_one(conn, task_id)
    if path == "complete":
        pgqueue.complete_many(conn, [(claimed.lease, "done")])
    elif path == "last failure":
        pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")
    elif path == "handler cancels":
        pgqueue.cancel_leased(conn, claimed.lease, "no")
    elif path == "release after cancel asked":
        pgqueue.cancel(conn, task_id)
        pgqueue.release(conn, [claimed.lease])
    elif path == "failure after cancel asked":
        pgqueue.cancel(conn, task_id)
        pgqueue.fail(conn, claimed.lease, "RuntimeError: stopped", retry_after=0)
    elif path == "snooze after cancel asked":
        pgqueue.cancel(conn, task_id)
        pgqueue.snooze(conn, claimed.lease, 60)
    elif path == "sweep":
        pgqueue.sweep_expired(conn, now=datetime.now(UTC) + timedelta(hours=1))
    return pgqueue.get_task(conn, task_id).status


@pytest.mark.parametrize(
    "path",
    [
        "complete",
        "last failure",
        "cancel queued",
        "handler cancels",
        "release after cancel asked",
        "failure after cancel asked",
        "sweep",
        "expiry",
        "snooze after cancel asked",
    ],
)
def test_every_path_that_finishes_a_task_notifies_its_waiters(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]], path: str
) -> None:
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue_done")
    task_id = pgqueue.enqueue(conn, "resize", {}, max_attempts=1).id
    conn.execute(
        "INSERT INTO pgqueue.task_waiters VALUES (%s, gen_random_uuid(), now() + interval '1 h')",
        (task_id,),
    )
    assert _finish(conn, path, task_id).is_final
    notes = list(listener.notifies(timeout=30, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("pgqueue_done", str(task_id))]


def test_a_failure_that_will_be_retried_notifies_nobody(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue_done")
    task_id = pgqueue.enqueue(conn, "resize", {}, max_attempts=2).id
    conn.execute(
        "INSERT INTO pgqueue.task_waiters VALUES (%s, gen_random_uuid(), now() + interval '1 h')",
        (task_id,),
    )
    pgqueue.fail(conn, claim_one(conn, task_id).lease, "RuntimeError: once")
    assert list(listener.notifies(timeout=0.5)) == []


def test_a_registration_during_a_finish_in_flight_waits_for_it_and_sees_it_final(
    conn: psycopg.Connection[Any],
    connect: Callable[..., psycopg.Connection[Any]],
    start_wait: Callable[..., Waiting],
    database_url: str,
) -> None:
    """The finishing UPDATE holds the row: registration (FOR SHARE) waits for its commit and
    reads the final row, instead of reading 'running' and sleeping until a poll."""
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    claimed = claim_one(conn, task_id)
    finisher = connect(autocommit=False)
    pgqueue.complete(finisher, claimed.lease, 1)  # not committed yet
    waiting = Waiting(database_url, task_id, timeout=LONG, poll_interval=NO_POLL)
    wait_until(
        lambda: conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        ).fetchone()[0],  # type: ignore[index]
        30,
        "the registration to wait for the finisher's lock",
    )
    finisher.commit()
    assert waiting.join().status is TaskStatus.COMPLETED


def test_a_finish_that_waited_for_a_registration_notifies_it(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """The other order: the registration holds the row (FOR SHARE, not yet committed), the
    finishing statement waits for it, and its wake-up (a fresh snapshot, after the lock)
    sees the registration and notifies."""
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    claimed = claim_one(conn, task_id)
    waiter = connect(autocommit=False, direct=True)
    waiter.execute("LISTEN pgqueue_done")
    waiter.commit()
    sql = driver.statements()["task_waiter_add"]
    waiter.execute(sql, {"id": task_id, "waiter": uuid.uuid4(), "seconds": 60})  # open
    finisher = connect()
    done = threading.Thread(target=pgqueue.complete, args=(finisher, claimed.lease, 1))
    done.start()
    wait_until(
        lambda: conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        ).fetchone()[0],  # type: ignore[index]
        30,
        "the finish to wait for the registration's lock",
    )
    waiter.commit()
    done.join(LONG)
    assert not done.is_alive()
    (note,) = list(waiter.notifies(timeout=30, stop_after=1))
    assert note.payload == str(task_id)


# --- async ------------------------------------------------------------------------------------


def test_async_wait_returns_on_completion_and_times_out_alike(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            task_id = (await pgqueue.aio.enqueue(aconn, "resize", {})).id
            with pytest.raises(pgqueue.WaitTimeout, match=str(task_id)):
                await pgqueue.aio.wait(aconn, task_id, timeout=0.3)
            waiting = asyncio.create_task(
                pgqueue.aio.wait(aconn, task_id, timeout=LONG, poll_interval=NO_POLL)
            )
            while not waiters(conn, task_id):
                await asyncio.sleep(0.02)
            began = time.monotonic()
            await asyncio.to_thread(
                lambda: pgqueue.complete(conn, claim_one(conn, task_id).lease, "done")
            )
            task = await asyncio.wait_for(waiting, LONG + 30)
            assert time.monotonic() - began < LONG  # woken, not at its deadline
            assert (task.status, task.result) == (TaskStatus.COMPLETED, "done")

    asyncio.run(scenario())
    assert waiters(conn) == 0


def test_async_wait_inside_a_transaction_is_refused(database_url: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            task_id = (await pgqueue.aio.enqueue(aconn, "resize", {})).id
            with pytest.raises(pgqueue.WaitInTransaction, match=str(task_id)):
                await pgqueue.aio.wait(aconn, task_id, timeout=LONG)

    asyncio.run(scenario())


def test_a_cancelled_async_wait_removes_its_registration(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            task_id = (await pgqueue.aio.enqueue(aconn, "resize", {})).id
            waiting = asyncio.create_task(pgqueue.aio.wait(aconn, task_id, timeout=LONG))
            while not waiters(conn, task_id):
                await asyncio.sleep(0.02)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting

    asyncio.run(scenario())
    assert waiters(conn) == 0


def test_client_wait_returns_the_finished_task(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    with pgqueue.Client(database_url) as client:
        task_id = client.enqueue("resize", {}).id
        with pytest.raises(pgqueue.WaitTimeout):
            client.wait(task_id, timeout=0.2)
        client.cancel(task_id)
        assert client.wait(task_id, timeout=LONG).status is TaskStatus.CANCELLED
