"""The HTTP API and concurrency keys: ``POST /api/v1/tasks`` takes ``concurrency_key``, the
answer, ``GET /api/v1/tasks/{id}`` and the list carry it, and a bad one is a 422 naming the
field with nothing written. The whole application (``create_app`` with its lifespan) through
httpx's ASGI transport, on a database of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api

import pgqueue
from pgqueue.api import ApiSettings


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def post(api: Api, body: dict[str, Any]) -> Any:
    return api.request("POST", "/api/v1/tasks", json=body)


def test_submit_stores_the_key_and_the_answer_get_and_list_return_it(api, conn):
    response = post(api, {"type": "report", "queue": "q", "concurrency_key": "acct-42"})

    assert response.status_code == 202, response.text
    task_id = uuid.UUID(response.json()["task_id"])
    assert response.json()["concurrency_key"] == "acct-42"
    assert pgqueue.get_task(conn, task_id).concurrency_key == "acct-42"
    got = api.request("GET", f"/api/v1/tasks/{task_id}")
    assert got.json()["concurrency_key"] == "acct-42"
    listed = api.request("GET", "/api/v1/tasks", params={"queue": "q"})
    assert [(i["task_id"], i["concurrency_key"]) for i in listed.json()["items"]] == [
        (str(task_id), "acct-42")
    ]


def test_submit_without_a_key_answers_and_reads_back_null(api, conn):
    response = post(api, {"type": "report"})

    assert response.status_code == 202, response.text
    assert response.json()["concurrency_key"] is None
    task_id = response.json()["task_id"]
    assert api.request("GET", f"/api/v1/tasks/{task_id}").json()["concurrency_key"] is None
    assert pgqueue.get_task(conn, task_id).concurrency_key is None


def test_a_key_set_by_the_library_is_read_back_over_http(api, conn):
    task_id = pgqueue.enqueue(conn, "t", concurrency_key="\U0001f389 tenant").id

    got = api.request("GET", f"/api/v1/tasks/{task_id}")

    assert got.json()["concurrency_key"] == "\U0001f389 tenant"


def test_a_repeated_idempotent_submit_answers_200_with_the_originals_key(api, conn):
    body = {"type": "t", "idempotency_key": "order-1", "concurrency_key": "acct-1"}
    first = post(api, body)
    again = post(api, {**body, "concurrency_key": "acct-2"})  # key_reuse 'return'

    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["task_id"] == first.json()["task_id"]
    assert again.json()["concurrency_key"] == "acct-1"
    assert count_tasks(conn) == 1


BAD_KEYS: dict[str, tuple[Any, str]] = {
    "number": (42, "Input should be a valid string"),
    "empty": ("", "String should have at least 1 character"),
    "201 characters": ("k" * 201, "String should have at most 200 characters"),
    "blank": ("   ", "must not be empty"),
    "NUL": ("a\x00b", "must not contain NUL characters"),
    "lone surrogate": (
        "t\udcff",
        "Input should be a valid string, unable to parse raw data as a unicode string",
    ),
}


@pytest.mark.parametrize("bad", BAD_KEYS, ids=str)
def test_a_bad_key_is_422_naming_the_field_and_writes_nothing(api, conn, bad):
    value, message = BAD_KEYS[bad]
    # json.dumps escapes a lone surrogate as \udcff, which is what a client would send.
    content = json.dumps({"type": "t", "concurrency_key": value})

    response = api.request(
        "POST", "/api/v1/tasks", content=content, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid_request"
    assert [(e["field"], e["message"]) for e in body["errors"]] == [("concurrency_key", message)]
    assert count_tasks(conn) == 0


def test_refuse_answers_409_naming_the_concurrency_key_when_another_tenant_reuses_a_key(api, conn):
    body = {"type": "t", "idempotency_key": "order-1", "concurrency_key": "acct-1"}
    first = post(api, body)
    same = post(api, {**body, "key_reuse": "refuse"})
    other = post(api, {**body, "concurrency_key": "acct-2", "key_reuse": "refuse"})

    assert (first.status_code, same.status_code, other.status_code) == (202, 200, 409)
    assert other.json()["error"] == "idempotency_conflict"
    assert other.json()["task_id"] == first.json()["task_id"]
    assert other.json()["differing_fields"] == ["concurrency_key"]
    assert count_tasks(conn) == 1
