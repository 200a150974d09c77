"""Fuzz the live HTTP API from its own OpenAPI document with schemathesis.

A real uvicorn server runs ``create_app`` in a background thread on a free port, over a
database of this module's own (a copy of the migrated template) seeded with tasks in every
status: queued (due, scheduled, high and low priority, with an idempotency key), running,
completed, failed (dead letters) and cancelled. Before every generated request the tasks
table is put back exactly as seeded, so every example meets the same data. Path parameters
are drawn from the seeded ids as well as generated, so GET, DELETE and replay run on tasks
that exist, in each status, and on ones that do not.

The document is loaded from the server (``GET /openapi.json``), and every operation gets
``MAX_EXAMPLES`` positive and ``MAX_EXAMPLES`` negative examples (Hypothesis derandomized, its
example database off), each checked for: no 5xx; a status code the document lists for the
operation; the declared content type; a body that matches the declared schema. Each
operation runs to its end whatever another found, and all distinct failures are reported
together, each with a curl command that reproduces it.

(Not ``schema.parametrize()`` over ``schemathesis.pytest.from_fixture``: with pytest 9 it
fails in schemathesis 4.32 itself, ``'Function' object has no attribute '_nodeid'``.)
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import requests
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import pgqueue
from pgqueue.api import ApiSettings, create_app
from pgqueue.api.scopes import SCOPES

# One token per scope; the document is loaded, and the full checks run, with the admin one.
TOKENS = {scope: f"fuzz-{scope}-" + "0123456789abcdef" * 2 for scope in SCOPES}
TOKEN = TOKENS["admin"]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_EXAMPLES = 25
# Per narrower scope (metrics, read, submit): examples per operation, positive ones only.
SCOPED_EXAMPLES = 8
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
STARTUP_SECONDS = 15.0
REQUEST_TIMEOUT = 10.0


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def _poll(what: str, ready: Any, deadline_s: float) -> None:
    """Call ``ready()`` until it is true; fail after ``deadline_s`` seconds."""
    deadline = time.monotonic() + deadline_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not ready after {deadline_s} s")
        time.sleep(0.02)


# --- the database: seeded once, restored before every example --------------------------------


@dataclass(frozen=True)
class Seed:
    url: str
    ids: dict[str, list[uuid.UUID]]  # status -> ids
    workflows: tuple[str, ...] = ()  # Ids of seeded workflows

    @property
    def all_ids(self) -> list[str]:
        return sorted(str(i) for ids in self.ids.values() for i in ids)


def _seed(url: str) -> Seed:
    """Tasks in every status, made through the library as a worker would make them."""
    ids: dict[str, list[uuid.UUID]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        queued = [
            pgqueue.enqueue(conn, "send_email", {"to": "a@example.com"}).id,
            pgqueue.enqueue(conn, "send_email", {"to": "b@example.com"}, priority="high").id,
            pgqueue.enqueue(conn, "resize", {"w": 10, "h": 20}, queue="images", priority="low").id,
            pgqueue.enqueue(conn, "report", {"n": "é✓"}, idempotency_key="fuzz-key-1").id,
            pgqueue.enqueue(conn, "report", {}, run_at=datetime.now(UTC) + timedelta(days=1)).id,
        ]
        for i in range(6):
            pgqueue.enqueue(conn, "work", {"i": i}, queue="work", max_attempts=1)
        claimed = pgqueue.claim(conn, ["work"], limit=6, worker_id="fuzz", lease_seconds=3600)
        assert len(claimed) == 6
        pgqueue.complete(conn, claimed[0].lease, {"ok": True})
        pgqueue.complete(conn, claimed[1].lease, None)
        pgqueue.fail(conn, claimed[2].lease, "ValueError: boom")
        pgqueue.fail(conn, claimed[3].lease, "TimeoutError: too slow")
        ids["completed"] = [claimed[0].id, claimed[1].id]
        ids["failed"] = [claimed[2].id, claimed[3].id]
        ids["running"] = [claimed[4].id, claimed[5].id]
        pgqueue.enqueue(conn, "gone", {}, queue="images", max_attempts=1)
        (dead,) = pgqueue.claim(conn, ["images"], limit=1, worker_id="fuzz", lease_seconds=3600)
        pgqueue.fail(conn, dead.lease, "RuntimeError: images too")
        ids["failed"].append(dead.id)
        cancelled = pgqueue.enqueue(conn, "send_email", {"to": "c@example.com"}, queue="x").id
        pgqueue.cancel(conn, cancelled)
        ids["cancelled"] = [cancelled]
        ids["queued"] = queued
        for status, wanted in ids.items():
            for task_id in wanted:
                assert pgqueue.get_task(conn, task_id).status.value == status
        # A workflow of one queued task (no edges: the restore puts back the tasks table only).
        workflow = pgqueue.enqueue(conn, "report", {}, workflow_id=uuid.uuid4()).task.workflow_id
        conn.execute("CREATE TABLE public.fuzz_seed AS SELECT * FROM pgqueue.tasks")
    return Seed(url, ids, (str(workflow),))


@pytest.fixture(scope="module")
def seeded(server_url: str, template_db: str) -> Iterator[Seed]:
    """A database of this module's own, copied from the migrated template and seeded."""
    name = f"pgqueue_fuzz_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield _seed(_with_database(server_url, name))
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def restore(seeded: Seed) -> Iterator[Any]:
    """Put the tasks table back exactly as seeded (one transaction)."""
    with psycopg.connect(seeded.url, autocommit=True) as conn:

        def _restore() -> None:
            with conn.transaction():
                conn.execute("DELETE FROM pgqueue.tasks")
                conn.execute("INSERT INTO pgqueue.tasks SELECT * FROM public.fuzz_seed")

        yield _restore


