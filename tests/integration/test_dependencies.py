"""Dependencies between tasks against real PostgreSQL: a child waits until its
parents are final, is released in the transaction that finishes its last parent, and is
cancelled (reason naming the parent) when a parent fails, unless it runs anyway."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until

import pgqueue
from pgqueue.models import TaskStatus


def claim(conn: psycopg.Connection[Any]) -> list[pgqueue.ClaimedTask]:
    return pgqueue.claim(conn, ["default"], limit=100, worker_id="w")


def status(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> TaskStatus:
    return pgqueue.get_task(conn, task_id).status


def test_child_waits_and_is_released_by_its_last_parents_completion(conn: Any) -> None:
    a = pgqueue.enqueue(conn, "a", {})
    b = pgqueue.enqueue(conn, "b", {})
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[a, b.id])
    assert child.task.status is TaskStatus.WAITING
    conn.commit()
    claimed = claim(conn)
    assert {t.id for t in claimed} == {a.id, b.id}  # the waiting child is not claimed
    first, second = sorted(claimed, key=lambda t: t.type)
    pgqueue.complete(conn, first.lease, {"x": 1})
    conn.commit()
    assert status(conn, child.id) is TaskStatus.WAITING
    pgqueue.complete(conn, second.lease, {"y": 2})
    # Released in the same transaction as the completion.
    assert status(conn, child.id) is TaskStatus.QUEUED
    conn.commit()
    (claimed_child,) = claim(conn)
    assert claimed_child.id == child.id


def test_retry_of_a_parent_releases_nothing_and_dead_letter_cancels(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {}, max_attempts=2)
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    cleanup = pgqueue.enqueue(conn, "z", {}, depends_on=[parent], on_parent_failure="run")
    conn.commit()
    (p,) = claim(conn)
    pgqueue.fail(conn, p.lease, "boom", retry_after=0)
    conn.commit()
    assert status(conn, child.id) is TaskStatus.WAITING
    assert status(conn, cleanup.id) is TaskStatus.WAITING
    (p,) = claim(conn)
    pgqueue.fail(conn, p.lease, "boom again", retry_after=0)
    conn.commit()
    task = pgqueue.get_task(conn, child.id)
    assert task.status is TaskStatus.CANCELLED
    assert task.cancelled_by == parent.id
    assert task.last_error == f"parent {parent.id} (p) failed"
    assert status(conn, cleanup.id) is TaskStatus.QUEUED


def test_operator_cancel_of_a_parent_cascades_down_the_graph(conn: Any) -> None:
    a = pgqueue.enqueue(conn, "a", {})
    b = pgqueue.enqueue(conn, "b", {}, depends_on=[a])
    c = pgqueue.enqueue(conn, "c", {}, depends_on=[b])
    conn.commit()
    pgqueue.cancel(conn, a.id)
    conn.commit()
    assert status(conn, b.id) is TaskStatus.CANCELLED
    tc = pgqueue.get_task(conn, c.id)
    assert tc.status is TaskStatus.CANCELLED and tc.cancelled_by == b.id


def test_enqueue_many_with_a_chain_inside_the_batch(conn: Any) -> None:
    first = pgqueue.prepare("one", {})
    second = pgqueue.prepare("two", {}, depends_on=[first])
    results = pgqueue.enqueue_many(conn, [first, second, {"type": "three", "depends_on": [second]}])
    assert [r.task.status for r in results] == [
        TaskStatus.QUEUED,
        TaskStatus.WAITING,
        TaskStatus.WAITING,
    ]


def test_unknown_parent_and_cycle_are_refused_with_nothing_written(conn: Any) -> None:
    ghost = uuid.uuid4()
    with pytest.raises(pgqueue.UnknownParent) as info:
        pgqueue.enqueue(conn, "c", {}, depends_on=[ghost])
    assert info.value.parent_id == ghost
    a = pgqueue.prepare("a", {})
    with pytest.raises(pgqueue.UnknownParent):
        pgqueue.enqueue_many(conn, [a, {"type": "b", "depends_on": [ghost]}])
    conn.rollback()
    assert pgqueue.list_tasks(conn) == [] or not any(t.id == a.id for t in pgqueue.list_tasks(conn))
    with pytest.raises(pgqueue.DependencyError):
        pgqueue.prepare("a", {}, depends_on=[a, a])


def test_a_child_of_a_completed_parent_is_queued_at_once(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {})
    conn.commit()
    (p,) = claim(conn)
    pgqueue.complete(conn, p.lease, None)
    conn.commit()
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    assert child.task.status is TaskStatus.QUEUED


def test_parents_children_and_the_claim_flags(conn: Any) -> None:
    a = pgqueue.enqueue(conn, "a", {})
    b = pgqueue.enqueue(conn, "b", {})
    wf = uuid.uuid4()
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[b, a], workflow_id=wf)
    conn.commit()
    ps = pgqueue.parents(conn, child.id)
    assert [(p.task_id, p.position) for p in ps] == [(b.id, 0), (a.id, 1)]
    assert [c.task_id for c in pgqueue.children(conn, a.id)] == [child.id]
    for t in claim(conn):
        pgqueue.complete(conn, t.lease, {"from": t.type})
    (claimed,) = claim(conn)
    assert claimed.has_parents and claimed.workflow_id == wf
    assert [p.result for p in pgqueue.parents(conn, child.id)] == [{"from": "b"}, {"from": "a"}]


def test_pruning_a_child_deletes_its_edges_and_buckets(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {})
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    pgqueue.cancel(conn, parent.id)  # cascades: the child is cancelled too
    assert status(conn, child.id) is TaskStatus.CANCELLED
    edges = "SELECT count(*) FROM pgqueue.task_dependencies WHERE child_id = %s"
    assert conn.execute(edges, (child.id,)).fetchone() == (1,)
    later = datetime.now(UTC) + timedelta(days=30)
    assert pgqueue.prune(conn, now=later) == 2
    assert conn.execute(edges, (child.id,)).fetchone() == (0,)


def test_a_worker_gives_the_handler_its_parents_results_in_order(
    database_url: str, conn: Any
) -> None:
    seen: dict[str, Any] = {}
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("member")
    def member(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return payload["n"] * 10

    @tasks.handler("callback")
    def callback(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        seen["results"] = ctx.parent_results
        seen["statuses"] = [p.status for p in ctx.parents]
        return sum(ctx.parent_results)

    members = [pgqueue.prepare("member", {"n": n}) for n in range(5)]
    (*_, cb) = pgqueue.enqueue_many(
        conn, [*members, {"type": "callback", "depends_on": list(reversed(members))}]
    )
    conn.commit()
    run_worker_until(database_url, tasks, lambda: status(conn, cb.id) is TaskStatus.COMPLETED)
    assert seen["results"] == [40, 30, 20, 10, 0]
    assert seen["statuses"] == [TaskStatus.COMPLETED] * 5


# --- refused batches write nothing ------------------------------------------------


def graph_rows(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """How many tasks, edges and dependency buckets the database holds."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgqueue.tasks),"
        " (SELECT count(*) FROM pgqueue.task_dependencies),"
        " (SELECT count(*) FROM pgqueue.task_dependency_buckets)"
    ).fetchone()
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


