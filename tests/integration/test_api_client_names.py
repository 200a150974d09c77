"""Names and keys that come from the client, through a real server: every queue or type name
the API accepts can be addressed in a URL, an ``Idempotency-Key`` header is the UTF-8 its
client sent, and the names a client makes up cannot grow ``/metrics`` without bound.

Every test talks HTTP to a real uvicorn server (a thread of this process, on a port the OS
picks) over real PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_http_edges import Served

import pgqueue
from pgqueue.api import ApiSettings, create_app
from pgqueue.api.metrics import MAX_SUBMITTED_QUEUES, OTHER_QUEUES

TOKEN = "tok-names-8c2a-0123456789abcdef0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Names a client may submit to that a path cannot hold as they are.
NAMES = [
    "a/b",
    "a/pause",
    "x/resume",
    "q/retention",
    "/leading/and/trailing/",
    "100%",
    "%2F",
    "with space",
    "two\nlines",
    "..",
    ".",
    "a/../b",
    "ünï/名前 ✓",
]


@pytest.fixture(scope="module")
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    name = f"pgqueue_names_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def api(db_url: str) -> Iterator[Served]:
    served = Served(create_app(ApiSettings(database_url=db_url, tokens=frozenset({TOKEN}))))
    served.client.headers.update(AUTH)
    try:
        yield served
    finally:
        served.close()


def segment(name: str) -> str:
    """``name`` as one path segment: percent-encoded (encodeURIComponent's rule), and a name
    that is only dots with them encoded too, since clients remove "." and ".." segments."""
    encoded = quote(name, safe="")
    return encoded.replace(".", "%2E") if set(encoded) == {"."} else encoded


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, (response.request.url, response.text[:500])
    return response.json()


# --- names in paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_queue_and_type_route_addresses_a_name_a_path_cannot_hold_as_it_is(
    name: str, api: Served, db_url: str
) -> None:
    http = api.client
    assert http.post("/api/v1/tasks", json={"type": name, "queue": name}).status_code == 202
    queue = f"/api/v1/queues/{segment(name)}"

    paused = ok(http.post(f"{queue}/pause"))
    with psycopg.connect(db_url) as conn:
        assert {q.name: q.paused for q in pgqueue.list_queues(conn)}[name] is True
    resumed = ok(http.post(f"{queue}/resume"))
    kept = ok(http.put(f"{queue}/retention", json={"completed_seconds": 3600}))
    listed = {q["name"]: q for q in ok(http.get("/api/v1/queues"))}
    limits = {
        kind: ok(http.put(f"/api/v1/limits/{kind}/{segment(name)}", json={"max_running": 3}))
        for kind in ("queue", "type")
    }
    all_limits = {(x["kind"], x["name"]) for x in ok(http.get("/api/v1/limits"))}
    cleared = [ok(http.delete(f"/api/v1/limits/{kind}/{segment(name)}")) for kind in limits]
    removed = ok(http.delete(queue))

    assert (paused["name"], paused["paused"]) == (name, True)
    assert (resumed["name"], resumed["paused"]) == (name, False)
    assert (kept["name"], kept["completed_retention"]) == (name, 3600)
    assert listed[name]["completed_retention"] == 3600
    assert [(x["kind"], x["name"]) for x in limits.values()] == [("queue", name), ("type", name)]
    assert {("queue", name), ("type", name)} <= all_limits
    assert [(x["kind"], x["name"], x["removed"]) for x in cleared] == [
        ("queue", name, True),
        ("type", name, True),
    ]
    assert (removed["name"], removed["removed"]) == (name, True)
    with psycopg.connect(db_url) as conn:
        assert all(x.name != name for x in pgqueue.list_limits(conn))


def test_a_queue_named_like_another_queues_action_is_told_apart_from_it(api: Served) -> None:
    http = api.client
    for queue in ("a", "a/pause"):
        assert http.post("/api/v1/tasks", json={"type": "t", "queue": queue}).status_code == 202

    paused = ok(http.post("/api/v1/queues/a%2Fpause/pause"))
    states = {q["name"]: q["paused"] for q in ok(http.get("/api/v1/queues"))}
    removed = ok(http.delete("/api/v1/queues/a/pause"))  # DELETE: the queue "a/pause"

    assert paused["name"] == "a/pause"
    assert (states["a"], states["a/pause"]) == (False, True)
    assert removed == {"name": "a/pause", "removed": True}


def test_an_empty_name_in_the_path_is_refused_naming_the_field(api: Served) -> None:
    response = api.client.post("/api/v1/queues//pause")

    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "queue"


# --- the Idempotency-Key header ------------------------------------------------------------------

KEY = "заказ-42 ünï 名前 ✓"


def test_a_non_ascii_idempotency_key_in_the_header_is_the_key_of_the_body(
    api: Served, db_url: str
) -> None:
    http = api.client
    by_header = http.post(
        "/api/v1/tasks", json={"type": "keyed"}, headers={"Idempotency-Key": KEY.encode()}
    )
    by_body = http.post("/api/v1/tasks", json={"type": "keyed", "idempotency_key": KEY})
    both = http.post(
        "/api/v1/tasks",
        json={"type": "keyed", "idempotency_key": KEY},
        headers={"Idempotency-Key": KEY.encode()},
    )

    assert by_header.status_code == 202, by_header.text
    assert (by_body.status_code, both.status_code) == (200, 200), (by_body.text, both.text)
    task_id = by_header.json()["task_id"]
    assert by_body.json()["task_id"] == both.json()["task_id"] == task_id
    with psycopg.connect(db_url) as conn:
        assert pgqueue.get_task(conn, task_id).idempotency_key == KEY


def test_an_idempotency_key_header_that_is_not_utf8_is_422_naming_the_header(
    api: Served,
) -> None:
    response = api.client.post(
        "/api/v1/tasks", json={"type": "keyed"}, headers={"Idempotency-Key": b"caf\xe9"}
    )

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["errors"] == [
        {"field": "Idempotency-Key", "message": "is not valid UTF-8: send the key as UTF-8"}
    ]


def test_an_idempotency_key_header_is_limited_in_characters_not_bytes(api: Served) -> None:
    longest = "名" * 500  # 1,500 bytes: as long as a key may be
    accepted = api.client.post(
        "/api/v1/tasks", json={"type": "keyed"}, headers={"Idempotency-Key": longest.encode()}
    )
    refused = api.client.post(
        "/api/v1/tasks",
        json={"type": "keyed"},
        headers={"Idempotency-Key": (longest + "名").encode()},
    )

    assert accepted.status_code == 202, accepted.text
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == (
        "Idempotency-Key"
    )


# --- /metrics ------------------------------------------------------------------------------------


def samples(http: httpx.Client, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = http.get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_submissions_to_made_up_queues_add_a_bounded_number_of_series_that_still_add_up(
    api: Served, db_url: str
) -> None:
    http = api.client
    prefix = f"made-up-{uuid.uuid4().hex[:6]}-"
    queues = [f"{prefix}{i}" for i in range(MAX_SUBMITTED_QUEUES + 50)]
    for queue in queues:
        assert http.post("/api/v1/tasks", json={"type": "t", "queue": queue}).status_code == 202
    replayed = http.post(
        "/api/v1/tasks", json={"type": "t", "queue": queues[-1], "idempotency_key": "k"}
    )
    assert replayed.status_code == 202
    assert (
        http.post(
            "/api/v1/tasks", json={"type": "t", "queue": queues[-1], "idempotency_key": "k"}
        ).status_code
        == 200
    )

    submitted = samples(http, "pgqueue_api_tasks_submitted_total")

    by_queue: dict[str, float] = {}
    for labels, value in submitted.items():
        by_queue[dict(labels)["queue"]] = by_queue.get(dict(labels)["queue"], 0) + value
    assert len(by_queue) <= MAX_SUBMITTED_QUEUES + 1
    assert len(submitted) <= 3 * (MAX_SUBMITTED_QUEUES + 1)
    assert sum(by_queue.values()) == len(queues) + 2
    assert by_queue[OTHER_QUEUES] >= 50 + 2
    assert by_queue[queues[0]] == 1  # the first names keep their own series
    # The gauges read from the database follow it: a queue gone is a series gone.
    depth = samples(http, "pgqueue_queue_depth")
    assert any(dict(labels)["queue"] == queues[0] for labels in depth)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM pgqueue.tasks WHERE queue LIKE %s", (prefix + "%",))
    for gauge in ("pgqueue_queue_depth", "pgqueue_queue_ready", "pgqueue_queue_paused"):
        left = [labels for labels in samples(http, gauge) if dict(labels)["queue"] in queues]
        assert left == [], (gauge, left[:3])
