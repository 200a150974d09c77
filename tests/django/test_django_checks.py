"""The backend's system checks fire where a user meets them: in a project fresh from
``django-admin startproject`` (SQLite by default) with the backend added as docs/django.md
says, ``manage.py check`` and ``manage.py migrate`` report pgqueue.E002 and stop, instead of
``migrate`` failing deep in pgqueue's migration with a traceback. Run as a user runs them, in
processes of their own: nothing in the project imports ``django.tasks`` before the checks
run, which is what hid them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from processes import clean_env

pytest.importorskip(
    "pgqueue.contrib.django.compat",
    reason="Django 6 (Python 3.12+), or 5.2 with django-tasks: .ci/django runs these",
    exc_type=ImportError,
)

import django  # after the skip: absent on Python 3.11 without the extra

# What docs/django.md tells a project to add, as a user appends it to startproject's settings.
BACKEND_SETTINGS = """
INSTALLED_APPS += ["pgqueue.contrib.django"]
TASKS = {"default": {"BACKEND": "pgqueue.contrib.django.PgQueueBackend"}}
"""
if django.VERSION < (6,):  # Django 5.2: the django-tasks backport is the Tasks framework
    BACKEND_SETTINGS += 'INSTALLED_APPS.insert(0, "django_tasks")\n'


def run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def sqlite_project(tmp_path: Path) -> Path:
    """``django-admin startproject mysite`` with the backend added, and nothing else: its
    default database is startproject's SQLite."""
    made = run(tmp_path, "-m", "django", "startproject", "mysite", ".")
    assert made.returncode == 0, made.stderr
    settings = tmp_path / "mysite" / "settings.py"
    assert "sqlite3" in settings.read_text(encoding="utf-8")
    with settings.open("a", encoding="utf-8") as file:
        file.write(BACKEND_SETTINGS)
    return tmp_path


def test_check_reports_e002_for_a_fresh_project_on_sqlite(sqlite_project: Path) -> None:
    checked = run(sqlite_project, "manage.py", "check")
    assert checked.returncode == 1, (checked.stdout, checked.stderr)
    assert "pgqueue.E002" in checked.stderr
    assert "pgqueue needs PostgreSQL: DATABASES['default'] uses" in checked.stderr
    assert "HINT: Set DATABASES['default']['ENGINE'] to 'django.db.backends.postgresql'" in (
        checked.stderr
    )


def test_migrate_stops_at_e002_before_pgqueues_migration(sqlite_project: Path) -> None:
    migrated = run(sqlite_project, "manage.py", "migrate")
    assert migrated.returncode == 1, (migrated.stdout, migrated.stderr)
    assert "pgqueue.E002" in migrated.stderr
    # A system check's report, not pgqueue's migration failing with ImproperlyConfigured.
    assert "Traceback" not in migrated.stderr
    assert "Applying" not in migrated.stdout
