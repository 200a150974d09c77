"""When the database is the problem: a schema behind head or missing, a connection killed in the
middle of an operation, a database URL that is malformed or points nowhere.

At each boundary the caller must learn exactly what is wrong - the library by a specific
exception (SchemaNotReady, DatabaseUnavailable, InvalidDatabaseURL), the CLI by one line and
exit code 1, the API by 503 (or by refusing to start) - never see a password, and never find a
partial batch or a changed task afterwards.

- The schema: a database migrated to head whose ``pgqueue.pgqueue_alembic_version`` is then set
  to a revision this pgqueue does not know ("0000_fake_old"), and a database with no pgqueue
  schema at all. The library checks the schema in ``pgqueue.Client`` (first use) and
  ``migrate.check``; the worker checks it before it starts; the API's ``/readyz`` compares the
  revision; a call on the caller's own connection does not check the revision (a missing
  table is still reported as SchemaNotReady).
- Connections killed with ``pg_terminate_backend`` from an admin connection while an operation
  is in flight. To kill it at a known point, not by timing, the operation is made to wait: on
  the unique index, for an idempotency key another transaction holds; or, for the middle of a
  COPY and between the batches of ``dlq replay --all``, on an advisory lock taken by a trigger
  this test adds to its own throwaway database.
- A per-key limit (``per_key_max_running``) that is not a count: negative, not whole, text,
  absurd, at the library, the CLI and the API, each refused naming the field or option and
  writing nothing (a limit holds every worker of the fleet).
- Database URLs: each malformed one at the library (Client), the CLI and the API (which must
  refuse to start); unreachable ones (a closed port) at the library and the CLI (the API's
  ``/readyz`` answer for an unreachable database is in test_api.py).

CLI commands run through the real entry point ``pgqueue.cli.main()`` in this process, except
where the process itself is the point (the worker, and ``dlq replay`` being killed: what a real
process prints on stderr). The API runs as ``create_app`` through httpx's ASGI transport, with
its lifespan. Where pgqueue misbehaves the test is ``xfail(strict=True, reason="BUG: ...")``.

Set ``PGQUEUE_BAD_INPUT_REPORT=DIR`` to have this module write what it observed as a markdown
table, ``DIR/failure-modes.md`` (docs/bad-input.md is made from it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from boundaries import Api, CliResult, Snapshot, code, run_main, shorten, snapshot, write_tables
from processes import wait_until

import pgqueue
from pgqueue import migrate
from pgqueue.api import ApiSettings

REPORT_ENV = "PGQUEUE_BAD_INPUT_REPORT"
FAKE_REVISION = "0000_fake_old"
SECRET = "cr3t"  # part of every password below; must never be printed
POLL = 0.005  # seconds between looks, waiting for a backend to reach the point it is killed at

ROWS: list[tuple[str, str, str, str, str]] = []  # (group, situation, library, CLI, HTTP)


def record(group: str, situation: str, library: str = "", cli_: str = "", http: str = "") -> None:
    ROWS.append((group, situation, library, cli_, http))


def bug(wrong: bool) -> str:
    """The table's mark for what the tests found wrong (xfail), from what was observed."""
    return "**BUG** " if wrong else ""


# --- helpers -------------------------------------------------------------------------------------


def one_line_error(result: CliResult, code: int = 1) -> str:
    """``result`` failed with ``code`` and said why in one line on stderr, nothing on stdout."""
    assert result.code == code, result
    assert "Traceback" not in result.stdout + result.stderr, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == "", result.stdout
    if lines[0].startswith("{"):  # under --json: one JSON document, the same exit code
        error = json.loads(lines[0])
        assert error["exit_code"] == code and error["error"], error
        return f"error: {error['message']}"
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


@contextlib.contextmanager
def running_api(url: str) -> Iterator[Api]:
    api = Api(ApiSettings(database_url=url))
    try:
        yield api
    finally:
        api.close()


def schema_exists(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regnamespace('pgqueue') IS NOT NULL").fetchone()
    return bool(row and row[0])


def seed(conn: psycopg.Connection[Any]) -> list[uuid.UUID]:
    """A few tasks that must come through every failure unchanged."""
    ids = [pgqueue.enqueue(conn, "existing", {"n": n}, queue="seed").id for n in range(3)]
    ids.append(pgqueue.enqueue(conn, "existing", {}, queue="seed", idempotency_key="seed-key").id)
    return ids


# --- databases -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(server_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A superuser connection to the server, apart from every connection under test."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def new_database(
    server_url: str, template_db: str, admin: psycopg.Connection[Any]
) -> Iterator[Callable[..., str]]:
    """Make databases for this module (migrated, or ``empty=True``); all dropped at its end."""
    made: list[str] = []

    def make(*, empty: bool = False) -> str:
        name = f"pgqueue_fm_{uuid.uuid4().hex[:12]}"
        template = "" if empty else f' TEMPLATE "{template_db}"'
        admin.execute(f'CREATE DATABASE "{name}"{template}')
        made.append(name)
        return urlunsplit(urlsplit(server_url)._replace(path="/" + name))

    yield make
    for name in made:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def behind_url(new_database: Callable[..., str]) -> str:
    """The pgqueue schema, recorded at a revision this pgqueue does not know."""
    url = new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        seed(conn)
        conn.execute("UPDATE pgqueue.pgqueue_alembic_version SET version_num = %s", [FAKE_REVISION])
    return url


