"""Which commits wait for the WAL flush. A submit, a completion and a failure do:
once they return, a crash of the server keeps them. A claim and its start mark do not: each
sets synchronous_commit off for its own transaction, which saves the idle pickup one durable
commit. The statement itself says so; these tests read the setting inside each transaction,
after the statement, where the commit will read it, and check that it goes no further. Each
session turns synchronous_commit on first: the embedded test server runs with it off."""

from __future__ import annotations

from typing import Any

import psycopg

import pgqueue
from pgqueue.queries import claiming, driver


def commit_waits_for_flush(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    assert row is not None
    return bool(row[0] != "off")


def durable_session(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("SET synchronous_commit = on")  # for the session, not a transaction's
    conn.commit()
    return conn


def claim(conn: psycopg.Connection[Any], owner: str = "w") -> pgqueue.ClaimedTask:
    (task,) = driver.run(
        conn, claiming.task_claim(queues=["default"], limit=1, owner=owner, lease_seconds=30)
    )
    return task


def test_the_claim_commits_without_waiting_for_the_flush_and_only_it(
    conn: psycopg.Connection[Any], connect: Any
) -> None:
    pgqueue.enqueue(conn, "job", {})
    worker = durable_session(connect(autocommit=False))
    assert commit_waits_for_flush(worker)

    claim(worker)
    assert not commit_waits_for_flush(worker)  # what this transaction's commit will do
    worker.commit()

    assert commit_waits_for_flush(worker)  # the next transaction is durable again


def test_the_limited_claim_commits_without_waiting_for_the_flush(
    conn: psycopg.Connection[Any], connect: Any
) -> None:
    pgqueue.set_limit(conn, type="limited", max_running=5)
    pgqueue.enqueue(conn, "limited", {})
    worker = durable_session(connect(autocommit=False))

    op = claiming.claim_round(queues=["default"], limit=1, owner="w", lease_seconds=30)
    (task,), _ = driver.run(worker, op)
    assert task.type == "limited"  # claimed through task_claim_limited
    assert not commit_waits_for_flush(worker)
    worker.rollback()


def test_the_start_mark_commits_without_waiting_for_the_flush(connect: Any) -> None:
    worker = durable_session(connect(autocommit=False))
    driver.run(worker, claiming.lease_starts_mark("w"))
    assert not commit_waits_for_flush(worker)
    worker.rollback()


def test_the_keyed_claim_does_not_wait_but_its_start_mark_does(
    conn: psycopg.Connection[Any], connect: Any
) -> None:
    """A keyed task's handler starts only once its claim is durable (the mark's flush takes
    the claim's commit with it): a crash that forgot the claim would run the task again
    beside it, past its key's limit. The claim, under the limits lock, still does not wait."""
    pgqueue.enqueue(conn, "job", {}, concurrency_key="tenant")
    worker = durable_session(connect(autocommit=False))

    op = claiming.claim_round(queues=["default"], limit=1, owner="w", lease_seconds=30)
    (task,), _ = driver.run(worker, op)
    assert task.concurrency_key == "tenant"  # claimed through task_claim_keyed
    assert not commit_waits_for_flush(worker)
    worker.commit()

    driver.run(worker, claiming.lease_starts_mark("w", durable=True))
    assert commit_waits_for_flush(worker)
    worker.commit()


def test_submit_completion_and_failure_wait_for_the_flush(
    conn: psycopg.Connection[Any], connect: Any
) -> None:
    producer = durable_session(connect(autocommit=False))
    pgqueue.enqueue(producer, "job", {})
    pgqueue.enqueue_many(producer, [{"type": "job", "payload": {}}] * 2)
    pgqueue.enqueue_columns(producer, "job", [{}, {}])
    assert commit_waits_for_flush(producer)
    producer.commit()

    first, second = claim(conn), claim(conn)
    outcome = durable_session(connect(autocommit=False))
    pgqueue.complete(outcome, first.lease, {"ok": True})
    pgqueue.fail(outcome, second.lease, "boom")
    assert commit_waits_for_flush(outcome)
    outcome.commit()
