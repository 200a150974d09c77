"""The HTTP API's edges: the body limit against the payload limit, the
submit answer and its Location, Content-Type, what /healthz says about the schema, the route
labels in /metrics, and over-limit uploads that must end in the 413, never a reset.

Every test talks HTTP to a real uvicorn server (a thread of this process, on a port the OS
picks) over real PostgreSQL; waits poll a condition against a deadline.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import config, migrate
from pgqueue.api import ApiSettings, create_app

JSON = {"Content-Type": "application/json"}
TOKEN = "tok-edges-5e1d-7a9c0b2e4d6f8a1c3e5f"
BIG = 8 * 1024 * 1024  # an upload many times any limit here
ENVELOPE_BYTES = 64 * 1024  # what the body limit allows on top of the payload limit
ESCAPING_RATIO = 3  # the body limit holds three payloads: \u00e9 is 6 bytes for 2


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class Served:
    """An ASGI app under uvicorn in a thread, with an httpx client for it."""

    def __init__(self, app: Any, http: str = "auto", **options: Any) -> None:
        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=http, **options
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, name="edges-uvicorn", daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 30, "uvicorn")
        assert self.server.started, "the server did not start (see the captured log)"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base_url, timeout=30)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def _serve(app: Any, http: str = "auto", **options: Any) -> Served:
        started.append(Served(app, http, **options))
        return started[-1]

    yield _serve
    for s in started:
        s.close()


@pytest.fixture(scope="module")
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    name = f"pgqueue_edges_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits' defaults: neither variable set."""
    monkeypatch.delenv(config.ENV_MAX_PAYLOAD_BYTES, raising=False)
    monkeypatch.delenv("PGQUEUE_API_MAX_BODY_BYTES", raising=False)


def payload_of(size: int) -> dict[str, str]:
    """A payload of ``size`` bytes by the payload rule (the UTF-8 text jsonb gives back)."""
    payload = {"s": "x" * (size - len('{"s": ""}'))}
    assert len(json.dumps(payload).encode()) == size
    return payload


def body_with(payload: dict[str, Any], **envelope: Any) -> bytes:
    fields = {"type": "edge", "queue": "edges", "priority": "low", **envelope}
    fields["payload"] = payload
    return json.dumps(fields, separators=(",", ":")).encode()


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return str(body["message"])


# --- 1. the body limit is the payload limit plus the envelope ---------------------------------