@pytest.fixture(scope="module")
def bare_url(new_database: Callable[..., str]) -> str:
    """A database without the pgqueue schema."""
    return new_database(empty=True)


@pytest.fixture
def behind(behind_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the behind-head database; tasks a test adds are removed afterwards."""
    with psycopg.connect(behind_url, autocommit=True) as conn:
        before = snapshot(conn)
        yield conn
        conn.execute("DELETE FROM pgqueue.tasks WHERE NOT (id = ANY(%s))", [list(before)])


@pytest.fixture
def bare(bare_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(bare_url, autocommit=True) as conn:
        yield conn
        assert not schema_exists(conn), "a failed call created the schema"


# --- a schema behind head ------------------------------------------------------------------------

CLI_COMMANDS = [
    ["enqueue", "send_email", "--payload", '{"to": "a@example.com"}'],
    ["status", str(uuid.UUID(int=1))],
    ["cancel", str(uuid.UUID(int=1))],
    ["list"],
    ["stats"],
    ["dlq", "replay", "--all"],
    ["dlq", "discard", "--all", "--yes"],
]


def test_unknown_revision_the_client_and_migrate_check_raise_schema_not_ready(
    behind: psycopg.Connection[Any], behind_url: str
) -> None:
    before = snapshot(behind)
    calls: list[Callable[[pgqueue.Client], Any]] = [
        lambda c: c.enqueue("t", {"a": 1}),
        lambda c: c.enqueue_many([{"type": "t"}]),
        lambda c: c.get_task(uuid.UUID(int=1)),
    ]
    for call in calls:
        with pgqueue.Client(behind_url) as client, pytest.raises(pgqueue.SchemaNotReady) as info:
            call(client)
        assert FAKE_REVISION in str(info.value)
        assert migrate.head() in str(info.value)
        assert "pgqueue migrate" in str(info.value)
    with pytest.raises(pgqueue.SchemaNotReady):
        migrate.check(behind_url)
    assert snapshot(behind) == before
    record(
        "schema at a revision pgqueue does not know (0000_fake_old)",
        "`Client` calls, `migrate.check`",
        f"`SchemaNotReady`: {info.value}",
    )


def test_unknown_revision_calls_on_the_callers_own_connection_are_not_checked(
    behind: psycopg.Connection[Any],
) -> None:
    """Observed design (README: workers and Client refuse): the functions that take the
    caller's connection do not read the revision, so they work while the tables fit."""
    result = pgqueue.enqueue(behind, "t", {"a": 1})
    assert pgqueue.get_task(behind, result.id).payload == {"a": 1}
    record(
        "schema at a revision pgqueue does not know (0000_fake_old)",
        "`pgqueue.enqueue(conn, ...)` on the caller's connection",
        "not checked: the task is written",
    )


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_unknown_revision_every_cli_command_says_to_run_migrate(
    behind: psycopg.Connection[Any], behind_url: str, command: list[str]
) -> None:
    before = snapshot(behind)
    for flags in ([], ["--json"]):
        line = one_line_error(run_main(behind_url, *flags, *command))
        assert "pgqueue migrate" in line and FAKE_REVISION in line, line
    assert snapshot(behind) == before
    if command[0] == "enqueue":
        record(
            "schema at a revision pgqueue does not know (0000_fake_old)",
            "`pgqueue enqueue` (and status, cancel, list, stats, dlq replay/discard)",
            "",
            f"exit 1: {code(line)}",
        )


def test_unknown_revision_migrate_check_exits_1(behind_url: str) -> None:
    result = run_main(behind_url, "--json", "migrate", "--check")

    assert result.code == 1
    assert json.loads(result.stdout) == {
        "current": FAKE_REVISION,
        "head": migrate.head(),
        "up_to_date": False,
    }


def test_unknown_revision_following_the_advice_to_migrate_works_or_says_what_to_do(
    behind: psycopg.Connection[Any], behind_url: str
) -> None:
    result = run_main(behind_url, "migrate")

    version = behind.execute("SELECT version_num FROM pgqueue.pgqueue_alembic_version").fetchone()
    assert version == (FAKE_REVISION,)  # nothing was changed either way
    record(
        "schema at a revision pgqueue does not know (0000_fake_old)",
        "following the advice: `pgqueue migrate`",
        "",
        f"{bug('CommandError' in result.line)}exit {result.code}: {code(result.line)}",
    )
    line = one_line_error(result)
    assert FAKE_REVISION in line
    assert "CommandError" not in line and "--debug" not in line, line


def test_unknown_revision_readyz_is_503_saying_to_migrate(behind_url: str) -> None:
    with running_api(behind_url) as api:
        response = api.request("GET", "/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "not_ready"
    assert "pgqueue migrate" in body["message"] and FAKE_REVISION in body["message"]
    record(
        "schema at a revision pgqueue does not know (0000_fake_old)",
        "`GET /readyz`",
        "",
        "",
        f"503 `{body['error']}`: {body['message']}",
    )


def test_unknown_revision_task_endpoints_answer_503_and_write_nothing(
    behind: psycopg.Connection[Any], behind_url: str
) -> None:
    before = snapshot(behind)
    with running_api(behind_url) as api:
        responses = {
            "POST /api/v1/tasks": api.request("POST", "/api/v1/tasks", json={"type": "t"}),
            "GET /api/v1/tasks": api.request("GET", "/api/v1/tasks"),
            "GET /api/v1/tasks/ID": api.request("GET", f"/api/v1/tasks/{uuid.UUID(int=1)}"),
        }
    record(
        "schema at a revision pgqueue does not know (0000_fake_old)",
        "task endpoints",
        "",
        "",
        bug(any(r.status_code != 503 for r in responses.values()))
        + "; ".join(f"{k}: {r.status_code}" for k, r in responses.items()),
    )
    for response in responses.values():
        assert response.status_code == 503, response.text
        assert "pgqueue migrate" in response.json()["message"]
    assert snapshot(behind) == before


# --- no schema at all ----------------------------------------------------------------------------


def test_no_schema_library_calls_raise_schema_not_ready(
    bare: psycopg.Connection[Any], bare_url: str
) -> None:
    for call in (
        lambda c: pgqueue.enqueue(c, "t", {"a": 1}),
        lambda c: pgqueue.enqueue_many(c, [{"type": "t"}] * 3),
        lambda c: pgqueue.get_task(c, uuid.UUID(int=1)),
        lambda c: pgqueue.list_tasks(c),
    ):
        with pytest.raises(pgqueue.SchemaNotReady, match="pgqueue migrate"):
            call(bare)
    with (
        pgqueue.Client(bare_url) as client,
        pytest.raises(pgqueue.SchemaNotReady, match=r"not installed.*pgqueue migrate") as info,
    ):
        client.enqueue("t", {"a": 1})
    record(
        "no pgqueue schema",
        "library calls",
        f"`SchemaNotReady` on the caller's connection (a missing table) and from `Client`: "
        f"{info.value}",
    )


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_no_schema_every_cli_command_says_to_run_migrate(
    bare: psycopg.Connection[Any], bare_url: str, command: list[str]
) -> None:
    for flags in ([], ["--json"]):
        line = one_line_error(run_main(bare_url, *flags, *command))
        assert "pgqueue migrate" in line, line
    if command[0] == "enqueue":
        record("no pgqueue schema", "every CLI command", "", f"exit 1: {code(line)}")


def test_no_schema_readyz_and_task_endpoints_answer_503_saying_to_migrate(
    bare: psycopg.Connection[Any], bare_url: str
) -> None:
    with running_api(bare_url) as api:
        ready = api.request("GET", "/readyz")
        tasks = [
            api.request("POST", "/api/v1/tasks", json={"type": "t"}),
            api.request("GET", "/api/v1/tasks"),
            api.request("GET", f"/api/v1/tasks/{uuid.UUID(int=1)}"),
            api.request("DELETE", f"/api/v1/tasks/{uuid.UUID(int=1)}"),
            api.request("POST", "/api/v1/dead-letters/replay", json={"all": True}),
        ]
    assert (ready.status_code, ready.json()["error"]) == (503, "not_ready")
    assert "pgqueue migrate" in ready.json()["message"]
    for response in tasks:
        assert response.status_code == 503, response.text
        assert "pgqueue migrate" in response.json()["message"]
    record(
        "no pgqueue schema",
        "`GET /readyz`; task endpoints",
        "",
        "",
        f"readyz 503 `{ready.json()['error']}`; tasks "
        f"{bug(tasks[0].json()['error'] == 'unavailable')}503 `{tasks[0].json()['error']}`: "
        f"{tasks[0].json()['message']}",
    )


def test_no_schema_task_endpoints_use_a_code_of_their_own(bare_url: str) -> None:
    with running_api(bare_url) as api:
        response = api.request("POST", "/api/v1/tasks", json={"type": "t"})
    assert response.status_code == 503
    assert response.json()["error"] not in ("unavailable", "internal_error"), response.json()


# --- the worker refuses to start -----------------------------------------------------------------


def test_the_worker_refuses_to_start_and_says_why(
    behind_url: str, bare_url: str, behind: psycopg.Connection[Any]
) -> None:
    """Real worker processes (concurrently): exit 1 at once with one line, and claim nothing.

    (A database that is down is another matter: a worker waits up to 60 s for it to come up,
    logging ``worker.database_unreachable``, before it gives up.)"""
    before = snapshot(behind)
    targets = {
        "schema behind head": (behind_url, ["pgqueue migrate", FAKE_REVISION]),
        "no schema": (bare_url, ["pgqueue migrate", "not installed"]),
    }  # (an unreachable database it waits for, 60 s by default: see test_secrets_not_leaked.py)
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgqueue",
                "--database-url",
                url,
                "worker",
                "pgqueue.demo:tasks",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (url, _) in targets.items()
    }
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=60)
            line = one_line_error(CliResult(proc.returncode, stdout, stderr))
            for fragment in targets[name][1]:
                assert fragment in line, (name, line)
            assert SECRET not in stdout + stderr
            record(
                "the worker (`pgqueue worker pgqueue.demo:tasks`)",
                name,
                "",
                f"exit 1: {code(line)}",
            )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert snapshot(behind) == before


