"""Every statement that finishes a task settles its dependants, against real
PostgreSQL, through the public functions a worker and its maintenance call (pgqueue.complete,
fail, cancel_leased, snooze, release, sweep_expired, expire; an operator's cancel and
cancel_workflow).

The graph is the same for every path::

    parent ──> child ──> grandchild
       └─────> cleanup (on_parent_failure="run")

A final parent settles: completed, it releases the child and the clean-up step (queued); failed
or cancelled, it cancels the child (``cancelled_by`` the parent, the reason naming it) and,
through the child, the grandchild, while the clean-up step still runs (queued). A parent that is
not final (a retry, a snooze, a release, a cooperative cancel still running) releases nothing:
everything stays waiting until the parent ends, and then settles once.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.models import Lease, TaskStatus

LATER = timedelta(hours=1)  # past any lease (30 s) and expiry used here
MUCH_LATER = timedelta(days=1)  # past any retry's backoff (capped at 300 s) after LATER


def claim(conn: psycopg.Connection[Any], **options: Any) -> list[pgqueue.ClaimedTask]:
    return pgqueue.claim(conn, ["default"], limit=100, worker_id="w", **options)


def claim_one(conn: psycopg.Connection[Any], task_id: uuid.UUID, **options: Any) -> Lease:
    """Claim the parent (the only ready task here but for an unrelated one) and its lease."""
    claimed = {t.id: t for t in claim(conn, **options)}
    assert task_id in claimed, "the parent was not claimable"
    return claimed[task_id].lease


@dataclasses.dataclass
class Graph:
    parent: uuid.UUID
    child: uuid.UUID
    grandchild: uuid.UUID
    cleanup: uuid.UUID
    root: uuid.UUID | None = None  # the parent's own parent, for a waiting parent
    workflow: uuid.UUID | None = None


def build(conn: psycopg.Connection[Any], **parent_options: Any) -> Graph:
    root = None
    if parent_options.pop("waiting", False):
        root = pgqueue.enqueue(conn, "root", {}).id
        parent_options["depends_on"] = [root]
    parent = pgqueue.enqueue(conn, "p", {}, **parent_options)
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    grandchild = pgqueue.enqueue(conn, "g", {}, depends_on=[child])
    cleanup = pgqueue.enqueue(conn, "z", {}, depends_on=[parent], on_parent_failure="run")
    for task in (child, grandchild, cleanup):
        assert task.task.status is TaskStatus.WAITING
    return Graph(
        parent.id,
        child.id,
        grandchild.id,
        cleanup.id,
        root=root,
        workflow=parent_options.get("workflow_id"),
    )


# Each path drives the parent from where build() left it and returns the lease of a parent
# still running afterwards (a cooperative cancel), else None.
Path = Callable[[psycopg.Connection[Any], Graph], Lease | None]


def complete(conn: psycopg.Connection[Any], g: Graph) -> None:
    pgqueue.complete(conn, claim_one(conn, g.parent), {"ok": True})


def complete_many(conn: psycopg.Connection[Any], g: Graph) -> None:
    # The worker's batched write: the parent with an unrelated task, in one statement.
    other = pgqueue.enqueue(conn, "other", {})
    claimed = {t.id: t.lease for t in claim(conn)}
    done = pgqueue.complete_many(conn, [(claimed[other.id], 1), (claimed[g.parent], 2)])
    assert done == {other.id, g.parent}


def fail(conn: psycopg.Connection[Any], g: Graph) -> None:
    pgqueue.fail(conn, claim_one(conn, g.parent), "ValueError: boom", retry_after=0)


def cancel_then(write: Callable[[psycopg.Connection[Any], Lease], Any]) -> Path:
    """Claim, then an operator's cancel while it runs (only flagged), then ``write``."""

    def path(conn: psycopg.Connection[Any], g: Graph) -> None:
        lease = claim_one(conn, g.parent)
        assert pgqueue.cancel(conn, g.parent).status is TaskStatus.RUNNING
        write(conn, lease)

    return path


def cancel(conn: psycopg.Connection[Any], g: Graph) -> None:
    assert pgqueue.cancel(conn, g.parent).status is TaskStatus.CANCELLED


def cancel_running(conn: psycopg.Connection[Any], g: Graph) -> Lease:
    lease = claim_one(conn, g.parent)
    assert pgqueue.cancel(conn, g.parent).cancel_requested
    return lease  # still running: the handler decides


def cancel_leased(conn: psycopg.Connection[Any], g: Graph) -> None:
    pgqueue.cancel_leased(conn, claim_one(conn, g.parent), "the handler raised Cancel")


