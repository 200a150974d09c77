"""What each entry point imports: ``import pgqueue`` and the commands load only
what they use, so that a script calling ``pgqueue status`` does not wait for FastAPI, and a
worker does not wait for alembic. Speed itself is measured by ``bench/startup.py``; these
tests pin the module sets, which do not depend on how busy the machine is.

Each case runs in a fresh interpreter and reads the modules it imported from ``-X
importtime`` (``tests/processes.py``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main
from processes import IMPORT_TIMES, among, clean_env, imported_modules

from pgqueue import migrate
from pgqueue.cli import root

# What no command but its own should pay for.
HEAVY = {
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pgqueue.api",
    "pgqueue.worker",
    "pgqueue.supervisor",
}
COMMAND_MODULES = {f"pgqueue.cli.{entry.module}" for entry in root.TREE}


def _imports(*args: str, code: int = 0) -> set[str]:
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(**IMPORT_TIMES),
    )
    assert proc.returncode == code, proc.stderr[-3000:]
    modules = imported_modules(proc.stderr)
    assert "pgqueue" in modules, "the probe saw no import at all"
    return modules


def test_import_pgqueue_loads_no_dependency() -> None:
    modules = _imports("-c", "import pgqueue")
    assert among(modules, {*HEAVY, "psycopg", "typer", "rich", "pgqueue.operations"}) == []


def test_the_core_loads_neither_the_worker_nor_the_api_nor_alembic() -> None:
    modules = _imports(
        "-c",
        "import pgqueue\n"
        "pgqueue.enqueue, pgqueue.Client, pgqueue.TaskRegistry, pgqueue.TaskContext\n"
        "pgqueue.Task, pgqueue.Priority, pgqueue.wait, pgqueue.check_arguments",
    )
    assert among(modules, HEAVY) == []
    assert among(modules, {"psycopg", "pgqueue.operations"}) == ["pgqueue.operations", "psycopg"]


def test_a_public_name_is_the_same_whether_loaded_eagerly_or_on_first_use() -> None:
    # pgqueue/enqueue.py is also a submodule's name: importing it must not hide the function.
    code = (
        "import pgqueue.enqueue, pgqueue.operations, pgqueue.worker, pgqueue\n"
        "assert pgqueue.enqueue is pgqueue.operations.enqueue, pgqueue.enqueue\n"
        "assert pgqueue.Worker is pgqueue.worker.Worker\n"
        "assert pgqueue.operations.__name__ == 'pgqueue.operations'\n"
        "assert set(pgqueue.__all__) <= set(dir(pgqueue))"
    )
    _imports("-c", code)


def test_the_worker_is_loaded_when_it_is_used() -> None:
    assert "pgqueue.worker" in _imports("-c", "import pgqueue; pgqueue.Worker")


@pytest.mark.parametrize(
    ("args", "loaded", "absent"),
    [
        (["--help"], set(), {*HEAVY, *COMMAND_MODULES, "psycopg", "pgqueue.operations"}),
        # The task commands' help (and usage errors) need no driver: psycopg is imported
        # when a command connects.
        (
            ["status", "x", "--help"],
            {"pgqueue.cli.tasks"},
            HEAVY | {"pgqueue.cli.workers", "psycopg"},
        ),
        (
            ["enqueue", "--help"],
            {"pgqueue.cli.tasks"},
            HEAVY | {"pgqueue.cli.dead_letters", "psycopg"},
        ),
        (["dlq", "list", "--help"], {"pgqueue.cli.dead_letters"}, HEAVY | {"pgqueue.cli.tasks"}),
        (["worker", "--help"], {"pgqueue.cli.workers"}, HEAVY | {"pgqueue.cli.serve"}),
        (["serve", "--help"], {"pgqueue.cli.serve"}, HEAVY | {"pgqueue.cli.workers"}),
    ],
)
def test_each_command_imports_its_own_module_only(
    args: list[str], loaded: set[str], absent: set[str]
) -> None:
    modules = _imports("-m", "pgqueue", *args)
    assert among(modules, absent) == []
    assert among(modules, loaded) == sorted(loaded)


def test_a_usage_error_is_reported_without_loading_the_driver() -> None:
    modules = _imports("-m", "pgqueue", "status", code=2)  # TASK_ID missing
    assert among(modules, {*HEAVY, "psycopg"}) == []
    assert "pgqueue.cli.tasks" in modules


def test_the_listing_of_each_command_is_its_help_first_paragraph() -> None:
    # pgqueue --help lists TREE's summaries without importing the commands: they must say
    # what each command's own help says.
    group = typer.main.get_command(root.app)
    for entry in root.TREE:
        command = entry.load()
        assert (command.help or "").split("\n\n")[0] == entry.summary, entry.name
    assert list(group.list_commands(None)) == [entry.name for entry in root.TREE]  # type: ignore[attr-defined]


def test_the_revisions_read_from_their_files_are_alembics() -> None:
    # The schema check knows the revisions without alembic (migrate.revisions); alembic
    # must agree on every one, on what it revises, and on the head.
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    by_alembic = {rev.revision: rev.down_revision for rev in script.walk_revisions()}
    assert migrate.revisions() == by_alembic
    assert migrate.head() == script.get_current_head()
    assert migrate.known(migrate.head()) and not migrate.known("not_a_revision")


def test_a_worker_reads_its_options_without_pydantic() -> None:
    # typer coerces option values with pydantic (100 ms of imports, a fifth of a worker's
    # start); pgqueue/cli/coercion.py answers for plain values. The URL points nowhere: the
    # options are read, then the connection is refused.
    modules = _imports(
        *("-m", "pgqueue", "--database-url", "postgresql://u@127.0.0.1:1/x", "worker"),
        *("pgqueue.demo:tasks", "--startup-timeout", "0", "--concurrency", "3", "-q", "a"),
        code=1,
    )
    assert "pgqueue.worker.service" in modules
    assert among(modules, {"pydantic", "pydantic_core"}) == []