# --- a connection killed mid-operation -----------------------------------------------------------


def backend_waiting(
    admin: psycopg.Connection[Any], pid: int, event_type: str, event: str | None = None
) -> str | None:
    """The query ``pid`` is running, once it waits on ``event_type`` (and ``event``)."""
    row = admin.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s AND wait_event_type = %s"
        " AND (%s::text IS NULL OR wait_event = %s)",
        [pid, event_type, event, event],
    ).fetchone()
    return None if row is None else str(row[0])


def terminate(admin: psycopg.Connection[Any], pids: list[int]) -> None:
    """``pg_terminate_backend`` each, then wait until they are gone."""
    for pid in pids:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_until(
        lambda: (
            not admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            ).fetchone()
        ),
        30,
        "the killed backends to exit",
        interval=POLL,
    )


def hold_on_advisory_lock(conn: psycopg.Connection[Any], event: str, condition: str) -> None:
    """A trigger that makes the statement writing the row matching ``condition`` wait on
    advisory lock 727, which the test holds: the operation stops there, mid-flight."""
    conn.execute(
        f"""CREATE FUNCTION public.pgqueue_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {condition} THEN PERFORM pg_advisory_xact_lock_shared(727); END IF;
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        f"CREATE TRIGGER pgqueue_test_hold BEFORE {event} ON pgqueue.tasks"
        " FOR EACH ROW EXECUTE FUNCTION public.pgqueue_test_hold()"
    )


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@dataclasses.dataclass
class Killed:
    """What happened when an operation's connection was killed."""

    error: BaseException | None
    waiting_in: str  # the statement the operation was in
    before: Snapshot
    after: Snapshot
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


BATCH = 50_000


def kill_enqueue_many(url: str, admin: psycopg.Connection[Any], where: str) -> Killed:
    """``enqueue_many`` of 50,000 tasks (and one with a key) on an autocommit connection,
    killed mid-COPY (``where="copy"``) or after the COPY, waiting for the keyed INSERT."""
    with (
        psycopg.connect(url, autocommit=True) as conn,
        psycopg.connect(url) as holder,
        psycopg.connect(url, autocommit=True) as victim,
    ):
        seed(conn)
        if where == "copy":
            hold_on_advisory_lock(conn, "INSERT", "NEW.payload->>'n' = '25000'")
            holder.execute("SELECT pg_advisory_lock(727)")
            event: tuple[str, str | None] = ("Lock", "advisory")
        else:  # another transaction holds the batch's idempotency key
            pgqueue.enqueue(holder, "holder", idempotency_key="held-key")
            event = ("Lock", None)
        before = snapshot(conn)
        size = BATCH if where == "copy" else BATCH // 5  # the COPY is done: its size is moot
        batch: list[dict[str, Any]] = [{"type": "batch", "payload": {"n": n}} for n in range(size)]
        batch.append({"type": "batch", "idempotency_key": "held-key"})
        thread, out = in_thread(lambda: pgqueue.enqueue_many(victim, batch))
        pid = victim.info.backend_pid
        waiting_in = wait_until(
            lambda: backend_waiting(admin, pid, *event) or not thread.is_alive(),
            60,
            "the batch to stop at the held lock",
            interval=POLL,
        )
        assert isinstance(waiting_in, str), out
        terminate(admin, [pid])
        thread.join(60)
        holder.rollback()
        return Killed(out.get("error"), waiting_in, before, snapshot(conn), out)


@pytest.fixture(scope="module")
def killed(
    new_database: Callable[..., str], admin: psycopg.Connection[Any]
) -> Callable[[str], Killed]:
    """Each kill scenario runs once; the tests of what it left behind share its result."""
    done: dict[str, Killed] = {}
    scenarios: dict[str, Callable[[str], Killed]] = {
        "enqueue_many-mid-copy": lambda url: kill_enqueue_many(url, admin, "copy"),
        "enqueue_many-after-copy": lambda url: kill_enqueue_many(url, admin, "keyed"),
        "dlq-replay-all": lambda url: kill_dlq_replay(url, admin),
        "idle-connection": lambda url: kill_idle_connections(url, admin),
    }

    def get(name: str) -> Killed:
        if name not in done:
            done[name] = scenarios[name](new_database())
        return done[name]

    return get


@pytest.mark.parametrize("where", ["mid-copy", "after-copy"])
def test_enqueue_many_killed_mid_batch_writes_none_of_it(
    killed: Callable[[str], Killed], where: str
) -> None:
    outcome = killed(f"enqueue_many-{where}")

    # It was killed in flight, with part of the batch already written in its transaction.
    assert ("COPY" if where == "mid-copy" else "INSERT") in outcome.waiting_in.upper()
    assert outcome.error is not None, "the caller was not told that the batch failed"
    assert outcome.after == outcome.before, "a partial batch (or a changed task) was left"
    message = str(outcome.error).splitlines()[0]
    if where == "mid-copy":
        # Killed while sending, the client reads either the server's farewell or the broken
        # socket's error, whichever it meets first: the doc says so rather than pick one.
        message = message.split(": ", 1)[0] + ": the server's farewell or the socket's error"
    record(
        "connection killed mid-operation",
        f"`enqueue_many` of {BATCH if where == 'mid-copy' else BATCH // 5:,} tasks and one with "
        f"an idempotency key, killed {where.replace('-', ' ')}",
        f"{bug(not isinstance(outcome.error, pgqueue.DatabaseUnavailable))}"
        f"`{type(outcome.error).__name__}`: {message}; none of the batch written",
    )


@pytest.mark.parametrize("where", ["mid-copy", "after-copy"])
def test_enqueue_many_killed_mid_batch_raises_database_unavailable(
    killed: Callable[[str], Killed], where: str
) -> None:
    outcome = killed(f"enqueue_many-{where}")
    assert isinstance(outcome.error, pgqueue.DatabaseUnavailable), repr(outcome.error)


def kill_idle_connections(url: str, admin: psycopg.Connection[Any]) -> Killed:
    """An idle connection and a Client's pooled one are killed; then each is used."""
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as victim:
        seed(conn)
        before = snapshot(conn)
        terminate(admin, [victim.info.backend_pid])
        errors: dict[str, Any] = {}
        try:
            pgqueue.enqueue(victim, "t", {"a": 1})
        except Exception as exc:
            errors["connection"] = exc
        with pgqueue.Client(url, max_connections=1) as client:
            client.queue_stats()  # the pool has its connection
            pids = [
                r[0]
                for r in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                    [conn.info.dbname, conn.info.backend_pid],
                ).fetchall()
            ]
            terminate(admin, pids)
            try:
                errors["client_first_call"] = client.enqueue("t", {"b": 1})
            except Exception as exc:
                errors["client"] = exc
            errors["client_next_call"] = client.enqueue("t", {"c": 1})
        return Killed(errors.get("connection"), "idle", before, snapshot(conn), errors)


