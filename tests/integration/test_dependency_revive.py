"""Replaying a dead-lettered parent revives the dependants its failure cancelled:
they wait for it again, and run once it completes; dependants cancelled for another reason,
or that already ran, are left as they are."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

import pgqueue
from pgqueue.models import TaskStatus


def claim(conn: psycopg.Connection[Any], limit: int = 100) -> list[pgqueue.ClaimedTask]:
    return pgqueue.claim(conn, ["default"], limit=limit, worker_id="w")


def task(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.Task:
    return pgqueue.get_task(conn, task_id)


def dead_letter(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> None:
    """Claim the task (it must be the only ready one) and fail its only attempt."""
    (claimed,) = claim(conn)
    assert claimed.id == task_id
    pgqueue.fail(conn, claimed.lease, "boom")
    conn.commit()
    assert task(conn, task_id).status is TaskStatus.FAILED


def complete_ready(conn: psycopg.Connection[Any]) -> list[uuid.UUID]:
    done = []
    for claimed in claim(conn):
        pgqueue.complete(conn, claimed.lease, {"ran": claimed.type})
        done.append(claimed.id)
    conn.commit()
    return done


def test_replay_revives_the_cancelled_chain_below_the_parent(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    grandchild = pgqueue.enqueue(conn, "g", {}, depends_on=[child])
    conn.commit()
    dead_letter(conn, parent.id)
    assert task(conn, child.id).cancelled_by == parent.id
    assert task(conn, grandchild.id).cancelled_by == child.id

    assert pgqueue.replay(conn, [parent.id]) == [parent.id]
    conn.commit()
    for waiting in (child.id, grandchild.id):
        t = task(conn, waiting)
        assert t.status is TaskStatus.WAITING
        assert (t.cancelled_by, t.last_error, t.finished_at) == (None, None, None)

    assert complete_ready(conn) == [parent.id]  # only the parent is ready
    assert task(conn, child.id).status is TaskStatus.QUEUED
    assert task(conn, grandchild.id).status is TaskStatus.WAITING
    assert complete_ready(conn) == [child.id]
    assert complete_ready(conn) == [grandchild.id]
    assert task(conn, grandchild.id).status is TaskStatus.COMPLETED


def test_a_child_still_doomed_by_another_failed_parent_stays_cancelled(conn: Any) -> None:
    first = pgqueue.enqueue(conn, "p1", {}, max_attempts=1)
    second = pgqueue.enqueue(conn, "p2", {}, max_attempts=1)
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[first, second])
    conn.commit()
    # The first fails and cancels the child; the second fails after it.
    claimed = sorted(claim(conn), key=lambda t: t.type)
    for c in claimed:
        pgqueue.fail(conn, c.lease, "boom")
        conn.commit()
    assert task(conn, child.id).cancelled_by == first.id

    pgqueue.replay(conn, [first.id])
    conn.commit()
    t = task(conn, child.id)
    assert t.status is TaskStatus.CANCELLED
    assert t.cancelled_by == second.id
    assert t.last_error == f"parent {second.id} (p2) failed"

    # Replaying the other one too makes it wait for both again, and run after both.
    pgqueue.replay(conn, [second.id])
    conn.commit()
    assert task(conn, child.id).status is TaskStatus.WAITING
    assert sorted(complete_ready(conn)) == sorted([first.id, second.id])
    assert complete_ready(conn) == [child.id]


def test_replay_leaves_alone_what_was_cancelled_by_hand_or_already_ran(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    by_hand = pgqueue.enqueue(conn, "h", {}, depends_on=[parent])
    cleanup = pgqueue.enqueue(conn, "z", {}, depends_on=[parent], on_parent_failure="run")
    conn.commit()
    pgqueue.cancel(conn, by_hand.id)
    conn.commit()
    dead_letter(conn, parent.id)
    assert complete_ready(conn) == [cleanup.id]  # the clean-up ran, seeing the failure

    pgqueue.replay(conn, [parent.id])
    conn.commit()
    t = task(conn, by_hand.id)
    assert t.status is TaskStatus.CANCELLED and t.cancelled_by is None
    assert task(conn, cleanup.id).status is TaskStatus.COMPLETED
    assert complete_ready(conn) == [parent.id]
    assert task(conn, cleanup.id).attempts == 1  # not run a second time


def test_a_waiting_run_anyway_child_waits_for_the_replayed_parent(conn: Any) -> None:
    failing = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    slow = pgqueue.enqueue(conn, "s", {}, run_at=None)
    cleanup = pgqueue.enqueue(conn, "z", {}, depends_on=[failing, slow], on_parent_failure="run")
    conn.commit()
    claimed = {c.type: c for c in claim(conn)}
    pgqueue.fail(conn, claimed["p"].lease, "boom")
    conn.commit()
    assert task(conn, cleanup.id).status is TaskStatus.WAITING  # still waits for "s"

    pgqueue.replay(conn, [failing.id])
    conn.commit()
    pgqueue.complete(conn, claimed["s"].lease, {})
    conn.commit()
    # "s" is done, but the replayed parent is not: the clean-up waits for its new outcome.
    assert task(conn, cleanup.id).status is TaskStatus.WAITING
    assert complete_ready(conn) == [failing.id]
    assert task(conn, cleanup.id).status is TaskStatus.QUEUED
    parents = pgqueue.parents(conn, cleanup.id)
    assert [p.status for p in parents] == [TaskStatus.COMPLETED, TaskStatus.COMPLETED]


def test_a_wide_fan_in_revives_with_its_buckets_counted_again(conn: Any) -> None:
    """130 parents: three buckets; the replayed one re-opens its bucket, the child waits for
    it alone and is released once, by its completion."""
    members = pgqueue.enqueue_many(conn, [{"type": "m"}] * 129)
    failing = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    ids = [r.task.id for r in members] + [failing.id]
    child = pgqueue.enqueue(conn, "c", {}, depends_on=ids)
    conn.commit()
    for claimed in claim(conn, limit=200):
        if claimed.type == "p":
            pgqueue.fail(conn, claimed.lease, "boom")
        else:
            pgqueue.complete(conn, claimed.lease, {})
    conn.commit()
    assert task(conn, child.id).cancelled_by == failing.id
    pgqueue.replay(conn, [failing.id])
    conn.commit()
    t = task(conn, child.id)
    assert (t.status, t.parents_pending) == (TaskStatus.WAITING, 1)
    assert complete_ready(conn) == [failing.id]
    t = task(conn, child.id)
    assert (t.status, t.parents_pending) == (TaskStatus.QUEUED, 0)


def test_a_batch_child_of_a_task_inserted_cancelled_is_cancelled_too(conn: Any) -> None:
    """A parent outside the batch had failed: the batch's task under it is inserted cancelled,
    and that task's own child in the same batch must not wait for ever."""
    failed = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    conn.commit()
    dead_letter(conn, failed.id)
    middle = pgqueue.prepare("m", {}, depends_on=[failed.id])
    last = pgqueue.prepare("l", {}, depends_on=[middle])
    results = pgqueue.enqueue_many(conn, [middle, last])
    conn.commit()
    assert [r.task.status for r in results] == [TaskStatus.CANCELLED, TaskStatus.CANCELLED]
    t = task(conn, last.id)
    assert (t.status, t.cancelled_by) == (TaskStatus.CANCELLED, middle.id)
    assert t.last_error == f"parent {middle.id} (m) cancelled"


