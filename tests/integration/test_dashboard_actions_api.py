"""The API rules behind the dashboard's actions: the count a bulk confirmation names, and the
refusal of writes that a browser sends from another site.

Real PostgreSQL (a fresh migrated database per test) and the real application in this process
(``boundaries.Api``). The browser side is tests/browser/test_dashboard_actions.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api
from helpers import make_dead_letters

import pgqueue
from pgqueue.api import ApiSettings

TOKEN = "actions-token-3c1e-9a0b2c4d6e8f1a3b"


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


def paused(conn: psycopg.Connection[Any], queue: str) -> bool:
    return any(q.name == queue and q.paused for q in pgqueue.list_queues(conn))


def test_the_dead_letter_count_is_what_a_bulk_replay_by_the_same_filter_takes(api, conn):
    make_dead_letters(conn, 3, type="charge", queue="payments")
    make_dead_letters(conn, 2, type="refund", queue="payments")
    make_dead_letters(conn, 4, type="charge", queue="other")
    pgqueue.enqueue(conn, "charge", queue="payments")  # queued: not a dead letter

    def count(**params: str) -> int:
        response = api.request("GET", "/api/v1/dead-letters/count", params=params)
        assert response.status_code == 200, response.text
        return int(response.json()["count"])

    assert count() == 9
    assert count(queue="payments") == 5
    assert count(type="charge") == 7
    assert count(type="charge", queue="payments") == 3
    assert count(type="nosuchtype") == 0

    replayed = api.request(
        "POST", "/api/v1/dead-letters/replay", json={"type": "charge", "queue": "payments"}
    )
    assert replayed.json()["count"] == 3
    assert count(type="charge", queue="payments") == 0
    assert pgqueue.count_dead_letters(conn, type="charge") == 4


def test_a_bad_filter_on_the_count_is_a_clear_400_not_a_traceback(api):
    response = api.request("GET", "/api/v1/dead-letters/count", params={"queue": "a\x00b"})

    assert response.status_code in (400, 422)
    assert "queue" in response.json()["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://other.example"},
        {"Origin": "https://evil.example"},  # an older browser: no Sec-Fetch-Site
        {"Origin": "null"},  # a sandboxed frame or a file:// page
    ],
    ids=["cross-site", "same-site", "origin-only", "null-origin"],
)
def test_a_write_sent_from_another_site_is_refused_and_changes_nothing(api, conn, headers):
    make_dead_letters(conn, 1, queue="payments")

    response = api.request(
        "POST",
        "/api/v1/queues/payments/pause",
        headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
        content=b"",
    )

    assert response.status_code == 403
    assert response.json()["error"] == "cross_site_request"
    assert not paused(conn, "payments")
    discarded = api.request(
        "POST", "/api/v1/dead-letters/discard", json={"all": True}, headers=headers
    )
    assert discarded.status_code == 403
    assert pgqueue.count_dead_letters(conn) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1"},
        {"Origin": "http://127.0.0.1"},
        {},  # curl, scripts, the CLI's HTTP clients: no browser headers at all
    ],
    ids=["same-origin", "origin-matches-host", "not-a-browser"],
)
def test_a_write_from_the_dashboards_own_origin_or_from_a_script_goes_through(api, conn, headers):
    make_dead_letters(conn, 1, queue="payments")

    response = api.request("POST", "/api/v1/queues/payments/pause", headers=headers)

    assert response.status_code == 200, response.text
    assert paused(conn, "payments")


def test_reads_from_another_site_are_not_refused_by_the_write_rule(database_url):
    # A read changes nothing; with tokens it still needs one (the browser cannot add it).
    server = Api(ApiSettings(database_url=database_url, tokens=frozenset({TOKEN})))
    try:
        cross = {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}
        assert server.request("GET", "/api/v1/stats", headers=cross).status_code == 401
        authed = {**cross, "Authorization": f"Bearer {TOKEN}"}
        assert server.request("GET", "/api/v1/stats", headers=authed).status_code == 200
    finally:
        server.close()
