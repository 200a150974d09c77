"""The starvation policy: a task that waits long enough climbs one priority per period.

Strict priority alone would let a steady stream of high tasks hold a low one back forever.
``promote_aged`` (run by every worker's maintenance, ``--promote-after``, 300 s by default)
moves a queued task that has been ready for a period up one level and restarts its wait, so a
low task is high after two periods and then, being older than the high tasks behind it, goes
first. These tests move the clock with ``now=``; a real worker doing it under a stream of high
tasks is in tests/acceptance.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from keyed_tasks import add_keyed

import pgqueue
from pgqueue import Priority

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PERIOD = 60.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def priority_of(conn, task_id) -> Priority:
    return Priority(pgqueue.get_task(conn, task_id).priority)


def test_a_waiting_task_climbs_one_level_per_period_and_no_faster(conn):
    low = pgqueue.enqueue(conn, "t", priority="low", now=T0).id
    normal = pgqueue.enqueue(conn, "t", priority="normal", now=T0).id
    high = pgqueue.enqueue(conn, "t", priority="high", now=T0).id

    assert pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(PERIOD - 1)) == []
    assert set(pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(PERIOD + 1))) == {
        low,
        normal,
    }
    assert priority_of(conn, low) is Priority.NORMAL
    assert priority_of(conn, normal) is Priority.HIGH
    assert priority_of(conn, high) is Priority.HIGH  # nothing above high

    # The wait restarts at each step: not again until another period has passed.
    assert pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(PERIOD + 2)) == []
    assert pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(2 * PERIOD + 2)) == [low]
    assert priority_of(conn, low) is Priority.HIGH


def test_once_promoted_the_old_low_task_goes_before_newer_high_tasks(conn):
    low = pgqueue.enqueue(conn, "t", priority="low", now=T0).id
    newer_high = [pgqueue.enqueue(conn, "t", priority="high", now=at(s)).id for s in (10, 20)]

    pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(PERIOD + 1))
    pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(2 * PERIOD + 2))

    claimed = pgqueue.claim(conn, ["default"], limit=3, worker_id="w", now=at(2 * PERIOD + 3))
    assert [t.id for t in claimed] == [low, *newer_high]


def test_scheduled_running_and_finished_tasks_are_not_promoted(conn):
    scheduled = pgqueue.enqueue(conn, "t", priority="low", run_at=at(3 * PERIOD), now=T0).id
    running = pgqueue.enqueue(conn, "t", priority="low", now=T0).id
    [claimed] = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0)
    assert claimed.id == running

    assert pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(2 * PERIOD)) == []
    assert priority_of(conn, scheduled) is Priority.LOW
    assert priority_of(conn, running) is Priority.LOW


def test_every_queue_is_promoted_in_batches(conn):
    ids = {
        pgqueue.enqueue(conn, "t", priority="low", queue=q, now=T0).id
        for q in ("a", "b", "c")
        for _ in range(4)
    }
    first = pgqueue.promote_aged(conn, after_seconds=PERIOD, limit=5, now=at(PERIOD + 1))
    rest = pgqueue.promote_aged(conn, after_seconds=PERIOD, limit=100, now=at(PERIOD + 1))
    assert len(first) == 5 and set(first) | set(rest) == ids and not set(first) & set(rest)


def test_tasks_with_a_concurrency_key_climb_as_the_others_do(conn):
    """Tasks with a key wait in an index of their own (tasks_claim_key_idx): promotion reads
    it too, in a queue that has only keyed tasks as in one that has both."""
    low = add_keyed(conn, "acme", 2, queue="tenants", priority=2, at=T0)
    normal = add_keyed(conn, "zeta", 1, queue="tenants", priority=1, at=T0)
    plain = pgqueue.enqueue(conn, "t", priority="low", queue="mixed", now=T0).id
    mixed = add_keyed(conn, "acme", 1, queue="mixed", priority=2, at=T0)
    young = add_keyed(conn, "acme", 1, queue="tenants", priority=2, at=at(PERIOD))

    promoted = pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(PERIOD + 1))

    assert set(promoted) == {*low, *normal, plain, *mixed}
    assert [priority_of(conn, t) for t in low + mixed] == [Priority.NORMAL] * 3
    assert priority_of(conn, normal[0]) is Priority.HIGH
    assert priority_of(conn, young[0]) is Priority.LOW
    task = pgqueue.get_task(conn, low[0])
    assert task.submitted_priority is Priority.LOW and task.ready_since < at(1), task
    # The wait restarts, then they climb again, with the young one now old enough.
    second = pgqueue.promote_aged(conn, after_seconds=PERIOD, now=at(2 * PERIOD + 2))
    assert set(second) == {*low, *mixed, *young, plain}


@pytest.mark.parametrize("after", [0, -1, float("nan"), "60"])
def test_a_period_that_is_not_positive_seconds_is_a_validation_error(conn, after):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.promote_aged(conn, after_seconds=after)
    assert info.value.field == "after_seconds"
