"""Retention on a queue nobody knows is refused, as pausing one is, unless told to create it.

A queue is known when it has tasks (in any status) or a row of settings. A name that is
neither is most often a typo (``paymnets``): its retention would apply to nothing while the
real queue kept the default, so the library (``create=False``), the CLI (without
``--create``) and the HTTP API (without ``?create=true``) all refuse it with one message that
says how to ask for it, and write nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings

DAY = 24 * 3600.0
MESSAGE = (
    "no queue 'paymnets': it has no tasks and no settings; to set its retention before its "
    "first task, say so: create=True (CLI: --create, HTTP: ?create=true)"
)


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT name, completed_retention, dead_retention FROM pgqueue.queues ORDER BY name"
    ).fetchall()


@pytest.fixture
def api(database_url: str) -> Any:
    client = Api(ApiSettings(database_url=database_url))
    try:
        yield client
    finally:
        client.close()


def test_the_library_refuses_an_unknown_queue_with_create_false_and_writes_nothing(conn):
    with pytest.raises(pgqueue.QueueNotFound) as info:
        pgqueue.set_queue_retention(conn, "paymnets", completed=DAY, create=False)
    assert str(info.value) == MESSAGE
    assert info.value.queue == "paymnets"
    assert rows(conn) == []


def test_the_async_twin_refuses_it_too(database_url, conn):
    async def attempt() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            await aio.set_queue_retention(a, "paymnets", dead=DAY, create=False)

    with pytest.raises(pgqueue.QueueNotFound, match="set its retention"):
        asyncio.run(attempt())
    assert rows(conn) == []


def test_the_cli_refuses_an_unknown_queue_in_one_line_naming_create(database_url, conn):
    refused = run_main(database_url, "queue", "retention", "paymnets", "--completed", "1d")
    assert refused.code == 1 and refused.stdout == "", (refused.stdout, refused.stderr)
    assert refused.line == "error: " + MESSAGE
    as_json = run_main(database_url, "--json", "queue", "retention", "paymnets", "--dead", "1d")
    assert as_json.code == 1
    error = json.loads(as_json.stderr)
    assert (error["error"], error["queue"]) == ("not_found", "paymnets")
    assert rows(conn) == []


def test_the_http_api_refuses_an_unknown_queue_with_404(api, conn):
    refused = api.request(
        "PUT", "/api/v1/queues/paymnets/retention", json={"completed_seconds": DAY}
    )
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"] == "not_found"
    assert refused.json()["message"] == MESSAGE
    assert rows(conn) == []


def test_create_sets_retention_on_a_queue_with_no_tasks_everywhere(database_url, conn, api):
    pgqueue.set_queue_retention(conn, "lib", completed=DAY, create=True)
    assert run_main(database_url, "queue", "retention", "cli", "--dead", "2d", "--create").code == 0
    put = api.request(
        "PUT",
        "/api/v1/queues/http/retention",
        params={"create": "true"},
        json={"completed_seconds": 3 * DAY},
    )
    assert put.status_code == 200, put.text
    assert rows(conn) == [("cli", None, 2 * DAY), ("http", 3 * DAY, None), ("lib", DAY, None)]


def test_a_queue_with_tasks_or_settings_needs_no_create(database_url, conn, api):
    pgqueue.enqueue(conn, "charge", {}, queue="payments")  # tasks, no settings row
    pgqueue.pause_queue(conn, "audit")  # a settings row, no tasks
    done = run_main(database_url, "queue", "retention", "payments", "--completed", "7d")
    assert done.code == 0, done.stderr
    put = api.request("PUT", "/api/v1/queues/audit/retention", json={"dead_seconds": 30 * DAY})
    assert put.status_code == 200, put.text
    pgqueue.set_queue_retention(conn, "payments", completed=DAY, create=False)
    assert rows(conn) == [("audit", None, 30 * DAY), ("payments", DAY, None)]


def test_a_bad_duration_is_refused_before_the_queue_is_looked_up(database_url):
    """Bad input is named first: the duration, not the missing queue."""
    result = run_main(database_url, "queue", "retention", "paymnets", "--completed", "soon")
    assert result.code == 2, (result.stdout, result.stderr)
    assert "no queue" not in result.line
