"""pgqueue's alembic revisions against real PostgreSQL: the schema they build, and how they live
next to an application's own alembic history.

The expected schema is ``schema_snapshot.sql`` next to this file; ``snapshot.py`` generates it
and, run as a script, rewrites it after a new migration.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config

import pgqueue
from pgqueue import migrate
from pgqueue.config import sqlalchemy_url
from pgqueue.errors import SchemaNotReady

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
UPGRADING = REPO / "docs" / "how-to" / "upgrading.md"  # where the by-hand statements are printed


def _load_snapshot_module() -> Any:
    # Loaded by path under a unique name: tests/ is not a package, and "snapshot" is too
    # common a module name to put on sys.path.
    spec = importlib.util.spec_from_file_location("pgqueue_schema_snapshot", HERE / "snapshot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


snapshot = _load_snapshot_module()


def assert_matches_snapshot(url: str) -> None:
    expected = snapshot.SNAPSHOT_PATH.read_text(encoding="utf-8")
    actual = snapshot.render(url)
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                "schema_snapshot.sql (committed)",
                "schema after upgrade head",
            )
        )
        pytest.fail(
            "the schema that `alembic upgrade head` builds differs from "
            f"{snapshot.SNAPSHOT_PATH}.\nIf the change is intended (a new migration), "
            f"regenerate the snapshot from the repository root with\n    {snapshot.REGENERATE}\n"
            f"and commit it.\n\n{diff}",
            pytrace=False,
        )


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def execute(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def objects_in_pgqueue_schema(url: str) -> list[str]:
    """Every object in schema pgqueue (tables, views, functions, types, sequences, ...)."""
    return [
        name
        for (name,) in rows(
            url,
            """
            SELECT o.type || ' ' || o.identity
              FROM pg_depend d, pg_identify_object(d.classid, d.objid, d.objsubid) o
             WHERE d.refclassid = 'pg_namespace'::regclass
               AND d.refobjid = (SELECT oid FROM pg_namespace WHERE nspname = 'pgqueue')
             ORDER BY 1
            """,
        )
    ]


def relations_in_pgqueue_schema(url: str) -> list[str]:
    """Every pg_class entry (tables, indexes, views, sequences) in schema pgqueue."""
    return [
        name
        for (name,) in rows(
            url,
            """
            SELECT c.relname::text FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'pgqueue' ORDER BY 1
            """,
        )
    ]


def regclass(url: str, name: str) -> str | None:
    return rows(url, f"SELECT to_regclass('{name}')::text")[0][0]  # type: ignore[no-any-return]


# --- the schema head builds ------------------------------------------------------------------


def test_upgrade_head_on_an_empty_database_builds_exactly_the_committed_snapshot(
    empty_database_url: str,
) -> None:
    assert snapshot.describe_schema(empty_database_url) == ""

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)


def test_alembic_upgrade_head_from_a_checkout_builds_the_committed_snapshot(
    empty_database_url: str,
) -> None:
    # The developer's path: the repository's alembic.ini, the URL from PGQUEUE_DATABASE_URL.
    env = {**os.environ, "PGQUEUE_DATABASE_URL": empty_database_url}
    proc = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr

    assert_matches_snapshot(empty_database_url)


# --- downgrade ---------------------------------------------------------------------------------


def test_downgrade_to_base_removes_everything_pgqueue_created_but_its_version_table(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    assert "table pgqueue.tasks" in objects_in_pgqueue_schema(empty_database_url)

    migrate.downgrade(empty_database_url, "base")

    assert objects_in_pgqueue_schema(empty_database_url) == [
        "table pgqueue.pgqueue_alembic_version"
    ]
    assert relations_in_pgqueue_schema(empty_database_url) == [
        "pgqueue_alembic_version",
        "pgqueue_alembic_version_pkc",
    ]
    assert rows(empty_database_url, "SELECT * FROM pgqueue.pgqueue_alembic_version") == []
    assert migrate.current(empty_database_url) is None


def test_upgrade_after_downgrade_to_base_builds_the_snapshot_again(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert migrate.current(empty_database_url) == migrate.head()


def test_0004_finds_indexes_a_dba_built_concurrently_and_keeps_the_tasks(
    empty_database_url: str,
) -> None:
    """The upgrading how-to's path for a large table: build 0004's indexes without blocking writes
    first, then migrate; the revision finds them (IF NOT EXISTS) and the result is head."""
    migrate.upgrade(empty_database_url, "0003_schedules")
    execute(
        empty_database_url,
        "INSERT INTO pgqueue.tasks (type, payload, status, finished_at)"
        " VALUES ('t', '{}', 'completed', now())",
    )
    docstring = (REPO / "migrations" / "versions" / "0004_limits_retention.py").read_text()
    statements = re.findall(r"CREATE INDEX CONCURRENTLY[^;]+;", docstring)
    assert len(statements) == 2, statements
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert rows(empty_database_url, "SELECT type, status FROM pgqueue.tasks") == [
        ("t", "completed")
    ]


def test_0008_finds_the_columns_and_the_expiry_index_a_dba_prepared_by_hand(
    empty_database_url: str,
) -> None:
    """The docstring's path for a large table, as the upgrading how-to prints it: the two
    columns added and the expiry index built without blocking writes first; the revision then
    finds all three (IF NOT EXISTS) and the result is head."""
    migrate.upgrade(empty_database_url, "0007_task_types")
    execute(empty_database_url, "INSERT INTO pgqueue.tasks (type, payload) VALUES ('t', '{}')")
    module = (REPO / "migrations" / "versions" / "0008_snooze_expiry.py").read_text()
    docstring = module.split('"""')[1]
    statements = re.findall(r"(?:ALTER TABLE|CREATE INDEX CONCURRENTLY)[^;]+;", docstring)
    assert len(statements) == 2, statements
    page = " ".join(UPGRADING.read_text(encoding="utf-8").split())
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        for statement in statements:
            assert " ".join(statement.split()) in page, "the upgrading how-to lacks it"
            conn.execute(statement)

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert rows(empty_database_url, "SELECT type, status FROM pgqueue.tasks") == [("t", "queued")]


