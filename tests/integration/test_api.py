"""The HTTP API against a live server and real PostgreSQL.

Every test talks HTTP to a real uvicorn server (in a background thread of this process, on a
port the OS picks) running ``create_app(ApiSettings(...))``, and checks the effect with the
library on a connection to the same database. Tests that change state get a fresh database and
server each (the ``database_url`` and ``conn`` fixtures); tests that only add tasks of their own,
or change nothing, share one database and servers per module and compare task counts before and
after. ``pgqueue serve`` runs as a real subprocess. Nothing is mocked, and every wait polls a
condition against a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.routing import APIRoute
from helpers import make_dead_letters as shared_dead_letters
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import migrate
from pgqueue.api import ApiSettings, create_app

UNREACHABLE_URL = "postgresql://postgres:s3cret-pw@127.0.0.1:1/x"
TOKEN = "tok-Alpha-9f3c2e71b8-5d0c4a7e1f2b3c4d5e6f"
# Tokens are 32 characters at least: the test tokens below end with this.
PAD = "-0123456789abcdef0123456789abcdef"
OTHER_TOKEN = "tok-Beta-0d44aa15c3-8a1b2c3d4e5f60718293"

HOSTILE = [
    "'; DROP TABLE pgqueue.tasks; --",
    "Robert'); DELETE FROM pgqueue.tasks; --",
    "%s %(x)s {0}",
    "Zo\u00eb \U0001f680 \u65e5\u672c\u8a9e \u202egnp.exe",
    "quotes \"double\" 'single' `back` \\ backslash",
]


# --- a live server -----------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@dataclasses.dataclass
class Live:
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread
    base_url: str
    client: httpx.Client


def _settle(server: uvicorn.Server) -> Callable[[httpx.Response], None]:
    """After a 500, wait until the server has finished the request (and logged the error).

    Python 3.11 formats a traceback with ``ast.parse``; up to 3.11.7 two threads doing that at
    once can fail with "AST constructor recursion depth mismatch" (CPython gh-106905), which
    would crash pytest's own failure report with an INTERNALERROR.
    """

    def hook(response: httpx.Response) -> None:
        if response.status_code == 500:
            wait_until(lambda: not server.server_state.tasks, 10, "the request to finish")

    return hook


def launch(settings: ApiSettings) -> Live:
    """``create_app(settings)`` under uvicorn in a thread, on a port the OS picks."""
    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="pgqueue-api-test", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "the server to start")
    assert server.started, "the server did not start (see the captured log)"
    port = server.servers[0].sockets[0].getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    client = httpx.Client(
        base_url=base_url, timeout=30, event_hooks={"response": [_settle(server)]}
    )
    return Live(app, server, thread, base_url, client)


def halt(servers: list[Live]) -> None:
    for live in servers:
        live.client.close()
        live.server.should_exit = True
    for live in servers:
        live.thread.join(timeout=30)
        assert not live.thread.is_alive(), "the server did not stop"


@pytest.fixture
def start_server() -> Iterator[Callable[[ApiSettings], Live]]:
    """Start servers for one test; all are stopped at its teardown."""
    started: list[Live] = []

    def _start(settings: ApiSettings) -> Live:
        started.append(launch(settings))
        return started[-1]

    yield _start
    halt(started)


# Function-scoped servers list database_url first, so they stop before their database goes.


@pytest.fixture
def api(database_url: str, start_server: Callable[[ApiSettings], Live]) -> Live:
    return start_server(ApiSettings(database_url=database_url))


@pytest.fixture
def client(api: Live) -> httpx.Client:
    return api.client


@pytest.fixture
def authed(database_url: str, start_server: Callable[[ApiSettings], Live]) -> Live:
    return start_server(
        ApiSettings(database_url=database_url, tokens=frozenset({TOKEN, OTHER_TOKEN}))
    )


# For tests that change nothing, or only add tasks of their own, one database and servers per
# module keep the file fast. They check task counts before and after, never absolute ones.


@pytest.fixture(scope="module")
def shared_database_url(
    server_url: str, template_db: str, under_test_url: Callable[[str], str]
) -> Iterator[str]:
    """A migrated database for this module (a copy of conftest's template), as
    ``database_url`` is reached."""
    name = f"pgqueue_api_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield under_test_url(urlunsplit(urlsplit(server_url)._replace(path="/" + name)))
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def shared_servers(shared_database_url: str) -> Iterator[dict[str, Live]]:
    url = shared_database_url
    servers = {
        "plain": launch(ApiSettings(database_url=url)),
        "small": launch(ApiSettings(database_url=url, max_body_bytes=4096)),
        "authed": launch(ApiSettings(database_url=url, tokens=frozenset({TOKEN, OTHER_TOKEN}))),
    }
    yield servers
    halt(list(servers.values()))


@pytest.fixture(scope="module")
def shared_conn(shared_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(
        shared_database_url, autocommit=True, prepare_threshold=None
    ) as connection:
        yield connection


@pytest.fixture
def shared_client(shared_servers: dict[str, Live]) -> httpx.Client:
    return shared_servers["plain"].client


@pytest.fixture
def small_client(shared_servers: dict[str, Live]) -> httpx.Client:
    """A server whose body limit is 4096 bytes."""
    return shared_servers["small"].client


@contextlib.contextmanager
def no_new_tasks(conn: psycopg.Connection[Any], added: int = 0) -> Iterator[None]:
    """The block adds exactly ``added`` tasks (none by default)."""
    before = count_tasks(conn)
    yield
    assert count_tasks(conn) == before + added


# --- helpers -----------------------------------------------------------------------------------


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0]


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def submit(client: httpx.Client, body: Any, **kwargs: Any) -> httpx.Response:
    return client.post("/api/v1/tasks", json=body, **kwargs)


def created(client: httpx.Client, body: Any, **kwargs: Any) -> dict[str, Any]:
    response = submit(client, body, **kwargs)
    assert response.status_code == 202, response.text
    return response.json()


def assert_error(
    response: httpx.Response, code: int, error: str, field: str | None = None
) -> dict[str, Any]:
    """An error response with the documented body shape; returns the body."""
    assert response.status_code == code, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"] == error, body
    assert isinstance(body["message"], str) and body["message"], body
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
        assert field in body["message"], body
    return body


def field_message(body: dict[str, Any], field: str) -> str:
    return next(e["message"] for e in body["errors"] if e["field"] == field)


def make_running(conn: psycopg.Connection[Any], queue: str = "running") -> pgqueue.ClaimedTask:
    task_id = pgqueue.enqueue(conn, "slow", {"n": 1}, queue=queue).id
    (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="test-worker")
    assert claimed.id == task_id
    return claimed


def make_completed(conn: psycopg.Connection[Any], result: Any, queue: str = "done") -> uuid.UUID:
    task_id = pgqueue.enqueue(conn, "work", {"n": 1}, queue=queue).id
    (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="test-worker")
    assert claimed.id == task_id
    pgqueue.complete(conn, claimed.lease, result)
    return task_id


def make_dead_letters(conn: psycopg.Connection[Any], count: int, **options: Any) -> list[uuid.UUID]:
    """Dead letters in this module's own queue unless told otherwise."""
    options.setdefault("queue", "dlq-src")
    return shared_dead_letters(conn, count, **options)


def status_of(conn: psycopg.Connection[Any], task_id: Any) -> str:
    return pgqueue.get_task(conn, task_id).status.value


def all_pages(client: httpx.Client, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Follow next_cursor from the first page to the last; returns the pages."""
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    for _ in range(100):
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        response = client.get(path, params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
    pytest.fail("next_cursor never ran out")


# --- submit, inspect, cancel -------------------------------------------------------------------


def test_submit_returns_202_with_the_new_queued_task(client, conn):
    before = datetime.now(UTC)
    response = submit(
        client, {"type": "send_email", "payload": {"to": "a@example.com"}, "priority": "high"}
    )

    assert response.status_code == 202, response.text
    assert "idempotent-replayed" not in response.headers
    body = response.json()
    task_id = uuid.UUID(body["task_id"])
    assert body["status"] == "queued"
    created_at = ts(body["created_at"])
    assert created_at.tzinfo is not None
    assert before - timedelta(seconds=5) <= created_at <= datetime.now(UTC) + timedelta(seconds=5)
    assert body["type"] == "send_email"
    assert "payload" not in body  # not echoed back; GET Location has it
    assert response.headers["location"] == f"/api/v1/tasks/{task_id}"
    assert body["priority"] == "high"
    assert body["queue"] == "default"
    assert body["attempts"] == 0
    assert body["max_attempts"] == 3
    assert body["idempotency_key"] is None
    assert body["cancel_requested"] is False
    assert ts(body["run_at"]) == created_at
    assert body["started_at"] is None and body["finished_at"] is None

    stored = pgqueue.get_task(conn, task_id)
    assert stored.status is pgqueue.TaskStatus.QUEUED
    assert stored.type == "send_email" and stored.payload == {"to": "a@example.com"}
    assert stored.priority is pgqueue.Priority.HIGH
    assert stored.created_at == created_at


def test_get_returns_the_task_with_status_attempts_and_timestamps(client):
    original = created(client, {"type": "report", "payload": {"day": "2030-01-01"}})

    response = client.get(f"/api/v1/tasks/{original['task_id']}")

    assert response.status_code == 200, response.text
    body = response.json()
    # The submit answer is the task without its payload, result and errors.
    assert {k: body[k] for k in original} == original
    assert body["payload"] == {"day": "2030-01-01"}
    for field in (
        "status",
        "result",
        "attempts",
        "type",
        "priority",
        "queue",
        "last_error",
        "created_at",
        "run_at",
        "started_at",
        "finished_at",
    ):
        assert field in body


def test_get_shows_the_result_of_a_task_completed_through_the_library(client, conn):
    task_id = created(client, {"type": "resize", "queue": "images"})["task_id"]
    (claimed,) = pgqueue.claim(conn, ["images"], limit=1, worker_id="test-worker")
    assert str(claimed.id) == task_id
    pgqueue.complete(conn, claimed.lease, {"width": 640, "tags": ["a", "b"], "ok": True})

    body = client.get(f"/api/v1/tasks/{task_id}").json()

    assert body["status"] == "completed"
    assert body["result"] == {"width": 640, "tags": ["a", "b"], "ok": True}
    assert body["attempts"] == 1
    assert body["last_error"] is None
    started, finished = ts(body["started_at"]), ts(body["finished_at"])
    assert ts(body["created_at"]) <= started <= finished


def test_get_shows_the_last_error_of_a_failed_attempt(client, conn):
    task_id = created(client, {"type": "flaky", "queue": "flaky"})["task_id"]
    (claimed,) = pgqueue.claim(conn, ["flaky"], limit=1, worker_id="test-worker")
    pgqueue.fail(conn, claimed.lease, "TimeoutError: upstream slow", retry_after=3600)

    body = client.get(f"/api/v1/tasks/{task_id}").json()

    assert body["status"] == "queued"
    assert body["attempts"] == 1
    assert body["last_error"] == "TimeoutError: upstream slow"
    assert ts(body["run_at"]) > datetime.now(UTC) + timedelta(minutes=50)


def test_cancel_of_a_queued_task_returns_200_and_it_never_runs(client, conn):
    task_id = created(client, {"type": "send_email", "queue": "cancel-me"})["task_id"]

    response = client.delete(f"/api/v1/tasks/{task_id}")

    assert response.status_code == 200, response.text
    assert response.json() == {"task_id": task_id, "status": "cancelled", "cancel_requested": True}
    assert client.get(f"/api/v1/tasks/{task_id}").json()["status"] == "cancelled"
    assert status_of(conn, task_id) == "cancelled"
    assert pgqueue.claim(conn, ["cancel-me"], limit=10, worker_id="test-worker") == []
    # Cancelling it again is a conflict that names the status.
    again = client.delete(f"/api/v1/tasks/{task_id}")
    assert assert_error(again, 409, "conflict")["status"] == "cancelled"


def test_cancel_of_a_running_task_returns_202_and_requests_cancellation(client, conn):
    claimed = make_running(conn)

    response = client.delete(f"/api/v1/tasks/{claimed.id}")

    assert response.status_code == 202, response.text
    assert response.json() == {
        "task_id": str(claimed.id),
        "status": "running",
        "cancel_requested": True,
    }
    body = client.get(f"/api/v1/tasks/{claimed.id}").json()
    assert body["status"] == "running"
    assert body["cancel_requested"] is True
    beat = pgqueue.heartbeat(conn, [claimed.lease])
    assert claimed.id in beat.cancel_requested


def test_cancel_of_a_completed_task_is_409_naming_its_status(client, conn):
    task_id = make_completed(conn, {"sent": True})

    response = client.delete(f"/api/v1/tasks/{task_id}")

    body = assert_error(response, 409, "conflict")
    assert body["status"] == "completed"
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.result == {"sent": True}


UNKNOWN_IDS = [
    str(uuid.uuid4()),
    "not-a-uuid",
    "12345",
    "01a2-zzzz",
    quote(HOSTILE[0], safe=""),
    quote(HOSTILE[2], safe=""),
]


def test_unknown_and_malformed_ids_are_404(shared_client, shared_conn):
    client, conn = shared_client, shared_conn
    bystander = pgqueue.enqueue(conn, "bystander", {}, queue="bystanders").id

    for template in (
        "GET /api/v1/tasks/{}",
        "DELETE /api/v1/tasks/{}",
        "POST /api/v1/dead-letters/{}/replay",
        "DELETE /api/v1/dead-letters/{}",
    ):
        method, path = template.split()
        for task_id in UNKNOWN_IDS:
            with no_new_tasks(conn):
                response = client.request(method, path.format(task_id))
            assert_error(response, 404, "not_found")
    assert status_of(conn, bystander) == "queued"


# --- submit options ----------------------------------------------------------------------------


def test_submit_to_a_named_queue_with_a_priority(client, conn):
    body = created(client, {"type": "thumbnail", "queue": "images", "priority": "low"})

    assert body["queue"] == "images" and body["priority"] == "low"
    assert pgqueue.claim(conn, ["default"], limit=10, worker_id="test-worker") == []
    (claimed,) = pgqueue.claim(conn, ["images"], limit=10, worker_id="test-worker")
    assert str(claimed.id) == body["task_id"]


def test_submit_with_an_aware_run_at_schedules_the_task_then(client, conn):
    india = timezone(timedelta(hours=5, minutes=30))
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0).astimezone(india)
    run_at = when.isoformat()
    assert run_at.endswith("+05:30")

    body = created(client, {"type": "reminder", "queue": "later", "run_at": run_at})

    assert ts(body["run_at"]) == ts(run_at)
    assert ts(body["run_at"]) > ts(body["created_at"]) + timedelta(minutes=110)
    assert pgqueue.get_task(conn, body["task_id"]).visible_after == ts(run_at)
    assert pgqueue.claim(conn, ["later"], limit=10, worker_id="test-worker") == []


def test_submit_with_delay_seconds_schedules_the_task_that_far_ahead(client, conn):
    body = created(client, {"type": "reminder", "queue": "later", "delay_seconds": 3600})

    delay = ts(body["run_at"]) - ts(body["created_at"])
    assert delay == timedelta(seconds=3600)
    assert ts(body["run_at"]) > datetime.now(UTC) + timedelta(minutes=55)
    assert pgqueue.claim(conn, ["later"], limit=10, worker_id="test-worker") == []


def test_submit_with_max_attempts_dead_letters_after_that_many(client, conn):
    body = created(client, {"type": "fragile", "queue": "fragile", "max_attempts": 1})
    assert body["max_attempts"] == 1

    (claimed,) = pgqueue.claim(conn, ["fragile"], limit=1, worker_id="test-worker")
    outcome = pgqueue.fail(conn, claimed.lease, "RuntimeError: once is enough")

    assert outcome.outcome is pgqueue.FailOutcome.DEAD
    assert client.get(f"/api/v1/tasks/{body['task_id']}").json()["status"] == "failed"


def test_repeated_idempotency_key_returns_200_replayed_with_the_original_task(client, conn):
    first = submit(client, {"type": "charge", "payload": {"amount": 10}, "idempotency_key": "k-1"})
    assert first.status_code == 202
    assert "idempotent-replayed" not in first.headers

    again = submit(
        client,
        {"type": "charge", "payload": {"amount": 99}, "idempotency_key": "k-1", "queue": "x"},
    )

    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert client.get(again.headers["location"]).json()["payload"] == {"amount": 10}
    assert count_tasks(conn) == 1


def test_idempotency_key_header_works_like_the_body_field(client, conn):
    first = submit(
        client, {"type": "charge", "payload": {"v": 1}}, headers={"Idempotency-Key": "h"}
    )
    assert first.status_code == 202, first.text
    assert first.json()["idempotency_key"] == "h"

    by_body = submit(client, {"type": "charge", "payload": {"v": 2}, "idempotency_key": "h"})
    by_header = submit(
        client, {"type": "charge", "payload": {"v": 3}}, headers={"Idempotency-Key": "h"}
    )
    both = submit(
        client,
        {"type": "charge", "payload": {"v": 4}, "idempotency_key": "h"},
        headers={"Idempotency-Key": "h"},
    )

    for replay in (by_body, by_header, both):
        assert replay.status_code == 200, replay.text
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json()["task_id"] == first.json()["task_id"]
        assert client.get(replay.headers["location"]).json()["payload"] == {"v": 1}
    assert count_tasks(conn) == 1


def test_replay_after_completion_returns_the_original_task_with_its_result(client, conn):
    first = created(
        client,
        {"type": "charge", "queue": "pay", "payload": {"amount": 5}},
        headers={"Idempotency-Key": "pay-7"},
    )
    (claimed,) = pgqueue.claim(conn, ["pay"], limit=1, worker_id="test-worker")
    pgqueue.complete(conn, claimed.lease, {"receipt": "R-1"})

    again = submit(
        client,
        {"type": "charge", "queue": "pay", "payload": {"amount": 6}},
        headers={"Idempotency-Key": "pay-7"},
    )

    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    body = again.json()
    assert body["task_id"] == first["task_id"]
    assert body["status"] == "completed"
    whole = client.get(again.headers["location"]).json()
    assert whole["result"] == {"receipt": "R-1"}
    assert whole["payload"] == {"amount": 5}
    assert count_tasks(conn) == 1


def test_idempotency_key_in_header_and_body_that_differ_is_422(client, conn):
    response = submit(
        client,
        {"type": "charge", "idempotency_key": "body-key"},
        headers={"Idempotency-Key": "header-key"},
    )

    body = assert_error(response, 422, "invalid_request", "idempotency_key")
    assert "differ" in field_message(body, "idempotency_key")
    assert count_tasks(conn) == 0


# --- validation --------------------------------------------------------------------------------

INVALID = {
    "unknown_priority": ({"type": "t", "priority": "urgent"}, "priority", "'high', 'normal'"),
    "payload_is_a_list": ({"type": "t", "payload": [1, 2]}, "payload", "dictionary"),
    "payload_is_a_string": ({"type": "t", "payload": "hello"}, "payload", "dictionary"),
    "empty_type": ({"type": ""}, "type", "at least 1 character"),
    "type_of_201_characters": ({"type": "x" * 201}, "type", "at most 200 characters"),
    "unparseable_run_at": ({"type": "t", "run_at": "next tuesday"}, "run_at", "datetime"),
    "naive_run_at": ({"type": "t", "run_at": "2030-01-31T09:00:00"}, "run_at", "timezone"),
    "negative_delay_seconds": (
        {"type": "t", "delay_seconds": -1},
        "delay_seconds",
        "greater than or equal to 0",
    ),
    "extra_unknown_field": ({"type": "t", "colour": "red"}, "colour", "extra inputs"),
}


@pytest.mark.parametrize(("body", "field", "reason"), INVALID.values(), ids=INVALID.keys())
def test_invalid_submission_is_422_naming_the_field_and_reason(
    shared_client, shared_conn, body, field, reason
):
    with no_new_tasks(shared_conn):
        response = submit(shared_client, body)

    error = assert_error(response, 422, "invalid_request", field)
    assert reason in field_message(error, field).lower()


MORE_INVALID = [
    ({"type": "   "}, "type", "must not be empty"),
    ({"type": "a\u0000b"}, "type", "nul"),
    ({"payload": {}}, "type", "required"),
    ({"type": "t", "queue": ""}, "queue", "at least 1 character"),
    ({"type": "t", "idempotency_key": "   "}, "idempotency_key", "must not be empty"),
    ({"type": "t", "run_at": "2030-01-31T09:00:00Z", "delay_seconds": 5}, "run_at", "either"),
    ({"type": "t", "delay_seconds": 1e12}, "delay_seconds", "less than or equal"),
    ({"type": "t", "max_attempts": 0}, "max_attempts", "greater than or equal to 1"),
    ({"type": "t", "payload": {"s": "a\u0000"}}, "payload", "nul"),
    ([{"type": "t"}], "body", "dictionary"),
]


def test_other_invalid_submissions_are_422_naming_the_field_never_500(shared_client, shared_conn):
    client = shared_client
    with no_new_tasks(shared_conn):
        for body, field, reason in MORE_INVALID:
            response = submit(client, body)
            error = assert_error(response, 422, "invalid_request", field)
            assert reason in field_message(error, field).lower(), error
        response = client.post(
            "/api/v1/tasks",
            content=b'{"type": "t", "payload": {"x": NaN}}',
            headers={"Content-Type": "application/json"},
        )
        assert_error(response, 422, "invalid_request", "payload")


def test_malformed_json_is_400(shared_client, shared_conn):
    json_type = {"Content-Type": "application/json"}
    with no_new_tasks(shared_conn):
        for raw in (b'{"type": ', b"not json", b'{"type": "t",}', b"{'type': 't'}"):
            response = shared_client.post("/api/v1/tasks", content=raw, headers=json_type)
            assert_error(response, 400, "malformed_json")
        response = shared_client.post(
            "/api/v1/dead-letters/discard", content=b"{", headers=json_type
        )
        assert_error(response, 400, "malformed_json")


def test_body_over_the_limit_is_413_and_nothing_is_created(small_client, shared_conn):
    with no_new_tasks(shared_conn):
        response = submit(small_client, {"type": "big", "payload": {"blob": "x" * 5000}})

    assert_error(response, 413, "body_too_large")
    assert "4096" in response.json()["message"]
    assert "content-length" in response.request.headers


def test_body_exactly_at_the_limit_is_accepted(small_client, shared_conn):
    prefix, suffix = b'{"type": "big", "payload": {"blob": "', b'"}}'
    raw = prefix + b"x" * (4096 - len(prefix) - len(suffix)) + suffix
    assert len(raw) == 4096

    with no_new_tasks(shared_conn, added=1):
        response = small_client.post(
            "/api/v1/tasks", content=raw, headers={"Content-Type": "application/json"}
        )

    assert response.status_code == 202, response.text


def test_chunked_body_over_the_limit_is_413_and_nothing_is_created(small_client, shared_conn):
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "big", "payload": {"blob": "'
        for _ in range(8):
            yield b"x" * 1000
        yield b'"}}'

    with no_new_tasks(shared_conn):
        response = small_client.post(
            "/api/v1/tasks", content=chunks(), headers={"Content-Type": "application/json"}
        )

    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_error(response, 413, "body_too_large")


def test_chunked_body_under_the_limit_is_accepted(small_client, shared_conn):
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "chunked", '
        yield b'"payload": {"n": 1}}'

    with no_new_tasks(shared_conn, added=1):
        response = small_client.post(
            "/api/v1/tasks", content=chunks(), headers={"Content-Type": "application/json"}
        )

    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 202, response.text
    assert small_client.get(response.headers["location"]).json()["payload"] == {"n": 1}


def test_run_at_outside_the_representable_range_is_422(client, conn):
    for run_at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        response = submit(client, {"type": "edge", "run_at": run_at})
        assert_error(response, 422, "invalid_request", "run_at")
    assert count_tasks(conn) == 0


# --- listing -----------------------------------------------------------------------------------


def test_list_filters_by_every_status(client, conn):
    queued = pgqueue.enqueue(conn, "a", {}, queue="q").id
    running = make_running(conn).id
    completed = make_completed(conn, 1)
    cancelled = pgqueue.cancel(conn, pgqueue.enqueue(conn, "a", {}, queue="q").id).id
    (dead,) = make_dead_letters(conn, 1)
    waiting = pgqueue.enqueue(conn, "a", {}, queue="q", depends_on=[queued]).id

    expected = {
        "waiting": {waiting},
        "queued": {queued},
        "running": {running},
        "completed": {completed},
        "cancelled": {cancelled},
        "failed": {dead},
    }
    for status, ids in expected.items():
        response = client.get("/api/v1/tasks", params={"status": status})
        assert response.status_code == 200, response.text
        items = response.json()["items"]
        assert {uuid.UUID(t["task_id"]) for t in items} == ids, status
        assert {t["status"] for t in items} == {status}
    everything = client.get("/api/v1/tasks").json()
    assert len(everything["items"]) == 6
    assert everything["next_cursor"] is None
    assert_error(
        client.get("/api/v1/tasks", params={"status": "exploded"}), 422, "invalid_request", "status"
    )


def test_list_filters_by_type_queue_and_limit(client, conn):
    (dead,) = make_dead_letters(conn, 1, type="email", queue="alpha")
    email_a = pgqueue.enqueue(conn, "email", {}, queue="alpha").id
    sms_a = pgqueue.enqueue(conn, "sms", {}, queue="alpha").id
    email_b = pgqueue.enqueue(conn, "email", {}, queue="beta").id

    def ids(path: str, **params: Any) -> list[uuid.UUID]:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return [uuid.UUID(t["task_id"]) for t in response.json()["items"]]

    assert set(ids("/api/v1/tasks", type="email")) == {email_a, email_b, dead}
    assert set(ids("/api/v1/tasks", queue="alpha")) == {email_a, sms_a, dead}
    assert ids("/api/v1/tasks", type="email", queue="beta") == [email_b]
    assert ids("/api/v1/tasks", type="email", queue="alpha", status="queued") == [email_a]
    assert ids("/api/v1/tasks", type="nothing") == []
    assert ids("/api/v1/dead-letters", type="email") == [dead]
    assert ids("/api/v1/dead-letters", queue="beta") == []
    # Newest first, two at a time.
    page = client.get("/api/v1/tasks", params={"limit": 2}).json()
    assert [uuid.UUID(t["task_id"]) for t in page["items"]] == [email_b, sms_a]
    assert page["next_cursor"]
    for bad in (0, 501, "ten"):
        response = client.get("/api/v1/tasks", params={"limit": bad})
        assert_error(response, 422, "invalid_request", "limit")


def test_following_next_cursor_visits_every_task_exactly_once(client, conn):
    # Half in one statement (one created_at, ordered by id), half one by one.
    batch = [r.id for r in pgqueue.enqueue_many(conn, [{"type": "bulk"}] * 60)]
    single = [pgqueue.enqueue(conn, "single", {"n": i}).id for i in range(55)]
    newest_first = [t.id for t in pgqueue.list_tasks(conn, limit=500)]
    assert set(newest_first) == set(batch) | set(single)

    pages = all_pages(client, "/api/v1/tasks")

    assert [len(p) for p in pages] == [50, 50, 15]
    visited = [uuid.UUID(t["task_id"]) for page in pages for t in page]
    assert visited == newest_first
    assert len(set(visited)) == 115
    # The cursor works under a filter too.
    filtered = all_pages(client, "/api/v1/tasks", status="queued")
    assert [uuid.UUID(t["task_id"]) for p in filtered for t in p] == newest_first


def test_following_next_cursor_with_limit_7_visits_25_tasks_exactly_once(client, conn):
    for i in range(25):
        created(client, {"type": "page", "payload": {"i": i}})
    newest_first = [t.id for t in pgqueue.list_tasks(conn, limit=100)]

    pages = all_pages(client, "/api/v1/tasks", limit=7)

    assert [len(p) for p in pages] == [7, 7, 7, 4]
    visited = [uuid.UUID(t["task_id"]) for page in pages for t in page]
    assert visited == newest_first
    assert len(set(visited)) == 25


def encoded(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


GARBAGE_CURSORS = [
    "garbage",
    "!!!***",
    encoded(b"\xff\xfe\xfd"),
    encoded(b"2030-01-01T00:00:00+00:00"),
    encoded(b"2030-01-01T00:00:00+00:00|nope"),
    encoded(b"yesterday|" + str(uuid.uuid4()).encode()),
]


def test_garbage_cursor_is_422(shared_client, shared_conn):
    pgqueue.enqueue(shared_conn, "a", {}, queue="cursor-bystander")

    for path in ("/api/v1/tasks", "/api/v1/dead-letters"):
        for cursor in GARBAGE_CURSORS:
            response = shared_client.get(path, params={"cursor": cursor})
            body = assert_error(response, 422, "invalid_request", "cursor")
            assert "is not a cursor" in field_message(body, "cursor")


# --- dead letters ------------------------------------------------------------------------------


def test_dead_letters_lists_only_dead_letters(client, conn):
    dead = make_dead_letters(conn, 3, error="ValueError: bad input")
    pgqueue.enqueue(conn, "alive", {})
    make_completed(conn, None)
    make_running(conn)

    response = client.get("/api/v1/dead-letters")

    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert {uuid.UUID(t["task_id"]) for t in items} == set(dead)
    for item in items:
        assert item["status"] == "failed"
        assert item["attempts"] == 1 and item["max_attempts"] == 1
        assert item["last_error"] == "ValueError: bad input"
        assert item["type"] == "boom"


def test_replay_of_one_dead_letter_queues_it_with_fresh_attempts(client, conn):
    target, other = make_dead_letters(conn, 2)

    response = client.post(f"/api/v1/dead-letters/{target}/replay")

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["task_id"] == str(target)
    assert body["status"] == "queued"
    assert body["attempts"] == 0
    assert body["finished_at"] is None
    assert client.get(f"/api/v1/tasks/{target}").json()["status"] == "queued"
    assert status_of(conn, other) == "failed"
    (claimed,) = pgqueue.claim(conn, ["dlq-src"], limit=5, worker_id="test-worker")
    assert claimed.id == target and claimed.attempts == 1


def test_replay_of_a_task_that_is_not_a_dead_letter_is_409(client, conn):
    queued = pgqueue.enqueue(conn, "alive", {}).id
    completed = make_completed(conn, {"r": 1})

    for task_id, status in ((queued, "queued"), (completed, "completed")):
        response = client.post(f"/api/v1/dead-letters/{task_id}/replay")
        assert assert_error(response, 409, "conflict")["status"] == status
        assert status_of(conn, task_id) == status
    assert pgqueue.get_task(conn, completed).result == {"r": 1}


def test_bulk_replay_by_type_replays_only_that_type_and_returns_the_count(client, conn):
    boom = make_dead_letters(conn, 3, type="boom")
    bang = make_dead_letters(conn, 2, type="bang")

    response = client.post("/api/v1/dead-letters/replay", json={"type": "boom"})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == 3
    assert {uuid.UUID(i) for i in body["task_ids"]} == set(boom)
    assert {status_of(conn, i) for i in boom} == {"queued"}
    assert {pgqueue.get_task(conn, i).attempts for i in boom} == {0}
    assert {status_of(conn, i) for i in bang} == {"failed"}


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_bulk_dead_letter_action_without_a_clear_selection_is_422(client, conn, action):
    dead = make_dead_letters(conn, 2)

    for body in ({}, {"limit": 10}, {"all": False}, {"all": True, "type": "boom"}):
        response = client.post(f"/api/v1/dead-letters/{action}", json=body)
        assert_error(response, 422, "invalid_request", "all")

    assert {status_of(conn, i) for i in dead} == {"failed"}


def test_delete_of_one_dead_letter_deletes_it(client, conn):
    target, other = make_dead_letters(conn, 2)
    queued = pgqueue.enqueue(conn, "alive", {}).id

    response = client.delete(f"/api/v1/dead-letters/{target}")

    assert response.status_code == 200, response.text
    assert response.json() == {"count": 1, "task_ids": [str(target)]}
    assert_error(client.get(f"/api/v1/tasks/{target}"), 404, "not_found")
    assert status_of(conn, other) == "failed"
    # A task that is not a dead letter is not deleted.
    assert (
        assert_error(client.delete(f"/api/v1/dead-letters/{queued}"), 409, "conflict")["status"]
        == "queued"
    )
    assert count_tasks(conn) == 2


def test_discard_all_deletes_every_dead_letter_and_no_other_task(client, conn):
    dead = make_dead_letters(conn, 3, type="boom") + make_dead_letters(
        conn, 2, type="bang", queue="elsewhere"
    )
    survivors = {
        pgqueue.enqueue(conn, "alive", {}).id,
        pgqueue.enqueue(conn, "later", {}, delay=3600).id,
        make_running(conn).id,
        make_completed(conn, {"r": 1}),
        pgqueue.cancel(conn, pgqueue.enqueue(conn, "x", {}).id).id,
    }

    response = client.post("/api/v1/dead-letters/discard", json={"all": True})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == 5
    assert {uuid.UUID(i) for i in body["task_ids"]} == set(dead)
    left = {row[0] for row in conn.execute("SELECT id FROM pgqueue.tasks")}
    assert left == survivors
    assert client.get("/api/v1/dead-letters").json()["items"] == []


# --- stats, health, metrics --------------------------------------------------------------------


def test_stats_reports_depth_with_ready_counts_and_oldest_ready_age(client, conn):
    two_minutes_ago = (datetime.now(UTC) - timedelta(seconds=120)).isoformat()
    created(client, {"type": "s", "queue": "stats", "run_at": two_minutes_ago})
    created(client, {"type": "s", "queue": "stats"})
    created(client, {"type": "s", "queue": "stats", "delay_seconds": 3600})
    created(client, {"type": "s", "queue": "stats", "priority": "high"})
    make_completed(conn, None, queue="stats-done")
    make_dead_letters(conn, 1, queue="stats-done")

    response = client.get("/api/v1/stats")

    assert response.status_code == 200, response.text
    body = response.json()
    rows = {(r["queue"], r["priority"], r["status"]): r for r in body["depth"]}
    normal = rows["stats", "normal", "queued"]
    assert (normal["tasks"], normal["ready"], normal["scheduled"]) == (3, 2, 1)
    assert 120 <= normal["oldest_ready_age_seconds"] < 180
    high = rows["stats", "high", "queued"]
    assert (high["tasks"], high["ready"], high["scheduled"]) == (1, 1, 0)
    assert 0 <= high["oldest_ready_age_seconds"] < 60
    # Completed tasks are counted in throughput only (counting every one kept would read the
    # whole table); dead letters are in the depth.
    assert ("stats-done", "normal", "completed") not in rows
    assert rows["stats-done", "normal", "failed"]["tasks"] == 1
    assert body["window_seconds"] == 60
    assert {"queue": "stats-done", "completed": 1, "failed": 1} in body["throughput"]


def test_healthz_is_200(shared_client):
    response = shared_client.get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz_is_200_on_a_migrated_database(shared_client):
    response = shared_client.get("/readyz")

    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "schema_revision": migrate.head()}


def test_readyz_is_503_when_the_schema_is_missing(start_server, empty_database_url):
    live = start_server(ApiSettings(database_url=empty_database_url))

    response = live.client.get("/readyz")

    body = assert_error(response, 503, "not_ready")
    assert "pgqueue migrate" in body["message"]
    assert live.client.get("/healthz").status_code == 200
    # A code of its own: an operator must migrate, not wait for the database.
    assert_error(live.client.get("/api/v1/tasks"), 503, "schema_not_ready")


def test_unreachable_database_still_starts_healthz_200_and_readyz_503(start_server):
    live = start_server(ApiSettings(database_url=UNREACHABLE_URL))

    health = live.client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # Both wait for the pool's timeout; ask concurrently.
    with ThreadPoolExecutor(2) as pool, httpx.Client(base_url=live.base_url, timeout=30) as other:
        ready = pool.submit(live.client.get, "/readyz")
        tasks = pool.submit(other.post, "/api/v1/tasks", json={"type": "t"})
        ready_response, tasks_response = ready.result(), tasks.result()

    assert_error(ready_response, 503, "not_ready")
    assert_error(tasks_response, 503, "unavailable")
    for response in (ready_response, tasks_response):
        assert "s3cret-pw" not in response.text


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def sample(samples, name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and lab == labels]
    assert len(found) == 1, (name, labels, [s for s in samples if s[0] == name])
    return found[0]


def test_metrics_has_queue_depth_age_submissions_and_latency(client):
    a_minute_ago = (datetime.now(UTC) - timedelta(seconds=90)).isoformat()
    first = created(client, {"type": "m", "queue": "metered", "run_at": a_minute_ago})
    created(client, {"type": "m", "queue": "metered", "idempotency_key": "once"})
    assert (
        submit(client, {"type": "m", "queue": "metered", "idempotency_key": "once"}).status_code
        == 200
    )
    assert client.get(f"/api/v1/tasks/{first['task_id']}").status_code == 200

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = metric_samples(response.text)
    labels = {"queue": "metered", "priority": "normal"}
    assert sample(samples, "pgqueue_queue_depth", status="queued", **labels) == 2
    assert sample(samples, "pgqueue_queue_ready", **labels) == 2
    assert 90 <= sample(samples, "pgqueue_queue_oldest_ready_age_seconds", **labels) < 150
    submitted = "pgqueue_api_tasks_submitted_total"
    assert sample(samples, submitted, queue="metered", outcome="created") == 2
    assert sample(samples, submitted, queue="metered", outcome="replayed") == 1
    latency = "pgqueue_api_request_duration_seconds_count"
    assert sample(samples, latency, method="POST", route="/api/v1/tasks") == 3
    # The route label is the template, not the id.
    assert sample(samples, latency, method="GET", route="/api/v1/tasks/{task_id}") == 1
    assert not [s for s in samples if first["task_id"] in str(s[1])]


def test_request_metrics_label_invented_methods_as_other_and_routes_by_their_template(client):
    for method in ("PROPFIND", "MKCOL", "LOCK"):  # methods the HTTP parser knows
        client.request(method, "/api/v1/tasks")
    paused = client.post("/api/v1/queues/team%2Fmail/pause", params={"create": "true"})
    assert paused.status_code == 200, paused.text

    samples = metric_samples(client.get("/metrics").text)

    latency = "pgqueue_api_request_duration_seconds_count"
    methods = {dict(s[1]).get("method") for s in samples if s[0] == latency}
    assert not methods & {"PROPFIND", "MKCOL", "LOCK"}, methods
    assert sample(samples, latency, method="other", route="/api/v1/tasks") >= 3
    assert sample(samples, latency, method="POST", route="/api/v1/queues/{name}/pause") >= 1


# --- authentication ----------------------------------------------------------------------------

# (method, route, which id goes in the path, JSON body, status with a valid token)
PROTECTED = [
    ("POST", "/api/v1/tasks", None, {"type": "auth-check"}, 202),
    ("GET", "/api/v1/tasks", None, None, 200),
    ("GET", "/api/v1/tasks/{task_id}", "queued", None, 200),
    ("DELETE", "/api/v1/tasks/{task_id}", "queued", None, 200),
    ("GET", "/api/v1/dead-letters", None, None, 200),
    ("GET", "/api/v1/dead-letters/count", None, None, 200),
    ("POST", "/api/v1/dead-letters/{task_id}/replay", "dead1", None, 200),
    ("POST", "/api/v1/dead-letters/replay", None, {"type": "none-such"}, 200),
    ("DELETE", "/api/v1/dead-letters/{task_id}", "dead2", None, 200),
    ("POST", "/api/v1/dead-letters/discard", None, {"type": "none-such"}, 200),
    ("GET", "/api/v1/stats", None, None, 200),
    ("GET", "/api/v1/queues", None, None, 200),
    ("GET", "/api/v1/schedules", None, None, 200),
    # {name} is "auth", the queue of the task above: a known queue, so that setting its
    # retention and pausing it need no ?create.
    ("PUT", "/api/v1/queues/{name}/retention", None, {"completed_seconds": 3600}, 200),
    ("POST", "/api/v1/queues/{name}/pause", None, None, 200),
    ("POST", "/api/v1/queues/{name}/resume", None, None, 200),
    ("DELETE", "/api/v1/queues/{name}", None, None, 200),
    ("GET", "/api/v1/limits", None, None, 200),
    ("PUT", "/api/v1/limits/{kind}/{name}", None, {"max_running": 1000}, 200),
    ("DELETE", "/api/v1/limits/{kind}/{name}", None, None, 200),
    ("GET", "/api/v1/throughput/series", None, None, 200),
    ("GET", "/api/v1/failures", None, None, 200),
    ("GET", "/api/v1/workflows/{workflow_id}", "workflow", None, 200),
    ("DELETE", "/api/v1/workflows/{workflow_id}", "workflow", None, 200),
    ("GET", "/metrics", None, None, 200),
]


def make_auth_targets(conn: psycopg.Connection[Any]) -> dict[str, uuid.UUID]:
    ids = {"queued": pgqueue.enqueue(conn, "auth", {}, queue="auth").id}
    ids["dead1"], ids["dead2"] = make_dead_letters(conn, 2, queue="auth-dead")
    ids["workflow"] = pgqueue.enqueue(
        conn, "auth", {}, queue="auth", workflow_id=uuid.uuid4()
    ).task.workflow_id
    return ids


def call_protected(client: httpx.Client, ids: dict[str, uuid.UUID], **options: Any):
    """Call every protected endpoint once; no response may show a token."""
    responses = []
    for method, route, which, body, _ in PROTECTED:
        target = ids[which] if which else None
        path = route.format(task_id=target, workflow_id=target, name="auth", kind="type")
        response = client.request(method, path, json=body, **options)
        for token in (TOKEN, OTHER_TOKEN):
            assert token not in response.text and token not in str(response.headers)
        responses.append(response)
    return responses


def snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status, attempts, cancel_requested, finished_at FROM pgqueue.tasks ORDER BY id"
    ).fetchall()


@pytest.fixture(scope="module")
def auth_targets(shared_conn: psycopg.Connection[Any]) -> dict[str, uuid.UUID]:
    return make_auth_targets(shared_conn)


@pytest.fixture
def refused(shared_servers, shared_conn, auth_targets) -> Callable[..., None]:
    """Call every protected endpoint of the shared server with tokens: all 401, nothing changes."""
    client = shared_servers["authed"].client

    def check(**options: Any) -> None:
        before = snapshot(shared_conn)
        assert_all_401(call_protected(client, auth_targets, **options))
        assert snapshot(shared_conn) == before

    return check


def assert_all_401(responses: list[httpx.Response]) -> None:
    for (method, route, *_), response in zip(PROTECTED, responses, strict=True):
        assert response.status_code == 401, (method, route, response.text)
        assert response.headers["www-authenticate"] == "Bearer", (method, route)
        assert response.json()["error"] == "unauthorized", (method, route)


def api_routes(routes: list[Any]) -> set[tuple[str, str]]:
    """(method, path) of every route, looking inside included routers."""
    found: set[tuple[str, str]] = set()
    for route in routes:
        inner = getattr(route, "original_router", None) or getattr(route, "routes", None)
        if inner is not None:
            found |= api_routes(getattr(inner, "routes", inner))
        elif isinstance(route, APIRoute):
            found |= {(method, route.path_format) for method in route.methods}
    return found


def test_every_api_route_is_in_the_auth_table(shared_servers):
    routes = {
        (method, path)
        for method, path in api_routes(shared_servers["authed"].app.routes)
        if path.startswith("/api/") or path == "/metrics"
    }

    assert routes == {(method, route) for method, route, *_ in PROTECTED}


def test_without_a_token_every_api_endpoint_and_metrics_are_401(refused):
    refused()


def test_with_a_wrong_token_every_endpoint_is_401(refused):
    for token in ("wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), f"{TOKEN},{OTHER_TOKEN}"):
        refused(headers=bearer(token))


def test_a_token_in_the_query_string_is_401(refused):
    for name in ("token", "access_token", "bearer"):
        refused(params={name: TOKEN})


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def test_a_token_under_another_scheme_or_header_is_401(refused):
    for headers in (
        {"Authorization": basic(TOKEN)},
        {"Authorization": basic(f"user:{TOKEN}")},
        {"Authorization": f"Token {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer{TOKEN}"},
        {"X-API-Token": TOKEN},
        {"Cookie": f"token={TOKEN}"},
    ):
        refused(headers=headers)


def test_with_the_right_token_every_endpoint_succeeds(authed, conn):
    ids = make_auth_targets(conn)

    responses = call_protected(authed.client, ids, headers=bearer(TOKEN))

    for (method, route, _, _, expected), response in zip(PROTECTED, responses, strict=True):
        assert response.status_code == expected, (method, route, response.text)
    assert status_of(conn, ids["queued"]) == "cancelled"
    assert status_of(conn, ids["dead1"]) == "queued"
    # The other configured token works too, and the scheme is case-insensitive.
    response = authed.client.get(
        "/api/v1/tasks", headers={"Authorization": f"bearer {OTHER_TOKEN}"}
    )
    assert response.status_code == 200, response.text
    assert TOKEN not in response.text and OTHER_TOKEN not in response.text


def test_healthz_and_readyz_need_no_token(shared_servers):
    client = shared_servers["authed"].client
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("PGQUEUE_API_TOKENS", "PGQUEUE_API_TOKENS_FILE", "PGQUEUE_API_MAX_BODY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_tokens_from_the_environment_comma_list(clean_env, start_server, shared_database_url):
    clean_env.setenv(
        "PGQUEUE_API_TOKENS",
        f" env-one{PAD} , env-two{PAD},, ",
    )

    settings = ApiSettings.from_env()
    assert set(settings.tokens) == {
        f"env-one{PAD}",
        f"env-two{PAD}",
    }
    live = start_server(dataclasses.replace(settings, database_url=shared_database_url))

    for token in (
        f"env-one{PAD}",
        f"env-two{PAD}",
    ):
        assert live.client.get("/api/v1/tasks", headers=bearer(token)).status_code == 200
    for token in (
        f"env-one{PAD} , env-two{PAD}",
        f"env-one{PAD},env-two{PAD}",
        "env",
    ):
        assert live.client.get("/api/v1/tasks", headers=bearer(token)).status_code == 401
    assert live.client.get("/api/v1/tasks").status_code == 401


def test_tokens_from_a_file_with_comments(clean_env, start_server, shared_database_url, tmp_path):
    path = tmp_path / "tokens"
    path.write_text(
        f"# API tokens\nfile-one{PAD}\n\n  file-two{PAD}  \n#file-retired{PAD}\n",
        encoding="utf-8",
    )
    clean_env.setenv("PGQUEUE_API_TOKENS_FILE", str(path))
    clean_env.setenv("PGQUEUE_API_TOKENS", f"env-one{PAD}")

    settings = ApiSettings.from_env()
    assert set(settings.tokens) == {
        f"file-one{PAD}",
        f"file-two{PAD}",
        f"env-one{PAD}",
    }
    live = start_server(dataclasses.replace(settings, database_url=shared_database_url))

    for token in (
        f"file-one{PAD}",
        f"file-two{PAD}",
        f"env-one{PAD}",
    ):
        assert live.client.get("/api/v1/tasks", headers=bearer(token)).status_code == 200
    for token in (
        f"#file-retired{PAD}",
        f"file-retired{PAD}",
        "# API tokens",
    ):
        response = live.client.get("/api/v1/tasks", headers=bearer(token))
        assert response.status_code == 401
        assert token not in response.text


def test_an_indented_comment_in_the_tokens_file_is_not_a_token(
    clean_env, start_server, shared_database_url, tmp_path
):
    path = tmp_path / "tokens"
    path.write_text(
        f"file-one{PAD}\n    # retired: old-token{PAD}\n",
        encoding="utf-8",
    )
    clean_env.setenv("PGQUEUE_API_TOKENS_FILE", str(path))

    settings = ApiSettings.from_env()
    live = start_server(dataclasses.replace(settings, database_url=shared_database_url))

    response = live.client.get("/api/v1/tasks", headers=bearer(f"# retired: old-token{PAD}"))
    assert response.status_code == 401
    assert set(settings.tokens) == {f"file-one{PAD}"}


def test_an_unreadable_tokens_file_is_a_configuration_error(clean_env, tmp_path):
    missing = tmp_path / "no-such-file"
    clean_env.setenv("PGQUEUE_API_TOKENS_FILE", str(missing))

    with pytest.raises(pgqueue.ConfigurationError, match="PGQUEUE_API_TOKENS_FILE"):
        ApiSettings.from_env()


# --- pgqueue serve -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    env.pop("PGQUEUE_DATABASE_URL", None)
    env.update(extra)
    return env


def serve_command(database_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pgqueue", "--database-url", database_url, "serve", *args]


@contextlib.contextmanager
def running_serve(
    database_url: str, port: int, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``pgqueue serve`` in a subprocess; yields its base URL once /healthz answers."""
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            serve_command(database_url, "--port", str(port), "--log-level", "warning", *args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or serve_env(),
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"pgqueue serve exited with {proc.returncode}: {log.read_text()}")
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 60, "pgqueue serve to answer /healthz")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def test_serve_refuses_a_non_loopback_host_without_tokens(shared_database_url):
    port = free_port()

    proc = subprocess.run(
        serve_command(shared_database_url, "--host", "0.0.0.0", "--port", str(port)),
        capture_output=True,
        text=True,
        timeout=60,
        env=serve_env(),
    )

    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "authentication" in lines[0]
    assert "Traceback" not in proc.stderr
    assert "Uvicorn running" not in proc.stdout + proc.stderr
    assert "Started server" not in proc.stdout + proc.stderr


def test_serve_allow_unauthenticated_starts_on_a_non_loopback_host_for_the_hosts_named(
    database_url, tmp_path
):
    port = free_port()
    args = ("--host", "0.0.0.0", "--allow-unauthenticated", "--allowed-host", "queue.internal")

    with running_serve(database_url, port, tmp_path, *args) as base:
        named = {"Host": f"queue.internal:{port}"}
        response = httpx.post(
            f"{base}/api/v1/tasks", json={"type": "open"}, headers=named, timeout=10
        )
        assert response.status_code == 202, response.text
        listed = httpx.get(f"{base}/api/v1/tasks", headers=named, timeout=10).json()["items"]
        assert [t["task_id"] for t in listed] == [response.json()["task_id"]]
        rebound = httpx.get(
            f"{base}/api/v1/tasks", headers={"Host": f"rebind.example:{port}"}, timeout=10
        )
        assert rebound.status_code == 400, rebound.text
        assert rebound.json()["error"] == "host_not_allowed"


def test_serve_without_tokens_beyond_loopback_refuses_to_start_without_the_hosts_named(
    shared_database_url,
):
    port = free_port()

    proc = subprocess.run(
        serve_command(
            shared_database_url, "--host", "0.0.0.0", "--port", str(port), "--allow-unauthenticated"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=serve_env(),
    )

    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    line = lines[0]
    assert "--allowed-host" in line and "PGQUEUE_API_ALLOWED_HOSTS" in line, line
    assert "Uvicorn running" not in proc.stdout + proc.stderr


def test_serve_with_tokens_from_the_environment_requires_them(database_url, tmp_path, conn):
    port = free_port()
    env = serve_env(PGQUEUE_API_TOKENS=f"serve-token{PAD}")

    with running_serve(database_url, port, tmp_path, "--host", "0.0.0.0", env=env) as base:
        denied = httpx.post(f"{base}/api/v1/tasks", json={"type": "x"}, timeout=10)
        assert denied.status_code == 401
        allowed = httpx.post(
            f"{base}/api/v1/tasks",
            json={"type": "x"},
            headers=bearer(f"serve-token{PAD}"),
            timeout=10,
        )
        assert allowed.status_code == 202, allowed.text
    assert count_tasks(conn) == 1


# --- hostile strings ---------------------------------------------------------------------------


def test_hostile_strings_are_stored_and_returned_verbatim(client, conn):
    pgqueue.enqueue(conn, "plain", {})
    ids = {}
    for text in HOSTILE:
        body = created(
            client,
            {"type": text, "queue": text, "idempotency_key": text, "payload": {text: text}},
        )
        assert (body["type"], body["queue"], body["idempotency_key"]) == (text, text, text)
        ids[text] = body["task_id"]

    assert count_tasks(conn) == len(HOSTILE) + 1
    for text, task_id in ids.items():
        got = client.get(f"/api/v1/tasks/{task_id}").json()
        assert (got["type"], got["queue"], got["idempotency_key"]) == (text, text, text)
        assert got["payload"] == {text: text}
        stored = pgqueue.get_task(conn, task_id)
        assert (stored.type, stored.queue, stored.idempotency_key) == (text, text, text)
        # The key is matched verbatim too.
        again = submit(client, {"type": "other", "idempotency_key": text})
        assert again.status_code == 200 and again.json()["task_id"] == task_id
    assert count_tasks(conn) == len(HOSTILE) + 1


def test_list_filters_with_hostile_strings_return_only_the_matching_task(client, conn):
    pgqueue.enqueue(conn, "plain", {}, queue="plain")
    ids = {t: created(client, {"type": t, "queue": t})["task_id"] for t in HOSTILE}

    for text, task_id in ids.items():
        for name in ("type", "queue"):
            response = client.get("/api/v1/tasks", params={name: text})
            assert response.status_code == 200, response.text
            assert [t["task_id"] for t in response.json()["items"]] == [task_id], (name, text)
    for pattern in ("%", "_", "%s%", "*"):
        response = client.get("/api/v1/tasks", params={"type": pattern})
        assert response.json()["items"] == []
    assert count_tasks(conn) == len(HOSTILE) + 1


def test_dead_letter_filters_with_hostile_strings_act_only_on_the_exact_match(client, conn):
    dead = {t: make_dead_letters(conn, 1, type=t, queue=t)[0] for t in HOSTILE}
    plain = make_dead_letters(conn, 1, type="plain", queue="plain")[0]

    for pattern in ("%", "_", "%s%", "*"):
        response = client.post("/api/v1/dead-letters/replay", json={"type": pattern})
        assert response.json()["count"] == 0
    for text, task_id in dead.items():
        response = client.post("/api/v1/dead-letters/replay", json={"type": text})
        assert response.status_code == 200, response.text
        assert response.json()["task_ids"] == [str(task_id)], text
        # Dead again, then discarded by queue.
        (claimed,) = pgqueue.claim(conn, [text], limit=1, worker_id="test-worker")
        pgqueue.fail(conn, claimed.lease, "again")
        response = client.post("/api/v1/dead-letters/discard", json={"queue": text})
        assert response.json()["task_ids"] == [str(task_id)], text
    assert {row[0] for row in conn.execute("SELECT id FROM pgqueue.tasks")} == {plain}


def test_dead_letter_filter_with_a_nul_character_is_422(client, conn):
    make_dead_letters(conn, 1)

    for action in ("replay", "discard"):
        response = client.post(f"/api/v1/dead-letters/{action}", json={"type": "boom\u0000"})
        assert_error(response, 422, "invalid_request", "type")


# --- OpenAPI -----------------------------------------------------------------------------------


def test_openapi_lists_every_path_and_the_documented_status_codes(shared_client):
    response = shared_client.get("/openapi.json")

    assert response.status_code == 200, response.text
    paths = response.json()["paths"]
    assert {p for p in paths if p.startswith("/api/v1")} == {
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/dead-letters",
        "/api/v1/dead-letters/count",
        "/api/v1/dead-letters/{task_id}/replay",
        "/api/v1/dead-letters/replay",
        "/api/v1/dead-letters/{task_id}",
        "/api/v1/dead-letters/discard",
        "/api/v1/stats",
        "/api/v1/queues",
        "/api/v1/schedules",
        "/api/v1/queues/{name}",
        "/api/v1/queues/{name}/pause",
        "/api/v1/queues/{name}/resume",
        "/api/v1/queues/{name}/retention",
        "/api/v1/limits",
        "/api/v1/limits/{kind}/{name}",
        "/api/v1/throughput/series",
        "/api/v1/failures",
        "/api/v1/workflows/{workflow_id}",
    }
    assert {"200", "202", "400", "401", "413", "422", "503"} <= set(
        paths["/api/v1/tasks"]["post"]["responses"]
    )
    assert {"200", "202", "404", "409"} <= set(
        paths["/api/v1/tasks/{task_id}"]["delete"]["responses"]
    )
    assert {"200", "404"} <= set(paths["/api/v1/tasks/{task_id}"]["get"]["responses"])
    assert {"200", "404", "409"} <= set(
        paths["/api/v1/dead-letters/{task_id}/replay"]["post"]["responses"]
    )
    params = {p["name"] for p in paths["/api/v1/tasks"]["get"]["parameters"]}
    assert {"status", "type", "queue", "limit", "cursor"} <= params


def test_authentication_is_checked_before_the_body_is_parsed(shared_servers, shared_conn):
    authed = shared_servers["authed"].client
    with no_new_tasks(shared_conn):
        response = authed.post(
            "/api/v1/tasks", content=b"{not json", headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"] == "unauthorized"


def test_unknown_routes_and_methods_answer_in_the_api_error_shape(shared_client):
    missing = shared_client.get("/api/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    wrong = shared_client.put("/api/v1/tasks")
    assert wrong.status_code == 405
    assert wrong.json()["error"] == "method_not_allowed"
    assert "POST" in wrong.headers["Allow"]


def test_dead_letter_filters_with_a_nul_are_422_not_500(shared_client):
    for path in ("/api/v1/dead-letters/replay", "/api/v1/dead-letters/discard"):
        response = shared_client.post(path, json={"type": "boom\u0000"})
        assert response.status_code == 422, path
        assert response.json()["errors"][0]["field"] == "type"
    listed = shared_client.get("/api/v1/tasks", params={"queue": "q\u0000"})
    assert listed.status_code == 422


def test_the_api_works_mounted_inside_another_asgi_app(database_url):
    """Starlette's Mount sends no lifespan events to the mounted app: it must open its pool
    on first use, and authentication must apply under the mount prefix."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(
        routes=[Mount("/queue", create_app(ApiSettings(database_url, frozenset({TOKEN}))))]
    )
    config = uvicorn.Config(outer, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "the server to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/queue", timeout=30) as client:
            assert client.get("/healthz").status_code == 200
            assert client.post("/api/v1/tasks", json={"type": "t"}).status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            made = client.post("/api/v1/tasks", json={"type": "t"}, headers=auth)
            assert made.status_code == 202
            got = client.get(f"/api/v1/tasks/{made.json()['task_id']}", headers=auth)
            assert got.json()["status"] == "queued"
            assert client.get("/readyz").json()["status"] == "ready"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_running_task_carries_its_types_declared_timeout_to_show_an_overrun(client, conn):
    """The dashboard marks a task running longer than its type's timeout (its worker holds it
    while the handler's thread runs on): list and get give the timeout while it runs."""
    from pgqueue.queries.driver import run
    from pgqueue.queries.task_types import TypeDeclaration, task_types_declare

    run(conn, task_types_declare("w", [TypeDeclaration("timed", timeout=2.5)]))
    timed = pgqueue.enqueue(conn, "timed", {}, queue="overrun").id
    untimed = pgqueue.enqueue(conn, "slow", {}, queue="overrun").id
    queued = pgqueue.enqueue(conn, "timed", {}, queue="overrun-later").id
    assert len(pgqueue.claim(conn, ["overrun"], limit=2, worker_id="test-worker")) == 2

    listed = client.get("/api/v1/tasks", params={"queue": "overrun", "status": "running"})
    assert listed.status_code == 200, listed.text
    by_id = {item["task_id"]: item["timeout_seconds"] for item in listed.json()["items"]}
    assert by_id == {str(timed): 2.5, str(untimed): None}
    assert client.get(f"/api/v1/tasks/{timed}").json()["timeout_seconds"] == 2.5
    # Only while it runs: a queued task of the type has none.
    assert client.get(f"/api/v1/tasks/{queued}").json()["timeout_seconds"] is None
