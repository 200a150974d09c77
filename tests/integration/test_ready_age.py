"""The age of waiting work counts from when a task first became ready.

The starvation policy's promotion and a retry both move ``visible_after`` (the promotion's
clock, the retry's due time); the age that alerts and autoscalers read must not restart with
them, or a task starved for 900 s reads as 0 s right after it is promoted. The views compute
ages against the database's own clock, so these tests put the task's history in the past
(``now=`` on every write) and read the ages as of now: every number is a lower bound that the
old, restarted age could not reach, whatever the machine's speed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pgqueue
from pgqueue import Priority

WAITED = 900.0  # seconds since the task first became ready
PERIOD = 300.0  # the promotion period


def ages(conn) -> dict[str, float]:
    """The oldest ready age of queue "q", as each reader reports it."""
    (backlog,) = [r for r in pgqueue.backlog(conn, ["q"])]
    (depth,) = [r for r in pgqueue.queue_stats(conn) if r.queue == "q" and r.status == "queued"]
    (overview,) = [r for r in pgqueue.overview(conn) if r.queue == "q" and r.status == "queued"]
    return {
        "pgqueue.backlog": backlog.oldest_ready_age_seconds or 0.0,
        "pgqueue.queue_depth": depth.oldest_ready_age_seconds or 0.0,
        "stats overview": overview.oldest_ready_age_seconds or 0.0,
    }


def test_promotion_does_not_restart_the_age_and_keeps_the_submitted_priority(conn):
    t0 = datetime.now(UTC) - timedelta(seconds=WAITED)
    task_id = pgqueue.enqueue(conn, "t", queue="q", priority="low", now=t0).id

    promoted = pgqueue.promote_aged(
        conn, after_seconds=PERIOD, now=t0 + timedelta(seconds=PERIOD + 1)
    )
    assert promoted == [task_id]

    # Restarted at the promotion, the age would be WAITED - PERIOD - 1 at most.
    assert all(age >= WAITED for age in ages(conn).values()), ages(conn)
    task = pgqueue.get_task(conn, task_id)
    assert task.priority is Priority.NORMAL
    assert task.submitted_priority is Priority.LOW
    assert task.ready_since == t0
    assert task.to_dict()["submitted_priority"] == "low"

    # A second promotion keeps the priority it was submitted with, not the intermediate one.
    pgqueue.promote_aged(conn, after_seconds=PERIOD, now=t0 + timedelta(seconds=2 * PERIOD + 2))
    task = pgqueue.get_task(conn, task_id)
    assert (task.priority, task.submitted_priority) == (Priority.HIGH, Priority.LOW)


def test_a_task_never_promoted_has_no_submitted_priority(conn):
    task_id = pgqueue.enqueue(conn, "t", queue="q", priority="low").id

    task = pgqueue.get_task(conn, task_id)
    assert task.submitted_priority is None
    assert task.ready_since == task.visible_after


def test_a_retry_keeps_counting_from_when_the_task_first_became_ready(conn):
    t0 = datetime.now(UTC) - timedelta(seconds=WAITED)
    task_id = pgqueue.enqueue(conn, "t", queue="q", now=t0).id
    (claimed,) = pgqueue.claim(conn, ["q"], limit=1, worker_id="w", now=t0)
    retried_at = t0 + timedelta(seconds=WAITED - 60)
    pgqueue.fail(conn, claimed.lease, "boom", retry_after=0, now=retried_at)

    # Restarted at the retry, the age would be about 60 s.
    assert all(age >= WAITED for age in ages(conn).values()), ages(conn)
    assert pgqueue.get_task(conn, task_id).ready_since == t0


def test_a_lost_lease_and_a_release_keep_the_first_ready_time(conn):
    t0 = datetime.now(UTC) - timedelta(seconds=WAITED)
    lost = pgqueue.enqueue(conn, "t", queue="q", now=t0).id
    (claimed,) = pgqueue.claim(conn, ["q"], limit=1, worker_id="w", lease_seconds=1, now=t0)
    pgqueue.sweep_expired(conn, now=t0 + timedelta(seconds=10))
    assert pgqueue.get_task(conn, lost).ready_since == t0

    released = pgqueue.enqueue(conn, "t", queue="other", now=t0).id
    (claimed,) = pgqueue.claim(conn, ["other"], limit=1, worker_id="w", now=t0)
    pgqueue.release(conn, [claimed.lease], now=t0 + timedelta(seconds=20))
    assert pgqueue.get_task(conn, released).ready_since == t0


def test_a_replayed_dead_letter_starts_a_new_wait(conn):
    t0 = datetime.now(UTC) - timedelta(seconds=WAITED)
    task_id = pgqueue.enqueue(conn, "t", queue="q", max_attempts=1, now=t0).id
    (claimed,) = pgqueue.claim(conn, ["q"], limit=1, worker_id="w", now=t0)
    pgqueue.fail(conn, claimed.lease, "boom", now=t0 + timedelta(seconds=1))

    pgqueue.replay(conn, [task_id])

    assert all(age < WAITED / 2 for age in ages(conn).values()), ages(conn)