# --- the live server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_url(seeded: Seed) -> Iterator[str]:
    """uvicorn serving create_app in a thread, on a socket bound to a free port."""
    tokens = {token: [scope] for scope, token in TOKENS.items()}
    app = create_app(ApiSettings(database_url=seeded.url, tokens=tokens))
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says so, and without it every keep-alive request waits ~40 ms (Nagle
    # against delayed ACKs).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="fuzz-uvicorn", daemon=True
    )
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:

        def started() -> bool:
            if not thread.is_alive():
                raise AssertionError("the uvicorn thread exited during start-up")
            return server.started

        _poll("uvicorn", started, STARTUP_SECONDS)

        def ready() -> bool:
            return httpx.get(f"{url}/readyz", timeout=REQUEST_TIMEOUT).status_code == 200

        _poll("GET /readyz", ready, STARTUP_SECONDS)
        yield url
    finally:
        server.should_exit = True
        thread.join(STARTUP_SECONDS)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def api_schema(live_url: str, seeded: Seed) -> schemathesis.BaseSchema:
    """The OpenAPI document as the live server serves it, with path ids from the seed."""
    # The token goes in as a fixed header on every generated case (explicit config: no
    # schemathesis.toml from the working directory).
    config = schemathesis.Config.from_dict({"headers": AUTH})
    schema = schemathesis.openapi.from_url(
        f"{live_url}/openapi.json", config=config, timeout=REQUEST_TIMEOUT
    )
    known = st.sampled_from(seeded.all_ids).map(lambda task_id: {"task_id": task_id})

    workflows = st.sampled_from(seeded.workflows).map(lambda w: {"workflow_id": w})
    # The seeded tasks' queues: a route that refuses a queue it does not know (resume) is
    # exercised on one that exists too.
    queues = st.sampled_from(["default", "images", "work", "x"]).map(lambda q: {"name": q})

    @schema.hook
    def before_generate_path_parameters(context: Any, strategy: Any) -> Any:
        operation = getattr(context, "operation", None)
        if operation is not None and "{workflow_id}" in operation.path:
            return st.one_of(workflows, strategy)
        if operation is not None and operation.path.startswith("/api/v1/queues/{name}"):
            return st.one_of(queues, strategy)
        if operation is not None and "{task_id}" not in operation.path:
            return strategy  # a type's name, say: nothing seeded to draw from
        return st.one_of(known, strategy)

    return schema


# --- the tests -------------------------------------------------------------------------------


def test_the_openapi_document_is_served(live_url: str) -> None:
    response = httpx.get(f"{live_url}/openapi.json", headers=AUTH, timeout=REQUEST_TIMEOUT)
    assert response.status_code == 200, response.text
    document = response.json()
    assert "/api/v1/tasks" in document["paths"]


def _headline(exc: BaseException) -> str:
    """What failed, without the values: one key per distinct failure."""
    if isinstance(exc, BaseExceptionGroup):
        return " + ".join(sorted({_headline(e) for e in exc.exceptions}))
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


@dataclass
class Outcome:
    """One operation in one generation mode."""

    statuses: dict[int, int]  # status code -> responses
    failures: dict[str, str]  # what failed -> the report of the last example that failed it