def snooze(conn: psycopg.Connection[Any], g: Graph) -> None:
    assert pgqueue.snooze(conn, claim_one(conn, g.parent), 60).snoozed


def release(conn: psycopg.Connection[Any], g: Graph) -> None:
    lease = claim_one(conn, g.parent)
    assert pgqueue.release(conn, [lease]) == {g.parent}


def sweep(conn: psycopg.Connection[Any], g: Graph) -> None:
    claim_one(conn, g.parent)  # and the worker vanishes
    result = pgqueue.sweep_expired(conn, now=datetime.now(UTC) + LATER)
    assert g.parent in result.details


def expire(conn: psycopg.Connection[Any], g: Graph) -> None:
    assert pgqueue.expire(conn, now=datetime.now(UTC) + LATER) == [g.parent]


def cancel_workflow(conn: psycopg.Connection[Any], g: Graph) -> None:
    assert g.workflow is not None
    pgqueue.cancel_workflow(conn, g.workflow)


PATHS: dict[str, tuple[dict[str, Any], Path, TaskStatus]] = {
    # name: (the parent's options, the path, the parent's status after it)
    "complete": ({}, complete, TaskStatus.COMPLETED),
    "complete_many": ({}, complete_many, TaskStatus.COMPLETED),
    "fail_dead_letter": ({"max_attempts": 1}, fail, TaskStatus.FAILED),
    "fail_retry": ({"max_attempts": 2}, fail, TaskStatus.QUEUED),
    "fail_cancel_requested": (
        {"max_attempts": 3},
        cancel_then(lambda c, lease: pgqueue.fail(c, lease, "boom")),
        TaskStatus.CANCELLED,
    ),
    "cancel_queued": ({}, cancel, TaskStatus.CANCELLED),
    "cancel_waiting": ({"waiting": True}, cancel, TaskStatus.CANCELLED),
    "cancel_running": ({}, cancel_running, TaskStatus.RUNNING),
    "cancel_leased": ({}, cancel_leased, TaskStatus.CANCELLED),
    "snooze": ({}, snooze, TaskStatus.QUEUED),
    "snooze_cancel_requested": (
        {},
        cancel_then(lambda c, lease: pgqueue.snooze(c, lease, 60)),
        TaskStatus.CANCELLED,
    ),
    "release": ({}, release, TaskStatus.QUEUED),
    "release_cancel_requested": (
        {},
        cancel_then(lambda c, lease: pgqueue.release(c, [lease])),
        TaskStatus.CANCELLED,
    ),
    "sweep_dead_letter": ({"max_attempts": 1}, sweep, TaskStatus.FAILED),
    "sweep_retry": ({"max_attempts": 2}, sweep, TaskStatus.QUEUED),
    "sweep_cancel_requested": (
        {},
        cancel_then(lambda c, lease: pgqueue.sweep_expired(c, now=datetime.now(UTC) + LATER)),
        TaskStatus.CANCELLED,
    ),
    "expire": ({"expires_in": 60}, expire, TaskStatus.CANCELLED),
    "cancel_workflow": ({"workflow_id": uuid.uuid4()}, cancel_workflow, TaskStatus.CANCELLED),
}


def statuses(conn: psycopg.Connection[Any], g: Graph) -> dict[str, TaskStatus]:
    names = ("parent", "child", "grandchild", "cleanup")
    return {name: pgqueue.get_task(conn, getattr(g, name)).status for name in names}


def assert_released(conn: psycopg.Connection[Any], g: Graph) -> None:
    assert statuses(conn, g) == {
        "parent": TaskStatus.COMPLETED,
        "child": TaskStatus.QUEUED,
        "grandchild": TaskStatus.WAITING,
        "cleanup": TaskStatus.QUEUED,
    }
    assert pgqueue.get_task(conn, g.child).cancelled_by is None


def assert_cancelled_down_the_graph(
    conn: psycopg.Connection[Any], g: Graph, parent_status: TaskStatus
) -> None:
    child = pgqueue.get_task(conn, g.child)
    assert child.status is TaskStatus.CANCELLED
    assert child.cancelled_by == g.parent
    assert child.last_error is not None
    assert str(g.parent) in child.last_error and parent_status.value in child.last_error
    assert child.finished_at is not None
    grandchild = pgqueue.get_task(conn, g.grandchild)
    assert grandchild.status is TaskStatus.CANCELLED
    assert grandchild.cancelled_by == g.child
    assert grandchild.last_error is not None and str(g.child) in grandchild.last_error
    # The clean-up step runs anyway, and sees why.
    assert pgqueue.get_task(conn, g.cleanup).status is TaskStatus.QUEUED
    (parent,) = pgqueue.parents(conn, g.cleanup)
    assert (parent.task_id, parent.status, parent.result) == (g.parent, parent_status, None)


