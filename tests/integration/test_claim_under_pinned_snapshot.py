"""While an old snapshot is open, a worker's claims cost the same after 30,000 tasks as after
the first thousand.

Every claimed task leaves a claim-index entry that vacuum cannot remove while the snapshot
stays; a walk from the start of the range steps over all of them. The worker starts its walks
where its last claim ended (pgqueue.worker.claim_starts), so its cost stays flat. Measured in
buffers, which the shared machine's load does not move, with EXPLAIN (ANALYZE, BUFFERS) of the
very statement the worker would send next, in a transaction rolled back."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

import pgqueue
from pgqueue.queries import claiming, driver, leased
from pgqueue.queries.claiming import ClaimStarts as Starts
from pgqueue.worker.claim_starts import ClaimStarts

BATCH = 100
TASKS = 30_000


def claim_op(starts: Starts | None) -> driver.Op[list[pgqueue.ClaimedTask]]:
    return claiming.task_claim(
        queues=["default"], limit=BATCH, owner="w", lease_seconds=30, starts=starts
    )


def walk_buffers(conn: psycopg.Connection[Any], starts: Starts | None) -> int:
    """Shared buffers the next claim's walks of the claim index would touch (the index scans
    and the heap rows they check, not the update of the rows claimed), found by running the
    claim and rolling it back."""
    query = next(claim_op(starts))
    assert isinstance(query, driver.Query)
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + driver.statements()[query.name],
            query.params,
        ).fetchone()
    assert row is not None
    plan = (row[0] if not isinstance(row[0], str) else json.loads(row[0]))[0]["Plan"]
    scans = [n for n in nodes(plan) if n.get("Index Name") == "tasks_claim_idx"]
    assert scans, "the claim no longer walks tasks_claim_idx"
    return sum(int(n["Shared Hit Blocks"] + n.get("Shared Read Blocks", 0)) for n in scans)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_claims_cost_the_same_after_30000_tasks_while_a_snapshot_is_pinned(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    pgqueue.enqueue_many(conn, [{"type": "job"} for _ in range(TASKS + 2 * BATCH)])
    conn.execute("ANALYZE pgqueue.tasks")
    pin = connect(autocommit=False)
    pin.execute("SELECT txid_current()")  # the snapshot every later row version must outlive

    clock = [0.0]
    starts = ClaimStarts(rescan_seconds=3600, lease_seconds=30, clock=lambda: clock[0])
    done = 0
    first = from_start_first = 0
    while done < TASKS:
        given = starts.next()
        if done == 1_000:
            first, from_start_first = walk_buffers(conn, given), walk_buffers(conn, None)
        claimed = driver.run(conn, claim_op(given))
        starts.claimed(claimed, starts=given, seconds=0.001)
        pgqueue.complete_many(conn, [(t.lease, None) for t in claimed])
        done += len(claimed)
        clock[0] += 0.01
    last, from_start_last = walk_buffers(conn, starts.next()), walk_buffers(conn, None)
    pin.rollback()

    # The walk from the start has grown with every task claimed: the pin is in effect ...
    assert from_start_last > 10 * max(from_start_first, 10), (from_start_first, from_start_last)
    # ... and the worker's walk has not.
    assert last <= 1.5 * first, (first, last)


def test_writes_by_lease_look_each_row_up_by_id_while_a_snapshot_is_pinned(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    # With fresh statistics the table has a handful of running tasks, so a join would read
    # the running-tasks index whole: here 20,000 entries of tasks finished under the pin.
    pgqueue.enqueue_many(conn, [{"type": "job"} for _ in range(20_000 + BATCH)])
    pin = connect(autocommit=False)
    pin.execute("SELECT txid_current()")
    for _ in range(20_000 // BATCH):
        claimed = pgqueue.claim(conn, ["default"], limit=BATCH, worker_id="w")
        pgqueue.complete_many(conn, [(t.lease, None) for t in claimed])
    # A worker's handful: 32 slots' worth.
    leases = [t.lease for t in pgqueue.claim(conn, ["default"], limit=32, worker_id="w")]
    conn.execute("ANALYZE pgqueue.tasks")

    writes = {
        "task_heartbeat": leased.task_heartbeat(leases, 30),
        "task_complete": leased.task_complete_many([(lease, None) for lease in leases]),
        "task_release": leased.task_release(leases),
    }
    for name, op in writes.items():
        query = next(op)
        assert isinstance(query, driver.Query) and query.name == name
        with conn.transaction(force_rollback=True):
            rows = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + driver.statements()[name],
                query.params,
            ).fetchone()
        assert rows is not None
        plan = (rows[0] if not isinstance(rows[0], str) else json.loads(rows[0]))[0]["Plan"]
        used = {n.get("Index Name") for n in nodes(plan)} - {None}
        assert used == {"tasks_pkey"}, (name, used)
        touched = int(plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0))
        assert touched < 40 * len(leases), (name, touched)  # a few dozen a row, not the index
    pin.rollback()