def a_cycle() -> list[pgqueue.TaskSpec]:
    """Three prepared tasks of one batch, each depending on the next: a -> c -> b -> a. A
    prepared task can only name tasks prepared before it, so the first is rebuilt
    (TaskSpec is a named tuple) to close the circle."""
    a = pgqueue.prepare("a", {})
    b = pgqueue.prepare("b", {}, depends_on=[a])
    c = pgqueue.prepare("c", {}, depends_on=[b])
    return [a._replace(depends_on=(c.id,)), b, c]


def test_a_cycle_within_one_batch_is_refused_naming_it_with_nothing_written(conn: Any) -> None:
    existing = pgqueue.enqueue(conn, "before", {})
    before = graph_rows(conn)
    batch = a_cycle()
    with pytest.raises(pgqueue.DependencyCycle) as info:
        pgqueue.enqueue_many(conn, [*batch, pgqueue.prepare("d", {}, depends_on=[existing])])
    cycle = info.value.cycle
    assert cycle[0] == cycle[-1] and set(cycle) == {s.id for s in batch}
    assert len(cycle) == 4
    assert isinstance(info.value, pgqueue.DependencyError)
    assert graph_rows(conn) == before


def test_a_task_depending_on_itself_is_refused_with_nothing_written(conn: Any) -> None:
    before = graph_rows(conn)
    spec = pgqueue.prepare("a", {})
    with pytest.raises(pgqueue.DependencyError, match=str(spec.id)):
        pgqueue.enqueue_many(conn, [spec._replace(depends_on=(spec.id,))])
    assert graph_rows(conn) == before


def test_a_parent_named_twice_in_any_form_is_refused_with_nothing_written(conn: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {})
    before = graph_rows(conn)
    for twice in ([parent, parent.id], [parent.id, str(parent.id)], [str(parent.id)] * 2):
        with pytest.raises(pgqueue.DependencyError, match="named twice"):
            pgqueue.enqueue(conn, "c", {}, depends_on=twice)
    with pytest.raises(pgqueue.DependencyError, match="named twice"):
        pgqueue.enqueue_many(conn, [{"type": "c", "depends_on": [parent.id, parent.id]}])
    assert graph_rows(conn) == before


