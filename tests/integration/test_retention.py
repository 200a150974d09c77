"""Retention per queue: finished tasks go when their queue's retention (or the default) ends.

Pruning reads each queue's setting in ``pgqueue.queues`` at every batch, so these tests set
one and prune with the clock controlled. The worker doing it on its own, as a process, is in
tests/acceptance/test_worker_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings
from pgqueue.worker.maintenance import Maintenance, MaintenanceConfig

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
DAY = 24 * HOUR


def finish(conn: psycopg.Connection[Any], queue: str, at: datetime, *, dead: bool = False):
    """A task of ``queue`` that completed (or was dead-lettered) at ``at``."""
    task_id = pgqueue.enqueue(conn, "t", {}, queue=queue, max_attempts=1, now=at).id
    (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="w", now=at)
    assert claimed.id == task_id
    if dead:
        pgqueue.fail(conn, claimed.lease, "broke", now=at)
    else:
        pgqueue.complete(conn, claimed.lease, now=at)
    return task_id


def left(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> set[uuid.UUID]:
    rows = conn.execute("SELECT id FROM pgqueue.tasks WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r[0] for r in rows}


def test_a_queue_kept_shorter_is_pruned_sooner_and_the_others_keep_the_default(conn):
    short = [finish(conn, "short", T0) for _ in range(3)]
    normal = [finish(conn, "default", T0) for _ in range(3)]
    pgqueue.set_queue_retention(conn, "short", completed=HOUR)

    pruned = pgqueue.prune(conn, completed_after=DAY, now=T0 + timedelta(hours=2))

    assert pruned == 3
    assert left(conn, short) == set()
    assert left(conn, normal) == set(normal)


def test_a_queue_kept_longer_survives_the_default_and_goes_at_its_own_time(conn):
    audit = [finish(conn, "audit", T0) for _ in range(3)]
    normal = [finish(conn, "default", T0) for _ in range(3)]
    pgqueue.set_queue_retention(conn, "audit", completed=30 * DAY)

    assert pgqueue.prune(conn, completed_after=DAY, now=T0 + timedelta(days=2)) == 3
    assert left(conn, audit) == set(audit) and left(conn, normal) == set()
    assert pgqueue.prune(conn, completed_after=DAY, now=T0 + timedelta(days=31)) == 3
    assert left(conn, audit) == set()


def test_dead_letters_have_a_retention_of_their_own_per_queue(conn):
    dead = finish(conn, "payments", T0, dead=True)
    done = finish(conn, "payments", T0)
    pgqueue.set_queue_retention(conn, "payments", completed=HOUR, dead=90 * DAY)

    pgqueue.prune(conn, completed_after=DAY, dead_after=14 * DAY, now=T0 + timedelta(days=20))

    assert left(conn, [dead, done]) == {dead}, "the completed task went, the dead letter stays"
    pgqueue.prune(conn, completed_after=DAY, dead_after=14 * DAY, now=T0 + timedelta(days=91))
    assert left(conn, [dead]) == set()


def test_setting_retention_to_none_goes_back_to_the_default(conn):
    task = finish(conn, "audit", T0)
    kept = pgqueue.set_queue_retention(conn, "audit", completed=30 * DAY)
    assert (kept.completed_retention, kept.dead_retention) == (30 * DAY, None)

    back = pgqueue.set_queue_retention(conn, "audit")
    assert (back.completed_retention, back.dead_retention) == (None, None)
    assert pgqueue.prune(conn, completed_after=DAY, now=T0 + timedelta(days=2)) == 1
    assert left(conn, [task]) == set()


def test_retention_and_pausing_are_separate_settings_of_one_queue(conn):
    pgqueue.pause_queue(conn, "audit")
    state = pgqueue.set_queue_retention(conn, "audit", completed=HOUR)
    assert state.paused and state.completed_retention == HOUR
    resumed = pgqueue.resume_queue(conn, "audit")
    assert not resumed.paused and resumed.completed_retention == HOUR
    assert [q.completed_retention for q in pgqueue.list_queues(conn) if q.name == "audit"] == [HOUR]


def test_pruning_per_queue_stays_in_batches_of_limit_across_queues(conn):
    for queue in ("a", "b", "c"):
        for _ in range(3):
            finish(conn, queue, T0)
    pgqueue.set_queue_retention(conn, "b", completed=HOUR)
    later = T0 + timedelta(days=2)

    batches = []
    while n := pgqueue.prune(conn, completed_after=DAY, limit=4, now=later):
        batches.append(n)

    assert sum(batches) == 9 and max(batches) <= 4 * 2  # a batch per status


def test_the_worker_maintenance_prunes_each_queue_by_its_own_retention(database_url, conn):
    now = datetime.now(UTC)
    short = [finish(conn, "short", now - timedelta(hours=2)) for _ in range(2)]
    normal = [finish(conn, "default", now - timedelta(hours=2)) for _ in range(2)]
    pgqueue.set_queue_retention(conn, "short", completed=HOUR)

    async def prune_round() -> int:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            return (await Maintenance(MaintenanceConfig()).prune_once(a)).pruned

    assert asyncio.run(prune_round()) == 2
    assert left(conn, short + normal) == set(normal)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"completed": 0}, "completed"),
        ({"completed": -1}, "completed"),
        ({"completed": float("inf")}, "completed"),
        ({"completed": True}, "completed"),
        ({"dead": "1d"}, "dead"),
    ],
)
def test_a_bad_retention_is_a_validation_error_naming_it_and_writes_nothing(conn, kwargs, field):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.set_queue_retention(conn, "q", **kwargs)
    assert info.value.field == field
    assert pgqueue.list_queues(conn) == []


def test_async_and_client_set_the_same_retention(database_url):
    async def set_it() -> pgqueue.QueueState:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            return await aio.set_queue_retention(a, "audit", completed=DAY, dead=60 * DAY)

    assert asyncio.run(set_it()).dead_retention == 60 * DAY
    with pgqueue.Client(database_url) as client:
        (state,) = client.list_queues()
        assert (state.completed_retention, state.dead_retention) == (DAY, 60 * DAY)


def test_cli_sets_retention_with_durations_and_shows_it(database_url, conn):
    # "audit" has no tasks yet: setting it up first is asked for (--create)
    result = run_main(database_url, "queue", "retention", "audit", "--completed", "7d", "--create")
    assert result.code == 0, result.stderr
    assert "keeps finished tasks 7d and dead letters default" in result.stdout
    machine = run_main(database_url, "--json", "queue", "retention", "audit", "--dead", "36h")
    assert json.loads(machine.stdout)["dead_retention"] == 36 * HOUR
    assert json.loads(machine.stdout)["completed_retention"] is None, "both are set at once"
    listed = run_main(database_url, "queue", "list")
    assert "audit" in listed.stdout and "36h" in listed.stdout


@pytest.mark.parametrize("value", ["soon", "-1d", "0", "1w"])
def test_cli_refuses_a_bad_duration_with_one_line_and_exit_2(database_url, conn, value):
    result = run_main(database_url, "queue", "retention", "audit", "--completed", value)
    assert result.code == 2, (result.stdout, result.stderr)
    assert result.line.startswith("error:"), result.line
    assert pgqueue.list_queues(conn) == []


def test_http_sets_retention_and_lists_it(database_url, conn):
    api = Api(ApiSettings(database_url=database_url))
    try:
        put = api.request(  # "audit" has no tasks yet: ?create=true
            "PUT",
            "/api/v1/queues/audit/retention",
            params={"create": "true"},
            json={"completed_seconds": 7 * DAY},
        )
        assert put.status_code == 200, put.text
        assert put.json()["completed_retention"] == 7 * DAY
        listed = api.request("GET", "/api/v1/queues").json()
        assert [(q["name"], q["dead_retention"]) for q in listed] == [("audit", None)]
        for bad in ({"completed_seconds": 0}, {"completed_seconds": "1d"}, {"keep": 1}):
            refused = api.request("PUT", "/api/v1/queues/audit/retention", json=bad)
            assert refused.status_code == 422, (bad, refused.text)
    finally:
        api.close()
    assert [q.completed_retention for q in pgqueue.list_queues(conn)] == [7 * DAY]