def test_a_payload_of_exactly_the_payload_limit_is_accepted_over_http(default_env, db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    limit = config.DEFAULT_MAX_PAYLOAD_BYTES
    body = body_with(payload_of(limit), idempotency_key="k" * 200, max_attempts=5)
    assert len(body) > limit  # the envelope comes on top of the payload

    response = api.client.post("/api/v1/tasks", content=body, headers=JSON)

    assert response.status_code == 202, response.text[:500]
    stored = api.client.get(response.headers["Location"]).json()
    assert stored["payload"] == payload_of(limit)


def test_a_payload_one_byte_over_is_413_naming_the_payload_limit(default_env, db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    limit = config.DEFAULT_MAX_PAYLOAD_BYTES

    response = api.client.post(
        "/api/v1/tasks", content=body_with(payload_of(limit + 1)), headers=JSON
    )

    message = error_of(response, 413, "payload_too_large")
    assert f"{limit + 1} bytes" in message and f"{limit} bytes" in message
    assert "PGQUEUE_MAX_PAYLOAD_BYTES" in message
    assert response.json()["errors"][0]["field"] == "payload"


def test_a_body_over_the_payload_limit_plus_the_envelope_is_413_body_too_large(
    default_env, db_url, serve
):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    body_limit = ESCAPING_RATIO * config.DEFAULT_MAX_PAYLOAD_BYTES + ENVELOPE_BYTES
    assert ApiSettings().body_limit() == body_limit
    # Whitespace pads the body past the body limit; the payload alone would be allowed.
    body = body_with(payload_of(1000)) + b" " * (body_limit - 1000)

    response = api.client.post("/api/v1/tasks", content=body, headers=JSON)

    message = error_of(response, 413, "body_too_large")
    assert str(body_limit) in message and "PGQUEUE_API_MAX_BODY_BYTES" in message


def test_the_body_limit_follows_the_payload_limit(monkeypatch, db_url, serve):
    monkeypatch.delenv("PGQUEUE_API_MAX_BODY_BYTES", raising=False)
    monkeypatch.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(2 * 1024 * 1024))
    assert ApiSettings.from_env().body_limit() == 3 * 2 * 1024 * 1024 + ENVELOPE_BYTES
    api = serve(create_app(ApiSettings(database_url=db_url)))

    response = api.client.post(
        "/api/v1/tasks", content=body_with(payload_of(2 * 1024 * 1024)), headers=JSON
    )

    assert response.status_code == 202, response.text[:500]


# --- 2. the submit answer: small, with a Location ---------------------------------------------


def test_submit_answers_202_without_the_payload_and_with_a_location(db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    secret = {"card": "4111 1111 1111 1111", "blob": "y" * 5000}

    response = api.client.post("/api/v1/tasks", json={"type": "charge", "payload": secret})

    assert response.status_code == 202, response.text
    body = response.json()
    assert "payload" not in body and "4111" not in response.text
    assert body["status"] == "queued" and body["created_at"]
    task_id = uuid.UUID(body["task_id"])
    assert response.headers["Location"] == f"/api/v1/tasks/{task_id}"
    assert len(response.content) < 1000
    got = api.client.get(response.headers["Location"])
    assert got.status_code == 200 and got.json()["payload"] == secret


def test_an_idempotent_replay_has_the_location_of_the_original_task(db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    first = api.client.post("/api/v1/tasks", json={"type": "t", "idempotency_key": "loc-1"})
    again = api.client.post("/api/v1/tasks", json={"type": "t", "idempotency_key": "loc-1"})

    assert (first.status_code, again.status_code) == (202, 200)
    assert "payload" not in again.json()
    assert again.headers["Location"] == first.headers["Location"]


def test_the_location_carries_the_mount_prefix(db_url, serve):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/queue", create_app(ApiSettings(database_url=db_url)))])
    api = serve(outer)

    response = api.client.post("/queue/api/v1/tasks", json={"type": "mounted"})

    assert response.status_code == 202, response.text
    location = response.headers["Location"]
    assert location == f"/queue/api/v1/tasks/{response.json()['task_id']}"
    assert api.client.get(location).json()["type"] == "mounted"


@pytest.mark.parametrize("how", ["named", "wrapped"])
def test_the_location_carries_the_prefix_of_a_named_or_wrapped_mount(db_url, serve, how):
    """Starlette's url_for starts from the outermost router: a mount given a name
    (``app.mount("/queue", api, name="queue")``) or wrapped in an ASGI middleware of the
    host app (its own login) hides the API's routes from it. The submit must not fail."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    class Passthrough:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await self.app(scope, receive, send)

    api_app = create_app(ApiSettings(database_url=db_url))
    mount = (
        Mount("/queue", api_app, name="queue")
        if how == "named"
        else Mount("/queue", Passthrough(api_app))
    )
    outer = Starlette(routes=[mount])
    api = serve(outer)

    response = api.client.post("/queue/api/v1/tasks", json={"type": "mounted"})

    assert response.status_code == 202, response.text
    location = response.headers["Location"]
    assert location == f"/queue/api/v1/tasks/{response.json()['task_id']}"
    assert api.client.get(location).json()["type"] == "mounted"


# --- 3. Content-Type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_a_body_that_is_not_declared_json_is_415_naming_the_content_type(
    content_type, db_url, serve
):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    headers = {} if content_type is None else {"Content-Type": content_type}
    request = api.client.build_request(
        "POST", "/api/v1/tasks", content=b'{"type": "t"}', headers=headers
    )
    assert ("content-type" in request.headers) == (content_type is not None)

    response = api.client.send(request)

    message = error_of(response, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in message


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        'application/json; charset="utf-8"',
    ],
)
def test_json_with_or_without_a_charset_is_accepted(content_type, db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))

    response = api.client.post(
        "/api/v1/tasks", content=b'{"type": "t"}', headers={"Content-Type": content_type}
    )

    assert response.status_code == 202, response.text


def test_a_write_without_a_body_needs_no_content_type(db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))

    response = api.client.post("/api/v1/queues/ct-free/pause", params={"create": "true"})

    assert response.status_code == 200, response.text


def test_the_openapi_document_lists_415_exactly_where_a_body_is_taken():
    app = create_app(ApiSettings(database_url="postgresql://postgres@127.0.0.1:9/none"))
    document = app.openapi()
    with_body = without = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            documented = "415" in operation["responses"]
            assert documented == ("requestBody" in operation), (method, path)
            with_body += documented
            without += not documented
    assert with_body >= 5 and without >= 5
    described = document["paths"]["/api/v1/tasks"]["post"]["responses"]["415"]["description"]
    assert "Content-Type: application/json" in described


# --- 4. /healthz and the schema revision ------------------------------------------------------


def test_healthz_reports_the_revision_in_the_database_and_that_it_is_current(db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url)))

    body = api.client.get("/healthz").json()

    assert body == {
        "status": "ok",
        "database": "reachable",
        "schema_revision": migrate.head(),
        "expected_schema_revision": migrate.head(),
        "schema_current": True,
    }


@pytest.fixture
def old_schema_url(server_url: str, template_db: str) -> Iterator[str]:
    """A database whose pgqueue schema claims a revision this pgqueue does not expect."""
    name = f"pgqueue_edges_old_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.pgqueue_alembic_version SET version_num = '0000_old'")
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_healthz_says_when_the_schema_is_not_the_expected_one(
    old_schema_url, empty_database_url, serve
):
    old = serve(create_app(ApiSettings(database_url=old_schema_url)))
    empty = serve(create_app(ApiSettings(database_url=empty_database_url)))

    at_old, at_none = old.client.get("/healthz"), empty.client.get("/healthz")

    assert at_old.status_code == at_none.status_code == 200  # liveness, not readiness
    assert at_old.json()["schema_revision"] == "0000_old"
    assert at_old.json()["schema_current"] is False
    assert at_old.json()["expected_schema_revision"] == migrate.head()
    assert at_none.json()["schema_revision"] is None
    assert at_none.json()["schema_current"] is False
    assert at_none.json()["database"] == "reachable"


def test_healthz_stays_200_when_the_database_is_unreachable(serve):
    api = serve(create_app(ApiSettings(database_url="postgresql://postgres@127.0.0.1:1/x")))

    response = api.client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["database"] == "unreachable" and body["schema_revision"] is None
    assert body["schema_current"] is False


# --- 5. route labels in /metrics ---------------------------------------------------------------


def test_metrics_label_docs_and_dashboard_requests_by_route_and_unknown_paths_unmatched(
    db_url, serve
):
    api = serve(create_app(ApiSettings(database_url=db_url)))
    paths = ["/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/dashboard/"]
    for path in [*paths, "/dashboard/app.js", "/no/such/path", "/another-unknown"]:
        api.client.get(path)

    text = api.client.get("/metrics").text

    counted: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "pgqueue_api_requests_total":
                key = (s.labels["route"], s.labels["status"])
                counted[key] = counted.get(key, 0) + s.value
    for path in paths:
        assert counted.get((path, "200")) == 1, (path, counted)
    assert counted.get(("/dashboard/{name}", "200")) == 1, counted
    assert counted.get(("unmatched", "404")) == 2, counted


# --- 6. over-limit uploads end in the 413, not in a connection reset ---------------------------


def big_chunks() -> Iterator[bytes]:
    for _ in range(BIG // 65536):
        yield b"x" * 65536


@pytest.mark.parametrize("http", ["h11", "httptools"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_over_limit_upload_gets_the_413_not_a_connection_reset(http, framing, db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url, max_body_bytes=4096)), http=http)
    for attempt in range(3):  # the reset was intermittent: one lucky answer proves little
        content: bytes | Iterator[bytes] = (
            b"x" * BIG if framing == "content-length" else big_chunks()
        )
        try:
            response = api.client.post("/api/v1/tasks", content=content, headers=JSON)
        except httpx.TransportError as exc:
            pytest.fail(f"attempt {attempt}: {type(exc).__name__}: {exc}")
        assert ("content-length" in response.request.headers) == (framing == "content-length")
        error_of(response, 413, "body_too_large")


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_an_upload_refused_for_its_token_gets_the_401_not_a_reset(http, db_url, serve):
    settings = ApiSettings(database_url=db_url, tokens=frozenset({TOKEN}))
    api = serve(create_app(settings), http=http)
    for attempt in range(3):
        try:
            response = api.client.post("/api/v1/tasks", content=b"x" * BIG, headers=JSON)
        except httpx.TransportError as exc:
            pytest.fail(f"attempt {attempt}: {type(exc).__name__}: {exc}")
        error_of(response, 401, "unauthorized")


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_client_expecting_100_continue_gets_the_413_without_sending_the_body(http, db_url, serve):
    api = serve(create_app(ApiSettings(database_url=db_url, max_body_bytes=4096)), http=http)
    request = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {BIG}\r\n"
        "Expect: 100-continue\r\n\r\n"
    ).encode()
    with contextlib.closing(socket.create_connection(("127.0.0.1", api.port), 30)) as sock:
        sock.settimeout(30)
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed without answering: {received!r}"
            received += chunk
    status_line = received.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 413"), received[:300]


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response (its head and its Content-Length body); a reset fails the test."""
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed without answering: {received[:300]!r}"
            received += chunk
        head, body = received.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed in the middle of its answer: {received[:300]!r}"
            body += chunk
    except ConnectionResetError:
        pytest.fail(f"the connection was reset; received before: {received[:300]!r}")
    return head.lower(), body


def assert_closed_cleanly(sock: socket.socket) -> None:
    """The server ends the connection with a close (FIN), not a reset, and nothing more."""
    sock.settimeout(10)
    try:
        rest = sock.recv(65536)
    except ConnectionResetError:
        pytest.fail("the server reset the connection after its answer")
    except TimeoutError:
        pytest.fail("the server kept the refused request's connection open for 10 s")
    assert rest == b"", rest[:300]


@pytest.mark.parametrize("http", ["h11", "httptools"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_client_that_pauses_mid_upload_gets_the_413_and_a_clean_close(
    http, framing, db_url, serve
):
    """A client that writes its whole request before reading (as most do), pausing on the
    way for longer than the server's keep-alive timeout: the 413 reaches it, says
    ``Connection: close``, and the connection ends in a close once the upload is through,
    never in a reset under the upload (nor left open)."""
    app = create_app(ApiSettings(database_url=db_url, max_body_bytes=4096))
    api = serve(app, http=http, timeout_keep_alive=1)
    half = 1024 * 1024
    if framing == "content-length":
        framed = f"Content-Length: {2 * half}\r\n".encode()
        first, rest = b"x" * half, b"x" * half
    else:
        framed = b"Transfer-Encoding: chunked\r\n"
        first = f"{half:x}\r\n".encode() + b"x" * half + b"\r\n"
        rest = f"{half:x}\r\n".encode() + b"x" * half + b"\r\n0\r\n\r\n"
    head = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    with contextlib.closing(socket.create_connection(("127.0.0.1", api.port), 30)) as sock:
        sock.settimeout(30)
        sock.sendall(head + framed + b"\r\n" + first)
        # The client's pause (reading its next block from a slow disk, say): longer than the
        # keep-alive timeout. What is asserted does not depend on its length.
        time.sleep(1.5)
        try:
            sock.sendall(rest)
        except OSError as exc:
            pytest.fail(f"the server closed the connection under the upload: {exc}")
        response_head, body = read_response(sock)
        assert_closed_cleanly(sock)
    assert response_head.startswith(b"http/1.1 413"), response_head
    assert b"connection: close" in response_head
    assert b"body_too_large" in body


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_refused_upload_on_a_kept_alive_connection_ends_it_cleanly(http, db_url, serve):
    """After a 413 the connection is closed, not reused with part of the refused body."""
    api = serve(create_app(ApiSettings(database_url=db_url, max_body_bytes=4096)), http=http)
    body = b"x" * BIG
    request = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with contextlib.closing(socket.create_connection(("127.0.0.1", api.port), 30)) as sock:
        sock.settimeout(30)
        sock.sendall(request + body)
        response_head, answer = read_response(sock)
        assert_closed_cleanly(sock)
    assert response_head.startswith(b"http/1.1 413") and b"connection: close" in response_head
    assert b"body_too_large" in answer
