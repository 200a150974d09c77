"""Leases: the fence against stale holders, heartbeats, release, the expired-lease sweep and
cooperative cancellation. The clock is injected with ``now=``; nothing here sleeps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = 30.0


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def row(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> dict[str, Any]:
    """Every column of the task, lease token included."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM pgqueue.tasks WHERE id = %s", (task_id,))
        found = cur.fetchone()
    assert found is not None
    return found


def claim_one(
    conn: psycopg.Connection[Any], now: datetime, worker_id: str = "w", lease: float = LEASE
) -> pgqueue.ClaimedTask:
    claimed = pgqueue.claim(
        conn, ["default"], limit=1, worker_id=worker_id, lease_seconds=lease, now=now
    )
    assert len(claimed) == 1, claimed
    return claimed[0]


def dead_letter_ids(conn: psycopg.Connection[Any]) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("SELECT id FROM pgqueue.dead_letters").fetchall()}


class LostLease:
    """A task claimed by A, expired and swept, then claimed again by B."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
        self.a = claim_one(conn, T0 + seconds(1), worker_id="worker-a")
        self.swept_at = T0 + seconds(1 + LEASE + 1)
        sweep = pgqueue.sweep_expired(conn, now=self.swept_at)
        assert sweep.requeued == [self.task_id]
        # Default backoff after attempt 1 is at most 1 s.
        self.b_at = self.swept_at + seconds(5)
        self.b = claim_one(conn, self.b_at, worker_id="worker-b")
        assert self.b.id == self.task_id
        self.later = self.b_at + seconds(1)  # B's lease is still valid here


@pytest.fixture
def lost(conn: psycopg.Connection[Any]) -> LostLease:
    return LostLease(conn)


def assert_held_by_b(conn: psycopg.Connection[Any], lost: LostLease) -> dict[str, Any]:
    current = row(conn, lost.task_id)
    assert current["status"] == "running"
    assert current["lease_token"] == lost.b.lease_token
    assert current["lease_owner"] == "worker-b"
    assert current["lease_expires_at"] == lost.b.lease_expires_at
    assert current["result"] is None
    assert current["attempts"] == 2
    assert current["finished_at"] is None
    return current


# --- the stale-holder fence ------------------------------------------------------------------


def test_reclaimed_task_has_a_new_lease_and_counts_the_lost_attempt(conn, lost):
    assert lost.a.lease_token != lost.b.lease_token
    assert (lost.a.attempts, lost.b.attempts) == (1, 2)
    assert_held_by_b(conn, lost)


def test_complete_is_refused_when_lease_was_lost(conn, lost):
    before = assert_held_by_b(conn, lost)

    with pytest.raises(pgqueue.LeaseLost) as info:
        pgqueue.complete(conn, lost.a.lease, {"stale": True}, now=lost.later)

    assert info.value.task_id == lost.task_id
    assert row(conn, lost.task_id) == before


def test_complete_many_skips_a_lost_lease_and_completes_the_held_one(conn, lost):
    other_id = pgqueue.enqueue(conn, "other", {}, now=T0).id
    other = claim_one(conn, lost.later, worker_id="worker-c")
    assert other.id == other_id
    before = row(conn, lost.task_id)

    done = pgqueue.complete_many(
        conn, [(lost.a.lease, "stale"), (other.lease, "fresh")], now=lost.later
    )

    assert done == {other_id}
    assert row(conn, lost.task_id) == before
    assert pgqueue.get_task(conn, other_id).result == "fresh"


def test_fail_is_refused_when_lease_was_lost(conn, lost):
    before = assert_held_by_b(conn, lost)

    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.fail(conn, lost.a.lease, "stale failure", now=lost.later)

    assert row(conn, lost.task_id) == before


def test_cancel_leased_is_refused_when_lease_was_lost(conn, lost):
    before = assert_held_by_b(conn, lost)

    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.cancel_leased(conn, lost.a.lease, "stale cancel", now=lost.later)

    assert row(conn, lost.task_id) == before


def test_heartbeat_with_a_lost_lease_neither_extends_nor_reports_it(conn, lost):
    before = assert_held_by_b(conn, lost)

    beat = pgqueue.heartbeat(conn, [lost.a.lease], lease_seconds=3600, now=lost.later + seconds(10))

    assert lost.task_id not in beat.held
    assert beat.held == {}
    assert beat.cancel_requested == set()
    assert row(conn, lost.task_id) == before


def test_release_with_a_lost_lease_does_not_release_the_new_holders_task(conn, lost):
    before = assert_held_by_b(conn, lost)

    released = pgqueue.release(conn, [lost.a.lease], now=lost.later)

    assert released == set()
    assert row(conn, lost.task_id) == before


def test_new_holder_completes_after_the_stale_holder_was_refused(conn, lost):
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, lost.a.lease, "stale", now=lost.later)

    pgqueue.complete(conn, lost.b.lease, {"by": "b"}, now=lost.later)

    task = pgqueue.get_task(conn, lost.task_id)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.result == {"by": "b"}
    assert task.attempts == 2
    assert task.finished_at == lost.later
    assert task.lease_owner is None
    assert task.lease_expires_at is None
    # ...and once completed, even the holder's lease is spent.
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, lost.b.lease, "twice", now=lost.later)
    assert pgqueue.get_task(conn, lost.task_id).result == {"by": "b"}


def test_stale_holder_cannot_complete_a_swept_task_that_is_queued_again(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    a = claim_one(conn, T0 + seconds(1))
    swept_at = T0 + seconds(1 + LEASE + 1)
    assert pgqueue.sweep_expired(conn, now=swept_at).requeued == [task_id]
    before = row(conn, task_id)

    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, a.lease, "late", now=swept_at + seconds(1))
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.fail(conn, a.lease, "late", now=swept_at + seconds(1))
    assert pgqueue.heartbeat(conn, [a.lease], now=swept_at + seconds(1)).held == {}

    assert row(conn, task_id) == before
    assert before["status"] == "queued"


# --- heartbeat -------------------------------------------------------------------------------


def test_heartbeat_extends_the_lease_from_now(conn):
    pgqueue.enqueue(conn, "job", {}, now=T0)
    claimed_at = T0 + seconds(1)
    task = claim_one(conn, claimed_at)
    assert task.lease_expires_at == claimed_at + seconds(LEASE)
    beat_at = claimed_at + seconds(20)

    beat = pgqueue.heartbeat(conn, [task.lease], lease_seconds=60, now=beat_at)

    assert beat.held == {task.id: beat_at + seconds(60)}
    assert beat.cancel_requested == set()
    assert row(conn, task.id)["lease_expires_at"] == beat_at + seconds(60)


def test_sweep_leaves_a_task_whose_lease_was_extended_by_heartbeat(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    claimed_at = T0 + seconds(1)
    task = claim_one(conn, claimed_at)
    original_expiry = claimed_at + seconds(LEASE)
    beat_at = claimed_at + seconds(20)
    pgqueue.heartbeat(conn, [task.lease], lease_seconds=LEASE, now=beat_at)
    extended_expiry = beat_at + seconds(LEASE)

    # After the original expiry, before the extended one: not taken.
    early = pgqueue.sweep_expired(conn, now=original_expiry + seconds(5))
    assert early.total == 0
    assert row(conn, task_id)["lease_token"] == task.lease_token
    pgqueue.complete(conn, task.lease, "ok", now=original_expiry + seconds(6))
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.COMPLETED
    assert extended_expiry > original_expiry + seconds(6)


def test_sweep_takes_the_task_once_the_extended_lease_has_expired(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    claimed_at = T0 + seconds(1)
    task = claim_one(conn, claimed_at)
    beat_at = claimed_at + seconds(20)
    pgqueue.heartbeat(conn, [task.lease], lease_seconds=LEASE, now=beat_at)
    extended_expiry = beat_at + seconds(LEASE)

    assert pgqueue.sweep_expired(conn, now=extended_expiry).total == 0  # not yet past it
    swept = pgqueue.sweep_expired(conn, now=extended_expiry + seconds(1))

    assert swept.requeued == [task_id]
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, task.lease, "too late", now=extended_expiry + seconds(2))


def test_heartbeat_reports_only_the_leases_still_held(conn):
    ids = [pgqueue.enqueue(conn, "job", {}, now=T0 + seconds(i)).id for i in range(3)]
    tasks = pgqueue.claim(conn, ["default"], limit=3, worker_id="w", now=T0 + seconds(5))
    assert [t.id for t in tasks] == ids
    pgqueue.complete(conn, tasks[1].lease, None, now=T0 + seconds(6))

    beat = pgqueue.heartbeat(conn, [t.lease for t in tasks], now=T0 + seconds(7))

    assert set(beat.held) == {ids[0], ids[2]}
    assert pgqueue.get_task(conn, ids[1]).lease_expires_at is None


@pytest.mark.parametrize("lease_seconds", [0, -100])
def test_heartbeat_rejects_a_non_positive_lease(conn, lease_seconds):
    pgqueue.enqueue(conn, "job", {}, now=T0)
    task = claim_one(conn, T0 + seconds(1))

    with pytest.raises(pgqueue.ValidationError):
        pgqueue.heartbeat(conn, [task.lease], lease_seconds=lease_seconds, now=T0 + seconds(2))

    assert row(conn, task.id)["lease_expires_at"] == task.lease_expires_at


# --- release ---------------------------------------------------------------------------------


def test_release_requeues_at_once_without_counting_the_attempt(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=2, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    assert task.attempts == 1
    released_at = T0 + seconds(2)

    assert pgqueue.release(conn, [task.lease], now=released_at) == {task_id}

    current = row(conn, task_id)
    assert current["status"] == "queued"
    assert current["attempts"] == 0
    assert current["visible_after"] == released_at
    assert current["lease_token"] is None
    assert current["lease_owner"] is None
    assert current["lease_expires_at"] is None
    assert current["started_at"] is None
    # Visible at once, and the released run did not use up one of the two attempts.
    again = claim_one(conn, released_at)
    assert again.id == task_id
    assert again.attempts == 1
    assert not again.is_last_attempt


def test_released_lease_is_spent(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    pgqueue.release(conn, [task.lease], now=T0 + seconds(2))

    assert pgqueue.release(conn, [task.lease], now=T0 + seconds(3)) == set()
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, task.lease, "after release", now=T0 + seconds(3))
    assert row(conn, task_id)["attempts"] == 0


# --- the expired-lease sweep -----------------------------------------------------------------


def test_sweep_requeues_an_expired_task_with_backoff_and_a_lease_expired_error(conn):
    policy = pgqueue.RetryPolicy(max_attempts=3, base=10, factor=2, cap=60)
    task_id = pgqueue.enqueue(conn, "job", {}, retry=policy, now=T0).id
    claim_one(conn, T0 + seconds(1), worker_id="crashy")
    swept_at = T0 + seconds(1 + LEASE + 1)

    result = pgqueue.sweep_expired(conn, now=swept_at)

    assert result.requeued == [task_id]
    assert result.dead == []
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.QUEUED
    assert task.attempts == 1
    assert task.last_error is not None
    assert "lease expired" in task.last_error
    assert "crashy" in task.last_error
    assert task.lease_owner is None
    assert task.lease_expires_at is None
    assert task.finished_at is None
    # Backoff after attempt 1: base 10 s with up to half taken off at random.
    wait = (task.visible_after - swept_at).total_seconds()
    assert 5 <= wait <= 10
    assert pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=swept_at) == []
    assert claim_one(conn, swept_at + seconds(10)).attempts == 2


def test_sweep_does_not_take_a_lease_that_has_not_expired(conn):
    task_id = pgqueue.enqueue(conn, "job", {}, now=T0).id
    task = claim_one(conn, T0 + seconds(1))

    assert pgqueue.sweep_expired(conn, now=task.lease_expires_at - seconds(1)).total == 0
    assert pgqueue.sweep_expired(conn, now=task.lease_expires_at).total == 0

    assert row(conn, task_id)["lease_token"] == task.lease_token


def test_sweep_dead_letters_an_expired_task_with_no_attempts_left(conn):
    task_id = pgqueue.enqueue(conn, "job", {"k": "v"}, max_attempts=1, now=T0).id
    claim_one(conn, T0 + seconds(1))
    swept_at = T0 + seconds(1 + LEASE + 1)

    result = pgqueue.sweep_expired(conn, now=swept_at)

    assert result.dead == [task_id]
    assert result.requeued == []
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.finished_at == swept_at
    assert task.attempts == 1
    assert task.last_error is not None
    assert "lease expired" in task.last_error
    assert task.lease_expires_at is None
    assert dead_letter_ids(conn) == {task_id}
    dead = conn.execute(
        "SELECT attempts, max_attempts, last_error, payload FROM pgqueue.dead_letters"
    ).fetchone()
    assert dead == (1, 1, task.last_error, {"k": "v"})
    # A dead letter is never claimed again.
    assert (
        pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + timedelta(days=1)) == []
    )


def test_sweep_works_in_batches_oldest_expiry_first(conn):
    for i in range(5):
        pgqueue.enqueue(conn, "job", {}, now=T0 + seconds(i))
    # Claimed one by one, so lease k expires at T0 + 10 + k + LEASE.
    claimed = [claim_one(conn, T0 + seconds(10 + k)).id for k in range(5)]
    swept_at = T0 + seconds(100)

    first = pgqueue.sweep_expired(conn, limit=2, now=swept_at)
    second = pgqueue.sweep_expired(conn, limit=2, now=swept_at)
    third = pgqueue.sweep_expired(conn, limit=2, now=swept_at)

    assert (first.total, second.total, third.total) == (2, 2, 1)
    assert sorted(first.requeued) == sorted(claimed[:2])
    assert sorted(second.requeued) == sorted(claimed[2:4])
    assert third.requeued == claimed[4:]
    assert pgqueue.sweep_expired(conn, now=swept_at).total == 0


def test_a_task_that_kills_its_worker_every_time_ends_dead_after_max_attempts(conn):
    task_id = pgqueue.enqueue(conn, "poison", {}, max_attempts=3, now=T0).id
    clock = T0
    claims = 0
    for _ in range(10):  # far more rounds than attempts: it must stop by itself
        clock += timedelta(hours=1)  # later than any backoff
        claimed = pgqueue.claim(conn, ["default"], limit=1, worker_id="doomed", now=clock)
        if not claimed:
            break
        claims += 1
        assert claimed[0].attempts == claims
        # The worker dies: no complete, no heartbeat. Its lease expires and is swept.
        clock += seconds(LEASE + 1)
        pgqueue.sweep_expired(conn, now=clock)

    assert claims == 3
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.attempts == 3
    assert "lease expired on attempt 3 of 3" in (task.last_error or "")
    assert dead_letter_ids(conn) == {task_id}


# --- cooperative cancellation ----------------------------------------------------------------


def test_cancelling_a_running_task_flags_it_and_heartbeat_reports_the_request(conn):
    task_id = pgqueue.enqueue(conn, "long", {}, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    before = pgqueue.heartbeat(conn, [task.lease], now=T0 + seconds(2))
    assert before.cancel_requested == set()

    cancelled = pgqueue.cancel(conn, task_id, now=T0 + seconds(3))

    assert cancelled.status is pgqueue.TaskStatus.RUNNING
    assert cancelled.cancel_requested is True
    assert cancelled.finished_at is None
    beat = pgqueue.heartbeat(conn, [task.lease], now=T0 + seconds(4))
    assert beat.cancel_requested == {task_id}
    assert task_id in beat.held  # the holder still holds it until it stops
    assert row(conn, task_id)["lease_token"] == task.lease_token


def test_holder_cancels_its_flagged_task_and_it_is_final(conn):
    task_id = pgqueue.enqueue(conn, "long", {}, max_attempts=3, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    pgqueue.cancel(conn, task_id, now=T0 + seconds(2))

    pgqueue.cancel_leased(conn, task.lease, "stopped on request", now=T0 + seconds(3))

    final = pgqueue.get_task(conn, task_id)
    assert final.status is pgqueue.TaskStatus.CANCELLED
    assert final.last_error == "stopped on request"
    assert final.finished_at == T0 + seconds(3)
    assert final.lease_expires_at is None
    assert (
        pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + timedelta(days=1)) == []
    )


def test_flagged_task_completed_anyway_keeps_its_result(conn):
    task_id = pgqueue.enqueue(conn, "long", {}, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    pgqueue.cancel(conn, task_id, now=T0 + seconds(2))

    pgqueue.complete(conn, task.lease, {"done": True}, now=T0 + seconds(3))

    final = pgqueue.get_task(conn, task_id)
    assert final.status is pgqueue.TaskStatus.COMPLETED
    assert final.result == {"done": True}


def _end_by_sweep(conn: psycopg.Connection[Any], task: pgqueue.ClaimedTask) -> None:
    pgqueue.sweep_expired(conn, now=task.lease_expires_at + seconds(1))


def _end_by_fail(conn: psycopg.Connection[Any], task: pgqueue.ClaimedTask) -> None:
    pgqueue.fail(conn, task.lease, "unrelated error", now=T0 + seconds(5))


def _end_by_release(conn: psycopg.Connection[Any], task: pgqueue.ClaimedTask) -> None:
    pgqueue.release(conn, [task.lease], now=T0 + seconds(5))


@pytest.mark.parametrize(
    "end_attempt", [_end_by_sweep, _end_by_fail, _end_by_release], ids=["sweep", "fail", "release"]
)
def test_task_whose_cancellation_was_requested_is_not_run_again(conn, end_attempt):
    task_id = pgqueue.enqueue(conn, "long", {}, max_attempts=3, now=T0).id
    task = claim_one(conn, T0 + seconds(1))
    pgqueue.cancel(conn, task_id, now=T0 + seconds(2))

    # The attempt ends without the holder honouring the request: its worker crashed, the
    # handler raised some other error, or the worker shut down and handed the task back.
    end_attempt(conn, task)

    rerun = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + timedelta(days=1))
    assert rerun == []
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.CANCELLED