def test_a_killed_idle_connection_is_database_unavailable_and_a_client_replaces_its_own(
    killed: Callable[[str], Killed],
) -> None:
    """The caller's own connection, killed while idle, fails its next call with
    DatabaseUnavailable and writes nothing; a Client checks its pooled connection before
    lending it, so its next call goes through on a fresh one."""
    outcome = killed("idle-connection")

    assert isinstance(outcome.error, pgqueue.DatabaseUnavailable), repr(outcome.error)
    assert "client" not in outcome.extra, repr(outcome.extra.get("client"))
    first, second = outcome.extra["client_first_call"], outcome.extra["client_next_call"]
    assert first.created and second.created
    added = set(outcome.after) - set(outcome.before)
    assert added == {first.id, second.id}
    assert all(outcome.after[i] == row for i, row in outcome.before.items())
    record(
        "connection killed mid-operation",
        "a killed idle connection (caller's, and a `Client`'s pooled one)",
        f"`{type(outcome.error).__name__}` on the caller's connection; a `Client` replaces "
        "its pooled one unseen (checked before each loan)",
    )


DEAD = 3000
REPLAY_BATCH = 1000


def kill_dlq_replay(url: str, admin: psycopg.Connection[Any]) -> Killed:
    """``pgqueue dlq replay --all`` (a real process) over 3,000 dead letters in batches of
    1,000, killed in its third batch."""
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as holder:
        ids = [r.id for r in pgqueue.enqueue_many(conn, [{"type": "boom"}] * DEAD)]
        # Dead letters, oldest first in id order (replay takes the oldest first).
        conn.execute(
            """UPDATE pgqueue.tasks AS t
                  SET status = 'failed', attempts = 1, max_attempts = 1, last_error = 'boom',
                      finished_at = now() - interval '1 hour' + x.n * interval '1 ms'
                FROM unnest(%s::uuid[]) WITH ORDINALITY AS x(id, n) WHERE t.id = x.id""",
            [ids],
        )
        held = ids[2 * REPLAY_BATCH + REPLAY_BATCH // 2]
        hold_on_advisory_lock(conn, "UPDATE", f"NEW.id = '{held}'")
        holder.execute("SELECT pg_advisory_lock(727)")
        before = snapshot(conn)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "--database-url", url, "dlq", "replay", "--all",
             "--batch-size", str(REPLAY_BATCH)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            pid = wait_until(
                lambda: (
                    admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s"
                        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                        [conn.info.dbname],
                    ).fetchone()
                    or proc.poll() is not None
                ),
                60,
                "the replay to reach the held dead letter",
                interval=POLL,
            )
            assert proc.poll() is None, proc.communicate()
            terminate(admin, [pid[0]])
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        holder.execute("SELECT pg_advisory_unlock(727)")
        return Killed(
            None,
            "UPDATE",
            before,
            snapshot(conn),
            {"result": CliResult(proc.returncode, stdout, stderr), "ids": ids},
        )


