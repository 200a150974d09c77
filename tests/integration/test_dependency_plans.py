"""How a chord member's completion finds what it settles: the settle function reads
each finished parent by its id, whatever the planner's statistics say.

The statistics left by an ANALYZE after a burst of enqueues say that almost no task is final.
Joined to the finished parents by status, the settle function's first statement was planned
as a scan of every final task, compared with every edge: a chord of 10,000 members drained in
a time quadratic in its size (bench/chord.py: 3.1x a plain drain). The plans of the
statements a function runs are visible only through auto_explain (log_nested_statements), so
this test runs where the server has it (PostgreSQL from the distribution; the embedded server
of the wheel does not ship it) and says so where it does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pgqueue

MEMBERS = 2_000
BACKLOG = 20_000
BATCH = 50


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def nested_plans(conn: psycopg.Connection[Any], run: Any) -> list[dict[str, Any]]:
    """The plans (JSON) of every statement ``run`` executes, functions' statements included."""
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error as error:
        conn.rollback()
        pytest.skip(f"this server has no auto_explain: {error}".strip())
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_analyze = on",
        "auto_explain.log_format = json",
        "auto_explain.log_level = notice",
    ):
        conn.execute(f"SET {setting}")
    messages: list[str] = []
    conn.add_notice_handler(lambda diag: messages.append(diag.message_primary or ""))
    run()
    conn.execute("RESET ALL")
    out = []
    for message in messages:
        if "plan:" in message:
            out.append(json.loads(message.split("plan:", 1)[1]))
    return out


def test_a_members_completion_reads_its_parents_by_id_not_by_status(conn: Any) -> None:
    members = pgqueue.enqueue_many(conn, [{"type": "m", "queue": "chord"}] * MEMBERS)
    pgqueue.enqueue(conn, "cb", {}, queue="chord", depends_on=[r.task.id for r in members])
    conn.execute(
        "INSERT INTO pgqueue.tasks (queue, type, payload)"
        " SELECT 'backlog', 'b', '{}' FROM generate_series(1, %s)",
        (BACKLOG,),
    )
    conn.commit()
    conn.execute("ANALYZE")  # statistics in which no task is final
    conn.commit()
    # Some members finished since, as in a drain.
    for _ in range(4):
        claimed = pgqueue.claim(conn, ["chord"], limit=BATCH, worker_id="w")
        pgqueue.complete_many(conn, [(c.lease, None) for c in claimed])
        conn.commit()
    claimed = pgqueue.claim(conn, ["chord"], limit=BATCH, worker_id="w")
    conn.commit()

    plans = nested_plans(
        conn, lambda: pgqueue.complete_many(conn, [(c.lease, None) for c in claimed])
    )
    conn.commit()
    counted = [p for p in plans if "SET outcome = p.status" in p["Query Text"]]
    assert len(counted) == 1, [p["Query Text"][:80] for p in plans]
    tree = list(nodes(counted[0]["Plan"]))
    task_scans = [n for n in tree if n.get("Relation Name") == "tasks"]
    assert task_scans and all(n.get("Index Name") == "tasks_pkey" for n in task_scans), [
        (n["Node Type"], n.get("Index Name")) for n in task_scans
    ]
    assert all(n.get("Actual Loops", 1) <= BATCH for n in task_scans)
    removed = max(n.get("Rows Removed by Join Filter", 0) * n.get("Actual Loops", 1) for n in tree)
    assert removed <= BATCH, removed
    rows = conn.execute(
        "SELECT count(*) FROM pgqueue.task_dependencies WHERE outcome = 'completed'"
    ).fetchone()
    assert rows is not None and rows[0] == 5 * BATCH
