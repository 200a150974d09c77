"""ClaimStarts: where a worker's claims start their walks of the claim index, and when they
walk from the beginning again. Pure bookkeeping, driven with a controlled clock."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from pgqueue.models import ClaimedTask, Priority
from pgqueue.worker.claim_starts import FULL_WALK_SPACING, MARGIN, ClaimStarts

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 30.0
FIRST = uuid.UUID(int=0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def task(queue: str, priority: Priority, created: datetime, claimed: datetime) -> ClaimedTask:
    """A task created at ``created`` and claimed at ``claimed`` (database time)."""
    return ClaimedTask(
        id=uuid.uuid4(),
        queue=queue,
        type="t",
        payload={},
        priority=priority,
        attempts=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        lease_expires_at=claimed + timedelta(seconds=LEASE),
        created_at=created,
    )


def starts_with_clock() -> tuple[ClaimStarts, Clock]:
    clock = Clock()
    return ClaimStarts(0.5, LEASE, clock=clock), clock


def test_the_first_claim_walks_from_the_beginning() -> None:
    starts, _ = starts_with_clock()
    assert starts.next() is None


def test_a_walk_starts_right_after_the_newest_task_claimed_at_its_level() -> None:
    starts, clock = starts_with_clock()
    now = T0 + timedelta(minutes=10)
    older, newest = T0, T0 + timedelta(seconds=7)
    normal = [task("mail", Priority.NORMAL, older, now), task("mail", Priority.NORMAL, newest, now)]
    high = task("mail", Priority.HIGH, older, now)
    starts.claimed([*normal, high], starts=None, seconds=0.001)
    clock.now += 0.1
    given = starts.next()
    assert given == {
        ("mail", Priority.NORMAL): (newest, normal[1].id),
        ("mail", Priority.HIGH): (older, high.id),
    }  # and no start for LOW, never claimed: its walk starts at the beginning


def test_tasks_created_in_the_last_second_are_walked_again() -> None:
    # Their transactions may have begun before others that committed first.
    starts, clock = starts_with_clock()
    now = T0 + timedelta(minutes=10)
    fresh = task("q", Priority.NORMAL, now - timedelta(milliseconds=200), now)
    starts.claimed([fresh], starts=None, seconds=0.001)
    clock.now += 0.3  # 0.3 s later by our clock: the database's is 0.3 s later too
    given = starts.next()
    assert given == {("q", Priority.NORMAL): (now + timedelta(seconds=0.3) - MARGIN, FIRST)}


def test_a_start_never_moves_back() -> None:
    starts, clock = starts_with_clock()
    now = T0 + timedelta(minutes=10)
    late = task("q", Priority.NORMAL, T0 + timedelta(seconds=60), now)
    starts.claimed([late], starts=None, seconds=0.001)
    # A full walk finds a task behind the start (a retry come due): the start stays.
    starts.claimed([task("q", Priority.NORMAL, T0, now)], starts=None, seconds=0.001)
    clock.now += 0.1
    assert starts.next() == {("q", Priority.NORMAL): (late.created_at, late.id)}


def test_a_full_walk_comes_back_after_the_rescan_interval() -> None:
    starts, clock = starts_with_clock()
    starts.claimed([task("q", Priority.NORMAL, T0, T0)], starts=None, seconds=0.001)
    clock.now += 0.49
    assert starts.next() is not None
    clock.now += 0.02
    assert starts.next() is None


def test_an_expensive_full_walk_is_spaced_out_to_a_twentieth_of_the_time() -> None:
    starts, clock = starts_with_clock()
    starts.claimed([task("q", Priority.NORMAL, T0, T0)], starts=None, seconds=0.2)
    clock.now += 0.2 * FULL_WALK_SPACING - 0.01  # 3.99 s: still from the starts
    assert starts.next() is not None
    clock.now += 0.02
    assert starts.next() is None


def test_claims_from_the_starts_do_not_reset_the_full_walk_timer() -> None:
    starts, clock = starts_with_clock()
    starts.claimed([task("q", Priority.NORMAL, T0, T0)], starts=None, seconds=0.001)
    for _ in range(4):
        clock.now += 0.1
        given = starts.next()
        assert given is not None
        starts.claimed([task("q", Priority.NORMAL, T0, T0)], starts=given, seconds=0.001)
    clock.now += 0.11
    assert starts.next() is None


def test_a_release_in_a_queue_makes_its_next_walk_start_at_the_beginning() -> None:
    """A dependant released by its last parent (or a replayed dead letter) is older than where
    the claims got to: the worker forgets that queue's starts, and only that queue's."""
    starts, clock = starts_with_clock()
    now = T0 + timedelta(minutes=10)
    mail = [task("mail", p, T0, now) for p in (Priority.HIGH, Priority.NORMAL)]
    jobs = task("jobs", Priority.NORMAL, T0, now)
    starts.claimed([*mail, jobs], starts=None, seconds=0.001)
    clock.now += 0.1
    starts.forget("mail")
    assert starts.next() == {("jobs", Priority.NORMAL): (T0, jobs.id)}
    starts.forget("unknown")  # a queue never claimed from: nothing to forget
    assert starts.next() == {("jobs", Priority.NORMAL): (T0, jobs.id)}