def test_dlq_replay_all_killed_mid_way_fails_keeping_whole_batches(
    killed: Callable[[str], Killed],
) -> None:
    outcome = killed("dlq-replay-all")
    result: CliResult = outcome.extra["result"]
    ids: list[uuid.UUID] = outcome.extra["ids"]

    assert result.code == 1, result
    assert "Traceback" not in result.stdout + result.stderr
    assert result.line.startswith("error: ") and "terminating connection" in result.line
    assert SECRET not in result.stderr
    # Batches 1 and 2 were committed, batch 3 rolled back whole: no partial batch.
    replayed = [i for i in ids if outcome.after[i]["status"] == "queued"]
    assert replayed == ids[: 2 * REPLAY_BATCH]
    assert all(outcome.after[i]["attempts"] == 0 for i in replayed)
    for task_id in ids[2 * REPLAY_BATCH :]:
        assert outcome.after[task_id] == outcome.before[task_id]
    record(
        "connection killed mid-operation",
        f"`pgqueue dlq replay --all` over {DEAD:,} dead letters, killed in batch 3 of 3",
        "",
        f"{bug(len(result.stderr.splitlines()) != 1 or 'AdminShutdown' in result.line)}"
        f"exit {result.code}, stderr {result.stderr!r}; batches 1-2 replayed, batch 3 untouched",
    )


