"""What a new operator runs into in the first hour with the command line: help that reads at
80 columns, a resume of a mistyped queue, a malformed task id, an old error shown on a task
that completed, schedules no worker declares any more.

The command line runs as a real subprocess (``python -m pgqueue``) against real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api
from helpers import make_dead_letters
from processes import clean_env, one_line_error, run_cli

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.cron import Cron, Schedule

# --- --help at 80 columns --------------------------------------------------------------------


def _commands(group: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    # Through list_commands/get_command: the root builds each command only when asked for it.
    yield path, group
    if not hasattr(group, "list_commands"):
        return
    for name in sorted(group.list_commands(None)):
        yield from _commands(group.get_command(None, name), (*path, name))


def _every_command() -> list[tuple[tuple[str, ...], Any]]:
    import typer.main

    from pgqueue.cli import app

    return list(_commands(typer.main.get_command(app), ()))


def _help_at_80_columns(path: tuple[str, ...]) -> str:
    env = clean_env(COLUMNS="80", TERM="dumb")
    env.pop("TERMINAL_WIDTH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", *path, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, (path, proc.stderr)
    return proc.stdout


def test_every_commands_help_at_80_columns_names_each_option_whole_with_a_placeholder_of_words():
    problems = []
    for path, command in _every_command():
        text = _help_at_80_columns(path)
        where = "pgqueue " + " ".join(path)
        for line in text.splitlines():
            if len(line) > 80:
                problems.append(f"{where}: line wider than 80 columns: {line!r}")
        if "…" in text:
            problems.append(f"{where}: something is cut short (…)")
        # A placeholder says what to write (N, SECONDS, QUEUE), not the Python type.
        for placeholder in re.findall(r"<(?:str|int|float|list\[|bool)[^>]*>", text):
            problems.append(f"{where}: a Python type as the placeholder: {placeholder}")
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            names = [*param.opts, *param.secondary_opts]
            for name in names:
                if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                    problems.append(f"{where}: option {name} is not shown whole")
            if param.is_flag:
                long = max(param.opts, key=len)
                # The flag's line: its names, then two spaces and its help, or nothing.
                flag_line = re.compile(
                    rf"^\s+(?:-\w, )?{re.escape(long)}(?: / [\w-]+)?(?:\s{{2,}}\S|$)", re.M
                )
                if not flag_line.search(text):
                    problems.append(f"{where}: flag {long} is shown as taking a value")
    assert problems == []


def test_a_group_lists_each_commands_summary_whole_at_80_columns():
    text = _help_at_80_columns(())
    flat = " ".join(text.split())
    assert (
        "Submit a task: its payload as --payload JSON, or a function task's arguments as --arg."
        in flat
    )
    assert not [line for line in text.split("Commands:")[1].splitlines() if line.endswith("...")]
    queue_help = " ".join(_help_at_80_columns(("dlq",)).split())
    assert (
        "Move dead letters back to queued with fresh attempts: by id, --all, or --type/--queue."
        in queue_help
    )


# --- resuming a queue nobody knows ---------------------------------------------------------------


def test_resuming_an_unknown_queue_is_refused_as_pausing_it_is(database_url, conn):
    paused = run_cli(database_url, "queue", "pause", "emials")
    resumed = run_cli(database_url, "queue", "resume", "emials")

    assert paused.returncode == resumed.returncode == 1 and resumed.stdout == ""
    assert one_line_error(resumed) == (
        "error: no queue 'emials': it has no tasks and no settings; nothing to resume "
        "(`pgqueue queue list` shows the queues)"
    )
    as_json = json.loads(run_cli(database_url, "--json", "queue", "resume", "emials").stderr)
    assert (as_json["error"], as_json["queue"], as_json["exit_code"]) == ("not_found", "emials", 1)
    assert conn.execute("SELECT count(*) FROM pgqueue.queues").fetchone() == (0,)


def test_resuming_a_queue_with_tasks_and_no_settings_still_succeeds(database_url, conn):
    pgqueue.enqueue(conn, "send", queue="emails")

    resumed = run_cli(database_url, "--json", "queue", "resume", "emails")

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["paused"] is False


def test_the_http_api_refuses_resuming_an_unknown_queue_with_404_as_pausing(database_url, conn):
    pgqueue.enqueue(conn, "send", queue="emails")
    api = Api(ApiSettings(database_url=database_url))
    try:
        paused = api.request("POST", "/api/v1/queues/emials/pause")
        refused = api.request("POST", "/api/v1/queues/emials/resume")
        known = api.request("POST", "/api/v1/queues/emails/resume")
    finally:
        api.close()
    assert paused.status_code == refused.status_code == 404
    assert refused.json()["error"] == "not_found"
    assert known.status_code == 200 and known.json()["paused"] is False


def test_code_may_still_resume_a_queue_it_has_not_used_yet(conn):
    assert pgqueue.resume_queue(conn, "later").paused is False
    with pytest.raises(pgqueue.QueueNotFound, match="nothing to resume"):
        pgqueue.resume_queue(conn, "later", missing_ok=False)


# --- a malformed task id -------------------------------------------------------------------------

MALFORMED = [
    (("status", "not-a-uuid"), "TASK_ID", "task id"),
    (("cancel", "not-a-uuid"), "TASK_ID", "task id"),
    (("dlq", "show", "not-a-uuid"), "TASK_ID", "task id"),
    (("dlq", "replay", "not-a-uuid"), "[ID]...", "task id"),
    (("dlq", "discard", "--yes", str(uuid.uuid4()), "not-a-uuid"), "[ID]...", "task id"),
    (("workflow", "show", "not-a-uuid"), "WORKFLOW_ID", "workflow id"),
    (("workflow", "wait", "not-a-uuid"), "WORKFLOW_ID", "workflow id"),
    (("workflow", "cancel", "not-a-uuid"), "WORKFLOW_ID", "workflow id"),
]


@pytest.mark.parametrize(("args", "argument", "what"), MALFORMED, ids=lambda v: str(v))
def test_a_malformed_id_is_a_usage_error_naming_the_argument(database_url, args, argument, what):
    proc = run_cli(database_url, *args)

    line = one_line_error(proc, code=2)
    assert f"'{argument}'" in line and f"'not-a-uuid' is not a {what} (a UUID)" in line
    as_json = json.loads(run_cli(database_url, "--json", *args).stderr)
    assert (as_json["error"], as_json["field"], as_json["exit_code"]) == ("usage", argument, 2)


def test_a_well_formed_unknown_task_id_is_still_not_found(database_url):
    missing = str(uuid.uuid4())
    proc = run_cli(database_url, "--json", "status", missing)

    assert proc.returncode == 1
    assert json.loads(proc.stderr)["error"] == "not_found"


# --- an earlier attempt's error ------------------------------------------------------------------


def _fail_once_then_complete(conn: psycopg.Connection[Any]) -> uuid.UUID:
    task = pgqueue.enqueue(conn, "flaky", max_attempts=3).id
    [first] = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    pgqueue.fail(conn, first.lease, "TimeoutError: upstream slow")
    conn.execute("UPDATE pgqueue.tasks SET visible_after = now() WHERE id = %s", (task,))
    [second] = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    pgqueue.complete(conn, second.lease, {"ok": True})
    return task


def _status_lines(database_url: str, task: uuid.UUID) -> dict[str, str]:
    proc = run_cli(database_url, "status", str(task))
    assert proc.returncode == 0, proc.stderr
    lines = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(": ")
        lines[key.strip()] = value.strip()
    return lines


def test_status_of_a_task_completed_on_a_retry_labels_the_error_as_an_earlier_attempts(
    database_url, conn
):
    task = _fail_once_then_complete(conn)

    lines = _status_lines(database_url, task)

    assert lines["status"] == "completed" and lines["attempts"] == "2/3"
    assert lines["last error"] == "TimeoutError: upstream slow"
    assert lines["error of"] == "an earlier attempt: retried, then completed"
    as_json = json.loads(run_cli(database_url, "--json", "status", str(task)).stdout)
    assert as_json["last_error_summary"] == "TimeoutError: upstream slow"


def test_status_of_a_replayed_dead_letter_labels_the_error_as_before_the_replay(database_url, conn):
    [task] = make_dead_letters(conn, 1, error="ValueError: boom")
    dead = _status_lines(database_url, task)
    assert dead["last error"] == "ValueError: boom" and "error of" not in dead
    pgqueue.replay(conn, [task])

    lines = _status_lines(database_url, task)

    assert lines["status"] == "queued"
    assert lines["last error"] == "ValueError: boom"
    assert lines["error of"] == "an attempt before the replay"


def test_status_of_a_task_waiting_for_its_retry_names_the_attempt_that_failed(database_url, conn):
    task = pgqueue.enqueue(conn, "flaky", max_attempts=3).id
    [first] = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    pgqueue.fail(conn, first.lease, "TimeoutError: upstream slow")

    lines = _status_lines(database_url, task)

    assert lines["last error"] == "TimeoutError: upstream slow"
    assert lines["error of"] == "attempt 1: to be retried"


# --- schedules no worker declares any more -------------------------------------------------------


def _schedule(name: str) -> Schedule:
    return Schedule(name, Cron.parse("*/5 * * * *"), "UTC", "beat", {}, "periodic", "normal", False)


def test_schedules_marks_those_no_running_worker_declared_recently_as_stale(database_url, conn):
    pgqueue.run_schedule(conn, _schedule("kept"))
    pgqueue.run_schedule(conn, _schedule("removed"))
    conn.execute(
        "UPDATE pgqueue.schedules SET updated_at = now() - interval '2 hours'"
        " WHERE name = 'removed'"
    )

    proc = run_cli(database_url, "schedules")

    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:3]}
    assert rows["kept"].split()[-1] == "active"
    assert rows["removed"].split()[-2:] == ["ago", "STALE"]
    assert re.search(r"\b2h0\dm ago\b", rows["removed"])
    assert "STALE: declared by no running worker for 5m00s" in proc.stdout
    as_json = json.loads(run_cli(database_url, "--json", "schedules").stdout)
    assert {r["name"]: r["stale"] for r in as_json} == {"kept": False, "removed": True}


def test_schedules_says_nothing_of_staleness_while_every_schedule_is_declared(database_url, conn):
    pgqueue.run_schedule(conn, _schedule("kept"))

    proc = run_cli(database_url, "schedules")

    assert proc.returncode == 0 and "STALE" not in proc.stdout
    assert os.linesep.join(proc.stdout.splitlines()[1:]).split()[-1] == "active"
