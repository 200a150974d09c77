"""Who may reach the API: the Host allow-list against a real server (a page that rebinds its
own name to 127.0.0.1 sends its name as Host), and, without tokens, only requests from this
machine (checked at the ASGI level: a server on 127.0.0.1 cannot be reached from elsewhere,
so httpx's ASGI transport plays the remote peer)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from test_api import Live, halt, launch

import pgqueue
from pgqueue.api import ApiSettings, create_app

TOKEN = "hosts-token-0f1e2d3c4b5a69788796a5b4"
FORGED = "rebind.attacker.example"


@pytest.fixture
def start_server() -> Iterator[Callable[[ApiSettings], Live]]:
    started: list[Live] = []

    def _start(settings: ApiSettings) -> Live:
        started.append(launch(settings))
        return started[-1]

    yield _start
    halt(started)


def dead_letter(conn: psycopg.Connection[Any]) -> None:
    pgqueue.enqueue(conn, "doomed", {"secret": "payload"}, queue="dlq", max_attempts=1)
    (claimed,) = pgqueue.claim(conn, ["dlq"], limit=1, worker_id="test")
    pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")


def port_of(live: Live) -> int:
    return int(live.base_url.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    "browser", [{}, {"Sec-Fetch-Site": "same-origin"}], ids=["no-fetch-headers", "same-origin"]
)
def test_a_forged_host_is_refused_before_any_read_or_write_without_tokens(
    database_url: str,
    start_server: Callable[[ApiSettings], Live],
    conn: psycopg.Connection[Any],
    browser: dict[str, str],
) -> None:
    live = start_server(ApiSettings(database_url=database_url))
    dead_letter(conn)
    host = {"Host": f"{FORGED}:{port_of(live)}", **browser}
    origin = {"Origin": f"http://{FORGED}:{port_of(live)}"} if browser else {}

    answers = [
        live.client.get("/api/v1/tasks", headers=host),
        live.client.get("/dashboard/", headers=host),
        live.client.post("/api/v1/tasks", json={"type": "x"}, headers={**host, **origin}),
        live.client.post(
            "/api/v1/dead-letters/discard", json={"all": True}, headers={**host, **origin}
        ),
        live.client.delete(f"/api/v1/tasks/{pgqueue.list_tasks(conn)[0].id}", headers=host),
    ]

    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == "host_not_allowed"
        assert "PGQUEUE_API_ALLOWED_HOSTS" in answer.json()["message"]
        assert "payload" not in answer.text
    assert [t.type for t in pgqueue.list_tasks(conn)] == ["doomed"]
    assert pgqueue.count_dead_letters(conn) == 1


def test_loopback_hosts_with_and_without_port_and_ipv6_are_answered_without_tokens(
    database_url: str, start_server: Callable[[ApiSettings], Live]
) -> None:
    live = start_server(ApiSettings(database_url=database_url))
    port = port_of(live)
    for host in (
        "localhost",
        f"localhost:{port}",
        "127.0.0.1",
        f"127.0.0.1:{port}",
        "[::1]",
        f"[::1]:{port}",
        "127.1.2.3",
        "LOCALHOST",
    ):
        response = live.client.get("/api/v1/tasks", headers={"Host": host})
        assert response.status_code == 200, (host, response.text)


def test_a_configured_name_is_answered_and_the_others_are_not(
    database_url: str, start_server: Callable[[ApiSettings], Live]
) -> None:
    live = start_server(
        ApiSettings(database_url=database_url, allowed_hosts=frozenset({"Queue.Internal"}))
    )
    port = port_of(live)
    assert live.client.get("/api/v1/tasks", headers={"Host": f"queue.internal:{port}"}).is_success
    for host in (FORGED, f"127.0.0.1:{port}"):  # a list given replaces the loopback default
        refused = live.client.get("/api/v1/tasks", headers={"Host": host})
        assert refused.status_code == 400, refused.text


def test_probes_answer_whatever_the_host_as_a_kubelet_sends_the_pods_address(
    database_url: str, start_server: Callable[[ApiSettings], Live]
) -> None:
    live = start_server(
        ApiSettings(database_url=database_url, allowed_hosts=frozenset({"queue.internal"}))
    )
    for path in ("/healthz", "/readyz"):
        response = live.client.get(path, headers={"Host": "10.1.2.3:8000"})
        assert response.status_code == 200, response.text


def test_with_tokens_and_no_list_any_host_is_answered_given_the_token(
    database_url: str, start_server: Callable[[ApiSettings], Live]
) -> None:
    live = start_server(ApiSettings(database_url=database_url, tokens=frozenset({TOKEN})))
    forged = {"Host": FORGED}
    assert live.client.get("/api/v1/tasks", headers=forged).status_code == 401
    bearer = {**forged, "Authorization": f"Bearer {TOKEN}"}
    assert live.client.get("/api/v1/tasks", headers=bearer).status_code == 200


# --- without tokens: this machine only -------------------------------------------------------


def call(
    settings: ApiSettings, peer: tuple[str, int] | None, path: str, **headers: str
) -> httpx.Response:
    """One GET through the ASGI app with ``peer`` as the client's address (the lifespan is
    entered, so the app's pool is open)."""
    app = create_app(settings)

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=peer)  # type: ignore[arg-type]
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
        ):
            return await client.get(path, headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize("peer", [("203.0.113.7", 5000), ("10.0.0.9", 1), ("::ffff:10.0.0.9", 1)])
def test_without_tokens_a_request_from_another_machine_is_refused(
    database_url: str, peer: tuple[str, int]
) -> None:
    response = call(ApiSettings(database_url=database_url), peer, "/api/v1/tasks")

    assert response.status_code == 403, response.text
    assert response.json()["error"] == "unauthenticated_remote"
    assert "PGQUEUE_API_TOKENS" in response.json()["message"]
    assert "PGQUEUE_API_ALLOW_UNAUTHENTICATED" in response.json()["message"]


def test_without_tokens_a_request_a_local_proxy_forwarded_is_refused(database_url: str) -> None:
    settings = ApiSettings(database_url=database_url)
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
        response = call(settings, ("127.0.0.1", 5000), "/api/v1/tasks", **{header: "203.0.113.7"})
        assert response.status_code == 403, (header, response.text)


@pytest.mark.parametrize(
    "peer", [("127.0.0.1", 5000), ("::1", 5000), ("::ffff:127.0.0.1", 1), None]
)
def test_without_tokens_a_request_from_this_machine_or_a_unix_socket_is_answered(
    database_url: str, peer: tuple[str, int] | None
) -> None:
    response = call(ApiSettings(database_url=database_url), peer, "/api/v1/tasks")
    assert response.status_code == 200, response.text


def test_allow_unauthenticated_answers_other_machines_and_probes_always_answer(
    database_url: str,
) -> None:
    remote = ("203.0.113.7", 5000)
    allowed = ApiSettings(database_url=database_url, allow_unauthenticated=True)
    assert call(allowed, remote, "/api/v1/tasks").status_code == 200
    assert call(ApiSettings(database_url=database_url), remote, "/healthz").status_code == 200
