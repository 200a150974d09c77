"""Idempotency keys: a key names one task for as long as the task exists, whatever its status,
and concurrent producers of the same key end up with that one task."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import pgqueue

KEY = "order-42:receipt"


def count_tasks(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0]


def enqueue_single(conn, key, payload):
    return pgqueue.enqueue(conn, "send_receipt", payload, idempotency_key=key)


def enqueue_batched(conn, key, payload):
    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "unrelated"},
            {"type": "send_receipt", "payload": payload, "idempotency_key": key},
        ],
    )
    return results[1]


SUBMIT = pytest.mark.parametrize(
    "submit", [enqueue_single, enqueue_batched], ids=["enqueue", "enqueue_many"]
)


def claim_one(conn):
    [claimed] = pgqueue.claim(conn, ["default"], limit=1, worker_id="worker-1")
    return claimed


def assert_returns_original(conn, submit, original, status):
    again = submit(conn, KEY, {"attempt": "second"})
    assert again.created is False
    assert again.id == original.id
    assert again.task.status is status
    assert again.task.payload == {"attempt": "first"}
    rows = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE idempotency_key = %s", [KEY]
    ).fetchone()
    assert rows[0] == 1
    return again.task


# --- every status ----------------------------------------------------------------------------


@SUBMIT
def test_repeated_key_returns_the_queued_original(conn, submit):
    original = enqueue_single(conn, KEY, {"attempt": "first"})
    assert original.created

    assert_returns_original(conn, submit, original, pgqueue.TaskStatus.QUEUED)


@SUBMIT
def test_repeated_key_returns_the_running_original(conn, submit):
    original = enqueue_single(conn, KEY, {"attempt": "first"})
    claimed = claim_one(conn)
    assert claimed.id == original.id

    task = assert_returns_original(conn, submit, original, pgqueue.TaskStatus.RUNNING)
    assert task.lease_owner == "worker-1"
    # The repeat must not have disturbed the lease: the worker can still finish its task.
    pgqueue.complete(conn, claimed.lease, {"ok": True})
    assert pgqueue.get_task(conn, original.id).status is pgqueue.TaskStatus.COMPLETED


@SUBMIT
def test_repeated_key_returns_the_completed_original_with_its_result(conn, submit):
    original = enqueue_single(conn, KEY, {"attempt": "first"})
    pgqueue.complete(conn, claim_one(conn).lease, {"receipt": "R-1001", "pages": 2})

    task = assert_returns_original(conn, submit, original, pgqueue.TaskStatus.COMPLETED)
    assert task.result == {"receipt": "R-1001", "pages": 2}
    assert task.finished_at is not None


@SUBMIT
def test_repeated_key_returns_the_dead_lettered_original(conn, submit):
    original = pgqueue.enqueue(
        conn, "send_receipt", {"attempt": "first"}, idempotency_key=KEY, max_attempts=1
    )
    outcome = pgqueue.fail(conn, claim_one(conn).lease, "smtp down")
    assert outcome.outcome is pgqueue.FailOutcome.DEAD

    task = assert_returns_original(conn, submit, original, pgqueue.TaskStatus.FAILED)
    assert task.last_error == "smtp down"
    # The key did not resurrect the work: nothing with this type became claimable.
    claimable = [t.type for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w2")]
    assert "send_receipt" not in claimable


@SUBMIT
def test_repeated_key_returns_the_cancelled_original(conn, submit):
    original = enqueue_single(conn, KEY, {"attempt": "first"})
    pgqueue.cancel(conn, original.id)

    assert_returns_original(conn, submit, original, pgqueue.TaskStatus.CANCELLED)
    claimable = [t.type for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w")]
    assert "send_receipt" not in claimable


def test_repeated_key_in_the_same_open_transaction_returns_the_same_task(connect, conn):
    tx = connect(autocommit=False)
    first = enqueue_single(tx, KEY, {"attempt": "first"})
    second = enqueue_single(tx, KEY, {"attempt": "second"})
    tx.commit()

    assert first.created and not second.created
    assert second.id == first.id
    assert count_tasks(conn) == 1


def test_different_keys_create_different_tasks(conn):
    a = enqueue_single(conn, "key-a", {"attempt": "first"})
    b = enqueue_single(conn, "key-b", {"attempt": "first"})
    no_key_1 = pgqueue.enqueue(conn, "send_receipt", {"attempt": "first"})
    no_key_2 = pgqueue.enqueue(conn, "send_receipt", {"attempt": "first"})

    assert all(r.created for r in (a, b, no_key_1, no_key_2))
    assert len({a.id, b.id, no_key_1.id, no_key_2.id}) == 4
    assert count_tasks(conn) == 4


# --- concurrent producers --------------------------------------------------------------------

THREADS = 8


def race(connections, submit):
    """Every connection submits KEY at the same moment; returns each one's result."""
    barrier = threading.Barrier(len(connections))

    def producer(index, c):
        barrier.wait(timeout=10)
        return submit(c, KEY, {"producer": index})

    with ThreadPoolExecutor(max_workers=len(connections)) as pool:
        futures = [pool.submit(producer, i, c) for i, c in enumerate(connections)]
        return [f.result(timeout=30) for f in futures]


