"""Claiming: order, queue selection, scheduling, lease bookkeeping and concurrency.

The clock is injected with ``now=`` everywhere it matters, so nothing here sleeps.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def lease_row(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT status, attempts, lease_owner, lease_token, lease_expires_at, started_at"
            " FROM pgqueue.tasks WHERE id = %s",
            (task_id,),
        )
        row = cur.fetchone()
    assert row is not None
    return row


def claim_one_at_a_time(
    conn: psycopg.Connection[Any], queues: list[str], now: datetime
) -> list[uuid.UUID]:
    """Claim with limit=1 until empty, so the order comes from the SQL, not a client sort."""
    order: list[uuid.UUID] = []
    while batch := pgqueue.claim(conn, queues, limit=1, worker_id="w", now=now):
        assert len(batch) == 1
        order.append(batch[0].id)
    return order


# --- order -----------------------------------------------------------------------------------


def test_claim_takes_high_before_normal_before_low_whatever_the_insertion_order(conn):
    # Inserted low first and high last, interleaved, each with a later created_at.
    inserted: dict[str, list[uuid.UUID]] = {"high": [], "normal": [], "low": []}
    for i, prio in enumerate(["low", "normal", "high", "low", "normal", "high", "low"]):
        result = pgqueue.enqueue(conn, "job", {"i": i}, priority=prio, now=T0 + seconds(i))
        inserted[prio].append(result.id)

    order = claim_one_at_a_time(conn, ["default"], now=T0 + seconds(60))

    assert order == inserted["high"] + inserted["normal"] + inserted["low"]


def test_claim_batch_is_returned_in_priority_then_fifo_order(conn):
    ids = {}
    for i, prio in enumerate(["low", "high", "normal", "high"]):
        ids[i] = pgqueue.enqueue(conn, "job", {}, priority=prio, now=T0 + seconds(i)).id

    claimed = pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=T0 + seconds(60))

    assert [c.id for c in claimed] == [ids[1], ids[3], ids[2], ids[0]]
    assert [c.priority for c in claimed] == [
        pgqueue.Priority.HIGH,
        pgqueue.Priority.HIGH,
        pgqueue.Priority.NORMAL,
        pgqueue.Priority.LOW,
    ]


def test_claim_is_fifo_by_created_at_within_one_priority(conn):
    # Enqueue in an order that differs from created_at order (and from id order): the
    # created_at given through now= must decide.
    offsets = [5, 1, 4, 2, 3, 0]
    by_offset = {
        off: pgqueue.enqueue(conn, "job", {"off": off}, now=T0 + seconds(off)).id for off in offsets
    }

    order = claim_one_at_a_time(conn, ["default"], now=T0 + seconds(60))

    assert order == [by_offset[off] for off in sorted(offsets)]


def test_a_claim_of_two_queues_takes_each_priority_across_both_before_the_next(conn):
    """Queue "alpha" holds low and normal tasks, queue "beta" high ones, created interleaved
    (a low one first, a high one last), and "alpha" is named first and sorts first: claims of
    both queues in batches smaller than the backlog take every high task before any normal
    one and every normal before any low, first in first out within a level, whichever queue
    holds them. A claim ordered by queue, or by age alone, takes alpha's or the oldest first."""
    pattern = [
        ("alpha", "low"),
        ("beta", "high"),
        ("alpha", "normal"),
        ("alpha", "low"),
        ("beta", "high"),
        ("alpha", "normal"),
        ("beta", "high"),
        ("alpha", "low"),
        ("alpha", "normal"),
    ]
    names = {}  # each task by its queue, priority and place in the creation order
    for i, (queue, prio) in enumerate(pattern):
        task = pgqueue.enqueue(conn, "job", {}, queue=queue, priority=prio, now=T0 + seconds(i))
        names[task.id] = f"{queue} {prio} #{i}"

    batches = []
    while batch := pgqueue.claim(
        conn, ["alpha", "beta"], limit=2, worker_id="w", now=T0 + seconds(60)
    ):
        batches.append([names[t.id] for t in batch])

    assert batches == [
        ["beta high #1", "beta high #4"],
        ["beta high #6", "alpha normal #2"],
        ["alpha normal #5", "alpha normal #8"],
        ["alpha low #0", "alpha low #3"],
        ["alpha low #7"],
    ]