def _fuzz(operation: Any, mode: GenerationMode, restore: Any, session: requests.Session) -> Outcome:
    """Send MAX_EXAMPLES cases (plus Hypothesis's shrinking) and check each response."""
    outcome = Outcome(statuses={}, failures={})

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def run(case: schemathesis.Case) -> None:
        restore()
        response = case.call(session=session, timeout=REQUEST_TIMEOUT)
        code = response.status_code
        outcome.statuses[code] = outcome.statuses.get(code, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis's Failure(Group)
            body = response.request.body
            if isinstance(body, bytes):
                body = body.decode(errors="backslashreplace")
            # Shrinking replays the smallest failing example last: keep the last one.
            outcome.failures[_headline(exc)] = f"{exc}\n  (request body: {body!r})"
            raise

    try:
        run()
    except (AssertionError, BaseExceptionGroup):
        assert outcome.failures, "a failure that was not recorded"
    return outcome


def test_api_conforms_to_its_openapi_document(
    api_schema: schemathesis.BaseSchema, restore: Any
) -> None:
    session = requests.Session()
    failures: list[str] = []
    statuses: dict[str, dict[int, int]] = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{operation.label} [{mode.value}]"
            try:
                outcome = _fuzz(operation, mode, restore, session)
            except Unsatisfiable:
                continue  # nothing to make invalid: no parameters and no body
            statuses[label] = dict(sorted(outcome.statuses.items()))
            failures += [f"{label}: {failure}" for failure in outcome.failures.values()]
    print("responses by status code:", json.dumps(statuses, indent=1))
    assert not failures, f"{len(failures)} distinct failure(s):\n\n" + "\n\n".join(failures)
    # Not vacuous: every operation succeeded on some valid input (the seeded ids included).
    unexercised = [
        label
        for label, codes in statuses.items()
        if label.endswith("[positive]") and not any(200 <= code < 300 for code in codes)
    ]
    assert not unexercised, f"no 2xx response at all: {unexercised}"


def _fuzz_scoped(
    operation: Any, scope: str, restore: Any, session: requests.Session
) -> tuple[Outcome, bool]:
    """SCOPED_EXAMPLES positive cases with ``scope``'s token; whether the scope may call it."""
    needed = operation.definition.raw["x-pgqueue-scope"]
    allowed = scope == "admin" or scope in needed or "open" in needed
    outcome = Outcome(statuses={}, failures={})
    bearer = {"Authorization": f"Bearer {TOKENS[scope]}"}

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(
        max_examples=SCOPED_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def run(case: schemathesis.Case) -> None:
        restore()
        response = case.call(session=session, headers=bearer, timeout=REQUEST_TIMEOUT)
        code = response.status_code
        outcome.statuses[code] = outcome.statuses.get(code, 0) + 1
        try:
            refused = code == 403 and response.json().get("error") == "insufficient_scope"
            if allowed:
                assert not refused, f"{scope} refused\n{response.text}"
                case.validate_response(response, checks=CHECKS, headers=bearer)
            else:
                assert refused, f"{scope} not refused (HTTP {code})\n{response.text[:300]}"
        except (AssertionError, BaseExceptionGroup) as exc:
            outcome.failures[_headline(exc)] = str(exc)
            raise

    try:
        run()
    except (AssertionError, BaseExceptionGroup):
        assert outcome.failures, "a failure that was not recorded"
    return outcome, allowed


def test_each_scope_is_refused_exactly_where_its_operations_scope_leaves_it_out(
    api_schema: schemathesis.BaseSchema, restore: Any
) -> None:
    session = requests.Session()
    failures: list[str] = []
    allowed_somewhere: dict[str, int] = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for scope in ("metrics", "read", "submit"):
            outcome, allowed = _fuzz_scoped(operation, scope, restore, session)
            allowed_somewhere[scope] = allowed_somewhere.get(scope, 0) + allowed
            label = f"{operation.label} [{scope}]"
            failures += [f"{label}: {failure}" for failure in outcome.failures.values()]
            assert not any(code >= 500 for code in outcome.statuses), (label, outcome.statuses)
    assert not failures, f"{len(failures)} distinct failure(s):\n\n" + "\n\n".join(failures)
    # Not vacuous: read and submit may call some operations of the document (metrics is
    # outside it).
    assert allowed_somewhere["read"] > 5 and allowed_somewhere["submit"] >= 3, allowed_somewhere
