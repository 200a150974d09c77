"""Workers and the HTTP API run as a role that can do their work and nothing else.

Each test creates LOGIN roles of its own (CREATE ROLE is cluster-wide: names are unique per
test, and every role is dropped with DROP OWNED afterwards), gives the application role its
privileges with ``pgqueue grant`` run as the schema's owner, and then works as that role:
the library, the CLI, a real ``pgqueue worker`` process and the HTTP API must all work, and
every kind of DDL (and ``pgqueue migrate``) must fail with a permission error. Another test
runs the migrations as an owner role that is not a superuser, as docs/security.md says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from helpers import make_dead_letters
from private_server import find_bindir, private_server
from processes import BOOM_HANDLER, NOOP_HANDLERS, Worker, one_line_error, run_cli, wait_until
from psycopg import sql
from session_databases import database_name
from typer.testing import CliRunner

import pgqueue
from pgqueue import migrate, roles
from pgqueue.api import ApiSettings, create_app
from pgqueue.cli import app as cli_app
from pgqueue.models import TaskStatus
from pgqueue.registry import TaskRegistry
from pgqueue.worker.maintenance import Maintenance

PASSWORD = "app-pw-7c1e"  # the shared test server trusts 127.0.0.1, so it is not checked there
TOKEN = "lp-token-5b2d-3e9f1a7c5b0d2e4f6a8c"
runner = CliRunner()


# --- roles ---------------------------------------------------------------------------------------


def url_as(url: str, role: str, password: str = PASSWORD) -> str:
    """``url`` (a test database) logged in as ``role``."""
    parts = psycopg.conninfo.conninfo_to_dict(url)
    host = str(parts.get("host") or "127.0.0.1")
    port = str(parts.get("port") or "5432")
    user = f"{quote(role, safe='')}:{password}"
    if host.startswith("/"):  # a Unix socket directory (the embedded server)
        return f"postgresql://{user}@/{parts['dbname']}?host={host}&port={port}"
    return f"postgresql://{user}@{host}:{port}/{parts['dbname']}"


class Roles:
    """Roles made for one test, dropped at its end (with what they own and were granted, in
    every database the test registered)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.names: list[str] = []
        self.databases: list[str] = []

    def create(self, prefix: str, options: str = "LOGIN", name: str | None = None) -> str:
        name = name or f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} " + options + " PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(PASSWORD)
                )
            )
        self.names.append(name)
        return name

    def uses(self, database_url: str) -> None:
        self.databases.append(database_url)

    def drop_all(self) -> None:
        if not self.names:
            return
        idents = sql.SQL(", ").join(sql.Identifier(n) for n in self.names)
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                (self.names,),
            )
            existing = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        for url in self.databases:
            if psycopg.conninfo.conninfo_to_dict(url)["dbname"] not in existing:
                continue
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(idents))
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            for name in self.names:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def make_roles(server_url: str) -> Iterator[Roles]:
    made = Roles(server_url)
    try:
        yield made
    finally:
        made.drop_all()


def invoke(url: str, *args: str) -> Any:
    return runner.invoke(cli_app, ["--database-url", url, *args])