def test_limited_claim_takes_the_oldest_tasks_first(conn):
    ids = [pgqueue.enqueue(conn, "job", {}, now=T0 + seconds(i)).id for i in range(6)]

    first = pgqueue.claim(conn, ["default"], limit=2, worker_id="w", now=T0 + seconds(60))
    second = pgqueue.claim(conn, ["default"], limit=2, worker_id="w", now=T0 + seconds(60))

    assert [c.id for c in first] == ids[:2]
    assert [c.id for c in second] == ids[2:4]


# --- which tasks -----------------------------------------------------------------------------


def test_claim_only_takes_tasks_of_the_requested_queues(conn):
    emails = [pgqueue.enqueue(conn, "send", {}, queue="emails", now=T0).id for _ in range(3)]
    reports = [pgqueue.enqueue(conn, "build", {}, queue="reports", now=T0).id for _ in range(2)]
    default = pgqueue.enqueue(conn, "misc", {}, now=T0).id

    got = pgqueue.claim(conn, ["emails"], limit=100, worker_id="w", now=T0 + seconds(1))
    assert {c.id for c in got} == set(emails)
    assert all(c.queue == "emails" for c in got)

    assert pgqueue.claim(conn, ["nothing-here"], limit=100, worker_id="w", now=T0) == []
    for task_id in [*reports, default]:
        assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.QUEUED

    got = pgqueue.claim(conn, ["reports", "default"], limit=100, worker_id="w", now=T0 + seconds(1))
    assert {c.id for c in got} == {*reports, default}


def test_delayed_task_is_not_claimed_until_its_delay_has_passed(conn):
    task = pgqueue.enqueue(conn, "later", {}, delay=60, now=T0).task
    assert task.visible_after == T0 + seconds(60)

    assert pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=T0) == []
    assert pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=T0 + seconds(59.999)) == []
    assert pgqueue.get_task(conn, task.id).status is pgqueue.TaskStatus.QUEUED

    got = pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=T0 + seconds(60))
    assert [c.id for c in got] == [task.id]


def test_task_with_run_at_is_not_claimed_before_run_at(conn):
    run_at = T0 + timedelta(hours=2)
    scheduled = pgqueue.enqueue(conn, "at", {}, run_at=run_at, now=T0).id
    ready = pgqueue.enqueue(conn, "now", {}, now=T0).id

    early = pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=run_at - seconds(1))
    assert [c.id for c in early] == [ready]

    due = pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=run_at)
    assert [c.id for c in due] == [scheduled]


def test_scheduled_task_does_not_hold_back_later_ready_tasks_of_higher_priority(conn):
    pgqueue.enqueue(conn, "later", {}, priority="high", delay=600, now=T0)
    ready = pgqueue.enqueue(conn, "now", {}, priority="low", now=T0).id

    got = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + seconds(1))

    assert [c.id for c in got] == [ready]


# --- what a claim records --------------------------------------------------------------------


def test_claim_marks_running_counts_the_attempt_and_sets_the_lease(conn):
    task_id = pgqueue.enqueue(conn, "job", {"x": 1}, max_attempts=4, now=T0).id
    claimed_at = T0 + seconds(5)

    (claimed,) = pgqueue.claim(
        conn, ["default"], limit=1, worker_id="worker-7", lease_seconds=45, now=claimed_at
    )

    assert claimed.id == task_id
    assert claimed.payload == {"x": 1}
    assert claimed.attempts == 1
    assert claimed.max_attempts == 4
    assert claimed.lease_expires_at == claimed_at + seconds(45)
    assert claimed.lease == pgqueue.Lease(task_id, claimed.lease_token)
    row = lease_row(conn, task_id)
    assert row == {
        "status": "running",
        "attempts": 1,
        "lease_owner": "worker-7",
        "lease_token": claimed.lease_token,
        "lease_expires_at": claimed_at + seconds(45),
        "started_at": claimed_at,
    }
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING


def test_each_claim_counts_another_attempt_and_issues_a_new_lease_token(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=5, now=T0).id

    (first,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="a", now=T0 + seconds(1))
    pgqueue.fail(conn, first.lease, "boom", retry_after=0, now=T0 + seconds(2))
    (second,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="b", now=T0 + seconds(3))

    assert second.id == task_id
    assert (first.attempts, second.attempts) == (1, 2)
    assert first.lease_token != second.lease_token
    assert lease_row(conn, task_id)["lease_owner"] == "b"


def test_claim_never_returns_more_than_limit(conn):
    pgqueue.enqueue_many(conn, [{"type": "job"} for _ in range(10)], now=T0)
    now = T0 + seconds(1)

    assert len(pgqueue.claim(conn, ["default"], limit=3, worker_id="w", now=now)) == 3
    assert len(pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=now)) == 1
    assert len(pgqueue.claim(conn, ["default"], limit=100, worker_id="w", now=now)) == 6
    assert pgqueue.claim(conn, ["default"], limit=100, worker_id="w", now=now) == []


def test_running_task_is_not_claimed_again(conn):
    pgqueue.enqueue(conn, "job", {}, now=T0)
    (held,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="a", now=T0 + seconds(1))

    # Even long after the lease expired: only the sweep may take it back.
    assert pgqueue.claim(conn, ["default"], limit=1, worker_id="b", now=T0 + seconds(3600)) == []
    assert lease_row(conn, held.id)["lease_token"] == held.lease_token


@pytest.mark.parametrize("limit", [0, -1, 10_001])
def test_claim_rejects_a_limit_out_of_range(conn, limit):
    pgqueue.enqueue(conn, "job", {}, now=T0)
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.claim(conn, ["default"], limit=limit, worker_id="w", now=T0)
    assert pgqueue.list_tasks(conn, status="queued")[0].attempts == 0


@pytest.mark.parametrize("lease_seconds", [0, -30])
def test_claim_rejects_a_non_positive_lease(conn, lease_seconds):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.claim(
            conn, ["default"], limit=1, worker_id="w", lease_seconds=lease_seconds, now=T0
        )
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.QUEUED


@pytest.mark.parametrize("lease_seconds", [float("nan"), float("inf")])
def test_claim_rejects_a_non_finite_lease_with_validation_error(conn, lease_seconds):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.claim(
            conn, ["default"], limit=1, worker_id="w", lease_seconds=lease_seconds, now=T0
        )
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.QUEUED


# --- concurrency -----------------------------------------------------------------------------

N_PROCESSES = 8
N_PROCESS_TASKS = 3000
N_THREADS = 12
N_THREAD_TASKS = 2000


def enqueue_in_chunks(conn: psycopg.Connection[Any], n: int, chunk: int = 500) -> set[uuid.UUID]:
    ids: set[uuid.UUID] = set()
    priorities = ["high", "normal", "low"]
    for start in range(0, n, chunk):
        batch = [
            {"type": "work", "payload": {"n": i}, "priority": priorities[i % 3]}
            for i in range(start, min(start + chunk, n))
        ]
        ids.update(r.id for r in pgqueue.enqueue_many(conn, batch))
    assert len(ids) == n
    return ids


def drain(url: str, worker_id: str, batch_size: int, start: Any) -> list[str]:
    """Claim in batches until the queue is empty, completing everything claimed."""
    claimed: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        start.wait(timeout=60)
        while batch := pgqueue.claim(conn, ["default"], limit=batch_size, worker_id=worker_id):
            done = pgqueue.complete_many(conn, [(t.lease, {"by": worker_id}) for t in batch])
            if done != {t.id for t in batch}:
                raise AssertionError(
                    f"{worker_id}: completion refused for {len(batch) - len(done)}"
                )
            claimed.extend(str(t.id) for t in batch)
    return claimed


