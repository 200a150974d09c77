"""Retries with backoff, the dead-letter queue (replay, discard), cancellation, retention
pruning, listing with keyset pagination, and queue depth. The clock is injected with ``now=``
wherever an operation accepts it; nothing here sleeps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def claim_all(
    conn: psycopg.Connection[Any], now: datetime, queues: tuple[str, ...] = ("default",)
) -> list[pgqueue.ClaimedTask]:
    return pgqueue.claim(conn, list(queues), limit=1000, worker_id="w", now=now)


def make_dead(
    conn: psycopg.Connection[Any], type: str, now: datetime, queue: str = "default"
) -> uuid.UUID:
    """A dead letter of this type, finished at ``now``."""
    task_id = pgqueue.enqueue(conn, type, {}, queue=queue, max_attempts=1, now=now).id
    (claimed,) = claim_all(conn, now, queues=(queue,))
    assert claimed.id == task_id
    outcome = pgqueue.fail(conn, claimed.lease, f"{type} broke", now=now)
    assert outcome.outcome is pgqueue.FailOutcome.DEAD
    return task_id


def make_completed(conn: psycopg.Connection[Any], type: str, now: datetime, **options: Any) -> Any:
    task_id = pgqueue.enqueue(conn, type, {}, now=now, **options).id
    (claimed,) = claim_all(conn, now)
    assert claimed.id == task_id
    pgqueue.complete(conn, claimed.lease, "ok", now=now)
    return task_id


def dead_letter_ids(conn: psycopg.Connection[Any]) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("SELECT id FROM pgqueue.dead_letters").fetchall()}


def status_of(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.TaskStatus:
    return pgqueue.get_task(conn, task_id).status


def exists(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> bool:
    try:
        pgqueue.get_task(conn, task_id)
    except pgqueue.TaskNotFound:
        return False
    return True


# --- backoff ---------------------------------------------------------------------------------


def test_failed_attempts_back_off_exponentially_with_jitter_and_a_cap_then_dead_letter(conn):
    policy = pgqueue.RetryPolicy(max_attempts=5, base=10, factor=2, cap=60)
    task_id = pgqueue.enqueue(conn, "flaky", {}, retry=policy, now=T0).id
    claim_at = T0 + seconds(1)

    for attempt, expected_max in zip(range(1, 5), [10, 20, 40, 60], strict=True):
        (claimed,) = claim_all(conn, claim_at)
        assert (claimed.id, claimed.attempts) == (task_id, attempt)
        failed_at = claim_at + seconds(1)
        d = policy.max_delay(attempt)
        assert d == expected_max

        result = pgqueue.fail(conn, claimed.lease, f"error {attempt}", now=failed_at)

        assert result.outcome is pgqueue.FailOutcome.RETRYING
        assert result.attempts == attempt
        task = pgqueue.get_task(conn, task_id)
        assert task.status is pgqueue.TaskStatus.QUEUED
        assert task.last_error == f"error {attempt}"
        assert result.retry_at == task.visible_after
        wait = task.visible_after - failed_at
        assert seconds(d / 2) - ONE_US <= wait <= seconds(d)
        # Not visible before the shortest possible wait; always visible after the longest.
        assert claim_all(conn, failed_at + seconds(d / 2) - timedelta(milliseconds=1)) == []
        claim_at = failed_at + seconds(d)

    (last,) = claim_all(conn, claim_at)
    assert last.attempts == 5
    assert last.is_last_attempt
    dead_at = claim_at + seconds(1)

    result = pgqueue.fail(conn, last.lease, "error 5", now=dead_at)

    assert result.outcome is pgqueue.FailOutcome.DEAD
    assert result.attempts == 5
    assert result.retry_at is None
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.finished_at == dead_at
    assert task.last_error == "error 5"
    assert task.lease_expires_at is None
    assert dead_letter_ids(conn) == {task_id}
    assert claim_all(conn, dead_at + timedelta(days=1)) == []


def test_backoff_jitter_spreads_tasks_that_failed_together(conn):
    policy = pgqueue.RetryPolicy(max_attempts=2, base=100, factor=2, cap=100)
    pgqueue.enqueue_many(conn, [{"type": "j", "retry": policy} for _ in range(20)], now=T0)
    failed_at = T0 + seconds(1)
    for t in claim_all(conn, T0):
        pgqueue.fail(conn, t.lease, "down", now=failed_at)

    waits = [(t.visible_after - failed_at).total_seconds() for t in pgqueue.list_tasks(conn)]

    assert all(50 - 1e-6 <= w <= 100 for w in waits)
    assert len(set(waits)) > 1


def test_retry_after_replaces_the_computed_backoff_exactly(conn):
    policy = pgqueue.RetryPolicy(max_attempts=3, base=10, factor=2, cap=60)
    task_id = pgqueue.enqueue(conn, "rate-limited", {}, retry=policy, now=T0).id
    (claimed,) = claim_all(conn, T0)
    failed_at = T0 + seconds(1)

    result = pgqueue.fail(conn, claimed.lease, "429", retry_after=123.5, now=failed_at)

    assert result.outcome is pgqueue.FailOutcome.RETRYING
    assert result.retry_at == failed_at + seconds(123.5)
    assert pgqueue.get_task(conn, task_id).visible_after == failed_at + seconds(123.5)
    assert claim_all(conn, failed_at + seconds(123.4)) == []
    assert [t.id for t in claim_all(conn, failed_at + seconds(123.5))] == [task_id]


def test_retry_after_zero_makes_the_task_visible_at_once(conn):
    policy = pgqueue.RetryPolicy(max_attempts=3, base=60, factor=2, cap=600)
    task_id = pgqueue.enqueue(conn, "j", {}, retry=policy, now=T0).id
    (claimed,) = claim_all(conn, T0)

    pgqueue.fail(conn, claimed.lease, "again", retry_after=0, now=T0 + seconds(1))

    assert [t.id for t in claim_all(conn, T0 + seconds(1))] == [task_id]


def test_retry_after_does_not_grant_an_attempt_beyond_max_attempts(conn):
    task_id = pgqueue.enqueue(conn, "j", {}, max_attempts=1, now=T0).id
    (claimed,) = claim_all(conn, T0)

    result = pgqueue.fail(conn, claimed.lease, "nope", retry_after=5, now=T0 + seconds(1))

    assert result.outcome is pgqueue.FailOutcome.DEAD
    assert status_of(conn, task_id) is pgqueue.TaskStatus.FAILED


# --- dead letters: replay and discard --------------------------------------------------------


def test_replay_by_id_requeues_a_dead_letter_with_fresh_attempts(conn):
    task_id = pgqueue.enqueue(conn, "j", {"n": 1}, max_attempts=2, now=T0).id
    for i in range(2):
        (claimed,) = claim_all(conn, T0 + timedelta(hours=i))
        pgqueue.fail(conn, claimed.lease, "bad", now=T0 + timedelta(hours=i))
    assert status_of(conn, task_id) is pgqueue.TaskStatus.FAILED
    replay_at = T0 + timedelta(hours=5)

    assert pgqueue.replay(conn, [task_id], now=replay_at) == [task_id]

    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.QUEUED
    assert task.attempts == 0
    assert task.visible_after == replay_at
    assert task.finished_at is None
    assert dead_letter_ids(conn) == set()
    (claimed,) = claim_all(conn, replay_at)
    assert (claimed.id, claimed.attempts, claimed.max_attempts) == (task_id, 1, 2)
    pgqueue.complete(conn, claimed.lease, {"second": "life"}, now=replay_at)
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.result == {"second": "life"}


def test_replay_by_id_accepts_text_ids(conn):
    task_id = make_dead(conn, "j", T0)

    assert pgqueue.replay(conn, [str(task_id)], now=T0) == [task_id]
    assert status_of(conn, task_id) is pgqueue.TaskStatus.QUEUED


def test_replay_by_type_moves_only_that_type_in_batches_of_limit(conn):
    a = [make_dead(conn, "alpha", T0 + seconds(i)) for i in range(5)]
    b = [make_dead(conn, "beta", T0 + seconds(10 + i)) for i in range(2)]
    other_queue = make_dead(conn, "alpha", T0 + seconds(20), queue="elsewhere")
    queued_alpha = pgqueue.enqueue(conn, "alpha", {}, now=T0 + timedelta(days=9)).id
    replay_at = T0 + seconds(100)

    first = pgqueue.replay(conn, type="alpha", queue="default", limit=2, now=replay_at)
    second = pgqueue.replay(conn, type="alpha", queue="default", limit=2, now=replay_at)
    third = pgqueue.replay(conn, type="alpha", queue="default", limit=2, now=replay_at)
    fourth = pgqueue.replay(conn, type="alpha", queue="default", limit=2, now=replay_at)

    assert [len(first), len(second), len(third), fourth] == [2, 2, 1, []]
    # Oldest dead letters first.
    assert first + second + third == a
    assert all(status_of(conn, i) is pgqueue.TaskStatus.QUEUED for i in a)
    assert all(status_of(conn, i) is pgqueue.TaskStatus.FAILED for i in b)
    assert status_of(conn, other_queue) is pgqueue.TaskStatus.FAILED
    assert dead_letter_ids(conn) == {*b, other_queue}
    assert pgqueue.get_task(conn, queued_alpha).visible_after == T0 + timedelta(days=9)


def test_replay_never_touches_tasks_that_are_not_dead_letters(conn):
    completed = make_completed(conn, "j", T0)
    pgqueue.enqueue(conn, "j", {}, now=T0 + seconds(1))
    queued = pgqueue.enqueue(conn, "j", {}, now=T0 + seconds(2)).id
    (running,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + seconds(3))
    assert running.id != queued

    assert pgqueue.replay(conn, [completed, queued, running.id], now=T0 + seconds(4)) == []
    assert pgqueue.replay(conn, type="j", now=T0 + seconds(4)) == []

    assert status_of(conn, completed) is pgqueue.TaskStatus.COMPLETED
    assert pgqueue.get_task(conn, queued).visible_after == T0 + seconds(2)
    assert pgqueue.get_task(conn, running.id).attempts == 1
    assert status_of(conn, running.id) is pgqueue.TaskStatus.RUNNING


def test_discard_deletes_dead_letters_by_id(conn):
    keep = make_dead(conn, "j", T0)
    drop = make_dead(conn, "j", T0 + seconds(1))

    assert pgqueue.discard(conn, [drop]) == [drop]

    assert not exists(conn, drop)
    assert dead_letter_ids(conn) == {keep}


def test_discard_by_filter_deletes_only_matching_dead_letters_in_batches(conn):
    doomed = [make_dead(conn, "poison", T0 + seconds(i)) for i in range(3)]
    other_type = make_dead(conn, "fine", T0 + seconds(5))
    other_queue = make_dead(conn, "poison", T0 + seconds(6), queue="q2")

    first = pgqueue.discard(conn, type="poison", queue="default", limit=2)
    rest = pgqueue.discard(conn, type="poison", queue="default", limit=2)

    assert (len(first), len(rest)) == (2, 1)
    assert set(first + rest) == set(doomed)
    assert pgqueue.discard(conn, type="poison", queue="default") == []
    assert dead_letter_ids(conn) == {other_type, other_queue}


def test_discard_never_touches_tasks_that_are_not_dead_letters(conn):
    completed = make_completed(conn, "j", T0)
    cancelled = pgqueue.enqueue(conn, "j", {}, now=T0 + seconds(1)).id
    pgqueue.cancel(conn, cancelled, now=T0 + seconds(1))
    queued = pgqueue.enqueue(conn, "j", {}, now=T0 + seconds(2)).id
    pgqueue.enqueue(conn, "j", {}, now=T0 + seconds(3))
    (running,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + seconds(4))
    ids = [completed, cancelled, queued, running.id]

    assert pgqueue.discard(conn, ids) == []
    assert pgqueue.discard(conn, type="j") == []
    assert pgqueue.discard(conn) == []

    assert all(exists(conn, i) for i in ids)
    assert len(pgqueue.list_tasks(conn)) == 4


# --- cancel ----------------------------------------------------------------------------------


def test_cancelled_queued_task_is_never_claimed(conn):
    task_id = pgqueue.enqueue(conn, "j", {}, now=T0).id
    cancelled_at = T0 + seconds(1)

    task = pgqueue.cancel(conn, task_id, now=cancelled_at)

    assert task.status is pgqueue.TaskStatus.CANCELLED
    assert task.finished_at == cancelled_at
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.CANCELLED
    assert claim_all(conn, T0 + timedelta(days=1)) == []


def test_scheduled_task_can_be_cancelled_before_it_is_due(conn):
    task_id = pgqueue.enqueue(conn, "j", {}, delay=3600, now=T0).id

    assert pgqueue.cancel(conn, task_id, now=T0 + seconds(1)).status is pgqueue.TaskStatus.CANCELLED

    assert claim_all(conn, T0 + timedelta(hours=2)) == []
    assert status_of(conn, task_id) is pgqueue.TaskStatus.CANCELLED


def test_cancelling_a_completed_task_raises_invalid_task_state(conn):
    task_id = make_completed(conn, "j", T0)

    with pytest.raises(pgqueue.InvalidTaskState) as info:
        pgqueue.cancel(conn, task_id, now=T0 + seconds(1))

    assert info.value.status == "completed"
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.cancel_requested is False
    assert task.result == "ok"


@pytest.mark.parametrize("final", ["failed", "cancelled"])
def test_cancelling_a_finished_task_raises_invalid_task_state(conn, final):
    if final == "failed":
        task_id = make_dead(conn, "j", T0)
    else:
        task_id = pgqueue.enqueue(conn, "j", {}, now=T0).id
        pgqueue.cancel(conn, task_id, now=T0)

    with pytest.raises(pgqueue.InvalidTaskState):
        pgqueue.cancel(conn, task_id, now=T0 + seconds(1))

    assert status_of(conn, task_id).value == final


def test_cancelling_an_unknown_task_raises_task_not_found(conn):
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.cancel(conn, uuid.uuid4())
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.cancel(conn, "not-a-uuid")


# --- prune -----------------------------------------------------------------------------------


def test_prune_deletes_finished_tasks_older_than_their_retention_and_nothing_else(conn):
    old_done = make_completed(conn, "j", T0)
    young_done = make_completed(conn, "j", T0 + seconds(100))
    old_cancelled = pgqueue.enqueue(conn, "j", {}, delay=9999, now=T0).id
    pgqueue.cancel(conn, old_cancelled, now=T0)
    young_cancelled = pgqueue.enqueue(conn, "j", {}, delay=9999, now=T0).id
    pgqueue.cancel(conn, young_cancelled, now=T0 + seconds(100))
    old_dead = make_dead(conn, "j", T0)
    young_dead = make_dead(conn, "j", T0 + seconds(100))
    queued = pgqueue.enqueue(conn, "j", {}, delay=9999, now=T0).id
    pgqueue.enqueue(conn, "j", {}, now=T0)
    (running,) = claim_all(conn, T0)
    prune_at = T0 + seconds(150)

    pruned = pgqueue.prune(conn, completed_after=120, dead_after=120, now=prune_at)

    assert pruned == 3
    for task_id in (old_done, old_cancelled, old_dead):
        assert not exists(conn, task_id)
    for task_id in (young_done, young_cancelled, young_dead):
        assert exists(conn, task_id)
    assert exists(conn, queued)
    assert status_of(conn, running.id) is pgqueue.TaskStatus.RUNNING


def test_prune_keeps_dead_letters_for_dead_after_not_completed_after(conn):
    done = make_completed(conn, "j", T0)
    dead = make_dead(conn, "j", T0)
    prune_at = T0 + timedelta(days=2)

    assert pgqueue.prune(conn, completed_after=3600, dead_after=7 * 86400, now=prune_at) == 1
    assert not exists(conn, done)
    assert exists(conn, dead)

    assert pgqueue.prune(conn, completed_after=3600, dead_after=86400, now=prune_at) == 1
    assert not exists(conn, dead)


def test_prune_never_deletes_queued_or_running_tasks_however_old(conn):
    queued = pgqueue.enqueue(conn, "j", {}, delay=1, now=T0).id
    pgqueue.enqueue(conn, "j", {}, now=T0)
    (running,) = claim_all(conn, T0)

    pruned = pgqueue.prune(conn, completed_after=0, dead_after=0, now=T0 + timedelta(days=3650))

    assert pruned == 0
    assert status_of(conn, queued) is pgqueue.TaskStatus.QUEUED
    assert status_of(conn, running.id) is pgqueue.TaskStatus.RUNNING


def test_prune_works_in_batches_of_limit(conn):
    for i in range(5):
        make_completed(conn, "j", T0 + seconds(i))
    prune_at = T0 + timedelta(days=1)

    assert pgqueue.prune(conn, completed_after=60, limit=2, now=prune_at) == 2
    assert pgqueue.prune(conn, completed_after=60, limit=2, now=prune_at) == 2
    assert pgqueue.prune(conn, completed_after=60, limit=2, now=prune_at) == 1
    assert pgqueue.list_tasks(conn) == []


def test_idempotency_key_is_reusable_once_its_task_was_pruned(conn):
    first = make_completed(conn, "j", T0, idempotency_key="order-42")
    again = pgqueue.enqueue(conn, "j", {}, idempotency_key="order-42", now=T0 + seconds(1))
    assert (again.created, again.id) == (False, first)
    assert again.task.status is pgqueue.TaskStatus.COMPLETED

    assert pgqueue.prune(conn, completed_after=60, now=T0 + timedelta(hours=1)) == 1
    fresh = pgqueue.enqueue(conn, "j", {}, idempotency_key="order-42", now=T0 + timedelta(hours=1))

    assert fresh.created is True
    assert fresh.id != first
    assert fresh.task.status is pgqueue.TaskStatus.QUEUED


# --- listing ---------------------------------------------------------------------------------


def test_list_tasks_filters_by_status_type_and_queue(conn):
    q_email = [pgqueue.enqueue(conn, "email", {}, queue="mail", now=T0).id for _ in range(2)]
    q_report = pgqueue.enqueue(conn, "report", {}, queue="reports", now=T0).id
    pgqueue.enqueue(conn, "email", {}, queue="default", now=T0 + seconds(1))
    (running,) = pgqueue.claim(conn, ["reports"], limit=1, worker_id="w", now=T0)
    assert running.id == q_report
    dead = make_dead(conn, "report", T0 + seconds(2), queue="reports")

    def ids(**filters: Any) -> set[uuid.UUID]:
        return {t.id for t in pgqueue.list_tasks(conn, **filters)}

    assert ids(queue="mail") == set(q_email)
    assert ids(type="report") == {q_report, dead}
    assert ids(status="running") == {q_report}
    assert ids(status=pgqueue.TaskStatus.FAILED) == {dead}
    assert ids(status="QUEUED", type="email", queue="mail") == set(q_email)
    assert ids(status="failed", queue="mail") == set()
    assert len(ids()) == 5
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.list_tasks(conn, status="bogus")


def test_list_tasks_keyset_pagination_visits_every_task_exactly_once(conn):
    expected: set[uuid.UUID] = set()
    # Singles with distinct created_at, and batches sharing one created_at so pages must
    # break ties by id.
    for i in range(7):
        expected.add(pgqueue.enqueue(conn, "j", {"i": i}, now=T0 + seconds(i)).id)
    for b in range(3):
        batch = pgqueue.enqueue_many(
            conn, [{"type": "j", "payload": {"b": b, "k": k}} for k in range(6)], now=T0
        )
        expected.update(r.id for r in batch)
    assert len(expected) == 25

    seen: list[pgqueue.Task] = []
    page = pgqueue.list_tasks(conn, limit=4)
    pages = 0
    while page:
        pages += 1
        assert len(page) <= 4
        seen.extend(page)
        page = pgqueue.list_tasks(conn, limit=4, before=page[-1])
        assert pages < 50

    assert pages == 7
    assert len(seen) == len(expected)
    assert {t.id for t in seen} == expected
    keys = [(t.created_at, t.id) for t in seen]
    assert keys == sorted(keys, reverse=True)
    assert len(set(keys)) == len(keys)


def test_list_tasks_pagination_with_a_filter_and_a_tuple_cursor(conn):
    wanted = [pgqueue.enqueue(conn, "a", {}, now=T0 + seconds(i)).id for i in range(5)]
    for i in range(5):
        pgqueue.enqueue(conn, "b", {}, now=T0 + seconds(i) + ONE_US)

    first = pgqueue.list_tasks(conn, type="a", limit=3)
    second = pgqueue.list_tasks(
        conn, type="a", limit=3, before=(first[-1].created_at, first[-1].id)
    )

    assert [t.id for t in first + second] == wanted[::-1]


# --- queue depth -----------------------------------------------------------------------------


def depth_rows(conn: psycopg.Connection[Any]) -> dict[tuple[str, str, str], pgqueue.QueueStats]:
    return {(s.queue, s.priority, s.status): s for s in pgqueue.queue_stats(conn)}


def test_queue_stats_counts_ready_and_scheduled_tasks_and_the_oldest_ready_age(conn):
    # queue_stats reads the real clock (the view uses now()), so these tasks use real times.
    real_now = datetime.now(UTC)
    pgqueue.enqueue(conn, "j", {}, now=real_now - seconds(300))
    pgqueue.enqueue(conn, "j", {}, now=real_now - seconds(10))
    pgqueue.enqueue(conn, "j", {}, delay=3600)
    pgqueue.enqueue(conn, "j", {}, run_at=real_now + timedelta(days=1))
    pgqueue.enqueue(conn, "j", {}, priority="high", queue="fast", delay=3600)

    rows = depth_rows(conn)

    normal = rows[("default", "normal", "queued")]
    assert (normal.tasks, normal.ready, normal.scheduled) == (4, 2, 2)
    assert normal.oldest_ready_age_seconds is not None
    assert 300 <= normal.oldest_ready_age_seconds < 300 + 60
    fast = rows[("fast", "high", "queued")]
    assert (fast.tasks, fast.ready, fast.scheduled) == (1, 0, 1)
    assert fast.oldest_ready_age_seconds is None
    assert set(rows) == {("default", "normal", "queued"), ("fast", "high", "queued")}


def test_queue_stats_splits_rows_by_status_and_priority(conn):
    past = datetime.now(UTC) - seconds(60)
    pgqueue.enqueue(conn, "j", {}, priority="low", now=past)
    pgqueue.enqueue(conn, "j", {}, priority="high", now=past)
    pgqueue.enqueue(conn, "j", {}, priority="high", now=past)
    (running,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")
    assert running.priority is pgqueue.Priority.HIGH
    make_dead(conn, "k", past, queue="other")

    rows = depth_rows(conn)

    assert {key: (s.tasks, s.ready, s.scheduled) for key, s in rows.items()} == {
        ("default", "high", "queued"): (1, 1, 0),
        ("default", "high", "running"): (1, 0, 0),
        ("default", "low", "queued"): (1, 1, 0),
        ("other", "normal", "failed"): (1, 0, 0),
    }
    assert rows[("default", "high", "running")].oldest_ready_age_seconds is None


def test_queue_depth_view_agrees_with_queue_stats(conn):
    real_now = datetime.now(UTC)
    pgqueue.enqueue(conn, "j", {}, now=real_now - seconds(120))
    pgqueue.enqueue(conn, "j", {}, delay=600)

    (row,) = conn.execute(
        "SELECT queue, priority, status, tasks, ready, scheduled,"
        " extract(epoch FROM oldest_ready_age) FROM pgqueue.queue_depth"
    ).fetchall()

    assert row[:6] == ("default", "normal", "queued", 2, 1, 1)
    assert 120 <= float(row[6]) < 180
