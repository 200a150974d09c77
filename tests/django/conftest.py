"""A real Django project (tests/django/project) on pgqueue's Tasks backend, on real PostgreSQL,
with real worker processes (``python manage.py pgqueue_worker``, ``pgqueue worker --django``).

Django 6 (``django.tasks``) needs Python 3.12+; Django 5.2 with the ``django-tasks`` backport
works too. Without either these tests skip, unless
``PGQUEUE_REQUIRE_DJANGO`` is set (``.ci/django`` sets it), when they fail instead.

The project is set up once per test run, in this process (Django cannot be set up twice),
on a database of its own copied from the migrated template; tests tell their tasks apart by
their ids and arguments, not by counting the table.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

PROJECT = Path(__file__).resolve().parent / "project"

_HAVE_DJANGO_TASKS = importlib.util.find_spec("django") is not None and (
    importlib.util.find_spec("django.tasks") is not None
    or importlib.util.find_spec("django_tasks") is not None
)
if not _HAVE_DJANGO_TASKS and os.environ.get("PGQUEUE_REQUIRE_DJANGO"):
    raise RuntimeError(
        "PGQUEUE_REQUIRE_DJANGO is set (as .ci/django sets it) but neither Django 6 "
        f"(django.tasks) nor the django-tasks backport is installed for {sys.executable}: "
        "pip install 'pgqueue-jobs[django]' on Python 3.12+"
    )


def _admin(server_url: str, sql: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql)


def _url_of(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path="/" + name))


@pytest.fixture(scope="session")
def django_database_url(server_url: str, template_db: str) -> Iterator[str]:
    """The project's database: pgqueue's schema from the template, Django's tables from
    ``migrate`` (which runs pgqueue's Django migration too), Django set up on it."""
    name = f"pgqueue_dj_{uuid.uuid4().hex[:12]}"
    _admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = _url_of(server_url, name)
    os.environ["DJANGO_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    sys.path.insert(0, str(PROJECT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield url
    from django.db import connections

    connections.close_all()
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg(django_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the test's own to the project's database (autocommit)."""
    with psycopg.connect(django_database_url, autocommit=True) as conn:
        yield conn
