"""What ``pgqueue worker`` prints as it starts and while it runs, read from a real worker
process: the database it works on (password masked), a warning for each type whose declared
queue it does not claim, and the application's own log lines in the worker's format."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from processes import Worker, wait_until

import pgqueue
from pgqueue.config import redact

pytestmark = [pytest.mark.timeout(120)]

HANDLERS = """
import logging

import pgqueue

tasks = pgqueue.TaskRegistry()
log = logging.getLogger(__name__)


@tasks.task(queue="mail")
def send_confirmation(to: str) -> None:
    pass


@tasks.handler("noop")
def noop(payload, ctx):
    return None


@tasks.handler("chatty")
def chatty(payload, ctx):
    log.info("confirmation sent to %s", payload["to"])
    log.debug("a detail nobody asked for")


@tasks.handler("chatty_async")
async def chatty_async(payload, ctx):
    log.info("confirmation sent to %s", payload["to"])


@tasks.handler("chatty_process", executor="process")
def chatty_process(payload, ctx):
    log.info("confirmation sent to %s", payload["to"])
"""

# The same handlers in an application that configures logging itself, as it imports.
SELF_CONFIGURED = (
    'import logging\nlogging.basicConfig(format="APP %(name)s %(message)s", level=logging.INFO)\n'
    + HANDLERS
)

FAST = ("--poll-interval", "0.2", "--sweep-interval", "0.5")
MADE_UP_PASSWORD = "s3cret-pw-9431"


@pytest.fixture
def handlers_dir(tmp_path: Path) -> Path:
    (tmp_path / "start_handlers.py").write_text(HANDLERS)
    (tmp_path / "self_configured.py").write_text(SELF_CONFIGURED)
    return tmp_path


def start(url: str, cwd: Path, *options: str, target: str = "start_handlers:tasks") -> Worker:
    log = cwd / f"worker-{uuid.uuid4().hex[:8]}.log"
    return Worker(url, cwd, target, *FAST, *options, log=log)


def started(worker: Worker) -> str:
    return wait_until(
        lambda: worker.alive() and "worker.started" in worker.text() and worker.text(),
        60,
        "worker.started",
    )


def stopped(worker: Worker) -> str:
    """The whole log of a worker stopped gracefully (every line it wrote is in it)."""
    assert worker.stop() == 0, worker.text()
    return worker.text()


def enqueue(conn: psycopg.Connection[Any], type: str, payload: dict[str, Any]) -> str:
    return str(pgqueue.enqueue_many(conn, [{"type": type, "payload": payload}])[0].task.id)


def completed(conn: psycopg.Connection[Any], task_id: str) -> bool:
    row = conn.execute("SELECT status FROM pgqueue.tasks WHERE id = %s", (task_id,)).fetchone()
    return row is not None and row[0] == "completed"


def with_password(url: str) -> tuple[str, str]:
    """``url`` with a password in it (the server's real one if it has one: trust auth ignores
    a made-up one), and that password."""
    parts = urlsplit(url)
    if parts.password:
        return url, parts.password
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}:{MADE_UP_PASSWORD}@{host}")), MADE_UP_PASSWORD


# --- the database on the start line ------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_start_line_names_the_database_with_its_password_masked(
    database_url: str, handlers_dir: Path, log_format: str
) -> None:
    url, password = with_password(database_url)
    worker = start(url, handlers_dir, "--queue", "mail", "--log-format", log_format)
    try:
        text = started(worker)
    finally:
        text = stopped(worker)
    line = next(x for x in text.splitlines() if "worker.started" in x)
    if log_format == "json":
        assert json.loads(line)["database"] == redact(url), line
    else:
        assert redact(url) in line or json.dumps(redact(url)) in line, line
    assert "***" in redact(url)
    assert password not in text


# --- a declared queue this worker does not claim -------------------------------------------------


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_type_whose_declared_queue_is_not_claimed_is_warned_about_at_start(
    database_url: str, handlers_dir: Path, log_format: str
) -> None:
    worker = start(database_url, handlers_dir, "--log-format", log_format)
    try:
        wait_until(lambda: worker.alive() and "queue_not_claimed" in worker.text(), 60, "warning")
    finally:
        text = stopped(worker)
    lines = [x for x in text.splitlines() if "worker.queue_not_claimed" in x]
    assert len(lines) == 1, text  # one type declares a queue: one line
    if log_format == "json":
        fields = json.loads(lines[0])
        assert fields["level"] == "warning"
        assert (fields["type"], fields["queue"], fields["claims"]) == (
            "start_handlers.send_confirmation",
            "mail",
            "default",
        )
        assert "--queue mail" in fields["note"]
    else:
        assert "WARNING" in lines[0]
        for part in (
            "type=start_handlers.send_confirmation",
            "queue=mail",
            "claims=default",
            "--queue mail",
        ):
            assert part in lines[0], lines[0]


def test_no_warning_when_the_declared_queue_is_claimed(
    database_url: str, handlers_dir: Path
) -> None:
    worker = start(database_url, handlers_dir, "--queue", "mail", "--queue", "default")
    try:
        started(worker)
    finally:
        text = stopped(worker)
    assert "worker.started" in text
    assert "queue_not_claimed" not in text, text


# --- the application's own logging ---------------------------------------------------------------


def app_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if "confirmation sent to ada@example.com" in x]


@pytest.mark.parametrize(
    ("log_format", "processes"), [("text", "1"), ("json", "1"), ("text", "2"), ("json", "2")]
)
def test_a_handlers_log_lines_appear_once_in_the_workers_format(
    database_url: str,
    conn: psycopg.Connection[Any],
    handlers_dir: Path,
    log_format: str,
    processes: str,
) -> None:
    worker = start(database_url, handlers_dir, "--log-format", log_format, "--processes", processes)
    try:
        task_id = enqueue(conn, "chatty", {"to": "ada@example.com"})
        wait_until(lambda: worker.alive() and app_lines(worker.text()), 60, "the handler's line")
        wait_until(lambda: completed(conn, task_id), 60, "the task to complete")
    finally:
        text = stopped(worker)
    lines = app_lines(text)
    assert len(lines) == 1, text
    assert "a detail nobody asked for" not in text  # INFO and up by default
    if log_format == "json":
        record = json.loads(lines[0])
        assert (record["level"], record["logger"]) == ("info", "start_handlers"), record
        assert (record["task_id"], record["type"], record["attempt"]) == (task_id, "chatty", 1)
    else:
        assert " INFO " in lines[0] and "logger=start_handlers" in lines[0], lines[0]
        assert f"task_id={task_id} type=chatty attempt=1" in lines[0], lines[0]
    # pgqueue's own lines are not printed twice now that the root logger has a handler.
    assert text.count("worker.started") == int(processes), text


def test_concurrent_async_handlers_log_lines_each_name_their_own_task(
    database_url: str, conn: psycopg.Connection[Any], handlers_dir: Path
) -> None:
    worker = start(database_url, handlers_dir, "--log-format", "json", "--concurrency", "8")
    try:
        sent = {enqueue(conn, "chatty_async", {"to": f"user{i}@example.com"}): i for i in range(8)}
        wait_until(
            lambda: worker.alive() and all(completed(conn, t) for t in sent), 60, "the tasks"
        )
    finally:
        text = stopped(worker)
    records = [json.loads(x) for x in text.splitlines() if "confirmation sent to user" in x]
    named = {r["task_id"]: r["message"] for r in records}
    assert named == {t: f"confirmation sent to user{i}@example.com" for t, i in sent.items()}, text


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_process_task_handlers_log_lines_reach_the_worker_with_the_task_id(
    database_url: str, conn: psycopg.Connection[Any], handlers_dir: Path, log_format: str
) -> None:
    worker = start(database_url, handlers_dir, "--log-format", log_format)
    try:
        task_id = enqueue(conn, "chatty_process", {"to": "ada@example.com"})
        wait_until(lambda: worker.alive() and app_lines(worker.text()), 60, "the handler's line")
        wait_until(lambda: completed(conn, task_id), 60, "the task to complete")
    finally:
        text = stopped(worker)
    lines = app_lines(text)
    assert len(lines) == 1, text
    if log_format == "json":
        assert json.loads(lines[0])["task_id"] == task_id, lines[0]
    else:
        assert f"task_id={task_id}" in lines[0], lines[0]


@pytest.mark.parametrize(("level", "shown"), [("off", False), ("warning", False), ("debug", True)])
def test_app_log_level_sets_what_a_handler_prints(
    database_url: str,
    conn: psycopg.Connection[Any],
    handlers_dir: Path,
    level: str,
    shown: bool,
) -> None:
    worker = start(database_url, handlers_dir, "--app-log-level", level)
    try:
        task_id = enqueue(conn, "chatty", {"to": "ada@example.com"})
        wait_until(lambda: worker.alive() and completed(conn, task_id), 60, "the task")
    finally:
        text = stopped(worker)
    assert bool(app_lines(text)) == shown, text
    assert ("a detail nobody asked for" in text) == (level == "debug"), text


def test_an_application_that_configures_logging_itself_keeps_its_own_format(
    database_url: str, conn: psycopg.Connection[Any], handlers_dir: Path
) -> None:
    worker = start(database_url, handlers_dir, target="self_configured:tasks")
    try:
        task_id = enqueue(conn, "chatty", {"to": "ada@example.com"})
        wait_until(lambda: worker.alive() and completed(conn, task_id), 60, "the task")
    finally:
        text = stopped(worker)
    lines = app_lines(text)
    assert lines == ["APP self_configured confirmation sent to ada@example.com"], text
    assert text.count("worker.started") == 1, text  # pgqueue's lines: once, in its format


def test_a_bad_app_log_level_is_refused_naming_the_option(handlers_dir: Path) -> None:
    from processes import run_cli

    proc = run_cli(
        "postgresql://postgres@127.0.0.1:1/x",
        "worker",
        "start_handlers:tasks",
        "--app-log-level",
        "loud",
        cwd=handlers_dir,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--app-log-level" in proc.stderr and "loud" in proc.stderr, proc.stderr