def ok(url: str, *args: str) -> str:
    result = invoke(url, *args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return str(result.stdout)


@pytest.fixture
def app_role(make_roles: Roles, database_url: str) -> str:
    """A LOGIN role granted with ``pgqueue grant``, run as the schema's owner."""
    make_roles.uses(database_url)
    role = make_roles.create("pgqueue_app")
    out = ok(database_url, "grant", role)
    assert f"granted role {role!r}" in out
    return role


@pytest.fixture
def app_url(database_url: str, app_role: str) -> str:
    return url_as(database_url, app_role)


@pytest.fixture
def app_conn(app_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(app_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() != ("postgres",)
        yield conn


def server_version(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version


def privileges(conn: psycopg.Connection[Any], role: str) -> set[tuple[str, str]]:
    """Every privilege ``role`` holds directly on the pgqueue schema and the objects in it."""
    rows = conn.execute(
        """
        SELECT 'schema ' || n.nspname, p.privilege_type
          FROM pg_namespace AS n, aclexplode(n.nspacl) AS p
         WHERE n.nspname = 'pgqueue' AND p.grantee = %(role)s::regrole
        UNION ALL
        SELECT c.relname, p.privilege_type
          FROM pg_class AS c, aclexplode(c.relacl) AS p
         WHERE c.relnamespace = 'pgqueue'::regnamespace AND p.grantee = %(role)s::regrole
        UNION ALL
        SELECT f.proname, p.privilege_type
          FROM pg_proc AS f, aclexplode(f.proacl) AS p
         WHERE f.pronamespace = 'pgqueue'::regnamespace AND p.grantee = %(role)s::regrole
        """,
        {"role": sql.Identifier(role).as_string(conn)},
    ).fetchall()
    return {(r[0], r[1]) for r in rows}


def expected_privileges(version: int) -> set[tuple[str, str]]:
    expected = {
        ("schema pgqueue", "USAGE"),
        ("tasks", "SELECT"),
        ("tasks", "INSERT"),
        ("tasks", "UPDATE"),
        ("tasks", "DELETE"),
        ("queues", "SELECT"),
        ("queues", "INSERT"),
        ("queues", "UPDATE"),
        ("queues", "DELETE"),
        ("schedules", "SELECT"),
        ("schedules", "INSERT"),
        ("schedules", "UPDATE"),
        ("limits", "SELECT"),
        ("limits", "INSERT"),
        ("limits", "UPDATE"),
        ("limits", "DELETE"),
        ("lease_starts", "SELECT"),
        ("lease_starts", "INSERT"),
        ("lease_starts", "UPDATE"),
        ("lease_starts", "DELETE"),
        ("task_types", "SELECT"),
        ("task_types", "INSERT"),
        ("task_types", "UPDATE"),
        ("task_waiters", "SELECT"),
        ("task_waiters", "INSERT"),
        ("task_waiters", "DELETE"),
        ("task_dependencies", "SELECT"),
        ("task_dependencies", "INSERT"),
        ("task_dependencies", "UPDATE"),
        ("task_dependencies", "DELETE"),
        ("task_dependency_buckets", "SELECT"),
        ("task_dependency_buckets", "INSERT"),
        ("task_dependency_buckets", "UPDATE"),
        ("task_dependency_buckets", "DELETE"),
        ("queue_depth", "SELECT"),
        ("dead_letters", "SELECT"),
        ("running_tasks", "SELECT"),
        ("backlog", "SELECT"),
        ("workflows", "SELECT"),
        ("pgqueue_alembic_version", "SELECT"),
        ("retry_delay", "EXECUTE"),
        ("priority_name", "EXECUTE"),
        ("task_waiters_wake", "EXECUTE"),
        ("task_dependants_settle", "EXECUTE"),
        ("task_dependants_revive", "EXECUTE"),
    }
    if version >= 170000:
        expected.add(("tasks", "MAINTAIN"))
    return expected


def flush_stats(admin: psycopg.Connection[Any]) -> None:
    admin.execute("SELECT pg_stat_force_next_flush()")
    admin.execute("SELECT 1")


def changed_since_analyze(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT n_mod_since_analyze FROM pg_stat_user_tables"
        " WHERE relid = 'pgqueue.tasks'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def analyze_count(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables"
        " WHERE relid = 'pgqueue.tasks'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def pgqueue_events() -> Iterator[list[logging.LogRecord]]:
    """pgqueue's log records, whatever an earlier test did to the logger's propagation."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("pgqueue")
    handler = Collect(logging.DEBUG)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def event_names(records: list[logging.LogRecord]) -> list[str]:
    return [str(getattr(r, "pgqueue_event", r.getMessage())) for r in records]


# --- pgqueue grant -------------------------------------------------------------------------------


def test_grant_print_is_the_sql_file_for_the_role_and_needs_no_database():
    # An unreachable URL: --print never connects.
    out = ok("postgresql://postgres:pw@127.0.0.1:1/x", "grant", "pgqueue_app", "--print")

    assert 'GRANT USAGE ON SCHEMA pgqueue TO "pgqueue_app";' in out
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.tasks TO "pgqueue_app";' in out
    assert "TRUNCATE ON" not in out and "GRANT ALL" not in out and "CREATE ON" not in out
    statements = roles.templates()
    assert len(statements) >= 6
    for template in statements:  # every statement comes with its reason
        assert template.why, template.text
        assert template.text.rstrip().endswith(";")
    # JSON: the statements alone, in order, the role quoted.
    data = json.loads(ok("postgresql://x@127.0.0.1:1/x", "--json", "grant", 'a "b"', "--print"))
    assert data["role"] == 'a "b"'
    assert data["statements"][0] == 'GRANT USAGE ON SCHEMA pgqueue TO "a ""b""";'


@pytest.mark.parametrize(
    "role", ["", "public", "PUBLIC", "none", "x" * 64, "\u00e9" * 32, "a\x00b"]
)
def test_grant_refuses_public_and_names_postgresql_would_not_keep(role):
    with pytest.raises(pgqueue.ValidationError) as caught:
        roles.grant_statements(role)

    assert caught.value.field == "role"


def test_a_refused_role_name_is_a_one_line_usage_error_before_any_connection():
    proc = run_cli("postgresql://postgres:pw@127.0.0.1:1/x", "grant", "public")

    line = one_line_error(proc, 2)
    assert "PUBLIC would mean every role" in line and "cannot connect" not in line


def test_grant_gives_exactly_the_documented_privileges(database_url, conn, app_role):
    assert privileges(conn, app_role) == expected_privileges(server_version(conn))
    # Granting again changes nothing.
    ok(database_url, "grant", app_role)
    assert privileges(conn, app_role) == expected_privileges(server_version(conn))


def test_grant_json_says_what_was_run_and_whether_maintain_was_granted(
    database_url, conn, make_roles
):
    make_roles.uses(database_url)
    role = make_roles.create("pgqueue_app")

    data = json.loads(ok(database_url, "--json", "grant", role))

    assert data["role"] == role
    assert data["maintain"] is (server_version(conn) >= 170000)
    assert data["statements"] == [s.as_string(conn) for s in roles.grant_statements(role)]


def test_the_sql_file_run_by_psql_grants_the_same_as_pgqueue_grant(database_url, conn, make_roles):
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("no psql binary on PATH to run pgqueue/sql/grants.sql with")
    make_roles.uses(database_url)
    by_psql = make_roles.create("pgqueue_psql")
    by_cli = make_roles.create("pgqueue_cli")
    sql_file = Path(roles.__file__).parent / "sql" / "grants.sql"

    proc = subprocess.run(
        [psql, "-X", "-q", "-d", database_url, "-v", f"app_role={by_psql}", "-f", str(sql_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    ok(database_url, "grant", by_cli)

    assert privileges(conn, by_psql) == privileges(conn, by_cli)
    assert privileges(conn, by_psql) == expected_privileges(server_version(conn))


def test_a_hostile_role_name_is_quoted_as_one_identifier(database_url, conn, make_roles):
    make_roles.uses(database_url)
    role = make_roles.create("", name=f'app"; DROP TABLE pgqueue.tasks; -- {uuid.uuid4().hex[:6]}')

    ok(database_url, "grant", role)

    assert conn.execute("SELECT to_regclass('pgqueue.tasks')").fetchone() == ("pgqueue.tasks",)
    assert privileges(conn, role) == expected_privileges(server_version(conn))
    with psycopg.connect(url_as(database_url, role), autocommit=True) as app:
        assert pgqueue.enqueue(app, "quoted", {}).created


def test_grant_to_a_role_that_does_not_exist_says_to_create_it(database_url):
    proc = run_cli(database_url, "grant", f"no_such_role_{uuid.uuid4().hex[:8]}")

    line = one_line_error(proc)
    assert "does not exist" in line and "CREATE ROLE" in line


def test_grant_on_a_database_without_the_schema_says_to_migrate(empty_database_url):
    proc = run_cli(empty_database_url, "grant", "pgqueue_app")

    assert "pgqueue migrate" in one_line_error(proc)


def test_the_app_role_cannot_grant_to_anyone(database_url, conn, app_role, app_url, make_roles):
    other = make_roles.create("pgqueue_other")

    # PostgreSQL only warns when a GRANT grants nothing; pgqueue grant makes it an error.
    line = one_line_error(run_cli(app_url, "grant", other))
    assert "schema's owner" in line and PASSWORD not in line
    with psycopg.connect(app_url, autocommit=True) as app:
        app.execute("GRANT ALL ON pgqueue.tasks TO PUBLIC")  # warns, grants nothing
    assert privileges(conn, other) == set()
    public = conn.execute(
        "SELECT count(*) FROM pg_class AS c, aclexplode(c.relacl) AS p"
        " WHERE c.oid = 'pgqueue.tasks'::regclass AND p.grantee = 0"
    ).fetchone()
    assert public == (0,)


# --- what the app role can do --------------------------------------------------------------------


def test_the_app_role_runs_every_library_operation(app_conn, conn):
    later = datetime.now(UTC) + timedelta(days=30)
    # Enqueue: plain, with an idempotency key (twice), in bulk (COPY) and in bulk with keys.
    first = pgqueue.enqueue(app_conn, "work", {"n": 1})
    keyed = pgqueue.enqueue(app_conn, "work", {"n": 2}, idempotency_key="k-1")
    assert not pgqueue.enqueue(app_conn, "work", {}, idempotency_key="k-1").created
    pgqueue.enqueue_many(app_conn, [{"type": "bulk", "payload": {"i": i}} for i in range(50)])
    pgqueue.enqueue_many(
        app_conn, [{"type": "bulk", "idempotency_key": f"b-{i}"} for i in range(3)]
    )
    # Claim, heartbeat, complete, complete_many, fail (retried and dead), release.
    claimed = pgqueue.claim(app_conn, ["default"], limit=10, worker_id="app")
    assert len(claimed) == 10
    held = pgqueue.heartbeat(app_conn, [t.lease for t in claimed])
    assert set(held.held) == {t.id for t in claimed}
    pgqueue.complete(app_conn, claimed[0].lease, {"ok": True})
    assert pgqueue.complete_many(app_conn, [(t.lease, None) for t in claimed[1:4]]) == {
        t.id for t in claimed[1:4]
    }
    retried = pgqueue.fail(app_conn, claimed[4].lease, "ValueError: again")
    assert retried.outcome is pgqueue.FailOutcome.RETRYING
    dead = pgqueue.enqueue(app_conn, "dies", {}, queue="d", max_attempts=1).task
    (dying,) = pgqueue.claim(app_conn, ["d"], limit=1, worker_id="app")
    assert pgqueue.fail(app_conn, dying.lease, "boom").outcome is pgqueue.FailOutcome.DEAD
    assert pgqueue.release(app_conn, [claimed[5].lease]) == {claimed[5].id}
    # The expired-lease sweep, with the clock moved past the leases.
    swept = pgqueue.sweep_expired(app_conn, now=datetime.now(UTC) + timedelta(hours=1))
    assert {t.id for t in claimed[6:]} <= set(swept.requeued)
    # Cancel (queued and running), replay and discard dead letters, inspect, prune.
    queued = pgqueue.enqueue(app_conn, "later", {}, queue="q").id
    assert pgqueue.cancel(app_conn, queued).status is TaskStatus.CANCELLED
    assert pgqueue.get_task(app_conn, first.id).status is TaskStatus.COMPLETED
    pgqueue.enqueue(app_conn, "slow", {}, queue="r")
    (running,) = pgqueue.claim(app_conn, ["r"], limit=1, worker_id="app")
    assert pgqueue.cancel(app_conn, running.id).cancel_requested
    assert pgqueue.replay(app_conn, [dead.id]) == [dead.id]
    ids = make_dead_letters(app_conn, 2, queue="dl")
    assert sorted(pgqueue.discard(app_conn, ids)) == sorted(ids)
    assert pgqueue.get_task(app_conn, keyed.id).idempotency_key == "k-1"
    assert pgqueue.list_tasks(app_conn, status="completed", limit=100)
    assert pgqueue.queue_stats(app_conn)
    assert pgqueue.throughput(app_conn, window_seconds=600)
    assert pgqueue.prune(app_conn, completed_after=1, dead_after=1, now=later) >= 4
    # The DBA views and the schema check.
    for view in ("queue_depth", "dead_letters", "running_tasks", "workflows"):
        app_conn.execute(sql.SQL("SELECT * FROM pgqueue.{}").format(sql.Identifier(view)))
    migrate.check(_url_of(app_conn))
    # Nothing of this needed the owner: the rows are there for the superuser to see.
    assert conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0] > 0


def _url_of(conn: psycopg.Connection[Any]) -> str:
    info = conn.info
    return url_as(
        f"postgresql://?host={info.host}&port={info.port}&dbname={info.dbname}", info.user
    )


def test_the_app_role_listens_and_is_notified_of_enqueues(app_url):
    with (
        psycopg.connect(app_url, autocommit=True) as listener,
        psycopg.connect(app_url, autocommit=True) as producer,
    ):
        listener.execute("LISTEN pgqueue")
        pgqueue.enqueue(producer, "wake", {}, queue="notify-me")
        notes = [n.payload for n in listener.notifies(timeout=60, stop_after=1)]

    assert notes == ["notify-me"]


def test_the_app_role_runs_the_operator_commands(app_url, app_conn):
    data = json.loads(ok(app_url, "--json", "enqueue", "cli", "--payload", '{"a": 1}'))
    task_id = data["task_id"]
    assert json.loads(ok(app_url, "--json", "status", task_id))["status"] == "queued"
    assert task_id in ok(app_url, "list")
    assert "default" in ok(app_url, "stats")
    assert "cancelled" in ok(app_url, "cancel", task_id)
    dead = make_dead_letters(app_conn, 3, queue="cli-dead")
    assert str(dead[0]) in ok(app_url, "dlq", "list")
    assert "boom" in ok(app_url, "dlq", "show", str(dead[0]))
    assert "replayed 1 dead letter" in ok(app_url, "dlq", "replay", str(dead[0]))
    assert "discarded 2 dead letters" in ok(app_url, "dlq", "discard", "--all", "--yes")
    assert json.loads(ok(app_url, "--json", "migrate", "--check"))["up_to_date"] is True
    # The queue's and the limits' settings: every command that writes them.
    assert "paused" in ok(app_url, "queue", "pause", "cli-q", "--create")
    assert "cli-q" in ok(app_url, "queue", "resume", "cli-q")
    ok(app_url, "queue", "retention", "cli-q", "--completed", "1h")
    assert "cli-q" in ok(app_url, "queue", "list")
    assert "settings removed" in ok(app_url, "queue", "remove", "cli-q")
    ok(app_url, "limit", "set", "--type", "cli", "--max-running", "2")
    ok(app_url, "limit", "set", "--queue", "cli-q", "--rate", "5", "--per", "1s")
    assert "cli-q" in ok(app_url, "limit", "list")
    assert "limit removed" in ok(app_url, "limit", "clear", "--type", "cli")
    assert "limit removed" in ok(app_url, "limit", "clear", "--queue", "cli-q")


HANDLERS = (
    NOOP_HANDLERS
    + BOOM_HANDLER
    + """

@tasks.handler("in_tx")
def in_tx(payload, ctx):
    # A handler's own connection, committed with the task's completion.
    (n,) = ctx.connection.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    return {"seen": n}


@tasks.handler("in_tx_async")
async def in_tx_async(payload, ctx):
    conn = await ctx.aconnection()
    cur = await conn.execute("SELECT current_user")
    return {"user": (await cur.fetchone())[0]}
"""
)


@pytest.mark.slow
def test_a_worker_process_as_the_app_role_drains_sweeps_and_reports_analyze_once(
    app_url, app_role, app_conn, conn, tmp_path
):
    # Autovacuum off for this table, so only the worker could analyze it (deterministic).
    conn.execute("ALTER TABLE pgqueue.tasks SET (autovacuum_enabled = off)")
    # A burst big enough for maintenance to want an ANALYZE (>= 1000 changed rows)...
    # (on a connection of its own: closing it publishes its statistics at once)
    with psycopg.connect(app_url, autocommit=True) as burst:
        pgqueue.enqueue_many(burst, [{"type": "noop", "payload": {"i": i}} for i in range(1200)])
    others = [pgqueue.enqueue(app_conn, kind, {}).id for kind in ("boom", "in_tx", "in_tx_async")]
    # ...and a task whose worker "died": its 1 s lease expires and the sweep must requeue it.
    orphan = pgqueue.enqueue(app_conn, "noop", {}, queue="orphans").id
    pgqueue.claim(app_conn, ["orphans"], limit=1, worker_id="dead-worker", lease_seconds=1)
    wait_until(lambda: (flush_stats(conn), changed_since_analyze(conn))[1] >= 1200, 15, "stats")
    before = analyze_count(conn)
    (tmp_path / "lp_handlers.py").write_text(HANDLERS)
    log = tmp_path / "worker.log"
    worker = Worker(
        app_url,
        tmp_path,
        "lp_handlers:tasks",
        *("--queue", "default", "--queue", "orphans", "--concurrency", "50"),
        *("--sweep-interval", "0.2", "--log-format", "json", "--lease-seconds", "5"),
        log=log,
    )
    try:

        def settled() -> bool:
            worker.alive()
            (left,) = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE status IN ('queued', 'running')"
            ).fetchone()
            return left == 0

        wait_until(settled, 60, "the worker to settle every task")
        # Two more maintenance rounds after the last task, each looking at the statistics
        # (still stale where ANALYZE was refused) before it sweeps: each round sweeps a lease
        # that expired after the previous round's sweep.
        for n in (1, 2):
            probe = pgqueue.enqueue(app_conn, "noop", {}, queue="probes").id  # no worker's queue
            pgqueue.claim(app_conn, ["probes"], limit=1, worker_id="dead-worker", lease_seconds=1)
            wait_until(
                lambda probe=probe: (
                    worker.alive() and pgqueue.get_task(conn, probe).status is TaskStatus.QUEUED
                ),
                30,
                f"maintenance round {n} after the last task to sweep an expired lease",
            )
    finally:
        code = worker.stop()
    text = log.read_text()
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    names = [e["event"] for e in events]
    text = "\n".join(json.dumps(e) for e in events if not e["event"].startswith("task."))

    assert code == 0, text
    assert pgqueue.get_task(conn, others[0]).status is TaskStatus.FAILED
    assert pgqueue.get_task(conn, others[1]).result == {"seen": 1204}
    assert pgqueue.get_task(conn, others[2]).result == {"user": app_role}
    swept = pgqueue.get_task(conn, orphan)
    assert (swept.status, swept.attempts) == (TaskStatus.COMPLETED, 2)
    assert "task.lease_expired" in names
    for bad in ("maintenance.error", "worker.database_error", "worker.internal_error", "log"):
        assert bad not in names, [e for e in events if e["event"] == bad]
    assert [e for e in events if e["level"] == "error"] == [
        e for e in events if e["event"] == "task.dead"
    ]
    if server_version(conn) >= 170000:  # MAINTAIN was granted: the worker analyzes
        assert "maintenance.analyze" in names, text
        assert "maintenance.analyze_not_permitted" not in names
        assert analyze_count(conn) > before
    else:  # it may not: said once, never claimed, never retried within the run
        assert names.count("maintenance.analyze_not_permitted") == 1, text
        assert "maintenance.analyze" not in names, text
        assert analyze_count(conn) == before


def test_maintenance_as_the_app_role_reports_a_refused_analyze_once(
    app_url, app_conn, conn, pgqueue_events
):
    with psycopg.connect(app_url, autocommit=True) as burst:  # closed: statistics published
        pgqueue.enqueue_many(burst, [{"type": "t"}] * 1500)
    wait_until(lambda: (flush_stats(conn), changed_since_analyze(conn))[1] >= 1500, 15, "stats")
    before = analyze_count(conn)
    maintenance = Maintenance()

    async def twice() -> list[int]:
        async with await psycopg.AsyncConnection.connect(app_url, autocommit=True) as aconn:
            return [await maintenance.analyze_once(aconn) for _ in range(3)]

    results = asyncio.run(twice())
    names = event_names(pgqueue_events)

    if server_version(conn) >= 170000:
        assert results[0] >= 1500 and names.count("maintenance.analyze") == 1
        assert analyze_count(conn) == before + 1
    else:
        assert results == [0, 0, 0]
        assert names.count("maintenance.analyze_not_permitted") == 1, names
        assert "maintenance.analyze" not in names
        (record,) = [r for r in pgqueue_events if "not_permitted" in r.getMessage()]
        assert record.levelno == logging.WARNING
        assert analyze_count(conn) == before


def two_step_workflow(conn: psycopg.Connection[Any]) -> str:
    """The id of a workflow of two tasks, the second waiting for the first."""
    tasks = TaskRegistry()

    @tasks.task(name="step")
    def step(x: int) -> int:
        return x

    return str(pgqueue.chain(step.s(1), step.s()).enqueue(conn).id)


def test_the_api_as_the_app_role_serves_every_endpoint(app_url, app_conn):
    settings = ApiSettings(database_url=app_url, tokens=frozenset({TOKEN}))
    dead = make_dead_letters(app_conn, 3, queue="api-dead")
    workflow = two_step_workflow(app_conn)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def exercise() -> dict[str, int]:
        app = create_app(settings)
        codes: dict[str, int] = {}
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api", headers=headers
            ) as client,
        ):

            async def call(name: str, method: str, path: str, body: Any = None) -> Any:
                response = await client.request(method, path, json=body)
                codes[name] = response.status_code
                return response.json() if "json" in response.headers["content-type"] else None

            task = await call(
                "submit", "POST", "/api/v1/tasks", {"type": "x", "idempotency_key": "i"}
            )
            await call(
                "submit_again", "POST", "/api/v1/tasks", {"type": "x", "idempotency_key": "i"}
            )
            await call("get", "GET", f"/api/v1/tasks/{task['task_id']}")
            await call("list", "GET", "/api/v1/tasks?limit=5")
            await call("cancel", "DELETE", f"/api/v1/tasks/{task['task_id']}")
            await call("dead_letters", "GET", "/api/v1/dead-letters")
            await call("replay_one", "POST", f"/api/v1/dead-letters/{dead[0]}/replay")
            await call("discard_one", "DELETE", f"/api/v1/dead-letters/{dead[1]}")
            await call("replay_many", "POST", "/api/v1/dead-letters/replay", {"all": True})
            await call("discard_many", "POST", "/api/v1/dead-letters/discard", {"all": True})
            await call("count_dead_letters", "GET", "/api/v1/dead-letters/count")
            await call("schedules", "GET", "/api/v1/schedules")
            await call("queues", "GET", "/api/v1/queues")
            await call("pause", "POST", "/api/v1/queues/api-q/pause?create=true")
            await call("resume", "POST", "/api/v1/queues/api-q/resume")
            await call(
                "retention", "PUT", "/api/v1/queues/api-q/retention", {"completed_seconds": 60}
            )
            await call("remove_queue", "DELETE", "/api/v1/queues/api-q")
            await call("set_limit", "PUT", "/api/v1/limits/type/x", {"max_running": 2})
            await call("set_queue_limit", "PUT", "/api/v1/limits/queue/api-q", {"rate": 5})
            await call("limits", "GET", "/api/v1/limits")
            await call("clear_limit", "DELETE", "/api/v1/limits/type/x")
            await call("clear_queue_limit", "DELETE", "/api/v1/limits/queue/api-q")
            await call("workflow", "GET", f"/api/v1/workflows/{workflow}")
            await call("cancel_workflow", "DELETE", f"/api/v1/workflows/{workflow}")
            await call("stats", "GET", "/api/v1/stats")
            await call("throughput_series", "GET", "/api/v1/throughput/series")
            await call("failures", "GET", "/api/v1/failures")
            await call("metrics", "GET", "/metrics")
            ready = await call("readyz", "GET", "/readyz")
            assert ready["status"] == "ready", ready
        return codes

    codes = asyncio.run(exercise())

    assert codes == {
        "submit": 202,
        "submit_again": 200,
        "get": 200,
        "list": 200,
        "cancel": 200,
        "dead_letters": 200,
        "replay_one": 200,
        "discard_one": 200,
        "replay_many": 200,
        "discard_many": 200,
        "count_dead_letters": 200,
        "schedules": 200,
        "queues": 200,
        "pause": 200,
        "resume": 200,
        "retention": 200,
        "remove_queue": 200,
        "set_limit": 200,
        "set_queue_limit": 200,
        "limits": 200,
        "clear_limit": 200,
        "clear_queue_limit": 200,
        "workflow": 200,
        "cancel_workflow": 200,
        "stats": 200,
        "throughput_series": 200,
        "failures": 200,
        "metrics": 200,
        "readyz": 200,
    }


def test_a_privilege_the_app_role_lacks_is_a_json_503_that_says_to_run_the_grants(
    app_url, app_role, conn
):
    # A role granted by an older pgqueue, or a DBA's revoke: the write is refused.
    conn.execute(
        sql.SQL("REVOKE DELETE ON pgqueue.limits FROM {}").format(sql.Identifier(app_role))
    )
    settings = ApiSettings(database_url=app_url, tokens=frozenset({TOKEN}))

    async def clear() -> httpx.Response:
        app = create_app(settings)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                base_url="http://api",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as client,
        ):
            await client.put("/api/v1/limits/type/t", json={"max_running": 1})
            return await client.delete("/api/v1/limits/type/t")

    response = asyncio.run(clear())

    assert response.status_code == 503, response.text
    body = response.json()
    assert body["error"] == "database_permission_denied"
    assert "permission denied for table limits" in body["message"]
    assert "pgqueue grant" in body["message"]


def test_a_privilege_the_app_role_lacks_is_one_line_from_the_cli_that_says_to_run_the_grants(
    app_url, app_role, conn
):
    conn.execute(
        sql.SQL("REVOKE DELETE ON pgqueue.queues FROM {}").format(sql.Identifier(app_role))
    )
    ok(app_url, "queue", "pause", "q", "--create")

    line = one_line_error(run_cli(app_url, "queue", "remove", "q"))

    assert "permission denied for table queues" in line and "pgqueue grant" in line, line
    assert "--debug" not in line and PASSWORD not in line


def test_any_command_refused_for_want_of_a_privilege_says_to_run_the_grants(
    app_url, app_role, conn
):
    conn.execute(sql.SQL("REVOKE INSERT ON pgqueue.tasks FROM {}").format(sql.Identifier(app_role)))

    result = run_cli(app_url, "enqueue", "t", "--payload", "{}", "--json")

    assert result.returncode == 1, result.stderr
    error = json.loads(result.stderr)
    assert error["error"] == "permission_denied", error
    assert "permission denied for table tasks" in error["message"], error
    assert "pgqueue grant" in error["message"] and PASSWORD not in result.stderr


def test_with_execute_revoked_from_public_the_grant_still_covers_the_functions(
    database_url, conn, app_url, app_conn
):
    # A hardened server: functions are not executable by PUBLIC.
    conn.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgqueue FROM PUBLIC")

    pgqueue.enqueue(app_conn, "t", {}, max_attempts=2)
    (task,) = pgqueue.claim(app_conn, ["default"], limit=1, worker_id="app")
    assert pgqueue.fail(app_conn, task.lease, "again").outcome is pgqueue.FailOutcome.RETRYING
    assert pgqueue.queue_stats(app_conn)  # the view calls priority_name


# --- what the app role cannot do -----------------------------------------------------------------

DDL = {
    "create table": "CREATE TABLE pgqueue.evil (id int)",
    "create table elsewhere in the schema": "CREATE TABLE pgqueue.tasks_copy AS SELECT 1 AS x",
    "create index": "CREATE INDEX evil_idx ON pgqueue.tasks (type)",
    "alter table": "ALTER TABLE pgqueue.tasks ADD COLUMN evil int",
    "alter table settings": "ALTER TABLE pgqueue.tasks SET (autovacuum_enabled = off)",
    "alter owner": "ALTER TABLE pgqueue.tasks OWNER TO CURRENT_USER",
    "drop table": "DROP TABLE pgqueue.tasks",
    "truncate": "TRUNCATE pgqueue.tasks",
    "create trigger": (
        "CREATE TRIGGER evil BEFORE UPDATE ON pgqueue.tasks FOR EACH ROW"
        " EXECUTE FUNCTION suppress_redundant_updates_trigger()"
    ),
    "replace view": "CREATE OR REPLACE VIEW pgqueue.queue_depth AS SELECT 1 AS x",
    "drop view": "DROP VIEW pgqueue.dead_letters",
    "create function": "CREATE FUNCTION pgqueue.evil() RETURNS int LANGUAGE sql RETURN 1",
    "drop function": "DROP FUNCTION pgqueue.priority_name(smallint)",
    "comment": "COMMENT ON TABLE pgqueue.tasks IS 'mine'",
    "create schema": "CREATE SCHEMA evil",
    "write the schema revision": "UPDATE pgqueue.pgqueue_alembic_version SET version_num = 'x'",
    "delete the schema revision": "DELETE FROM pgqueue.pgqueue_alembic_version",
}


def test_every_kind_of_ddl_fails_with_a_permission_error(app_conn, conn):
    failures = {}
    for what, statement in DDL.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            app_conn.execute(statement)
        failures[what] = caught.value.sqlstate

    assert set(failures.values()) == {"42501"}
    # Nothing changed.
    assert conn.execute("SELECT to_regclass('pgqueue.evil')").fetchone() == (None,)
    assert conn.execute(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgqueue' AND indexname = 'evil_idx'"
    ).fetchone() == (0,)
    assert migrate.current(_url_of(app_conn)) == migrate.head()


def test_pgqueue_migrate_as_an_app_role_cannot_create_the_schema(empty_database_url, make_roles):
    make_roles.uses(empty_database_url)
    app = make_roles.create("pgqueue_app")
    proc = run_cli(url_as(empty_database_url, app), "migrate")

    line = one_line_error(proc)
    assert "permission denied" in line, line
    assert PASSWORD not in proc.stdout + proc.stderr
    with psycopg.connect(empty_database_url) as admin:
        assert admin.execute("SELECT to_regnamespace('pgqueue')").fetchone() == (None,)


def test_pgqueue_migrate_as_the_app_role_at_head_changes_nothing(app_url, conn):
    """Nothing to apply is not DDL: the app role may run it (a deploy step that always runs
    `pgqueue migrate` works with either role once the owner has migrated)."""
    before = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'pgqueue'::regnamespace"
    ).fetchone()
    proc = run_cli(app_url, "migrate")

    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    after = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'pgqueue'::regnamespace"
    ).fetchone()
    assert before == after


# --- the owner role ------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_owner_role_that_is_not_superuser_migrates_and_grants(empty_database_url, make_roles):
    make_roles.uses(empty_database_url)
    owner = make_roles.create("pgqueue_owner", "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    app = make_roles.create("pgqueue_app")
    owner_url = url_as(empty_database_url, owner)
    app_url = url_as(empty_database_url, app)
    dbname = psycopg.conninfo.conninfo_to_dict(empty_database_url)["dbname"]

    # Without CREATE on the database the owner cannot create the schema.
    refused = invoke(owner_url, "migrate")
    assert refused.exit_code != 0 and "permission denied" in str(refused.exception)
    # As documented: the DBA lets the owner role create schemas in the application's database.
    with psycopg.connect(empty_database_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(owner)
            )
        )
    assert "pgqueue schema at" in ok(owner_url, "migrate")
    # `grant` also takes the owner's URL after the command (the app's may be in the environment).
    result = runner.invoke(
        cli_app,
        ["grant", app, "--database-url", owner_url],
        env={"PGQUEUE_DATABASE_URL": app_url},
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"granted role {app!r}" in result.stdout and ":***@" in result.stdout

    with psycopg.connect(empty_database_url, autocommit=True) as admin:
        owners = admin.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
            " WHERE relnamespace = 'pgqueue'::regnamespace"
            " UNION SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pgqueue'"
        ).fetchall()
        assert owners == [(owner,)]
        assert privileges(admin, app) == expected_privileges(admin.info.server_version)
    with psycopg.connect(app_url, autocommit=True) as app_conn:
        pgqueue.enqueue(app_conn, "t", {"x": 1})
        (task,) = pgqueue.claim(app_conn, ["default"], limit=1, worker_id="app")
        pgqueue.complete(app_conn, task.lease, {"done": True})
        assert pgqueue.get_task(app_conn, task.id).status is TaskStatus.COMPLETED
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app_conn.execute("DROP TABLE pgqueue.tasks")
    # The owner may analyze its table, unlike the app role before PostgreSQL 17.
    with psycopg.connect(owner_url, autocommit=True) as owner_conn:
        warnings: list[str] = []
        owner_conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
        owner_conn.execute("ANALYZE pgqueue.tasks")
        assert warnings == []


def test_an_owner_given_the_schema_by_the_dba_migrates_without_create_on_the_database(
    empty_database_url, make_roles
):
    """The documented minimal setup: the DBA creates the schema for the owner role, which has
    no CREATE on the database; `pgqueue migrate` as that role goes to head."""
    make_roles.uses(empty_database_url)
    owner = make_roles.create("pgqueue_owner", "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    owner_url = url_as(empty_database_url, owner)
    with psycopg.connect(empty_database_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE SCHEMA pgqueue AUTHORIZATION {}").format(sql.Identifier(owner))
        )
        (may_create,) = admin.execute(
            "SELECT has_database_privilege(%s, current_database(), 'CREATE')", (owner,)
        ).fetchone()
        assert may_create is False

    assert "pgqueue schema at" in ok(owner_url, "migrate")

    assert migrate.current(owner_url) == migrate.head()
    with psycopg.connect(empty_database_url, autocommit=True) as admin:
        owners = admin.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
            " WHERE relnamespace = 'pgqueue'::regnamespace"
        ).fetchall()
        assert owners == [(owner,)]


# --- PostgreSQL 17 and newer: MAINTAIN -----------------------------------------------------------


@pytest.fixture(scope="module")
def pg17_server_url(server_url: str) -> Iterator[str]:
    """A server of version 17 or newer: the shared one if it is, else a private one."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        if conn.info.server_version >= 170000:
            yield server_url
            return
    bindir = find_bindir(min_version=17)
    if bindir is None:
        pytest.skip("no PostgreSQL 17+ binaries (MAINTAIN) here, and the shared server is older")
    with private_server(bindir) as server:
        yield server.admin_url()


def test_on_postgresql_17_the_app_role_is_granted_maintain_and_analyzes(pg17_server_url, tmp_path):
    name = database_name("t")
    role = f"pgqueue_app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg17_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)
            )
        )
    parts = psycopg.conninfo.conninfo_to_dict(pg17_server_url)
    parts["dbname"] = name
    db_url = "postgresql://?" + "&".join(f"{k}={v}" for k, v in parts.items())
    app_db_url = "postgresql://?" + "&".join(
        f"{k}={v}" for k, v in {**parts, "user": role, "password": PASSWORD}.items()
    )
    try:
        migrate.upgrade(db_url)
        data = json.loads(ok(db_url, "--json", "grant", role))
        assert data["maintain"] is True
        with psycopg.connect(db_url, autocommit=True) as admin:
            assert ("tasks", "MAINTAIN") in privileges(admin, role)
            admin.execute("ALTER TABLE pgqueue.tasks SET (autovacuum_enabled = off)")
        with psycopg.connect(app_db_url, autocommit=True) as burst:  # closed: stats published
            pgqueue.enqueue_many(burst, [{"type": "t"}] * 1500)
        with psycopg.connect(db_url, autocommit=True) as admin:
            wait_until(
                lambda: (flush_stats(admin), changed_since_analyze(admin))[1] >= 1500, 15, "stats"
            )
            before = analyze_count(admin)

        async def analyze() -> int:
            async with await psycopg.AsyncConnection.connect(app_db_url, autocommit=True) as a:
                return await Maintenance().analyze_once(a)

        assert asyncio.run(analyze()) >= 1500
        with psycopg.connect(db_url, autocommit=True) as admin:
            assert analyze_count(admin) == before + 1
    finally:
        with psycopg.connect(pg17_server_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
