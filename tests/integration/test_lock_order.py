"""Statements that write many leased rows lock them in one order (by id), so two of them over
the same rows wait for each other instead of deadlocking (a worker's heartbeat and
its batched completions, ``UPDATE ... FROM unnest(...)`` each locking in the order given, hit
``deadlock detected`` and stalled completions for ``deadlock_timeout``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.models import Lease


def two_leases(conn: psycopg.Connection[Any]) -> tuple[Lease, Lease]:
    """Two running tasks, the first with the smaller id, stored after the second: a batch
    given high first meets the rows in that order whether the plan follows the array or the
    table, so only a deliberate order by id locks the low row first."""
    high, low = sorted((pgqueue.prepare("job", {}) for _ in range(2)), key=lambda s: s.id)[::-1]
    for spec in (high, low):
        pgqueue.enqueue_many(conn, [spec])
    claimed = pgqueue.claim(conn, ["default"], limit=2, worker_id="w")
    leases = sorted((t.lease for t in claimed), key=lambda lease: lease.task_id)
    return leases[0], leases[1]


WRITES: dict[str, Callable[[Any, list[Lease]], Any]] = {
    "complete_many": lambda c, leases: pgqueue.complete_many(c, [(lease, 1) for lease in leases]),
    "heartbeat": lambda c, leases: pgqueue.heartbeat(c, leases),
    "release": lambda c, leases: pgqueue.release(c, leases),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_batch_given_in_reverse_order_waits_instead_of_deadlocking(
    connect: Callable[..., psycopg.Connection[Any]], write: str
) -> None:
    setup = connect()
    low, high = two_leases(setup)
    holder = connect(autocommit=False)  # the heartbeat's transaction, held open
    batch = connect()
    holder.execute("SET lock_timeout = '20s'")
    batch.execute("SET lock_timeout = '20s'")
    holder.execute("SET deadlock_timeout = '50ms'")  # a deadlock, if any, is found at once

    pgqueue.heartbeat(holder, [low])  # holds the low row
    errors: list[BaseException] = []
    started = threading.Event()

    def run_batch() -> None:
        started.set()
        try:
            WRITES[write](batch, [high, low])  # given high first
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_batch)
    thread.start()
    started.wait()
    # Until the batch waits on the low row. Locking in the order given, it would hold the
    # high row by then, and the holder's next statement would close the cycle.
    waiting = connect()
    for _ in range(2000):
        blocked = waiting.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        ).fetchone()
        if blocked and blocked[0]:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the batch never waited for the held row")
    try:
        pgqueue.heartbeat(holder, [high])
    finally:
        holder.commit()
        thread.join(30)
    assert not thread.is_alive()
    assert errors == []
