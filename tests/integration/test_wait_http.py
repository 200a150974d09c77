"""GET /api/v1/tasks/{id}?wait=SECONDS, against a real server (uvicorn) and
PostgreSQL.

The apps here poll once an hour (``wait_poll_seconds``) unless a test says otherwise: an
answer that comes before its ``wait`` is up was sent on the notification (a wait that reaches
its end reads the task once more, so only the time tells the two apart: ``Get.join`` checks
it, the wait being a minute).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from processes import wait_until
from test_api import Live, halt, launch

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.api.waiters import APPLICATION_NAME

NO_POLL = 3600.0


def waiters(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.task_waiters").fetchone()
    assert row is not None
    return int(row[0])


def backends(conn: psycopg.Connection[Any], application_name: str | None = None) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
        " AND (%(name)s::text IS NULL OR application_name = %(name)s)",
        {"name": application_name},
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def start_server() -> Iterator[Callable[[ApiSettings], Live]]:
    """Start servers for one test (test_api's launch); all are stopped at its teardown."""
    started: list[Live] = []

    def _start(settings: ApiSettings) -> Live:
        started.append(launch(settings))
        return started[-1]

    yield _start
    halt(started)


@pytest.fixture
def live(database_url: str, start_server: Callable[[ApiSettings], Live]) -> Live:
    return start_server(ApiSettings(database_url=database_url, wait_poll_seconds=NO_POLL))


class Get:
    """A GET in a thread (the test goes on while the request waits)."""

    def __init__(self, live: Live, path: str) -> None:
        self.response: httpx.Response | None = None
        self.elapsed = 0.0
        self._thread = threading.Thread(target=self._run, args=(live.base_url, path))
        self._thread.start()

    def _run(self, base_url: str, path: str) -> None:
        began = time.monotonic()
        with httpx.Client(base_url=base_url, timeout=120) as client:
            self.response = client.get(path)
        self.elapsed = time.monotonic() - began

    def join(self) -> httpx.Response:
        """The answer, which came before the wait (60 s) was up."""
        self._thread.join(120)
        assert self.response is not None, "no answer"
        assert self.elapsed < 60, f"answered only at the end of the wait ({self.elapsed} s)"
        return self.response


def test_wait_answers_as_soon_as_the_task_completes(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    get = Get(live, f"/api/v1/tasks/{task_id}?wait=60")
    wait_until(lambda: waiters(conn) == 1, 30, "the request to register")
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    pgqueue.complete(conn, claimed.lease, {"size": 3})
    response = get.join()
    assert response.status_code == 200, response.text
    assert response.headers["Pgqueue-Wait"] == "finished"
    body = response.json()
    assert (body["task_id"], body["status"], body["result"], body["attempts"]) == (
        str(task_id),
        "completed",
        {"size": 3},
        1,
    )
    wait_until(lambda: waiters(conn) == 0, 30, "the registration to go")


def test_wait_answers_with_the_dead_letter_and_the_cancelled_task(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    dead = pgqueue.enqueue(conn, "boom", {}, max_attempts=1).id
    cancelled = pgqueue.enqueue(conn, "resize", {}, queue="other").id
    gets = [Get(live, f"/api/v1/tasks/{t}?wait=60") for t in (dead, cancelled)]
    wait_until(lambda: waiters(conn) == 2, 30, "both requests to register")
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")
    pgqueue.cancel(conn, cancelled)
    assert [g.join().json()["status"] for g in gets] == ["failed", "cancelled"]


def test_a_wait_that_runs_out_answers_with_the_task_as_it_is(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    response = live.client.get(f"/api/v1/tasks/{task_id}", params={"wait": 0.3})
    assert response.status_code == 200
    assert response.headers["Pgqueue-Wait"] == "timeout"
    assert response.json()["status"] == "queued"
    assert waiters(conn) == 0
    # Without ?wait= the answer is as it always was, without the header.
    plain = live.client.get(f"/api/v1/tasks/{task_id}")
    assert plain.status_code == 200 and "Pgqueue-Wait" not in plain.headers


@pytest.mark.parametrize("bad", ["0", "-1", "60.5", "61", "abc", "nan", "inf", ""])
def test_a_wait_out_of_bounds_is_refused_naming_wait(
    live: Live, conn: psycopg.Connection[Any], bad: str
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    response = live.client.get(f"/api/v1/tasks/{task_id}?wait={bad}")
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid_request"
    assert [e["field"] for e in body["errors"]] == ["wait"]
    assert waiters(conn) == 0


def test_a_wait_for_an_unknown_task_is_404(live: Live, conn: psycopg.Connection[Any]) -> None:
    for task_id in (str(uuid.uuid4()), "not-a-uuid"):
        response = live.client.get(f"/api/v1/tasks/{task_id}?wait=5")
        assert response.status_code == 404, response.text
        assert task_id in response.json()["message"]
    assert waiters(conn) == 0


def test_many_waiters_on_one_app_share_one_listening_connection(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    count = 200
    ids = [r.id for r in pgqueue.enqueue_many(conn, [{"type": "t"} for _ in range(count)])]

    async def wait_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count + 10)
        async with httpx.AsyncClient(base_url=live.base_url, timeout=120, limits=limits) as client:
            return await asyncio.gather(
                *(client.get(f"/api/v1/tasks/{t}", params={"wait": 60}) for t in ids)
            )

    answers: list[list[httpx.Response]] = []
    began = time.monotonic()
    thread = threading.Thread(target=lambda: answers.append(asyncio.run(wait_all())))
    thread.start()
    wait_until(lambda: waiters(conn) == count, 60, f"{count} requests to register")
    # All of them wait on one LISTEN connection, with the pool (10) for their reads.
    assert backends(conn, APPLICATION_NAME) == 1
    assert backends(conn) <= 1 + ApiSettings().pool_size
    claimed = pgqueue.claim(conn, ["default"], limit=count, worker_id="test")
    pgqueue.complete_many(conn, [(c.lease, c.payload) for c in claimed])
    thread.join(120)
    assert time.monotonic() - began < 60, "answered only at the end of the wait"
    (responses,) = answers
    assert [r.status_code for r in responses] == [200] * count
    assert {r.json()["status"] for r in responses} == {"completed"}
    assert {r.headers["Pgqueue-Wait"] for r in responses} == {"finished"}


def test_waiters_beyond_the_limit_are_refused_with_503_and_retry_after(
    database_url: str, start_server: Callable[[ApiSettings], Live], conn: psycopg.Connection[Any]
) -> None:
    live = start_server(ApiSettings(database_url=database_url, max_waiters=2))
    ids = [pgqueue.enqueue(conn, "t", {}).id for _ in range(3)]
    gets = [Get(live, f"/api/v1/tasks/{t}?wait=60") for t in ids[:2]]
    wait_until(lambda: waiters(conn) == 2, 30, "two requests to register")
    refused = live.client.get(f"/api/v1/tasks/{ids[2]}?wait=60")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "too_many_waiters"
    assert refused.headers["Retry-After"] == "1"
    for task_id in ids[:2]:
        pgqueue.cancel(conn, task_id)
    assert [g.join().status_code for g in gets] == [200, 200]


def test_a_lost_listening_connection_reconnects_and_waits_still_end(
    live: Live, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "resize", {}).id
    get = Get(live, f"/api/v1/tasks/{task_id}?wait=60")
    wait_until(lambda: waiters(conn) == 1, 30, "the request to register")
    (old,) = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname ="
        " current_database()",
        (APPLICATION_NAME,),
    ).fetchall()
    conn.execute("SELECT pg_terminate_backend(%s)", old)
    wait_until(
        lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database() AND pid <> %s",
            (APPLICATION_NAME, old[0]),
        ).fetchone()[0],  # type: ignore[index]
        30,
        "the hub to reconnect",
    )
    pgqueue.cancel(conn, task_id)
    response = get.join()
    assert response.json()["status"] == "cancelled"
    assert response.headers["Pgqueue-Wait"] == "finished"