def _process_main(url: str, index: int, start: Any, results: Any) -> None:
    try:
        results.put((index, drain(url, f"proc-{index}", 10 + 5 * index, start), None))
    except BaseException as exc:
        results.put((index, [], repr(exc)))


def assert_each_claimed_exactly_once(
    conn: psycopg.Connection[Any], all_ids: set[uuid.UUID], per_worker: list[list[str]]
) -> None:
    flat = [uuid.UUID(i) for ids in per_worker for i in ids]
    assert len(flat) == len(set(flat)), "some task was claimed by two claimers"
    assert set(flat) == all_ids
    with conn.cursor() as cur:
        cur.execute(
            "SELECT status, attempts, count(*) FROM pgqueue.tasks GROUP BY status, attempts"
        )
        assert cur.fetchall() == [("completed", 1, len(all_ids))]
    # Several claimers did real work (the barrier released them together).
    assert sum(1 for ids in per_worker if ids) >= 2


def test_concurrent_claimer_processes_claim_every_task_exactly_once(conn, database_url):
    all_ids = enqueue_in_chunks(conn, N_PROCESS_TASKS)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(N_PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_process_main, args=(database_url, i, start, results), daemon=True)
        for i in range(N_PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [err for _, _, err in outcomes if err]
    assert errors == []
    assert all(p.exitcode == 0 for p in procs)

    assert_each_claimed_exactly_once(conn, all_ids, [ids for _, ids, _ in outcomes])


def test_concurrent_claimer_threads_claim_every_task_exactly_once(conn, database_url):
    all_ids = enqueue_in_chunks(conn, N_THREAD_TASKS)
    start = threading.Barrier(N_THREADS)
    results: queue_module.Queue[tuple[int, list[str], str | None]] = queue_module.Queue()

    def run(index: int) -> None:
        try:
            results.put((index, drain(database_url, f"thread-{index}", 17 + index, start), None))
        except BaseException as exc:
            start.abort()
            results.put((index, [], repr(exc)))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    outcomes = [results.get_nowait() for _ in threads]
    assert [err for _, _, err in outcomes if err] == []

    assert_each_claimed_exactly_once(conn, all_ids, [ids for _, ids, _ in outcomes])


def test_open_claim_transactions_do_not_block_each_other_and_get_disjoint_tasks(conn, connect):
    ids = [pgqueue.enqueue(conn, "job", {}, now=T0 + seconds(i)).id for i in range(10)]
    now = T0 + seconds(60)
    a = connect(autocommit=False)
    b = connect(autocommit=False)
    # Were the claim to wait for A's row locks instead of skipping them, B would fail with
    # LockNotAvailable after a second instead of hanging the test.
    b.execute("SET lock_timeout = '1s'")
    b.execute("SET statement_timeout = '10s'")

    claimed_a = pgqueue.claim(a, ["default"], limit=4, worker_id="a", now=now)
    claimed_b = pgqueue.claim(b, ["default"], limit=4, worker_id="b", now=now)

    # Both transactions are still open here.
    assert a.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    assert b.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    assert [t.id for t in claimed_a] == ids[:4]
    assert [t.id for t in claimed_b] == ids[4:8]
    # Uncommitted, so an outside observer still sees every task queued.
    assert len(pgqueue.list_tasks(conn, status="queued")) == 10

    # A third claimer passes both sets of locked rows.
    claimed_c = pgqueue.claim(conn, ["default"], limit=10, worker_id="c", now=now)
    assert [t.id for t in claimed_c] == ids[8:]

    b.commit()
    a.rollback()
    statuses = {t.id: (t.status, t.attempts) for t in pgqueue.list_tasks(conn)}
    queued = (pgqueue.TaskStatus.QUEUED, 0)
    running = (pgqueue.TaskStatus.RUNNING, 1)
    assert [statuses[i] for i in ids] == [queued] * 4 + [running] * 6

    # A's rolled-back claim left its tasks claimable again.
    again = pgqueue.claim(conn, ["default"], limit=10, worker_id="d", now=now)
    assert [t.id for t in again] == ids[:4]