def test_dlq_replay_all_killed_mid_way_prints_one_line(killed: Callable[[str], Killed]) -> None:
    result: CliResult = killed("dlq-replay-all").extra["result"]
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_dlq_replay_all_killed_mid_way_says_the_database_was_lost(
    killed: Callable[[str], Killed],
) -> None:
    result: CliResult = killed("dlq-replay-all").extra["result"]
    assert "AdminShutdown" not in result.line and "--debug" not in result.line, result.line


@pytest.fixture(scope="module")
def api_url(new_database: Callable[..., str]) -> str:
    """One database for the API's kill tests: each compares the table before and after."""
    return new_database()


def api_backends(admin: psycopg.Connection[Any], dbname: str, mine: list[int]) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)", [dbname, mine]
    ).fetchall()
    return [r[0] for r in rows]


def test_api_post_killed_in_flight_is_503_writes_nothing_and_the_next_request_works(
    api_url: str, admin: psycopg.Connection[Any]
) -> None:
    url = api_url
    with (
        psycopg.connect(url, autocommit=True) as conn,
        psycopg.connect(url) as holder,
        running_api(url) as api,
    ):
        seed(conn)
        pgqueue.enqueue(holder, "holder", idempotency_key="held-key")  # uncommitted
        before = snapshot(conn)
        body = {"type": "t", "payload": {"x": 1}, "idempotency_key": "held-key"}
        pending = api.start("POST", "/api/v1/tasks", json=body)
        mine = [conn.info.backend_pid, holder.info.backend_pid]
        waiting = wait_until(
            lambda: [
                pid for pid in api_backends(admin, conn.info.dbname, mine)
                if backend_waiting(admin, pid, "Lock")
            ],
            60,
            "the POST to wait for the held key",
            interval=POLL,
        )  # fmt: skip
        terminate(admin, waiting)
        response = pending.result(60)

        assert response.status_code == 503, response.text
        assert response.json()["error"] == "unavailable"
        holder.rollback()
        assert snapshot(conn) == before
        again = api.request("POST", "/api/v1/tasks", json=body)
        assert again.status_code == 202, again.text
        assert set(snapshot(conn)) - set(before) == {uuid.UUID(again.json()["task_id"])}
    record(
        "connection killed mid-operation",
        "`POST /api/v1/tasks` whose connection is killed in flight",
        "",
        "",
        f"503 `{response.json()['error']}`: {response.json()['message'].splitlines()[0]}; "
        "nothing written; the next POST 202",
    )


def kill_the_pool(api: Api, url: str, admin: psycopg.Connection[Any], conn: Any) -> None:
    assert api.request("POST", "/api/v1/tasks", json={"type": "warm-up"}).status_code == 202
    terminate(admin, api_backends(admin, conn.info.dbname, [conn.info.backend_pid]))


def test_api_with_its_idle_pool_killed_recovers_without_a_5xx_or_a_lost_task(
    api_url: str, admin: psycopg.Connection[Any]
) -> None:
    url = api_url
    with psycopg.connect(url, autocommit=True) as conn, running_api(url) as api:
        kill_the_pool(api, url, admin, conn)
        before = snapshot(conn)
        statuses = []
        for n in range(ApiSettings().pool_size + 1):
            response = api.request("POST", "/api/v1/tasks", json={"type": "t", "payload": {"n": n}})
            statuses.append(response.status_code)
            if response.status_code == 202:
                break
        assert statuses[-1] == 202, statuses
        assert set(statuses) <= {202, 503}, statuses
        assert len(snapshot(conn)) == len(before) + 1
    record(
        "connection killed mid-operation",
        "the API's idle pooled connections killed, then `POST /api/v1/tasks`",
        "",
        "",
        f"{bug(statuses[0] != 202)}answers {statuses} (one 503 per dead pooled connection), "
        "then 202; nothing lost",
    )


