"""The API the dashboard reads, and how the dashboard itself is served.

Real PostgreSQL (a fresh migrated database per test) and the real application, run in this
process by ``boundaries.Api``. Tasks are finished through the library with its ``now=`` clock,
so the per-minute series is checked against minutes the test chose, not against the wall
clock's luck. The browser side is tests/browser/test_dashboard.py.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psycopg
import pytest
from boundaries import Api
from helpers import make_dead_letters

import pgqueue
from pgqueue.api import ApiSettings

TOKEN = "dash-token-5b2d9e-0f1e2d3c4b5a69788796"
DASHBOARD = Path(pgqueue.__file__).parent / "dashboard"


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


@pytest.fixture
def authed_api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url, tokens=frozenset({TOKEN})))
    yield server
    server.close()


def finish(
    conn: psycopg.Connection[Any],
    queue: str,
    count: int,
    *,
    at: datetime,
    outcome: str = "completed",
    type: str = "job",
) -> list[uuid.UUID]:
    """``count`` tasks of ``queue`` finished at ``at``: completed, or dead-lettered (one attempt
    allowed, failed)."""
    created = pgqueue.enqueue_many(
        conn, [{"type": type, "queue": queue, "max_attempts": 1} for _ in range(count)]
    )
    with conn.transaction():
        claimed = pgqueue.claim(conn, [queue], limit=count, worker_id="test")
        assert len(claimed) == count
        for task in claimed:
            if outcome == "completed":
                pgqueue.complete(conn, task.lease, {"ok": True}, now=at)
            else:
                pgqueue.fail(conn, task.lease, f"ValueError: failed at {at:%H:%M}", now=at)
    return [r.id for r in created]


def minute_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def points_by_minute(body: dict[str, Any]) -> dict[datetime, tuple[int, int]]:
    return {
        minute_of(datetime.fromisoformat(p["minute"])): (p["completed"], p["failed"])
        for p in body["points"]
    }


# --- the throughput series ---------------------------------------------------------------------


def test_series_counts_completed_and_dead_lettered_tasks_in_their_minutes(api, conn):
    now = datetime.now(UTC)
    thirty_ago, five_ago = now - timedelta(minutes=30), now - timedelta(minutes=5)
    finish(conn, "mail", 3, at=thirty_ago)
    finish(conn, "mail", 2, at=five_ago, outcome="dead")
    finish(conn, "sms", 4, at=five_ago)
    finish(conn, "mail", 7, at=now - timedelta(hours=2))  # outside the hour
    cancelled = pgqueue.enqueue(conn, "job", queue="mail")
    pgqueue.cancel(conn, cancelled.id)  # finished, but neither completed nor failed

    response = api.request("GET", "/api/v1/throughput/series", params={"minutes": 60})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["minutes"] == 60 and body["queue"] is None
    minutes = [datetime.fromisoformat(p["minute"]) for p in body["points"]]
    assert len(minutes) == 60
    # Every minute, oldest first, one apart, the last being the current minute.
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(minutes))
    assert minute_of(minutes[-1]) >= minute_of(now)
    by_minute = points_by_minute(body)
    assert by_minute[minute_of(thirty_ago)] == (3, 0)
    assert by_minute[minute_of(five_ago)] == (4, 2)
    assert sum(c for c, _ in by_minute.values()) == 7
    assert sum(f for _, f in by_minute.values()) == 2


def test_series_of_one_queue_counts_only_that_queue(api, conn):
    five_ago = datetime.now(UTC) - timedelta(minutes=5)
    finish(conn, "mail", 2, at=five_ago)
    finish(conn, "mail", 1, at=five_ago, outcome="dead")
    finish(conn, "sms", 4, at=five_ago)

    body = api.request(
        "GET", "/api/v1/throughput/series", params={"minutes": 10, "queue": "mail"}
    ).json()

    assert body["queue"] == "mail" and len(body["points"]) == 10
    assert points_by_minute(body)[minute_of(five_ago)] == (2, 1)
    assert sum(p["completed"] for p in body["points"]) == 2


def test_series_of_a_day_has_1440_points_and_an_empty_database_gives_zeros(api):
    body = api.request("GET", "/api/v1/throughput/series", params={"minutes": 1440}).json()

    assert len(body["points"]) == 1440
    assert {(p["completed"], p["failed"]) for p in body["points"]} == {(0, 0)}


def test_series_defaults_to_the_last_hour(api):
    body = api.request("GET", "/api/v1/throughput/series").json()

    assert body["minutes"] == 60 and len(body["points"]) == 60


@pytest.mark.parametrize(
    "params",
    [
        {"minutes": 0},
        {"minutes": 1441},
        {"minutes": -5},
        {"minutes": "an hour"},
        {"minutes": 1.5},
        {"queue": ""},
        {"queue": "q\u0000"},
        {"queue": "x" * 201},
    ],
    ids=["zero", "over-a-day", "negative", "text", "fraction", "empty-queue", "nul", "long"],
)
def test_series_with_bad_parameters_is_422_naming_the_field(api, params):
    response = api.request("GET", "/api/v1/throughput/series", params=params)

    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == next(iter(params))


# --- recent failures ---------------------------------------------------------------------------


def retrying(
    conn: psycopg.Connection[Any], queue: str, error: str, *, retry_after: float
) -> uuid.UUID:
    """A task that failed its first attempt and waits ``retry_after`` seconds for the next."""
    task = pgqueue.enqueue(conn, "webhook.deliver", {"url": "https://example.com"}, queue=queue)
    with conn.transaction():
        (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="host:1")
        pgqueue.fail(conn, claimed.lease, error, retry_after=retry_after)
    return task.id


def test_failures_lists_retrying_tasks_and_dead_letters_with_their_errors(api, conn):
    soon = retrying(conn, "hooks", "ConnectionError: refused", retry_after=60)
    later = retrying(conn, "hooks", "TimeoutError: 10 s", retry_after=3600)
    (dead,) = make_dead_letters(
        conn, 1, type="payment.capture", queue="payments", error="CardDeclined: 4242"
    )
    pgqueue.enqueue(conn, "never-tried", queue="hooks")  # queued, no attempt: not a failure
    finish(conn, "hooks", 2, at=datetime.now(UTC))  # completed: not a failure

    response = api.request("GET", "/api/v1/failures")

    assert response.status_code == 200, response.text
    body = response.json()
    # Retrying: the latest next attempt first.
    assert [f["task_id"] for f in body["retrying"]] == [str(later), str(soon)]
    first = body["retrying"][0]
    assert first["last_error"] == "TimeoutError: 10 s"
    assert (first["type"], first["queue"], first["priority"]) == (
        "webhook.deliver",
        "hooks",
        "normal",
    )
    assert (first["attempts"], first["max_attempts"]) == (1, 3)
    assert first["retry_at"] is not None and first["finished_at"] is None
    assert first["started_at"] is not None
    retry_in = datetime.fromisoformat(first["retry_at"]) - datetime.now(UTC)
    assert timedelta(minutes=55) < retry_in <= timedelta(hours=1)
    # Dead letters.
    assert [f["task_id"] for f in body["dead"]] == [str(dead)]
    (letter,) = body["dead"]
    assert letter["last_error"] == "CardDeclined: 4242"
    assert (letter["type"], letter["queue"], letter["attempts"]) == (
        "payment.capture",
        "payments",
        1,
    )
    assert letter["finished_at"] is not None and letter["retry_at"] is None


def test_failures_lists_the_newest_dead_letters_across_queues_up_to_the_limit(api, conn):
    base = datetime.now(UTC) - timedelta(minutes=30)
    ids = []
    for i, queue in enumerate(["a", "b", "c", "a", "b", "c"]):
        ids += finish(conn, queue, 1, at=base + timedelta(minutes=i), outcome="dead")
    retrying(conn, "hooks", "one", retry_after=60)
    retrying(conn, "hooks", "two", retry_after=120)
    retrying(conn, "hooks", "three", retry_after=180)

    body = api.request("GET", "/api/v1/failures", params={"limit": 2}).json()

    # The limit applies to each list; dead letters newest first whatever their queue.
    assert [f["task_id"] for f in body["dead"]] == [str(ids[5]), str(ids[4])]
    assert [f["last_error"] for f in body["retrying"]] == ["three", "two"]


def test_a_replayed_dead_letter_leaves_the_failures(api, conn):
    (dead,) = make_dead_letters(conn, 1)
    assert [f["task_id"] for f in api.request("GET", "/api/v1/failures").json()["dead"]] == [
        str(dead)
    ]

    assert api.request("POST", f"/api/v1/dead-letters/{dead}/replay").status_code == 200

    body = api.request("GET", "/api/v1/failures").json()
    assert body == {"retrying": [], "dead": []}  # replayed: queued with attempts back at 0


@pytest.mark.parametrize("limit", [0, 501, -1, "ten"])
def test_failures_with_a_bad_limit_is_422(api, limit):
    response = api.request("GET", "/api/v1/failures", params={"limit": limit})

    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "limit"


# --- running tasks: worker and lease -------------------------------------------------------------


def test_running_tasks_show_the_worker_holding_the_lease_and_its_expiry(api, conn):
    task = pgqueue.enqueue(conn, "video.transcode", queue="media")
    done = pgqueue.enqueue(conn, "video.transcode", queue="media-done")
    with conn.transaction():
        (claimed,) = pgqueue.claim(
            conn, ["media"], limit=1, worker_id="web-7:4242", lease_seconds=600
        )
        (other,) = pgqueue.claim(conn, ["media-done"], limit=1, worker_id="web-8:1")
        pgqueue.complete(conn, other.lease)

    listed = api.request("GET", "/api/v1/tasks", params={"status": "running"}).json()["items"]
    one = api.request("GET", f"/api/v1/tasks/{task.id}").json()
    finished = api.request("GET", f"/api/v1/tasks/{done.id}").json()

    assert [t["task_id"] for t in listed] == [str(task.id)]
    for shown in (listed[0], one):
        assert shown["worker"] == "web-7:4242"
        expires = datetime.fromisoformat(shown["lease_expires_at"])
        assert expires == claimed.lease_expires_at
        assert timedelta(minutes=9) < expires - datetime.now(UTC) <= timedelta(minutes=10)
    # A finished task holds no lease.
    assert finished["worker"] is None and finished["lease_expires_at"] is None


# --- serving the dashboard ---------------------------------------------------------------------

DASHBOARD_TYPES = {
    "/dashboard/": "text/html",
    "/dashboard/app.js": "text/javascript",
    "/dashboard/style.css": "text/css",
    "/dashboard/icon.svg": "image/svg+xml",
}


def test_the_dashboard_files_need_no_token_and_carry_a_strict_content_security_policy(
    authed_api,
):
    for path, media_type in DASHBOARD_TYPES.items():
        response = authed_api.request("GET", path)

        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"].startswith(media_type), path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy, path
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
        assert "frame-ancestors 'none'" in policy, path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert TOKEN not in response.text


def test_the_dashboard_data_needs_the_token(authed_api):
    for path in ("/api/v1/stats", "/api/v1/failures", "/api/v1/throughput/series"):
        assert authed_api.request("GET", path).status_code == 401, path
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert authed_api.request("GET", path, headers=auth).status_code == 200, path


def test_dashboard_without_a_slash_redirects_relatively_so_it_works_under_a_mount(authed_api):
    response = authed_api.request("GET", "/dashboard")

    assert response.status_code == 307
    assert response.headers["location"] == "dashboard/"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/dashboard/nothing.js", 404),
        ("/dashboard/index.html", 404),
        # No route has this path (a name holds no "/"): it needs a token, as any unknown path.
        ("/dashboard/..%2fapi%2fv1%2fstats", 401),
    ],
)
def test_only_the_dashboard_files_are_served_without_a_token(authed_api, path, code):
    response = authed_api.request("GET", path)

    assert response.status_code == code, response.text
    assert "depth" not in response.text


def test_the_dashboard_is_not_in_the_openapi_document(api):
    paths = api.request("GET", "/openapi.json").json()["paths"]

    assert not [p for p in paths if p.startswith("/dashboard")]


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script":
            self.scripts.append(named)
        self.inline += [f"{tag} {k}" for k in named if k.startswith("on") or k == "style"]


def test_the_page_has_no_inline_script_or_style_and_the_script_never_parses_markup():
    """The CSP forbids inline code; this keeps the files honest about it, and keeps the script
    off the APIs that turn strings into markup or code (payloads and errors are user data)."""
    markup = _Markup()
    markup.feed((DASHBOARD / "index.html").read_text(encoding="utf-8"))
    assert markup.scripts == [{"src": "app.js", "defer": None}]
    assert markup.inline == []
    assert "<style" not in (DASHBOARD / "index.html").read_text(encoding="utf-8")

    script = (DASHBOARD / "app.js").read_text(encoding="utf-8")
    code = re.sub(r"^\s*//.*$", "", script, flags=re.M)  # comments may name them
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "setAttribute(\"style\""):  # fmt: skip
        assert sink not in code, sink
    # Nothing is loaded from elsewhere (no CDN); the one URL is SVG's namespace name.
    assert re.findall(r"https?://[^\s\"'`]+", code) == ["http://www.w3.org/2000/svg"]


def test_the_dashboard_is_served_without_a_token_under_a_mount_prefix(database_url):
    """Mounted at /queue, the page is /queue/dashboard/ and its relative links (app.js,
    ../api/v1/...) resolve under the prefix; the API there still wants the token."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from pgqueue.api import create_app

    outer = Starlette(
        routes=[Mount("/queue", create_app(ApiSettings(database_url, frozenset({TOKEN}))))]
    )

    async def fetch() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return [
                await client.get("/queue/dashboard"),
                await client.get("/queue/dashboard/"),
                await client.get("/queue/dashboard/app.js"),
                await client.get("/queue/api/v1/failures"),
            ]

    redirect, page, script, data = asyncio.run(fetch())

    assert redirect.status_code == 307 and redirect.headers["location"] == "dashboard/"
    assert page.status_code == 200 and '<script src="app.js" defer>' in page.text
    assert script.status_code == 200 and 'new URL("../api/v1/", document.baseURI)' in script.text
    assert data.status_code == 401


