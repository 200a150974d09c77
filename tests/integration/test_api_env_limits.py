"""The API's limits as read from the environment by ``ApiSettings.from_env()``, against a
real server: the wait settings apply whether or not the body limit is set, and the default
body limit lets through the largest payload however the client escapes it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from processes import wait_until
from test_api import Live, halt, launch
from test_wait_http import Get, waiters

import pgqueue
from pgqueue.api import ApiSettings

# Large enough that the 64 KiB envelope alone could not hold the escaping of a payload.
PAYLOAD_LIMIT = 128 * 1024


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        "PGQUEUE_API_TOKENS",
        "PGQUEUE_API_TOKENS_FILE",
        "PGQUEUE_API_MAX_BODY_BYTES",
        "PGQUEUE_API_MAX_WAITERS",
        "PGQUEUE_API_WAIT_POLL_SECONDS",
        "PGQUEUE_API_ALLOWED_HOSTS",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def serve(database_url: str) -> Iterator[Any]:
    started: list[Live] = []

    def _serve() -> Live:
        settings = dataclasses.replace(ApiSettings.from_env(), database_url=database_url)
        started.append(launch(settings))
        return started[-1]

    yield _serve
    halt(started)


def test_max_waiters_from_the_environment_applies_without_a_body_limit_set(
    env: pytest.MonkeyPatch, serve: Any, conn: psycopg.Connection[Any]
) -> None:
    env.setenv("PGQUEUE_API_MAX_WAITERS", "1")
    env.setenv("PGQUEUE_API_WAIT_POLL_SECONDS", "0.5")
    live = serve()
    first, second = (pgqueue.enqueue(conn, "t", {}).id for _ in range(2))

    waiting = Get(live, f"/api/v1/tasks/{first}?wait=60")
    wait_until(lambda: waiters(conn) == 1, 30, "the first request to register")
    refused = live.client.get(f"/api/v1/tasks/{second}?wait=60")

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "too_many_waiters"
    pgqueue.cancel(conn, first)
    assert waiting.join().status_code == 200


def test_the_wait_poll_from_the_environment_is_read_without_a_body_limit_set(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("PGQUEUE_API_WAIT_POLL_SECONDS", "0.25")
    env.setenv("PGQUEUE_API_MAX_WAITERS", "7")
    settings = ApiSettings.from_env()
    assert (settings.wait_poll_seconds, settings.max_waiters) == (0.25, 7)


def escaped_body(payload: dict[str, Any]) -> bytes:
    """What a Python client sends by default: ``json.dumps`` with ensure_ascii and spaces."""
    return json.dumps({"type": "accented", "payload": payload}).encode()


def payload_of_size(size: int, char: str) -> dict[str, Any]:
    """A payload whose text as PostgreSQL gives it back (``{"s": "..."}``, jsonb's spacing)
    is exactly ``size`` bytes of UTF-8, mostly ``char``."""
    frame = len(json.dumps({"s": ""}).encode())
    width = len(char.encode())
    count, rest = divmod(size - frame, width)
    payload = {"s": char * count + "a" * rest}
    assert len(json.dumps(payload, ensure_ascii=False).encode()) == size
    return payload


@pytest.mark.parametrize("char", ["é", "😀"], ids=["two-byte", "astral"])
def test_a_non_ascii_payload_at_the_limit_sent_escaped_is_accepted_and_one_byte_more_is_refused_by_the_payload_rule(  # noqa: E501
    env: pytest.MonkeyPatch, serve: Any, conn: psycopg.Connection[Any], char: str
) -> None:
    env.setenv("PGQUEUE_MAX_PAYLOAD_BYTES", str(PAYLOAD_LIMIT))
    live = serve()
    headers = {"Content-Type": "application/json"}

    at_limit = escaped_body(payload_of_size(PAYLOAD_LIMIT, char))
    assert len(at_limit) > 2 * PAYLOAD_LIMIT  # escaped, it is far above the payload limit
    accepted = live.client.post("/api/v1/tasks", content=at_limit, headers=headers)
    assert accepted.status_code == 202, accepted.text

    over = escaped_body(payload_of_size(PAYLOAD_LIMIT + 1, char))
    refused = live.client.post("/api/v1/tasks", content=over, headers=headers)
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"] == "payload_too_large"
    assert [t.type for t in pgqueue.list_tasks(conn)] == ["accented"]
