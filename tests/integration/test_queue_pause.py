"""Pausing a queue: claims skip it until it is resumed, whoever claims and whenever.

The setting lives in ``pgqueue.queues``, so these tests hold every claim (library, async,
another session) to it, and check the library, the CLI and the HTTP API agree on it. Real
worker processes honouring it across a restart are in tests/acceptance.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def claim_ids(conn: psycopg.Connection[Any], *queues: str) -> set[Any]:
    return {t.id for t in pgqueue.claim(conn, list(queues), limit=100, worker_id="test")}


def test_a_paused_queue_is_skipped_by_claims_and_other_queues_are_not(conn, connect):
    emails = {pgqueue.enqueue(conn, "send", queue="emails").id for _ in range(3)}
    reports = {pgqueue.enqueue(conn, "build", queue="reports").id for _ in range(3)}

    pgqueue.pause_queue(conn, "emails")

    other_session = connect()
    assert claim_ids(other_session, "emails", "reports") == reports
    assert claim_ids(other_session, "emails") == set()
    statuses = {t.status for t in (pgqueue.get_task(conn, i) for i in emails)}
    assert statuses == {pgqueue.TaskStatus.QUEUED}

    pgqueue.resume_queue(conn, "emails")
    assert claim_ids(other_session, "emails") == emails


def test_pausing_inside_a_transaction_takes_effect_on_commit(conn, connect):
    task = pgqueue.enqueue(conn, "send", queue="emails").task
    tx = connect(autocommit=False)
    pgqueue.pause_queue(tx, "emails")

    [claimed] = pgqueue.claim(conn, ["emails"], limit=10, worker_id="w")
    assert claimed.id == task.id, "not paused before the commit"
    pgqueue.release(conn, [claimed.lease])
    tx.commit()
    assert claim_ids(conn, "emails") == set()


def test_pausing_twice_keeps_the_first_pause_time_and_resuming_clears_it(conn):
    first = pgqueue.pause_queue(conn, "emails", now=NOW)
    again = pgqueue.pause_queue(conn, "emails", now=NOW.replace(year=2031))
    assert first.paused and again.paused
    assert again.paused_at == first.paused_at == NOW

    resumed = pgqueue.resume_queue(conn, "emails")
    assert not resumed.paused and resumed.paused_at is None
    assert pgqueue.resume_queue(conn, "emails").paused is False  # resuming twice is fine


def test_resume_wakes_listening_workers_only_when_it_commits(conn, connect):
    listener = connect()
    listener.execute("LISTEN pgqueue")
    pgqueue.pause_queue(conn, "emails")
    tx = connect(autocommit=False)

    pgqueue.resume_queue(tx, "emails")
    assert list(listener.notifies(timeout=0.2)) == []
    tx.commit()
    notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


def test_list_queues_shows_queues_with_work_or_a_setting_and_their_state(conn):
    pgqueue.enqueue(conn, "send", queue="emails")
    done = pgqueue.enqueue(conn, "build", queue="finished-only").task
    [claimed] = pgqueue.claim(conn, ["finished-only"], limit=1, worker_id="w")
    pgqueue.complete(conn, claimed.lease)
    pgqueue.pause_queue(conn, "idle-but-paused")

    states = {q.name: q for q in pgqueue.list_queues(conn)}

    assert set(states) == {"emails", "idle-but-paused"}, done.id
    assert states["idle-but-paused"].paused and not states["emails"].paused
    assert states["emails"].updated_at is None  # never had a setting


@pytest.mark.parametrize("name", ["", " ", "x" * 201, "a\x00b", 7])
def test_a_bad_queue_name_is_a_validation_error_naming_queue(conn, name):
    before = conn.execute("SELECT count(*) FROM pgqueue.queues").fetchone()
    for op in (pgqueue.pause_queue, pgqueue.resume_queue):
        with pytest.raises(pgqueue.ValidationError) as info:
            op(conn, name)
        assert info.value.field == "queue"
    assert conn.execute("SELECT count(*) FROM pgqueue.queues").fetchone() == before


def test_async_and_client_pause_the_same_setting(database_url, conn):
    task = pgqueue.enqueue(conn, "send", queue="emails").id

    async def pause() -> pgqueue.QueueState:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            return await aio.pause_queue(a, "emails")

    assert asyncio.run(pause()).paused
    assert claim_ids(conn, "emails") == set()  # the async pause holds for a sync claim
    with pgqueue.Client(database_url) as client:
        assert [q.paused for q in client.list_queues() if q.name == "emails"] == [True]
        assert client.resume_queue("emails").paused is False
    assert claim_ids(conn, "emails") == {task}


def test_cli_pauses_lists_and_resumes_with_json_and_tables(database_url, conn):
    pgqueue.enqueue(conn, "send", queue="emails")

    paused = run_main(database_url, "--json", "queue", "pause", "emails")
    assert paused.code == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"] is True
    listed = run_main(database_url, "queue", "list")
    assert listed.code == 0 and "emails" in listed.stdout and "paused" in listed.stdout
    assert claim_ids(conn, "emails") == set()

    resumed = run_main(database_url, "queue", "resume", "emails")
    assert resumed.code == 0 and "is running" in resumed.stdout
    assert len(claim_ids(conn, "emails")) == 1


def test_cli_refuses_a_bad_queue_name_with_one_line_and_exit_2(database_url):
    result = run_main(database_url, "queue", "pause", "x" * 201)
    assert result.code == 2
    assert result.line.startswith("error: queue:"), result.line


def test_http_pauses_lists_and_resumes(database_url, conn):
    pgqueue.enqueue(conn, "send", queue="emails")
    api = Api(ApiSettings(database_url=database_url))
    try:
        paused = api.request("POST", "/api/v1/queues/emails/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        assert claim_ids(conn, "emails") == set()
        listed = api.request("GET", "/api/v1/queues").json()
        assert {"name": "emails", "paused": True}.items() <= listed[0].items()
        stats = api.request("GET", "/api/v1/stats").json()
        assert stats["paused_queues"] == ["emails"]
        metrics = api.request("GET", "/metrics").text
        assert 'pgqueue_queue_paused{queue="emails"} 1.0' in metrics
        resumed = api.request("POST", "/api/v1/queues/emails/resume")
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
        too_long = api.request("POST", f"/api/v1/queues/{'x' * 201}/pause")
        assert too_long.status_code == 422 and too_long.json()["errors"][0]["field"] == "queue"
    finally:
        api.close()
    assert len(claim_ids(conn, "emails")) == 1


def test_stats_says_which_queues_are_paused(database_url, conn):
    pgqueue.enqueue(conn, "send", queue="emails")
    pgqueue.pause_queue(conn, "emails")

    human = run_main(database_url, "stats")
    assert human.code == 0 and "paused (no worker claims from them): emails" in human.stdout
    machine = run_main(database_url, "--json", "stats")
    assert json.loads(machine.stdout)["paused_queues"] == ["emails"]
    pgqueue.resume_queue(conn, "emails")
    assert json.loads(run_main(database_url, "--json", "stats").stdout)["paused_queues"] == []