def test_0014_finds_the_waiting_index_a_dba_built_concurrently_and_its_downgrade_drops_it(
    empty_database_url: str,
) -> None:
    """The docstring's path for a large table (the upgrading how-to gives the same statement):
    the waiting index built without blocking writes first, then the revision finds it (IF NOT
    EXISTS); a downgrade keeps the tasks."""
    migrate.upgrade(empty_database_url, "0013_dependants_flag")
    execute(
        empty_database_url,
        "INSERT INTO pgqueue.tasks (type, payload, queue, status, parents_pending)"
        " VALUES ('t', '{}', 'callbacks', 'waiting', 1)",
    )
    docstring = (REPO / "migrations" / "versions" / "0014_waiting_index.py").read_text()
    statements = re.findall(r"CREATE INDEX CONCURRENTLY[^;]+;", docstring)
    assert len(statements) == 1, statements
    page = " ".join(UPGRADING.read_text(encoding="utf-8").split())
    assert " ".join(statements[0].split()) in page, "the upgrading how-to lacks it"
    execute(empty_database_url, statements[0])

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert rows(
        empty_database_url,
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'pgqueue.tasks_waiting_idx'::regclass",
    ) == [(True,)]

    migrate.downgrade(empty_database_url, "0013_dependants_flag")

    assert regclass(empty_database_url, "pgqueue.tasks_waiting_idx") is None
    assert rows(empty_database_url, "SELECT queue, status FROM pgqueue.tasks") == [
        ("callbacks", "waiting")
    ]


# --- idempotence and the version table ---------------------------------------------------------