def test_api_with_its_idle_pool_killed_answers_the_next_request(
    api_url: str, admin: psycopg.Connection[Any]
) -> None:
    url = api_url
    with psycopg.connect(url, autocommit=True) as conn, running_api(url) as api:
        kill_the_pool(api, url, admin, conn)
        response = api.request("POST", "/api/v1/tasks", json={"type": "t"})
    assert response.status_code == 202, response.text


# --- a per-key limit that is not a count ---------------------------------------------------------

PER_KEY = "a per-key limit that is not a count (`per_key_max_running`)"
NA = object()  # a value a boundary cannot be given (argv is text; JSON has no big float)

# (situation, library value, CLI text, JSON value)
PER_KEY_CASES: list[tuple[str, Any, Any, Any]] = [
    ("negative: `-1`", -1, "-1", -1),
    ("not whole: `2.5`", 2.5, "2.5", 2.5),
    ("whole, as a float: `2.0`", 2.0, "2.0", 2.0),
    ('text: `"two"`', "two", "two", "two"),
    ('a number as text: `"2"` (CLI: argv is text, `2` is the spelling)', "2", NA, "2"),
    ("boolean `true`", True, NA, True),
    ("over the most, 1,000,000: `1000001`", 1_000_001, "1000001", 1_000_001),
    ("absurd: `10**30`", 10**30, "1" + "0" * 30, 10**30),
]


@pytest.fixture(scope="module")
def limits_url(new_database: Callable[..., str]) -> str:
    return new_database()


@pytest.mark.parametrize(
    ("situation", "library", "argv", "json_value"), PER_KEY_CASES, ids=lambda v: str(v)[:20]
)
def test_a_per_key_limit_that_is_not_a_count_is_refused_naming_it_and_writes_nothing(
    limits_url: str, situation: str, library: Any, argv: Any, json_value: Any
) -> None:
    """Limits hold every worker of the fleet: a wrong one is refused at each boundary with
    the field (or option) named, before anything is written."""
    with psycopg.connect(limits_url, autocommit=True) as conn:
        with pytest.raises(pgqueue.ValidationError) as info:
            pgqueue.set_limit(conn, type="email", per_key_max_running=library)
        assert info.value.field == "per_key_max_running"
        library_cell = (
            f"`{type(info.value).__name__}` (`.field` = `{info.value.field}`): {info.value}"
        )
        cli_cell = "n/a (argv is text)"
        if argv is not NA:
            results = [
                run_main(limits_url, *flags, "limit", "set", "--type", "email",
                         "--per-key-max-running", argv)
                for flags in ([], ["--json"])
            ]  # fmt: skip
            line = one_line_error(results[0], code=2)
            one_line_error(results[1], code=2)
            assert "per-key-max-running" in line or "per_key_max_running" in line, line
            cli_cell = f"exit 2: {code(line)}"
        with running_api(limits_url) as api:
            response = api.request(
                "PUT", "/api/v1/limits/type/email", json={"per_key_max_running": json_value}
            )
        body = response.json()
        assert response.status_code == 422, response.text
        fields = [e["field"] for e in body["errors"]]
        assert fields == ["per_key_max_running"], body
        http_cell = f"422 `{body['error']}` (fields: {', '.join(fields)}): {body['message']}"
        assert pgqueue.list_limits(conn) == []
    record(PER_KEY, situation, library_cell, cli_cell, http_cell)


def test_a_limit_with_no_part_is_refused_naming_the_parts(limits_url: str) -> None:
    with psycopg.connect(limits_url, autocommit=True) as conn:
        with pytest.raises(pgqueue.ValidationError) as info:
            pgqueue.set_limit(conn, type="email")
        assert "per_key_max_running" in str(info.value)
        line = one_line_error(run_main(limits_url, "limit", "set", "--type", "email"), code=2)
        assert "per_key_max_running" in line, line
        with running_api(limits_url) as api:
            response = api.request("PUT", "/api/v1/limits/type/email", json={})
        body = response.json()
        assert response.status_code == 422 and "per_key_max_running" in body["message"], body
        assert pgqueue.list_limits(conn) == []
    record(
        PER_KEY,
        "no part at all (no max_running, rate or per_key_max_running)",
        f"`{type(info.value).__name__}` (`.field` = `{info.value.field}`): {info.value}",
        f"exit 2: {code(line)}",
        f"422 `{body['error']}`: {body['message']}",
    )


# --- database URLs -------------------------------------------------------------------------------

