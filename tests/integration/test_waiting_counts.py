"""Tasks waiting on their parents (status 'waiting') where operators count and list
tasks, against real PostgreSQL.

Counted by the DBA's pgqueue.queue_depth view and pgqueue.queue_stats() (which read the whole
table anyway), and listed by status in the CLI, the HTTP API and the dashboard's filter. The
cheap reads asked every few seconds (the overview behind `pgqueue stats`, GET /api/v1/stats,
/metrics and the dashboard; the queue list; whether a queue exists) read each status through
a partial index of its rows, the waiting ones through tasks_waiting_idx (migration 0014):
tests/integration/test_query_plans.py checks that they read no more.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import pgqueue
from pgqueue.cli import app
from pgqueue.models import QueueStats, TaskStatus


def waiting_in_their_own_queue(conn: psycopg.Connection[Any]) -> list[pgqueue.EnqueueResult]:
    """A parent in 'default' and three dependants waiting on it in 'callbacks' (one high)."""
    parent = pgqueue.enqueue(conn, "p", {})
    return [
        pgqueue.enqueue(conn, "c", {}, queue="callbacks", depends_on=[parent], priority=p)
        for p in ("normal", "normal", "high")
    ]


def test_the_queue_depth_view_and_queue_stats_count_waiting_tasks(conn: Any) -> None:
    waiting_in_their_own_queue(conn)
    rows = {(s.queue, s.priority, s.status): s for s in pgqueue.queue_stats(conn)}
    assert rows[("callbacks", "normal", "waiting")] == QueueStats(
        "callbacks", "normal", "waiting", 2, 0, 0, None
    )
    assert rows[("callbacks", "high", "waiting")].tasks == 1
    assert rows[("default", "normal", "queued")].tasks == 1
    assert not any(
        s.status == "queued" for s in pgqueue.queue_stats(conn) if s.queue == "callbacks"
    )
    view = conn.execute(
        "SELECT priority, tasks FROM pgqueue.queue_depth"
        " WHERE queue = 'callbacks' AND status = 'waiting' ORDER BY priority"
    ).fetchall()
    assert view == [("high", 1), ("normal", 2)]


def test_cli_list_by_status_waiting_lists_the_waiting_tasks(database_url: str, conn: Any) -> None:
    children = waiting_in_their_own_queue(conn)
    result = CliRunner().invoke(
        app, ["--database-url", database_url, "--json", "list", "--status", "waiting"]
    )
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert {d["task_id"] for d in listed} == {str(c.id) for c in children}
    assert {d["status"] for d in listed} == {"waiting"}


def test_the_overview_counts_waiting_tasks_by_queue_and_priority(conn: Any) -> None:
    """What `pgqueue stats` (and --json), GET /api/v1/stats, the pgqueue_queue_depth gauge and
    the dashboard's queue table show."""
    waiting_in_their_own_queue(conn)
    rows = {(s.queue, s.priority, s.status): s.tasks for s in pgqueue.overview(conn)}
    assert rows.get(("callbacks", "normal", "waiting")) == 2
    assert rows.get(("callbacks", "high", "waiting")) == 1


def test_cli_stats_shows_the_waiting_tasks_in_its_table_and_its_json(
    database_url: str, conn: Any
) -> None:
    waiting_in_their_own_queue(conn)
    human = CliRunner().invoke(app, ["--database-url", database_url, "stats"])
    assert human.exit_code == 0, human.output
    lines = [line.split() for line in human.output.splitlines()]
    assert ["callbacks", "normal", "waiting", "2", "0", "0", "-"] in lines
    assert ["callbacks", "high", "waiting", "1", "0", "0", "-"] in lines

    result = CliRunner().invoke(app, ["--database-url", database_url, "--json", "stats"])
    assert result.exit_code == 0, result.output
    depth = json.loads(result.output)["depth"]
    assert {
        "queue": "callbacks",
        "priority": "normal",
        "status": "waiting",
        "tasks": 2,
        "ready": 0,
        "scheduled": 0,
        "oldest_ready_age_seconds": None,
    } in depth
    assert not [d for d in depth if d["queue"] == "callbacks" and d["status"] != "waiting"]


