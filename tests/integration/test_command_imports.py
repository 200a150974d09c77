"""What a command imports when it really runs against PostgreSQL: ``enqueue``,
``status`` and ``list`` talk to the database through a ``Client``, whose schema check reads
the version with psycopg, so none of them loads alembic or SQLAlchemy, the worker or FastAPI.
``tests/unit/test_imports.py`` covers ``import pgqueue`` and each command's ``--help``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from processes import IMPORT_TIMES, among, clean_env, imported_modules

HEAVY = {
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pgqueue.api",
    "pgqueue.worker",
    "pgqueue.supervisor",
    "pgqueue.cli.workers",
    "pgqueue.cli.serve",
    "pgqueue.cli.dead_letters",
}


def _run(url: str, *args: str) -> tuple[str, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(**IMPORT_TIMES),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, imported_modules(proc.stderr)


@pytest.mark.parametrize("command", ["enqueue", "status", "list"])
def test_a_database_command_loads_neither_alembic_nor_the_worker_nor_the_api(
    database_url: str, command: str
) -> None:
    out, modules = _run(database_url, "enqueue", "noop", "--payload", '{"n": 1}')
    task_id = json.loads(out)["task_id"]
    if command == "status":
        out, modules = _run(database_url, "status", task_id)
        assert json.loads(out)["task_id"] == task_id
    elif command == "list":
        out, modules = _run(database_url, "list")
        assert [t["task_id"] for t in json.loads(out)] == [task_id]
    assert among(modules, HEAVY) == []
    # It did reach the database: psycopg and the schema check ran.
    assert among(modules, {"psycopg", "pgqueue.migrate"}) == ["pgqueue.migrate", "psycopg"]