def test_the_library_gives_the_same_series_and_failures_sync_and_on_the_client(database_url, conn):
    make_dead_letters(conn, 2, queue="payments")
    series = pgqueue.throughput_series(conn, minutes=5)
    assert len(series) == 5 and sum(p.failed for p in series) == 2
    failures = pgqueue.recent_failures(conn, limit=1)
    with pgqueue.Client(database_url) as client:
        assert client.recent_failures(limit=1) == failures
        assert [p.failed for p in client.throughput_series(minutes=5)] == [p.failed for p in series]
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.throughput_series(conn, minutes=1441)


class _StatusOptions(HTMLParser):
    """The values of the task list's status filter (<select name="status">)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.values: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "select":
            self.inside = named.get("name") == "status"
        elif tag == "option" and self.inside:
            self.values.append(named.get("value") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.inside = False


def test_the_task_lists_status_filter_offers_every_status_and_the_api_lists_each(api, conn):
    """Waiting tasks included: each option of the served page's filter is a status
    the API's task list accepts, and it lists exactly the tasks in that status."""
    parent = pgqueue.enqueue(conn, "p", {}).id
    waiting = pgqueue.enqueue(conn, "c", {}, depends_on=[parent]).id
    page = api.request("GET", "/dashboard/")
    assert page.status_code == 200
    options = _StatusOptions()
    options.feed(page.text)
    assert options.values[0] == ""  # any
    assert sorted(options.values[1:]) == sorted(s.value for s in pgqueue.TaskStatus)
    expected = {"waiting": {waiting}, "queued": {parent}}
    for status in options.values[1:]:
        response = api.request("GET", "/api/v1/tasks", params={"status": status})
        assert response.status_code == 200, (status, response.text)
        listed = {uuid.UUID(t["task_id"]) for t in response.json()["items"]}
        assert listed == expected.get(status, set()), status