def test_0015_finds_the_claim_indexes_a_dba_built_concurrently_and_its_downgrade_keeps_the_tasks(
    empty_database_url: str,
) -> None:
    """The docstring's path for a large table (the upgrading how-to gives the same statements): the
    column added and the four indexes built without blocking writes first, then the
    revision finds them (IF NOT EXISTS), drops the old two and renames the new ones; a
    downgrade keeps the tasks (their keys go with the column)."""
    migrate.upgrade(empty_database_url, "0014_waiting_index")
    execute(empty_database_url, "INSERT INTO pgqueue.tasks (type, payload) VALUES ('t', '{}')")
    module = (REPO / "migrations" / "versions" / "0015_concurrency_keys.py").read_text()
    docstring = module.split('"""')[1]
    statements = re.findall(r"(?:ALTER TABLE|CREATE INDEX CONCURRENTLY)[^;]+;", docstring)
    assert len(statements) == 5, statements
    page = " ".join(UPGRADING.read_text(encoding="utf-8").split())
    for statement in statements:
        assert " ".join(statement.split()) in page, "the upgrading how-to lacks it"
        execute(empty_database_url, statement)

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert rows(
        empty_database_url,
        "SELECT count(*) FROM pg_index WHERE indexrelid IN ('pgqueue.tasks_claim_idx'::regclass,"
        " 'pgqueue.tasks_claim_type_idx'::regclass, 'pgqueue.tasks_claim_key_idx'::regclass,"
        " 'pgqueue.tasks_running_key_idx'::regclass) AND indisvalid",
    ) == [(4,)]

    migrate.downgrade(empty_database_url, "0014_waiting_index")

    assert regclass(empty_database_url, "pgqueue.tasks_claim_key_idx") is None
    assert rows(empty_database_url, "SELECT type, status FROM pgqueue.tasks") == [("t", "queued")]


def test_0011_finds_the_status_check_and_index_a_dba_replaced_by_hand(
    empty_database_url: str,
) -> None:
    """The upgrading how-to's path for a large table before the workflows' revisions: the
    status CHECK replaced in the steps that hold no long lock, and the workflow index built
    without blocking writes, by hand, as the page prints them; the revisions then find both."""
    migrate.upgrade(empty_database_url, "0010_function_tasks")
    execute(
        empty_database_url,
        "INSERT INTO pgqueue.tasks (type, payload, status) VALUES ('t', '{}', 'queued')",
    )
    page = UPGRADING.read_text(encoding="utf-8")
    by_hand = [
        statement
        for statement in re.findall(r"(?:ALTER TABLE|CREATE INDEX CONCURRENTLY)[^;]+;", page)
        if "tasks_status_check" in statement
        or "tasks_workflow_idx" in statement
        or "workflow_id uuid" in statement
    ]
    assert len(by_hand) == 6, by_hand
    for statement in by_hand:
        execute(empty_database_url, statement)

    migrate.upgrade(empty_database_url)

    assert_matches_snapshot(empty_database_url)
    assert rows(empty_database_url, "SELECT type, status FROM pgqueue.tasks") == [("t", "queued")]


def test_0013_marks_the_parents_of_workflows_enqueued_before_it(empty_database_url: str) -> None:
    """A workflow enqueued at 0012 (before has_dependants) still settles after the upgrade:
    the revision marks every task that has an edge as a parent."""
    migrate.upgrade(empty_database_url, "0012_workflow_views")
    parent, child, plain = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    execute(
        empty_database_url,
        "INSERT INTO pgqueue.tasks (id, type, payload, status, parents_pending) VALUES"
        f" ('{parent}', 'p', '{{}}', 'queued', NULL), ('{child}', 'c', '{{}}', 'waiting', 1),"
        f" ('{plain}', 'x', '{{}}', 'queued', NULL);"
        "INSERT INTO pgqueue.task_dependencies (child_id, parent_id, position, bucket)"
        f" VALUES ('{child}', '{parent}', 0, 0);"
        "INSERT INTO pgqueue.task_dependency_buckets (child_id, bucket, pending)"
        f" VALUES ('{child}', 0, 1)",
    )

    migrate.upgrade(empty_database_url)

    assert rows(
        empty_database_url, "SELECT id, has_dependants FROM pgqueue.tasks ORDER BY type"
    ) == [(child, None), (parent, True), (plain, None)]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        claimed = pgqueue.claim(conn, ["default"], limit=10, worker_id="w")
        for task in claimed:
            pgqueue.complete(conn, task.lease, None)
        assert pgqueue.get_task(conn, child).status is pgqueue.TaskStatus.QUEUED