@pytest.mark.parametrize("refused", ["cycle", "unknown_parent"])
def test_a_refused_batch_writes_none_of_its_tasks_in_the_callers_transaction(
    connect: Any, refused: str
) -> None:
    """In the caller's own transaction (not autocommit), a batch refused for a cycle or an
    unknown parent leaves nothing behind, not even its tasks that have no parents: a caller
    that catches the error and commits must not commit half a batch."""
    conn = connect(autocommit=False)
    before = graph_rows(conn)
    bad: list[Any] = (
        a_cycle() if refused == "cycle" else [{"type": "orphan", "depends_on": [uuid.uuid4()]}]
    )
    with pytest.raises(pgqueue.DependencyError):
        pgqueue.enqueue_many(conn, [pgqueue.prepare("plain", {}), *bad])
    assert graph_rows(conn) == before
    conn.rollback()


# --- a chord's fan-in across buckets -----------------------------------------------


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 2, 0), (2, 0, 1)])
def test_a_fan_in_of_130_parents_waits_for_every_bucket_and_releases_the_child_once(
    connect: Any, order: tuple[int, int, int]
) -> None:
    """130 parents make three buckets (64 parents at most to a bucket, dealt by position
    modulo the number of buckets: positions 0, 3, 6, ... share one; 44, 43 and 43 parents).
    They are completed so that the buckets empty at different times (each bucket in each
    role once, over the three orders): one bucket emptied while the others are still open,
    then a second while the third keeps one parent, then that last parent, each bucket's
    parents in a shuffled order. The child's count of open buckets follows (3, 2, 1, 0): it
    waits through every transaction but the last, is released in the transaction of the
    last, and only once (one wake-up of its queue, claimed once)."""
    conn = connect()
    members = [pgqueue.prepare("member", {"n": n}) for n in range(130)]
    callback = pgqueue.prepare("callback", {}, queue="callbacks", depends_on=members)
    pgqueue.enqueue_many(conn, [*members, callback])
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue")
    leases = {}
    while batch := claim(conn):
        leases.update((t.id, t.lease) for t in batch)
    assert sorted(leases) == sorted(m.id for m in members)
    buckets = [[m.id for m in members[b::3]] for b in range(3)]
    assert [len(b) for b in buckets] == [44, 43, 43]
    rng = random.Random(order[0])
    first, second, third = (rng.sample(buckets[b], len(buckets[b])) for b in order)
    # Each step in transactions of at most 17 completions.
    middle = second + third[:-1]
    steps = [first[:-1], first[-1:], rng.sample(middle, len(middle)), third[-1:]]
    transactions = [step[i : i + 17] for step in steps for i in range(0, len(step), 17)]

    writer = connect(autocommit=False)
    done: set[uuid.UUID] = set()
    open_seen = []
    for chunk in transactions:
        completed = pgqueue.complete_many(writer, [(leases[i], i.hex) for i in chunk])
        assert completed == set(chunk)
        done.update(chunk)
        still_open = sum(not done.issuperset(b) for b in buckets)
        expected = (TaskStatus.WAITING if still_open else TaskStatus.QUEUED, still_open)
        # Released (or not) in the transaction of the completions themselves.
        child = pgqueue.get_task(writer, callback.id)
        assert (child.status, child.parents_pending) == expected, f"{len(done)} parents done"
        writer.commit()
        child = pgqueue.get_task(conn, callback.id)
        assert (child.status, child.parents_pending) == expected, f"{len(done)} parents done"
        if still_open:
            assert pgqueue.claim(conn, ["callbacks"], limit=10, worker_id="w") == []
        if still_open not in open_seen:
            open_seen.append(still_open)
    assert open_seen == [3, 2, 1, 0], "the buckets emptied one at a time"

    # Notifications arrive in commit order: once this one is read, every earlier one was.
    conn.execute("SELECT pg_notify('pgqueue', 'end of test')")
    payloads = []
    for note in listener.notifies(timeout=60):
        if note.payload == "end of test":
            break
        payloads.append(note.payload)
    else:
        pytest.fail("the sentinel notification never arrived")
    assert payloads.count("callbacks") == 1
    (claimed,) = pgqueue.claim(conn, ["callbacks"], limit=10, worker_id="w")
    assert (claimed.id, claimed.attempts) == (callback.id, 1)
    pgqueue.complete(conn, claimed.lease, "all in")
    assert pgqueue.claim(conn, ["callbacks"], limit=10, worker_id="w") == []
    results = [p.result for p in pgqueue.parents(conn, callback.id)]
    assert results == [m.id.hex for m in members]  # in depends_on order, not completion order
