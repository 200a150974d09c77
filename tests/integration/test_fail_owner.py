"""``task_fail_owner``: the supervisor's take-back of a dead worker process's tasks, as one
statement against real PostgreSQL. Every task still running under the dead process's lease
owner fails at once, as ``task_fail`` would have failed it (an attempt spent: retried after
the row's backoff, or dead-lettered, or cancelled when that was asked, dependants settled);
another owner's tasks and what the dead process had already finished are left alone. The
clock is injected with ``now=``; nothing here sleeps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue
from pgqueue.queries import claiming
from pgqueue.queries.driver import run

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
DEAD = "host:100:0.1"  # the worker process that died
ALIVE = "host:100:1.1"  # its sibling
CAUSE = "worker process exited with code 3"


def at(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def row(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM pgqueue.tasks WHERE id = %s", (task_id,))
        found = cur.fetchone()
    assert found is not None
    return found


def claim(conn: psycopg.Connection[Any], owner: str, now: datetime, n: int) -> set[uuid.UUID]:
    claimed = pgqueue.claim(conn, ["default"], limit=n, worker_id=owner, now=now)
    assert len(claimed) == n, claimed
    return {t.id for t in claimed}


def fail_owner(conn: psycopg.Connection[Any], owner: str, now: datetime) -> list[dict[str, Any]]:
    return run(conn, claiming.task_fail_owner(owner, CAUSE, pid=4242, now=now))


def test_the_dead_owners_running_tasks_fail_at_once_each_as_a_spent_attempt(
    conn: psycopg.Connection[Any],
) -> None:
    retried = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
    last = pgqueue.enqueue(conn, "poison", {}, max_attempts=1, now=T0).id
    asked = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
    done = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
    sibling = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
    child = pgqueue.enqueue(conn, "after", {}, depends_on=[last], now=T0).id
    assert claim(conn, DEAD, at(1), 4) == {retried, last, asked, done}
    assert claim(conn, ALIVE, at(1), 1) == {sibling}
    # What the dead process wrote before it died stands: a completion, a cancel request.
    pgqueue.complete(conn, row_lease(conn, done), {"ok": True})
    pgqueue.cancel(conn, asked)
    before = row(conn, sibling)

    failed = fail_owner(conn, DEAD, at(5))

    by_id = {r["id"]: r for r in failed}
    assert set(by_id) == {retried, last, asked}
    assert {(i, r["status"], r["attempts"], r["never_started"]) for i, r in by_id.items()} == {
        (retried, "queued", 1, False),
        (last, "failed", 1, False),
        (asked, "cancelled", 1, False),
    }
    assert by_id[last]["type"] == "poison" and by_id[last]["max_attempts"] == 1

    again = row(conn, retried)
    assert again["status"] == "queued" and again["attempts"] == 1
    assert again["lease_owner"] is None and again["lease_token"] is None
    # The row's backoff after a first attempt (1 s base, jittered down by up to half).
    assert at(5.5) <= again["visible_after"] <= at(6)
    assert again["last_error"] == f"{CAUSE} on attempt 1 of 3 (pid 4242, worker {DEAD})"
    assert again["finished_at"] is None

    dead = row(conn, last)
    assert (dead["status"], dead["finished_at"]) == ("failed", at(5))
    assert dead["last_error"] == f"{CAUSE} on attempt 1 of 1 (pid 4242, worker {DEAD})"
    assert last in {r[0] for r in conn.execute("SELECT id FROM pgqueue.dead_letters")}
    # Its dependant is settled as by any failure: cancelled, naming the parent.
    waiting = row(conn, child)
    assert (waiting["status"], waiting["cancelled_by"]) == ("cancelled", last)

    cancelled = row(conn, asked)
    assert (cancelled["status"], cancelled["finished_at"]) == ("cancelled", at(5))

    assert row(conn, done)["status"] == "completed"
    assert row(conn, done)["last_error"] is None
    assert row(conn, sibling) == before, "another owner's task must not be touched"

    assert fail_owner(conn, DEAD, at(6)) == [], "a second take-back finds nothing"


def row_lease(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.Lease:
    current = row(conn, task_id)
    return pgqueue.Lease(task_id, current["lease_token"])


def test_a_claim_whose_handlers_never_started_gets_its_attempt_back(
    conn: psycopg.Connection[Any],
) -> None:
    """As the lease sweep does: a claim later than the owner's last start mark died before
    any of its handlers ran, and is ready again at once, with no attempt spent."""
    started = pgqueue.enqueue(conn, "job", {}, max_attempts=3, now=T0).id
    unstarted = pgqueue.enqueue(conn, "job", {}, max_attempts=1, now=T0).id
    run(conn, claiming.lease_starts_mark(DEAD, started=False, now=at(0)))
    assert claim(conn, DEAD, at(1), 1) == {started}
    run(conn, claiming.lease_starts_mark(DEAD, now=at(2)))
    assert claim(conn, DEAD, at(3), 1) == {unstarted}

    failed = {r["id"]: r for r in fail_owner(conn, DEAD, at(4))}

    assert (failed[started]["status"], failed[started]["attempts"]) == ("queued", 1)
    assert failed[unstarted]["never_started"] is True
    fresh = row(conn, unstarted)
    assert (fresh["status"], fresh["attempts"], fresh["visible_after"]) == ("queued", 0, at(4))
    assert fresh["last_error"] is None


@pytest.mark.parametrize("owner", ["", "host:100:9.9"])
def test_an_owner_with_nothing_running_fails_nothing(
    conn: psycopg.Connection[Any], owner: str
) -> None:
    pgqueue.enqueue(conn, "job", {}, now=T0)
    claim(conn, DEAD, at(1), 1)
    assert fail_owner(conn, owner, at(2)) == []