def test_upgrade_twice_is_a_no_op_that_keeps_data_and_leaves_the_database_at_head(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    execute(empty_database_url, "INSERT INTO pgqueue.tasks (type, payload) VALUES ('t', '{}')")

    migrate.upgrade(empty_database_url)

    assert migrate.current(empty_database_url) == migrate.head()
    assert rows(empty_database_url, "SELECT type FROM pgqueue.tasks") == [("t",)]
    assert rows(empty_database_url, "SELECT version_num FROM pgqueue.pgqueue_alembic_version") == [
        (migrate.head(),)
    ]
    assert_matches_snapshot(empty_database_url)


def test_upgrade_on_an_already_migrated_database_changes_nothing(database_url: str) -> None:
    before = snapshot.describe_schema(database_url)

    migrate.upgrade(database_url)

    assert snapshot.describe_schema(database_url) == before
    assert migrate.current(database_url) == migrate.head()


def test_pgqueue_versions_itself_in_its_own_table_and_leaves_the_apps_alembic_version_alone(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    execute(
        url,
        """
        CREATE TABLE public.alembic_version (
            version_num varchar(32) NOT NULL PRIMARY KEY
        );
        INSERT INTO public.alembic_version VALUES ('app_rev_42');
        """,
    )

    migrate.upgrade(url)

    assert regclass(url, "pgqueue.pgqueue_alembic_version") == "pgqueue.pgqueue_alembic_version"
    assert rows(url, "SELECT version_num FROM pgqueue.pgqueue_alembic_version") == [
        (migrate.head(),)
    ]
    assert rows(url, "SELECT version_num FROM public.alembic_version") == [("app_rev_42",)]
    # No stray version table anywhere else.
    assert regclass(url, "pgqueue.alembic_version") is None
    assert regclass(url, "public.pgqueue_alembic_version") is None

    migrate.downgrade(url, "base")

    assert rows(url, "SELECT version_num FROM public.alembic_version") == [("app_rev_42",)]


# --- check() -----------------------------------------------------------------------------------


def test_check_on_an_empty_database_raises_schema_not_ready_saying_run_pgqueue_migrate(
    empty_database_url: str,
) -> None:
    with pytest.raises(SchemaNotReady, match="pgqueue migrate"):
        migrate.check(empty_database_url)


def test_check_passes_once_the_database_is_upgraded(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)

    migrate.check(empty_database_url)  # does not raise


def test_check_on_a_database_at_another_revision_names_both_and_says_run_pgqueue_migrate(
    database_url: str,
) -> None:
    execute(database_url, "UPDATE pgqueue.pgqueue_alembic_version SET version_num = '0000_old'")

    with pytest.raises(SchemaNotReady, match="pgqueue migrate") as excinfo:
        migrate.check(database_url)

    assert "0000_old" in str(excinfo.value)
    assert migrate.head() in str(excinfo.value)


# --- an application's own alembic runs pgqueue's revisions -------------------------------------

USER_ENV_PY = """\
from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""


def make_user_alembic_project(root: Path, url: str, upgrade_body: str) -> Config:
    """An application's alembic project with one revision; returns its Config."""
    versions = root / "app_migrations" / "versions"
    versions.mkdir(parents=True)
    (root / "app_migrations" / "env.py").write_text(USER_ENV_PY)
    (versions / "app_0001_add_pgqueue.py").write_text(
        textwrap.dedent('''\
            """The application's first revision: its own table, then pgqueue's schema."""
            import sqlalchemy as sa
            from alembic import op

            import pgqueue.migrate

            revision = "app_0001"
            down_revision = None
            branch_labels = None
            depends_on = None


            def upgrade():
            {body}


            def downgrade():
                pgqueue.migrate.downgrade(op.get_bind())
            ''').format(body=textwrap.indent(textwrap.dedent(upgrade_body), "    "))
    )
    ini = root / "alembic.ini"
    ini.write_text("[alembic]\nscript_location = %(here)s/app_migrations\n")
    cfg = Config(str(ini))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def test_an_apps_alembic_revision_calling_pgqueue_upgrade_builds_pgqueues_schema(
    empty_database_url: str, tmp_path: Path
) -> None:
    url = empty_database_url
    cfg = make_user_alembic_project(tmp_path, url, "pgqueue.migrate.upgrade(op.get_bind())\n")

    command.upgrade(cfg, "head")

    assert rows(url, "SELECT version_num FROM public.alembic_version") == [("app_0001",)]
    assert rows(url, "SELECT version_num FROM pgqueue.pgqueue_alembic_version") == [
        (migrate.head(),)
    ]
    assert_matches_snapshot(url)


def test_an_apps_alembic_revision_can_use_op_after_calling_pgqueue_upgrade(
    empty_database_url: str, tmp_path: Path
) -> None:
    url = empty_database_url
    cfg = make_user_alembic_project(
        tmp_path,
        url,
        """\
        op.create_table("widgets", sa.Column("id", sa.Integer, primary_key=True))
        pgqueue.migrate.upgrade(op.get_bind())
        op.create_table("gadgets", sa.Column("id", sa.Integer, primary_key=True))
        """,
    )

    command.upgrade(cfg, "head")

    assert regclass(url, "public.widgets") == "widgets"
    assert regclass(url, "public.gadgets") == "gadgets"
    assert migrate.current(url) == migrate.head()


def test_a_failed_apps_alembic_run_leaves_no_pgqueue_schema_behind(
    empty_database_url: str, tmp_path: Path
) -> None:
    # pgqueue's revisions run in the application's transaction: if the application's revision
    # fails afterwards, pgqueue's schema is rolled back with it.
    url = empty_database_url
    cfg = make_user_alembic_project(
        tmp_path,
        url,
        """\
        op.create_table("widgets", sa.Column("id", sa.Integer, primary_key=True))
        pgqueue.migrate.upgrade(op.get_bind())
        raise RuntimeError("the application's revision failed")
        """,
    )

    with pytest.raises(Exception) as excinfo:
        command.upgrade(cfg, "head")

    causes = []
    error: BaseException | None = excinfo.value
    while error is not None:
        causes.append(str(error))
        error = error.__context__
    assert any("the application's revision failed" in cause for cause in causes), causes

    assert regclass(url, "pgqueue.tasks") is None
    assert regclass(url, "pgqueue.pgqueue_alembic_version") is None
    assert regclass(url, "public.widgets") is None
    assert regclass(url, "public.alembic_version") is None


# --- the CLI -----------------------------------------------------------------------------------


def run_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_migrate_check_exits_1_on_an_empty_database_and_0_after_migrate(
    empty_database_url: str,
) -> None:
    url = empty_database_url

    behind = run_cli(url, "migrate", "--check")
    assert behind.returncode == 1, behind.stderr
    assert "pgqueue migrate" in behind.stdout
    assert regclass(url, "pgqueue.tasks") is None  # --check only reports

    migrated = run_cli(url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert migrate.head() in migrated.stdout

    up_to_date = run_cli(url, "migrate", "--check")
    assert up_to_date.returncode == 0, up_to_date.stderr
    assert "up to date" in up_to_date.stdout
    assert_matches_snapshot(url)


def test_cli_migrate_json_output_parses_and_reports_the_revisions(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    head = migrate.head()

    behind = run_cli(url, "--json", "migrate", "--check")
    assert behind.returncode == 1, behind.stderr
    assert json.loads(behind.stdout) == {"current": None, "head": head, "up_to_date": False}

    migrated = run_cli(url, "--json", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    report = json.loads(migrated.stdout)
    assert report["previous"] is None
    assert report["current"] == head

    again = run_cli(url, "--json", "migrate")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["previous"] == head

    up_to_date = run_cli(url, "--json", "migrate", "--check")
    assert up_to_date.returncode == 0, up_to_date.stderr
    assert json.loads(up_to_date.stdout) == {"current": head, "head": head, "up_to_date": True}
