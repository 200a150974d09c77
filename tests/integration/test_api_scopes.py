"""Each token may do what its scopes say, against a real server: a scraper's metrics token
reads /metrics and nothing else, a read token reads everything and changes nothing, a submit
token submits, reads and cancels its tasks by id but lists nothing, an admin token does all.
A refusal is 403 ``insufficient_scope`` naming the scope needed, and changes nothing."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from test_api import Live, halt, launch

import pgqueue
from pgqueue.api import ApiSettings

METRICS = "m" * 32
READ = "r" * 32
SUBMIT = "s" * 32
ADMIN = "a" * 32
TOKENS = {"metrics": METRICS, "read": READ, "submit": SUBMIT, "admin": ADMIN}


@pytest.fixture
def live(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    """A server whose tokens come from the environment, in the documented syntax."""
    monkeypatch.delenv("PGQUEUE_API_TOKENS_FILE", raising=False)
    monkeypatch.setenv(
        "PGQUEUE_API_TOKENS", f"metrics:{METRICS}, read:{READ}, submit:{SUBMIT}, {ADMIN}"
    )
    settings = ApiSettings.from_env()
    server = launch(dataclasses.replace(settings, database_url=database_url))
    yield server
    halt([server])


def dead_letter(conn: psycopg.Connection[Any]) -> str:
    pgqueue.enqueue(conn, "doomed", {}, queue="dlq", max_attempts=1)
    (claimed,) = pgqueue.claim(conn, ["dlq"], limit=1, worker_id="test")
    pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")
    return str(claimed.id)


# (method, path, body), the scopes that may: the API's promise, written out.
Request = tuple[tuple[str, str, Any], set[str]]


def requests(task_id: str, dead_id: str) -> list[Request]:
    return [
        (("GET", "/metrics", None), {"metrics", "read", "admin"}),
        (("GET", "/openapi.json", None), {"read", "admin"}),
        (("GET", "/api/v1/tasks", None), {"read", "admin"}),
        (("GET", "/api/v1/stats", None), {"read", "admin"}),
        (("GET", "/api/v1/dead-letters", None), {"read", "admin"}),
        (("GET", f"/api/v1/tasks/{task_id}", None), {"read", "submit", "admin"}),
        (("GET", f"/api/v1/tasks/{task_id}?wait=0.1", None), {"read", "submit", "admin"}),
        (("POST", "/api/v1/tasks", {"type": "scoped"}), {"submit", "admin"}),
        (("POST", "/api/v1/queues/dlq/pause", None), {"admin"}),
        (("POST", "/api/v1/dead-letters/discard", {"all": True}), {"admin"}),
        (("POST", f"/api/v1/dead-letters/{dead_id}/replay", None), {"admin"}),
        (("PUT", "/api/v1/limits/queue/dlq", {"max_running": 3}), {"admin"}),
    ]


def test_each_scope_may_do_what_the_table_says_and_is_refused_the_rest(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    task_id = str(pgqueue.enqueue(conn, "kept", {"secret": "payload"}).id)
    dead_id = dead_letter(conn)
    before = {t.id: t.status for t in pgqueue.list_tasks(conn)}

    for scope in ("metrics", "read", "submit"):
        token = TOKENS[scope]
        for (method, path, body), may in requests(task_id, dead_id):
            response = live.client.request(
                method, path, json=body, headers={"Authorization": f"Bearer {token}"}
            )
            if scope in may:
                assert response.status_code < 300, (scope, method, path, response.text)
                continue
            assert response.status_code == 403, (scope, method, path, response.text)
            answer = response.json()
            assert answer["error"] == "insufficient_scope"
            assert scope in answer["message"] and token not in response.text
            challenge = response.headers["WWW-Authenticate"]
            named = re.fullmatch(r'Bearer error="insufficient_scope", scope="(\w+)"', challenge)
            assert named is not None and named.group(1) in may, (scope, path, challenge)
            assert "payload" not in response.text

    # Only the submit token's own task is new; the refused writes changed nothing.
    after = {t.id: t.status for t in pgqueue.list_tasks(conn)}
    assert {i: s for i, s in after.items() if i in before} == before
    assert [t.type for t in pgqueue.list_tasks(conn) if t.id not in before] == ["scoped"]
    assert pgqueue.count_dead_letters(conn) == 1
    assert not any(q.paused for q in pgqueue.list_queues(conn))


def test_a_submit_token_cancels_a_task_by_id_but_a_read_token_cannot(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "to_cancel", {}).id
    path = f"/api/v1/tasks/{task_id}"

    refused = live.client.delete(path, headers={"Authorization": f"Bearer {READ}"})
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    assert 'scope="submit"' in refused.headers["WWW-Authenticate"]
    assert pgqueue.get_task(conn, task_id).status.value == "queued"

    cancelled = live.client.delete(path, headers={"Authorization": f"Bearer {SUBMIT}"})
    assert cancelled.status_code == 200, cancelled.text
    assert pgqueue.get_task(conn, task_id).status.value == "cancelled"


def test_an_admin_token_does_everything(live: Live, conn: psycopg.Connection[Any]) -> None:
    dead_letter(conn)
    bearer = {"Authorization": f"Bearer {ADMIN}"}
    discarded = live.client.post("/api/v1/dead-letters/discard", json={"all": True}, headers=bearer)
    assert discarded.status_code == 200, discarded.text
    assert pgqueue.count_dead_letters(conn) == 0
    pgqueue.enqueue(conn, "waiting", {})
    assert live.client.post("/api/v1/queues/default/pause", headers=bearer).status_code == 200


def test_a_path_no_route_has_needs_a_valid_token_of_any_scope(live: Live) -> None:
    assert live.client.get("/api/v1/nothing-here").status_code == 401
    for token in TOKENS.values():
        response = live.client.get(
            "/api/v1/nothing-here", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 404, response.text


def test_the_open_routes_need_no_token(live: Live) -> None:
    for path in ("/healthz", "/readyz", "/dashboard/", "/dashboard/app.js"):
        assert live.client.get(path).status_code == 200, path
