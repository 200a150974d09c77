"""pgqueue's schema in a Django project: ``manage.py migrate`` installs it (this app's
migration) beside the project's own tables, and ``manage.py pgqueue_migrate`` upgrades it;
neither touches the other's history. Run as a user runs them: ``python manage.py ...``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from processes import clean_env

from pgqueue import migrate

PROJECT = Path(__file__).resolve().parent / "project"

pytest.importorskip(
    "pgqueue.contrib.django.compat",
    reason="Django 6 (Python 3.12+), or 5.2 with django-tasks: .ci/django runs these",
    exc_type=ImportError,
)


def manage(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=clean_env(DJANGO_DATABASE_URL=url, **env),
        capture_output=True,
        text=True,
        timeout=180,
    )


def tables(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.slow
def test_manage_py_migrate_installs_pgqueue_beside_the_projects_tables(
    empty_database_url: str,
) -> None:
    done = manage(empty_database_url, "migrate")

    assert done.returncode == 0, done.stderr
    assert "Applying pgqueue.0001_pgqueue_schema... OK" in done.stdout
    assert migrate.current(empty_database_url) == migrate.head()
    with psycopg.connect(empty_database_url) as conn:
        public = tables(conn, "public")
        assert {"shop_order", "django_migrations"} <= public
        # pgqueue's tables and its alembic history stay in its own schema.
        assert not {t for t in public if "pgqueue" in t or "alembic" in t}
        assert {"tasks", "pgqueue_alembic_version"} <= tables(conn, "pgqueue")
        applied = conn.execute("SELECT app, name FROM django_migrations ORDER BY app").fetchall()
    assert ("pgqueue", "0001_pgqueue_schema") in applied
    assert ("shop", "0001_initial") in applied

    again = manage(empty_database_url, "pgqueue_migrate")
    assert again.returncode == 0, again.stderr
    assert f"pgqueue schema already at {migrate.head()}" in again.stdout


@pytest.mark.slow
def test_pgqueue_migrate_upgrades_a_schema_left_behind(empty_database_url: str) -> None:
    assert manage(empty_database_url, "migrate").returncode == 0
    migrate.downgrade(empty_database_url, "-1")  # as if pgqueue had been upgraded since
    behind = migrate.current(empty_database_url)
    assert behind != migrate.head()

    done = manage(empty_database_url, "pgqueue_migrate")

    assert done.returncode == 0, done.stderr
    assert f"pgqueue schema: {behind} -> {migrate.head()}" in done.stdout
    assert migrate.current(empty_database_url) == migrate.head()


def test_pgqueue_worker_django_needs_settings(empty_database_url: str) -> None:
    env = clean_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the other tests' process sets it
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "--django"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode != 0
    assert "DJANGO_SETTINGS_MODULE" in done.stderr and "Traceback" not in done.stderr
