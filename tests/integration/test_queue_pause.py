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
from keyed_tasks import add_keyed

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
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue")
    pgqueue.pause_queue(conn, "emails")
    tx = connect(autocommit=False)

    pgqueue.resume_queue(tx, "emails")
    assert list(listener.notifies(timeout=0.2)) == []
    tx.commit()
    notes = list(listener.notifies(timeout=60, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


def test_list_queues_shows_every_queue_with_tasks_or_a_setting_and_its_state(conn):
    pgqueue.enqueue(conn, "send", queue="emails")
    for queue, finish in (("completed-only", "complete"), ("dead-only", "fail")):
        pgqueue.enqueue(conn, "build", queue=queue, max_attempts=1)
        [claimed] = pgqueue.claim(conn, [queue], limit=1, worker_id="w")
        if finish == "complete":
            pgqueue.complete(conn, claimed.lease)
        else:
            pgqueue.fail(conn, claimed.lease, "boom")
    cancelled = pgqueue.enqueue(conn, "build", queue="cancelled-only").id
    pgqueue.cancel(conn, cancelled)
    pgqueue.pause_queue(conn, "idle-but-paused")

    states = {q.name: q for q in pgqueue.list_queues(conn)}

    assert set(states) == {
        "emails",
        "completed-only",
        "dead-only",
        "cancelled-only",
        "idle-but-paused",
    }
    assert states["idle-but-paused"].paused and not states["emails"].paused
    assert states["emails"].updated_at is None  # never had a setting


def test_a_queue_whose_only_tasks_have_a_concurrency_key_is_listed_and_known(database_url, conn):
    """Tasks with a key wait in an index of their own (tasks_claim_key_idx): the queue list
    and the probe before a pause (no --create needed) read it too."""
    add_keyed(conn, "acme", 2, queue="tenants")
    pgqueue.enqueue(conn, "send", queue="emails")

    assert {q.name for q in pgqueue.list_queues(conn)} == {"emails", "tenants"}
    assert pgqueue.pause_queue(conn, "tenants", create=False).paused
    listed = run_main(database_url, "queue", "list")
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [
        ["emails", "running"],
        ["tenants", "paused"],
    ]
    assert pgqueue.resume_queue(conn, "tenants").paused is False
    paused = run_main(database_url, "queue", "pause", "tenants")
    assert paused.code == 0, paused.stderr
    api = Api(ApiSettings(database_url=database_url))
    try:
        resumed = api.request("POST", "/api/v1/queues/tenants/resume")
        again = api.request("POST", "/api/v1/queues/tenants/pause")
    finally:
        api.close()
    assert resumed.status_code == 200 and again.status_code == 200, again.text


def test_cli_queue_list_shows_a_queue_whose_tasks_have_all_finished(database_url, conn):
    pgqueue.enqueue(conn, "report", queue="demo")
    [claimed] = pgqueue.claim(conn, ["demo"], limit=1, worker_id="w")
    pgqueue.complete(conn, claimed.lease)

    listed = run_main(database_url, "queue", "list")

    assert listed.code == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:2] == ["demo", "running"]


def test_pausing_an_unknown_queue_is_refused_unless_told_to_create_it(database_url, conn):
    def rows() -> Any:
        return conn.execute("SELECT name FROM pgqueue.queues").fetchall()

    with pytest.raises(pgqueue.QueueNotFound, match="create=True"):
        pgqueue.pause_queue(conn, "emials", create=False)
    refused = run_main(database_url, "queue", "pause", "emials")
    assert refused.code == 1 and refused.stdout == ""
    assert refused.line == (
        "error: no queue 'emials': it has no tasks and no settings; to pause it before its "
        "first task, say so: create=True (CLI: --create, HTTP: ?create=true)"
    )
    as_json = json.loads(run_main(database_url, "queue", "pause", "emials", "--json").stderr)
    assert (as_json["error"], as_json["queue"]) == ("not_found", "emials")
    api = Api(ApiSettings(database_url=database_url))
    try:
        response = api.request("POST", "/api/v1/queues/emials/pause")
        assert response.status_code == 404 and response.json()["error"] == "not_found"
        assert rows() == []
        created = api.request("POST", "/api/v1/queues/later/pause", params={"create": "true"})
        assert created.status_code == 200 and created.json()["paused"] is True
    finally:
        api.close()
    assert run_main(database_url, "queue", "pause", "soon", "--create").code == 0
    pgqueue.enqueue(conn, "send", queue="emails")  # a queue with a task needs no --create
    assert run_main(database_url, "queue", "pause", "emails").code == 0
    assert sorted(rows()) == [("emails",), ("later",), ("soon",)]


def test_removing_a_queue_forgets_its_settings_and_resumes_it(database_url, conn):
    task = pgqueue.enqueue(conn, "send", queue="emails").id
    pgqueue.pause_queue(conn, "emails")
    pgqueue.pause_queue(conn, "typo")

    removed = run_main(database_url, "--json", "queue", "remove", "typo")
    again = run_main(database_url, "queue", "remove", "typo")
    api = Api(ApiSettings(database_url=database_url))
    try:
        response = api.request("DELETE", "/api/v1/queues/emails")
    finally:
        api.close()

    assert json.loads(removed.stdout) == {"name": "typo", "removed": True}
    assert (again.code, again.stdout.strip()) == (0, "queue 'typo' had no settings")
    assert response.status_code == 200
    assert response.json() == {"name": "emails", "removed": True}
    assert conn.execute("SELECT count(*) FROM pgqueue.queues").fetchone() == (0,)
    assert claim_ids(conn, "emails") == {task}  # running again
    assert pgqueue.get_task(conn, task).queue == "emails"  # tasks untouched


def test_resuming_a_queue_without_settings_writes_no_row(conn):
    resumed = pgqueue.resume_queue(conn, "never-paused")

    assert (resumed.paused, resumed.updated_at) == (False, None)
    assert conn.execute("SELECT count(*) FROM pgqueue.queues").fetchone() == (0,)


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