def test_the_api_stats_and_the_queue_depth_gauge_count_waiting_tasks(
    database_url: str, conn: Any
) -> None:
    """GET /api/v1/stats (the dashboard's source) and /metrics: pgqueue_queue_depth has a
    'waiting' series; the ready gauge, which counts due queued tasks, has none for them. The
    queue is listed, and paused without ?create."""
    from fastapi.testclient import TestClient

    from pgqueue.api import ApiSettings, create_app

    waiting_in_their_own_queue(conn)
    with TestClient(
        create_app(ApiSettings(database_url=database_url)),
        base_url="http://localhost",
        client=("127.0.0.1", 50000),
    ) as client:
        stats = client.get("/api/v1/stats")
        metrics = client.get("/metrics")
        queues = client.get("/api/v1/queues")
        paused = client.post("/api/v1/queues/callbacks/pause")
    assert stats.status_code == metrics.status_code == queues.status_code == 200
    assert paused.status_code == 200, paused.text  # not 404: the queue exists
    rows = {(r["queue"], r["priority"], r["status"]): r["tasks"] for r in stats.json()["depth"]}
    assert rows[("callbacks", "normal", "waiting")] == 2
    assert rows[("callbacks", "high", "waiting")] == 1
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.text)
        for s in family.samples
    }
    depth = {
        dict(labels)["priority"]: value
        for (name, labels), value in samples.items()
        if name == "pgqueue_queue_depth"
        and dict(labels)["queue"] == "callbacks"
        and dict(labels)["status"] == "waiting"
    }
    assert depth == {"normal": 2.0, "high": 1.0}
    helps = {f.name: f.documentation for f in text_string_to_metric_families(metrics.text)}
    assert helps["pgqueue_queue_depth"].startswith("Queued, running, waiting and dead-lettered")
    assert not [
        k for k in samples if k[0] == "pgqueue_queue_ready" and ("queue", "callbacks") in k[1]
    ]
    assert "callbacks" in {q["name"] for q in queues.json()}


def test_cli_pauses_a_queue_whose_only_tasks_are_waiting_without_create(
    database_url: str, conn: Any
) -> None:
    waiting_in_their_own_queue(conn)
    listed = CliRunner().invoke(app, ["--database-url", database_url, "queue", "list"])
    assert listed.exit_code == 0, listed.output
    assert "callbacks" in listed.output
    paused = CliRunner().invoke(
        app, ["--database-url", database_url, "queue", "pause", "callbacks"]
    )
    assert paused.exit_code == 0, paused.output
    assert "is paused" in paused.output


def test_a_queue_whose_only_tasks_are_waiting_is_listed(conn: Any) -> None:
    """`pgqueue queue list` (and GET /api/v1/queues) lists every queue with tasks in any
    status."""
    waiting_in_their_own_queue(conn)
    assert "callbacks" in {q.name for q in pgqueue.list_queues(conn)}


def test_a_queue_whose_only_tasks_are_waiting_may_be_paused_without_create(conn: Any) -> None:
    """The CLI and the API refuse to pause a queue with no tasks and no settings unless told
    --create (most often a typo); a queue of waiting tasks is not one."""
    waiting_in_their_own_queue(conn)
    assert pgqueue.pause_queue(conn, "callbacks", create=False).paused


def test_waiting_tasks_are_not_claimed_and_not_counted_as_ready(conn: Any) -> None:
    """The claim and the backlog (the autoscaling signal) never read them."""
    children = waiting_in_their_own_queue(conn)
    assert pgqueue.claim(conn, ["callbacks"], limit=10, worker_id="w") == []
    backlog = pgqueue.backlog(conn, ["callbacks"])
    assert all(b.ready == b.scheduled == b.running == 0 for b in backlog), backlog
    assert {pgqueue.get_task(conn, c.id).status for c in children} == {TaskStatus.WAITING}