def test_a_keyed_root_task_keeps_its_workflow_id(conn: Any) -> None:
    workflow = uuid.uuid4()
    one = pgqueue.enqueue(conn, "r", {}, idempotency_key="root-1", workflow_id=workflow)
    (many,) = pgqueue.enqueue_many(
        conn, [pgqueue.prepare("r", {}, idempotency_key="root-2", workflow_id=workflow)]
    )
    conn.commit()
    assert task(conn, one.id).workflow_id == workflow
    assert task(conn, many.task.id).workflow_id == workflow


def test_a_child_enqueued_after_its_parent_died_is_revived_by_the_replay(conn: Any) -> None:
    """Inserted cancelled (its parent was already a dead letter): the replay revives it too,
    though its edge was counted by the insert, not by the parent's failure."""
    parent = pgqueue.enqueue(conn, "p", {}, max_attempts=1)
    conn.commit()
    dead_letter(conn, parent.id)
    late = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    conn.commit()
    assert (late.task.status, late.task.cancelled_by) == (TaskStatus.CANCELLED, parent.id)
    pgqueue.replay(conn, [parent.id])
    conn.commit()
    assert task(conn, late.id).status is TaskStatus.WAITING
    assert complete_ready(conn) == [parent.id]
    assert complete_ready(conn) == [late.id]