@SUBMIT
def test_concurrent_producers_of_one_key_get_exactly_one_task(connect, conn, submit):
    connections = [connect(autocommit=True) for _ in range(THREADS)]

    results = race(connections, submit)

    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    rows = conn.execute(
        "SELECT id, payload FROM pgqueue.tasks WHERE idempotency_key = %s", [KEY]
    ).fetchall()
    assert len(rows) == 1
    assert rows[0][0] == results[0].id
    winner = next(i for i, r in enumerate(results) if r.created)
    assert rows[0][1] == {"producer": winner}


@SUBMIT
def test_concurrent_producers_in_explicit_transactions_get_exactly_one_task(connect, conn, submit):
    connections = [connect(autocommit=False) for _ in range(THREADS)]

    def submit_and_commit(c, key, payload):
        result = submit(c, key, payload)
        c.commit()
        return result

    results = race(connections, submit_and_commit)

    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    rows = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE idempotency_key = %s", [KEY]
    ).fetchone()
    assert rows[0] == 1


# --- a key held by an open transaction -------------------------------------------------------


def wait_until_blocked(observer, waiter_pid, holder_pid, timeout=10.0):
    """Return once the waiter's backend is waiting on the holder's lock (polls the server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        blockers = observer.execute("SELECT pg_blocking_pids(%s)", [waiter_pid]).fetchone()[0]
        if holder_pid in blockers:
            return
    pytest.fail(f"backend {waiter_pid} never blocked on {holder_pid}")


def start_second_enqueue(connection):
    """Run the second producer's enqueue in a thread; returns (thread, outcome dict)."""
    outcome = {}

    def second():
        try:
            outcome["result"] = enqueue_single(connection, KEY, {"attempt": "second"})
        except BaseException as exc:  # reported by the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.no_pooler("finds who blocks whom by backend pid; through a pooler a client sees none")
def test_second_enqueue_waits_for_the_open_holder_then_returns_its_task(connect, conn):
    holder = connect(autocommit=False)
    waiter = connect(autocommit=True)
    first = enqueue_single(holder, KEY, {"attempt": "first"})

    thread, outcome = start_second_enqueue(waiter)
    wait_until_blocked(conn, waiter.info.backend_pid, holder.info.backend_pid)
    assert thread.is_alive()
    assert outcome == {}

    holder.commit()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    second = outcome["result"]
    assert second.created is False
    assert second.id == first.id
    assert second.task.payload == {"attempt": "first"}
    assert count_tasks(conn) == 1


@pytest.mark.no_pooler("finds who blocks whom by backend pid; through a pooler a client sees none")
def test_second_enqueue_creates_its_own_task_when_the_holder_rolls_back(connect, conn):
    holder = connect(autocommit=False)
    waiter = connect(autocommit=True)
    first = enqueue_single(holder, KEY, {"attempt": "first"})

    thread, outcome = start_second_enqueue(waiter)
    wait_until_blocked(conn, waiter.info.backend_pid, holder.info.backend_pid)
    assert thread.is_alive()

    holder.rollback()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    second = outcome["result"]
    assert second.created is True
    assert second.id != first.id
    assert pgqueue.get_task(conn, second.id).payload == {"attempt": "second"}
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, first.id)
    assert count_tasks(conn) == 1
