"""A task's expiry: if no attempt has been spent by then it is never run, and ends
cancelled with the reason ``expired``; once an attempt was spent, it no longer applies.

The library with a controlled clock, the validation at the library, the CLI and the HTTP API
(each refusing with the field named and writing nothing), and a real worker that never runs
an expired task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from helpers import run_worker_until

import pgqueue
from pgqueue.api import ApiSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def claim(conn: psycopg.Connection[Any], now: datetime) -> list[pgqueue.ClaimedTask]:
    return pgqueue.claim(conn, ["default"], limit=10, worker_id="w", now=now)


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def test_an_expired_task_is_never_claimed_and_ends_cancelled_expired(
    conn: psycopg.Connection[Any],
):
    doomed = pgqueue.enqueue(conn, "notify", {}, expires_in=60, now=T0).task
    assert doomed.expires_at == at(60)
    keeper = pgqueue.enqueue(conn, "notify", {}, now=T0).id

    # Past its expiry the claim passes it by, and takes the task behind it.
    assert [t.id for t in claim(conn, at(61))] == [keeper]
    assert pgqueue.get_task(conn, doomed.id).status is pgqueue.TaskStatus.QUEUED

    assert pgqueue.expire(conn, now=at(61)) == [doomed.id]
    task = pgqueue.get_task(conn, doomed.id)
    assert (task.status, task.last_error, task.attempts) == (
        pgqueue.TaskStatus.CANCELLED,
        "expired",
        0,
    )
    assert task.finished_at == at(61) and task.started_at is None
    assert pgqueue.expire(conn, now=at(62)) == []


def test_a_task_claimed_before_its_expiry_is_not_expired(conn: psycopg.Connection[Any]):
    task_id = pgqueue.enqueue(conn, "notify", {}, expires_in=60, max_attempts=3, now=T0).id
    (first,) = claim(conn, at(10))
    pgqueue.fail(conn, first.lease, "ValueError: flaky", retry_after=100, now=at(11))

    # An attempt was spent before the expiry: the retry runs after it, and nothing expires it.
    assert pgqueue.expire(conn, now=at(120)) == []
    (retry,) = claim(conn, at(120))
    assert retry.id == task_id and retry.attempts == 2
    pgqueue.complete(conn, retry.lease, None, now=at(121))
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.COMPLETED


def test_a_task_that_expires_unclaimed_before_its_run_time_is_refused_at_enqueue(
    conn: psycopg.Connection[Any],
):
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.enqueue(conn, "notify", {}, delay=60, expires_in=30)
    assert caught.value.field == "expires_in"
    assert count_tasks(conn) == 0


def test_bulk_enqueue_stores_the_expiry_on_both_paths(conn: psycopg.Connection[Any]):
    when = datetime.now(UTC) + timedelta(hours=1)
    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "notify", "expires_in": 60},
            {"type": "notify", "expires_at": when},
            {"type": "notify", "expires_in": 60, "idempotency_key": "k1"},
            {"type": "notify", "expires_at": when, "idempotency_key": "k2"},
            {"type": "notify"},
        ],
        now=T0,
    )
    stored = [pgqueue.get_task(conn, r.id).expires_at for r in results]
    assert stored == [at(60), when, at(60), when, None]
    assert [r.task.expires_at for r in results] == stored


# --- bad input, at every boundary ------------------------------------------------------------

FUTURE = "2099-01-01T00:00:00+00:00"
PAST = "2001-01-01T00:00:00+00:00"

# (library options, CLI arguments, HTTP body fields, the field each names)
BAD = [
    ({"expires_in": 0}, ["--expires-in", "0"], {"expires_in": 0}, "expires_in"),
    ({"expires_in": -5}, ["--expires-in", "-5"], {"expires_in": -5}, "expires_in"),
    ({"expires_in": float("nan")}, ["--expires-in", "nan"], None, "expires_in"),
    ({"expires_in": float("inf")}, ["--expires-in", "inf"], None, "expires_in"),
    (
        {"expires_in": 10, "expires_at": datetime(2099, 1, 1, tzinfo=UTC)},
        ["--expires-in", "10", "--expires-at", FUTURE],
        {"expires_in": 10, "expires_at": FUTURE},
        "expires_at",
    ),
    (
        {"expires_at": datetime(2001, 1, 1, tzinfo=UTC)},
        ["--expires-at", PAST],
        {"expires_at": PAST},
        "expires_at",
    ),
    (
        {
            "expires_at": datetime(2098, 1, 1, tzinfo=UTC),
            "run_at": datetime(2099, 1, 1, tzinfo=UTC),
        },
        ["--expires-at", "2098-01-01T00:00:00Z", "--run-at", FUTURE],
        {"expires_at": "2098-01-01T00:00:00Z", "run_at": FUTURE},
        "expires_at",
    ),
    (
        {"expires_in": 10, "delay": 20},
        ["--expires-in", "10", "--delay", "20"],
        {"expires_in": 10, "delay_seconds": 20},
        "expires_in",
    ),
    (
        {"expires_at": datetime(2099, 1, 1)},
        ["--expires-at", "2099-01-01T00:00:00"],
        None,
        "expires_at",
    ),
]


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


@pytest.mark.parametrize("options", [b[0] for b in BAD], ids=[str(i) for i in range(len(BAD))])
def test_bad_expiry_is_refused_by_the_library_naming_the_field(
    conn: psycopg.Connection[Any], options: dict[str, Any]
):
    field = next(b[3] for b in BAD if b[0] is options)
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.enqueue(conn, "notify", {}, **options)
    assert caught.value.field == field
    assert count_tasks(conn) == 0


@pytest.mark.parametrize("args", [b[1] for b in BAD], ids=[str(i) for i in range(len(BAD))])
def test_bad_expiry_is_refused_by_the_cli_naming_the_field(
    database_url: str, conn: psycopg.Connection[Any], args: list[str]
):
    field = next(b[3] for b in BAD if b[1] is args)
    out = run_main(database_url, "--json", "enqueue", "notify", *args)
    assert out.code == 2, (out.stdout, out.stderr)
    error = json.loads(out.stderr.splitlines()[-1])
    assert error["field"] in (field, "--" + field.replace("_", "-")), error
    assert count_tasks(conn) == 0


HTTP_BAD = [b for b in BAD if b[2] is not None]


@pytest.mark.parametrize(
    "body", [b[2] for b in HTTP_BAD], ids=[str(i) for i in range(len(HTTP_BAD))]
)
def test_bad_expiry_is_refused_by_the_http_api_naming_the_field(
    api: Api, conn: psycopg.Connection[Any], body: dict[str, Any]
):
    field = next(b[3] for b in HTTP_BAD if b[2] is body)
    response = api.request("POST", "/api/v1/tasks", json={"type": "notify", **body})
    assert response.status_code in (400, 422), response.text
    assert field in response.text
    assert count_tasks(conn) == 0


def test_the_expiry_is_accepted_and_shown_at_every_boundary(
    database_url: str, conn: psycopg.Connection[Any], api: Api
):
    out = run_main(database_url, "--json", "enqueue", "notify", "--expires-in", "600")
    assert out.code == 0, out.stderr
    by_cli = json.loads(out.stdout)
    assert by_cli["expires_at"] is not None

    response = api.request("POST", "/api/v1/tasks", json={"type": "notify", "expires_in": 600})
    assert response.status_code == 202, response.text
    by_http = response.json()
    assert by_http["expires_at"] is not None
    assert api.request("GET", f"/api/v1/tasks/{by_http['task_id']}").json()["expires_at"]

    shown = run_main(database_url, "status", by_cli["task_id"])
    assert "expires" in shown.stdout


# --- through a real worker -------------------------------------------------------------------


def test_a_worker_never_runs_an_expired_task_and_maintenance_cancels_it(
    database_url: str, conn: psycopg.Connection[Any]
):
    registry = pgqueue.TaskRegistry()
    ran: list[str] = []

    @registry.handler("notify")
    def notify(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        ran.append(payload["name"])

    # Expired on the server's clock before any worker starts (now= moves the insert back).
    past = datetime.now(UTC) - timedelta(minutes=5)
    expired = pgqueue.enqueue(conn, "notify", {"name": "expired"}, expires_in=60, now=past).id
    fresh = pgqueue.enqueue(conn, "notify", {"name": "fresh"}, expires_in=3600).id

    def settled() -> bool:
        return all(pgqueue.get_task(conn, t).status.is_final for t in (expired, fresh))

    run_worker_until(database_url, registry, settled)
    assert ran == ["fresh"]
    task = pgqueue.get_task(conn, expired)
    assert (task.status, task.last_error) == (pgqueue.TaskStatus.CANCELLED, "expired")
    assert pgqueue.get_task(conn, fresh).status is pgqueue.TaskStatus.COMPLETED
    row = conn.execute("SELECT status FROM pgqueue.queue_depth WHERE status = 'queued'").fetchall()
    assert row == []