MALFORMED_URLS: dict[str, tuple[str, bool]] = {  # name -> (url, held a leak once: fixed)
    "not-a-url": ("not a url", False),
    # libpq's keyword form is taken (a failover's several hosts are often written so); one
    # that libpq cannot parse, with a password in it, is refused without the password.
    "conninfo-with-password": ("host=db user=app password=s3cr3t dbname='app", True),
    "mysql-scheme": ("mysql://app:s3cr3t@db/app", False),
    "port-out-of-range": ("postgresql://app:s3cr3t@db:99999/app", False),
    "port-not-a-number": ("postgresql://app:s3cr3t@db:abc/app", False),
    "bad-percent-encoding-in-password": ("postgresql://app:s3%zzcr3t@db/app", False),
    "bad-percent-encoding-in-dbname": ("postgresql://app:s3cr3t@db/d%zzb", False),
    "unknown-query-option": ("postgresql://app:s3cr3t@db/app?bogus_option=1", False),
    "password-in-query": ("postgresql://db/app?password=s3cr3t&bogus_option=1", False),
    "broken-ipv6-host": ("postgresql://app:s3cr3t@[::1/app", False),
}


def url_cases(urls: dict[str, tuple[str, bool]], boundaries: list[str]) -> list[Any]:
    return [
        pytest.param(
            name,
            boundary,
            id=f"{name}-{boundary}",
        )
        for name in urls
        for boundary in boundaries
    ]


URL_ROWS: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize(("name", "boundary"), url_cases(MALFORMED_URLS, ["library", "cli", "api"]))
def test_a_malformed_database_url_is_refused_without_the_password(
    name: str, boundary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = MALFORMED_URLS[name][0]
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    if boundary == "library":
        with pytest.raises(pgqueue.InvalidDatabaseURL) as info:
            pgqueue.Client(url)
        text = "".join(traceback.format_exception(info.value))
        URL_ROWS[(name, boundary)] = f"`InvalidDatabaseURL`: {info.value}"
    elif boundary == "cli":
        results = [run_main(url, *flags, "enqueue", "t") for flags in ([], ["--json"])]
        text = "".join(r.stderr + r.stdout for r in results)
        URL_ROWS[(name, boundary)] = f"exit {results[0].code}: {code(results[0].line)}"
        for result in results:
            assert "database URL" in one_line_error(result)
    else:  # the server refuses to start: the app's startup, and `pgqueue serve`
        with pytest.raises(pgqueue.InvalidDatabaseURL) as info:
            Api(ApiSettings(database_url=url))
        serve = run_main(url, "serve", "--port", "1")
        text = str(info.value) + serve.stderr + serve.stdout
        URL_ROWS[(name, boundary)] = (
            f"does not start: `InvalidDatabaseURL` at startup ({info.value}); `pgqueue serve` "
            f"exit {serve.code}"
        )
        assert "database URL" in one_line_error(serve)
    URL_ROWS[(name, boundary)] = bug(SECRET in text) + URL_ROWS[(name, boundary)]
    assert SECRET not in text, text


UNREACHABLE_URLS: dict[str, tuple[str, bool]] = {
    "closed-port": ("postgresql://app:s3cr3t@127.0.0.1:1/app", False),
    "closed-port-password-in-query": ("postgresql://app@127.0.0.1:1/app?password=s3cr3t", False),
}


@pytest.mark.parametrize(("name", "boundary"), url_cases(UNREACHABLE_URLS, ["library", "cli"]))
def test_an_unreachable_database_is_database_unavailable_without_the_password(
    name: str, boundary: str
) -> None:
    url = UNREACHABLE_URLS[name][0]
    if boundary == "library":
        with pgqueue.Client(url) as client, pytest.raises(pgqueue.DatabaseUnavailable) as info:
            client.enqueue("t")
        text = "".join(traceback.format_exception(info.value))
        URL_ROWS[(name, boundary)] = f"`DatabaseUnavailable`: {info.value}"
    else:
        results = [run_main(url, *flags, "enqueue", "t") for flags in ([], ["--json"])]
        text = "".join(r.stderr + r.stdout for r in results)
        URL_ROWS[(name, boundary)] = f"exit {results[0].code}: {code(results[0].line)}"
        for result in results:
            assert "cannot connect" in one_line_error(result)
    assert "127.0.0.1" in text
    URL_ROWS[(name, boundary)] = bug(SECRET in text) + URL_ROWS[(name, boundary)]
    assert SECRET not in text, text


# --- the table for docs/bad-input.md -------------------------------------------------------------


def _cell(text: str) -> str:
    text = re.sub(r"0x[0-9a-f]{6,}", "0x...", text)  # object addresses change every run
    text = text.replace("|", "\\|").replace("\n", " ")
    return shorten(text)


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    target = os.environ.get(REPORT_ENV)
    if not target:
        return
    rows = list(ROWS)
    for urls, group in (
        (MALFORMED_URLS, "malformed database URL"),
        (UNREACHABLE_URLS, "unreachable database"),
    ):
        for name, (url, _) in urls.items():
            http = URL_ROWS.get(
                (name, "api"),
                "(see test_api.py: starts; /readyz 503)" if group.startswith("unreach") else "",
            )
            rows.append((group, f"{name}: `{url}`", URL_ROWS.get((name, "library"), ""),
                         URL_ROWS.get((name, "cli"), ""), http))  # fmt: skip
    table = [
        (group, [_cell(situation), *(_cell(c) if c else "-" for c in (library, cli_text, http))])
        for group, situation, library, cli_text, http in rows
    ]
    write_tables(Path(target) / "failure-modes.md", ["situation", "library", "CLI", "HTTP"], table)