@pytest.mark.parametrize("name", list(PATHS))
def test_each_finishing_path_settles_the_parents_dependants(conn: Any, name: str) -> None:
    options, path, parent_status = PATHS[name]
    g = build(conn, **options)
    lease = path(conn, g)
    assert pgqueue.get_task(conn, g.parent).status is parent_status

    if parent_status is TaskStatus.COMPLETED:
        assert_released(conn, g)
    elif parent_status.is_final:
        assert_cancelled_down_the_graph(conn, g, parent_status)
        if g.root is not None:  # a waiting parent's cancel leaves its own parent alone
            assert pgqueue.get_task(conn, g.root).status is TaskStatus.QUEUED
    else:
        # Not final (a retry, a snooze, a release, a cancel the handler has yet to obey):
        # nothing is released or cancelled early, not even the clean-up step.
        assert statuses(conn, g) == {
            "parent": parent_status,
            "child": TaskStatus.WAITING,
            "grandchild": TaskStatus.WAITING,
            "cleanup": TaskStatus.WAITING,
        }
        # When the parent does complete, it settles them then, once.
        if lease is None:
            lease = claim_one(conn, g.parent, now=datetime.now(UTC) + LATER + MUCH_LATER)
        pgqueue.complete(conn, lease, "at last")
        assert_released(conn, g)
        assert [p.result for p in pgqueue.parents(conn, g.child)] == ["at last"]


def test_a_run_anyway_child_of_several_parents_waits_for_the_last_even_after_a_failure(
    conn: Any,
) -> None:
    """A failure does not release a clean-up step early: it still waits for its other
    parents, and then runs, seeing which failed."""
    ok = pgqueue.enqueue(conn, "ok", {})
    bad = pgqueue.enqueue(conn, "bad", {}, max_attempts=1)
    cleanup = pgqueue.enqueue(conn, "z", {}, depends_on=[ok, bad], on_parent_failure="run")
    leases = {t.id: t.lease for t in claim(conn)}
    pgqueue.fail(conn, leases[bad.id], "boom")
    assert pgqueue.get_task(conn, cleanup.id).status is TaskStatus.WAITING
    pgqueue.complete(conn, leases[ok.id], 7)
    assert pgqueue.get_task(conn, cleanup.id).status is TaskStatus.QUEUED
    assert [(p.status, p.result) for p in pgqueue.parents(conn, cleanup.id)] == [
        (TaskStatus.COMPLETED, 7),
        (TaskStatus.FAILED, None),
    ]


def test_complete_many_of_every_parent_of_a_child_releases_it_in_that_statement(
    conn: Any,
) -> None:
    a = pgqueue.enqueue(conn, "a", {})
    b = pgqueue.enqueue(conn, "b", {})
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[a, b])
    leases = {t.id: t.lease for t in claim(conn)}
    assert pgqueue.complete_many(conn, [(leases[b.id], "b"), (leases[a.id], "a")]) == {a.id, b.id}
    assert pgqueue.get_task(conn, child.id).status is TaskStatus.QUEUED
    (claimed,) = claim(conn)
    assert claimed.id == child.id
    assert [p.result for p in pgqueue.parents(conn, child.id)] == ["a", "b"]


def test_a_stale_workers_outcome_releases_and_cancels_nothing(conn: Any) -> None:
    """The lease was lost (swept) and the parent claimed again under a new token: the first
    worker's completion, batched completion, failure or cancel each raise LeaseLost or are
    dropped, and the child keeps waiting until the current holder completes."""
    parent = pgqueue.enqueue(conn, "p", {}, max_attempts=3)
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    stale = claim_one(conn, parent.id)
    swept = pgqueue.sweep_expired(conn, now=datetime.now(UTC) + LATER)
    assert swept.requeued == [parent.id]
    current = claim_one(conn, parent.id, now=datetime.now(UTC) + LATER + MUCH_LATER)
    assert current.token != stale.token

    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.complete(conn, stale, "stale")
    assert pgqueue.complete_many(conn, [(stale, "stale")]) == set()
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.fail(conn, stale, "stale failure")
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.cancel_leased(conn, stale, "stale cancel")
    assert pgqueue.get_task(conn, parent.id).status is TaskStatus.RUNNING
    assert pgqueue.get_task(conn, child.id).status is TaskStatus.WAITING

    pgqueue.complete(conn, current, "current")
    assert pgqueue.get_task(conn, child.id).status is TaskStatus.QUEUED
    assert [p.result for p in pgqueue.parents(conn, child.id)] == ["current"]
