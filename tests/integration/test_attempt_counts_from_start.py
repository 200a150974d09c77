"""An attempt counts from the moment a worker's handler is about to start, not from the claim
(tasks claimed but not yet started when a worker was killed came back with an
attempt spent, and a task whose workers died before starting it three times was
dead-lettered without ever running). The poison-task rule holds: a task that kills its worker
once started is counted every time. The clock is injected; nothing here sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

import pgqueue
from pgqueue.queries import claiming, driver

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = 30.0


def worker_claim(
    conn: psycopg.Connection[Any], now: datetime, owner: str = "w"
) -> pgqueue.ClaimedTask:
    """Claim one task as a worker does: its row of start marks first (a worker writes it at
    its first claim), the claim not yet marked started."""
    driver.run(conn, claiming.lease_starts_mark(owner, started=False, now=now))
    op = claiming.claim_round(
        queues=["default"], limit=1, owner=owner, lease_seconds=LEASE, now=now
    )
    (task,), _ = driver.run(conn, op, atomic=True)
    return task


def mark_started(conn: psycopg.Connection[Any], now: datetime, owner: str = "w") -> None:
    """What a worker does between its claim and its handlers."""
    driver.run(conn, claiming.lease_starts_mark(owner, now=now))


def row(conn: psycopg.Connection[Any], task_id: Any) -> tuple[Any, ...]:
    found = conn.execute(
        "SELECT status, attempts, visible_after, last_error, started_at"
        " FROM pgqueue.tasks WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert found is not None
    return found


def test_a_claim_lost_before_its_handler_started_gives_the_attempt_back(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    claimed = worker_claim(conn, T0)
    assert claimed.attempts == 1  # the handler sees which attempt it would be

    swept_at = T0 + timedelta(seconds=LEASE + 1)
    sweep = pgqueue.sweep_expired(conn, now=swept_at)

    assert sweep.requeued == [task_id] and sweep.dead == []
    status, attempts, visible_after, last_error, _ = row(conn, task_id)
    # Not dead-lettered though max_attempts is 1: that attempt never happened.
    assert (status, attempts, last_error) == ("queued", 0, None)
    assert visible_after == swept_at  # ready at once: no backoff for a run that never was
    again = pgqueue.claim(conn, ["default"], limit=1, worker_id="w2", now=swept_at)
    assert [t.attempts for t in again] == [1]


def test_a_started_attempt_whose_lease_is_lost_is_counted(conn: psycopg.Connection[Any]) -> None:
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=2, now=T0).id
    worker_claim(conn, T0)
    mark_started(conn, T0 + timedelta(milliseconds=2))
    assert row(conn, task_id)[4] == T0  # started_at: the claim's time

    pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=LEASE + 1))

    status, attempts, _, last_error, _ = row(conn, task_id)
    assert (status, attempts) == ("queued", 1)
    assert last_error.startswith("lease expired on attempt 1 of 2")


def test_a_task_that_kills_its_worker_every_time_it_starts_is_dead_lettered(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "poison", {}, max_attempts=3, now=T0).id
    now = T0
    for attempt in (1, 2, 3):
        claimed = worker_claim(conn, now, owner=f"w{attempt}")  # a new worker each time
        assert claimed.attempts == attempt
        mark_started(conn, now, owner=f"w{attempt}")
        now += timedelta(seconds=LEASE + 1)
        sweep = pgqueue.sweep_expired(conn, now=now)
        now += timedelta(hours=1)  # past any backoff
    assert sweep.dead == [task_id]
    assert row(conn, task_id)[:2] == ("failed", 3)


def test_a_mark_covers_the_claims_before_it_and_none_after(conn: psycopg.Connection[Any]) -> None:
    """A worker that started its first claim and was killed after its second: only the
    second gives its attempt back."""
    first = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    second = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    worker_claim(conn, T0)
    mark_started(conn, T0)
    later = T0 + timedelta(milliseconds=5)
    driver.run(
        conn,
        claiming.claim_round(
            queues=["default"], limit=1, owner="w", lease_seconds=LEASE, now=later
        ),
        atomic=True,
    )

    sweep = pgqueue.sweep_expired(conn, now=later + timedelta(seconds=LEASE + 1))

    assert (sweep.dead, sweep.requeued) == ([first], [second])


def test_a_lost_lease_of_an_owner_without_marks_is_counted(conn: psycopg.Connection[Any]) -> None:
    """A worker from before start marks existed (or whose row was pruned): the safe side."""
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    driver.run(
        conn,
        claiming.claim_round(queues=["default"], limit=1, owner="old", lease_seconds=LEASE, now=T0),
        atomic=True,
    )
    sweep = pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=LEASE + 1))
    assert sweep.dead == [task_id]


def test_a_mark_never_moves_back(conn: psycopg.Connection[Any]) -> None:
    """The start-up mark of a restarted owner id does not unmark what it had started."""
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    worker_claim(conn, T0)
    mark_started(conn, T0)
    driver.run(conn, claiming.lease_starts_mark("w", started=False, now=T0))
    sweep = pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=LEASE + 1))
    assert sweep.dead == [task_id]


def test_marks_of_owners_gone_for_an_hour_are_pruned_and_others_kept(
    conn: psycopg.Connection[Any],
) -> None:
    pgqueue.enqueue(conn, "job", {}, now=T0)
    worker_claim(conn, T0, owner="busy")  # holds a lease: kept however old
    driver.run(conn, claiming.lease_starts_mark("gone", now=T0))
    driver.run(conn, claiming.lease_starts_mark("recent", now=T0 + timedelta(minutes=30)))

    pruned = driver.run(conn, claiming.lease_starts_prune(now=T0 + timedelta(minutes=61)))

    assert pruned == 1
    owners = {r[0] for r in conn.execute("SELECT owner FROM pgqueue.lease_starts")}
    assert owners == {"busy", "recent"}


def test_the_library_claim_counts_from_the_claim_as_before(conn: psycopg.Connection[Any]) -> None:
    task_id = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0)
    assert row(conn, task_id)[4] == T0
    sweep = pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=LEASE + 1))
    assert sweep.dead == [task_id]


def test_the_rule_holds_for_tasks_under_a_limit(conn: psycopg.Connection[Any]) -> None:
    pgqueue.set_limit(conn, type="rationed", max_running=5)
    by_worker = pgqueue.enqueue(conn, "rationed", {}, max_attempts=1, now=T0).id
    worker_claim(conn, T0)
    by_library = pgqueue.enqueue(conn, "rationed", {}, max_attempts=1, now=T0).id
    pgqueue.claim(conn, ["default"], limit=1, worker_id="lib", now=T0)

    sweep = pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=LEASE + 1))

    assert (sweep.requeued, sweep.dead) == ([by_worker], [by_library])
