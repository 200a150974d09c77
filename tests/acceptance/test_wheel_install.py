"""The wheel, built from this checkout and installed into an empty virtualenv, works on its own.

`pip install pgqueue-jobs && pgqueue migrate` must need no source checkout: the alembic revisions
ship inside the wheel as ``pgqueue/_migrations`` and the named SQL as ``pgqueue/sql``. Commands
run with the temporary directory as their working directory, so the checkout is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

REPO = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _clean_env() -> dict[str, str]:
    """The environment without anything that would point at the checkout or its venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PGQUEUE_DATABASE_URL"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )


def _load_snapshot_module() -> Any:
    path = REPO / "tests" / "migrations" / "snapshot.py"
    spec = importlib.util.spec_from_file_location("pgqueue_schema_snapshot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    outdir = tmp_path_factory.mktemp("dist")
    proc = _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(REPO)],
        cwd=REPO,
    )
    assert proc.returncode == 0, (
        "building the wheel failed (is the `build` package installed? it is in pgqueue-jobs[test])"
        f"\n{proc.stdout}\n{proc.stderr}"
    )
    (built,) = outdir.glob("pgqueue_jobs-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty virtualenv with only the wheel (and its dependencies) installed."""
    root = tmp_path_factory.mktemp("venv")
    env_dir = root / "venv"
    created = _run([sys.executable, "-m", "venv", str(env_dir)], cwd=root)
    assert created.returncode == 0, created.stderr
    python = env_dir / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], cwd=root)
    assert installed.returncode == 0, f"{installed.stdout}\n{installed.stderr}"
    return env_dir


def test_wheel_ships_the_alembic_migrations_and_the_named_sql(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

    assert "pgqueue/_migrations/env.py" in names
    assert "pgqueue/_migrations/versions/0001_tasks.py" in names
    # Every SQL file of the checkout: the statements' rooms and grants.sql.
    sql_files = sorted((REPO / "pgqueue" / "sql").glob("*.sql"))
    assert {f.name for f in sql_files} >= {"claiming.sql", "submitting.sql", "grants.sql"}
    for path in sql_files:
        assert f"pgqueue/sql/{path.name}" in names
    # Every revision of the checkout, not only the first one.
    for revision in sorted((REPO / "migrations" / "versions").glob("*.py")):
        assert f"pgqueue/_migrations/versions/{revision.name}" in names


def test_wheel_ships_the_dashboard_files(wheel: Path) -> None:
    """`pgqueue serve` serves the dashboard from the package, so its files must be in it."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

    files = sorted((REPO / "pgqueue" / "dashboard").iterdir())
    assert {f.name for f in files} >= {"index.html", "app.js", "style.css"}
    for path in files:
        assert f"pgqueue/dashboard/{path.name}" in names


def test_installed_wheel_runs_from_site_packages_not_from_the_checkout(
    venv: Path, tmp_path: Path
) -> None:
    proc = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import pgqueue, pgqueue.migrate as m; print(pgqueue.__file__); "
            "print(m.migrations_dir())",
        ],
        cwd=tmp_path,
    )

    assert proc.returncode == 0, proc.stderr
    package_file, migrations = proc.stdout.split()
    assert Path(package_file).is_relative_to(venv)
    assert Path(migrations).is_relative_to(venv)
    assert Path(migrations).name == "_migrations"


def test_pgqueue_migrate_from_the_installed_wheel_creates_the_schema(
    venv: Path, empty_database_url: str, tmp_path: Path
) -> None:
    pgqueue_cli = str(venv / "bin" / "pgqueue")

    migrated = _run([pgqueue_cli, "--database-url", empty_database_url, "migrate"], cwd=tmp_path)

    assert migrated.returncode == 0, f"{migrated.stdout}\n{migrated.stderr}"
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('pgqueue.tasks')").fetchone() == ("pgqueue.tasks",)
    check = _run(
        [pgqueue_cli, "--database-url", empty_database_url, "migrate", "--check"], cwd=tmp_path
    )
    assert check.returncode == 0, f"{check.stdout}\n{check.stderr}"
    # The installed revisions build the same schema as the checkout's.
    snapshot = _load_snapshot_module()
    assert snapshot.render(empty_database_url) == snapshot.SNAPSHOT_PATH.read_text(encoding="utf-8")


def test_installed_wheel_enqueues_a_task_with_its_packaged_sql(
    venv: Path, database_url: str, tmp_path: Path
) -> None:
    script = (
        "import sys, psycopg, pgqueue\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
        "    print(pgqueue.enqueue(conn, 'wheel.smoke', {'n': 1}).id)\n"
    )

    proc = _run([str(venv / "bin" / "python"), "-c", script, database_url], cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT id::text, type, payload FROM pgqueue.tasks").fetchall()
    assert rows == [(proc.stdout.strip(), "wheel.smoke", {"n": 1})]
