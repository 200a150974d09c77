"""The operator command line, against real PostgreSQL.

Successful runs go through typer's CliRunner in-process. Error paths run the real entry point
(``python -m pgqueue``) in a subprocess, because in-process the runner bypasses ``main()``,
which is what turns errors into one line on stderr with the right exit code.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import run_main
from helpers import make_dead_letters
from typer.testing import CliRunner

import pgqueue
from pgqueue import aio
from pgqueue.cli import app

runner = CliRunner()


# --- helpers -------------------------------------------------------------------------------------


def invoke(url: str, *args: str, input: str | None = None) -> Any:
    return runner.invoke(app, ["--database-url", url, *args], input=input)


def ok(url: str, *args: str, input: str | None = None) -> str:
    """Run a command in-process; it must succeed. Returns its stdout."""
    result = invoke(url, *args, input=input)
    assert result.exit_code == 0, (result.output, result.exception)
    return str(result.stdout)


def ok_json(url: str, *args: str) -> Any:
    return json.loads(ok(url, "--json", *args))


def run_cli(url: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=input,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The process failed with ``exit_code`` and said why in one line on stderr."""
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


def make_running(conn: psycopg.Connection[Any], type: str = "slow") -> pgqueue.ClaimedTask:
    task_id = pgqueue.enqueue(conn, type, {}, queue="running").id
    (claimed,) = pgqueue.claim(conn, ["running"], limit=1, worker_id="test-worker")
    assert claimed.id == task_id
    return claimed


def make_completed(conn: psycopg.Connection[Any], result: Any, queue: str = "done") -> uuid.UUID:
    task_id = pgqueue.enqueue(conn, "work", {}, queue=queue).id
    (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="test")
    pgqueue.complete(conn, claimed.lease, result)
    return task_id


# --- enqueue -------------------------------------------------------------------------------------


def test_enqueue_prints_the_new_task_id_status_and_creation_time(database_url, conn):
    out = ok(database_url, "enqueue", "send_email", "--payload", '{"to": "a@example.com"}')

    fields = dict(line.split(":", 1) for line in out.splitlines())
    task = pgqueue.get_task(conn, fields["id"].strip())
    assert fields["status"].strip() == "queued"
    assert fields["created"].strip() == task.created_at.isoformat(sep=" ", timespec="seconds")
    assert task.type == "send_email"
    assert task.payload == {"to": "a@example.com"}
    assert "existing task" not in out


def test_enqueue_json_applies_priority_queue_delay_and_max_attempts(database_url, conn):
    data = ok_json(
        database_url,
        "enqueue",
        "report",
        "--payload",
        '{"day": "2030-01-01"}',
        "--priority",
        "HIGH",
        "--queue",
        "reports",
        "--delay",
        "3600",
        "--max-attempts",
        "7",
    )

    assert data["created"] is True
    task = pgqueue.get_task(conn, data["task_id"])
    assert data == {**task.to_dict(), "created": True}
    assert (task.priority, task.queue, task.max_attempts) == (pgqueue.Priority.HIGH, "reports", 7)
    assert task.visible_after - task.created_at == timedelta(seconds=3600)


def test_enqueue_run_at_schedules_the_task_for_that_time(database_url, conn):
    out = ok(database_url, "enqueue", "report", "--run-at", "2030-01-31T09:00:00+01:00")

    task = pgqueue.list_tasks(conn)[0]
    assert task.visible_after == datetime(2030, 1, 31, 8, 0, tzinfo=UTC)
    assert "run at:" in out


def test_enqueue_with_a_used_idempotency_key_returns_the_existing_task(database_url, conn):
    first = ok_json(database_url, "enqueue", "charge", "--idempotency-key", "order-42")
    again = ok_json(
        database_url, "enqueue", "charge", "--idempotency-key", "order-42", "--payload", '{"x": 1}'
    )
    human = ok(database_url, "enqueue", "charge", "--idempotency-key", "order-42")

    assert first["created"] is True
    assert again["created"] is False
    assert again["task_id"] == first["task_id"]
    assert "existing task returned" in human
    assert first["task_id"] in human
    assert len(pgqueue.list_tasks(conn)) == 1


def test_enqueue_rejects_delay_together_with_run_at_as_a_usage_error(database_url, conn):
    result = invoke(
        database_url, "enqueue", "x", "--delay", "5", "--run-at", "2030-01-01T00:00:00Z"
    )

    assert result.exit_code == 2
    assert "not both" in result.stderr
    assert pgqueue.list_tasks(conn) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ["enqueue", "x", "--payload", '{"a": 1,}'],
            ["--payload", "not valid JSON", "line 1, column 9"],
            id="invalid-json",
        ),
        pytest.param(
            ["enqueue", "x", "--payload", "[1, 2]"],
            ["--payload", "must be a JSON object", "not an array"],
            id="payload-not-an-object",
        ),
        pytest.param(
            ["enqueue", "x", "--priority", "urgent"],
            ["--priority", "'urgent'", "'high', 'normal', 'low'"],
            id="bad-priority",
        ),
        pytest.param(
            ["enqueue", "x", "--run-at", "2030-01-01T09:00:00"],
            ["--run-at", "no timezone"],
            id="naive-run-at",
        ),
        pytest.param(["enqueue", " "], ["type", "must not be empty"], id="empty-type"),
        pytest.param(["list", "--status", "finished"], ["--status", "'finished'"], id="bad-status"),
        pytest.param(
            ["dlq", "replay"], ["which dead letters to replay", "--all"], id="replay-nothing"
        ),
        pytest.param(
            ["dlq", "discard", "--all", "--type", "x"], ["--all"], id="discard-all-and-type"
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line_naming_the_problem(database_url, conn, args, expected):
    proc = run_cli(database_url, *args)

    line = one_line_error(proc, 2)
    for fragment in expected:
        assert fragment in line
    assert pgqueue.list_tasks(conn) == []


# --- status --------------------------------------------------------------------------------------


def test_status_shows_a_readable_block_of_the_task_fields(database_url, conn):
    task_id = pgqueue.enqueue(
        conn, "send_email", {"to": "a@example.com"}, priority="low", queue="mail"
    ).id

    out = ok(database_url, "status", str(task_id))

    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert fields["id"] == str(task_id)
    assert fields["type"] == "send_email"
    assert fields["queue"] == "mail"
    assert fields["priority"] == "low"
    assert fields["status"] == "queued"
    assert fields["attempts"] == "0/3"
    assert fields["payload"] == '{"to": "a@example.com"}'
    assert fields["result"] == "-"
    assert fields["last error"] == "-"
    assert {"created", "started", "finished"} <= fields.keys()


def test_status_shows_the_result_of_a_completed_task(database_url, conn):
    task_id = make_completed(conn, {"sent": 3})

    out = ok(database_url, "status", str(task_id))

    assert "completed" in out
    assert '{"sent": 3}' in out
    assert "1/3" in out


def test_status_shows_the_whole_last_error_of_a_failed_task(database_url, conn):
    (task_id,) = make_dead_letters(
        conn, 1, error="Traceback (most recent call last):\nKeyError: 'x'"
    )

    out = ok(database_url, "status", str(task_id))

    assert "failed" in out
    assert "1/1" in out
    assert "Traceback (most recent call last):" in out
    assert "KeyError: 'x'" in out


def test_status_json_is_the_task_dict(database_url, conn):
    task_id = pgqueue.enqueue(conn, "x", {"k": [1, 2]}).id

    data = ok_json(database_url, "status", str(task_id))

    assert data == pgqueue.get_task(conn, task_id).to_dict()


def test_status_of_an_unknown_id_is_a_one_line_error(database_url):
    task_id = str(uuid.UUID(int=42))
    proc = run_cli(database_url, "status", task_id)

    assert one_line_error(proc, 1) == f"error: no task with id '{task_id}'"


def test_status_of_a_malformed_id_is_a_one_line_usage_error(database_url):
    proc = run_cli(database_url, "status", "not-a-task-id")

    assert one_line_error(proc, 2) == (
        "error: Invalid value for 'TASK_ID': 'not-a-task-id' is not a task id (a UUID) "
        "(see `pgqueue status --help`)"
    )


# --- list ----------------------------------------------------------------------------------------


def test_list_shows_tasks_newest_first_in_an_aligned_table(database_url, conn):
    first = pgqueue.enqueue(conn, "a", {}).id
    second = pgqueue.enqueue(conn, "bb", {}, priority="high", queue="other").id

    lines = ok(database_url, "list").splitlines()

    assert lines[0].split() == [
        "ID",
        "TYPE",
        "QUEUE",
        "PRIORITY",
        "STATUS",
        "ATTEMPTS",
        "CREATED",
    ]
    assert lines[1].startswith(str(second))
    assert lines[2].startswith(str(first))
    assert lines[1].split()[1:6] == ["bb", "other", "high", "queued", "0/3"]
    # Aligned: every column starts at the same offset on every line.
    assert lines[0].index("QUEUE") == lines[1].index("other") == lines[2].index("default")


def test_list_filters_by_status_type_and_queue_and_honours_limit(database_url, conn):
    make_dead_letters(conn, 1, type="b", queue="q2")
    pgqueue.enqueue(conn, "a", {}, queue="q1")
    wanted = [pgqueue.enqueue(conn, "b", {}, queue="q2").id for _ in range(3)]
    pgqueue.enqueue(conn, "b", {}, queue="q1")

    data = ok_json(database_url, "list", "--status", "queued", "--type", "b", "--queue", "q2")
    limited = ok_json(database_url, "list", "--type", "b", "--queue", "q2", "--limit", "2")
    human = ok(database_url, "list", "--type", "b", "--limit", "2")

    assert [d["task_id"] for d in data] == [str(i) for i in reversed(wanted)]
    assert len(limited) == 2
    assert "raise --limit" in human


def test_list_json_is_a_list_of_task_dicts_newest_first(database_url, conn):
    ids = [pgqueue.enqueue(conn, "t", {"n": i}).id for i in range(3)]

    data = ok_json(database_url, "list")

    assert data == [pgqueue.get_task(conn, i).to_dict() for i in reversed(ids)]


def test_list_with_no_matching_tasks_says_so(database_url):
    assert ok(database_url, "list").strip() == "no tasks"
    assert ok_json(database_url, "list") == []


# --- cancel --------------------------------------------------------------------------------------


def test_cancel_of_a_queued_task_cancels_it(database_url, conn):
    task_id = pgqueue.enqueue(conn, "x", {}).id

    out = ok(database_url, "cancel", str(task_id))

    assert out.strip() == f"cancelled task {task_id}"
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.CANCELLED


def test_cancel_of_a_running_task_requests_cooperative_cancellation(database_url, conn):
    running = make_running(conn)

    out = ok(database_url, "cancel", str(running.id))
    data = ok_json(database_url, "cancel", str(running.id))

    assert "cancellation requested" in out
    task = pgqueue.get_task(conn, running.id)
    assert task.status is pgqueue.TaskStatus.RUNNING
    assert task.cancel_requested is True
    assert data["status"] == "running"
    assert data["cancel_requested"] is True


def test_cancel_json_of_a_queued_task_is_the_cancelled_task(database_url, conn):
    task_id = pgqueue.enqueue(conn, "x", {}).id

    data = ok_json(database_url, "cancel", str(task_id))

    assert data == pgqueue.get_task(conn, task_id).to_dict()
    assert data["status"] == "cancelled"


def test_cancel_of_a_finished_task_is_an_error_naming_its_status(database_url, conn):
    task_id = make_completed(conn, None)

    proc = run_cli(database_url, "cancel", str(task_id))

    line = one_line_error(proc, 1)
    assert str(task_id) in line
    assert "'completed'" in line
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.COMPLETED


# --- stats and throughput ------------------------------------------------------------------------


def test_stats_shows_depth_and_last_minute_throughput_per_queue(database_url, conn):
    make_completed(conn, None, queue="mail")
    make_completed(conn, None, queue="mail")
    pgqueue.enqueue(conn, "x", {}, queue="mail", priority="high")
    pgqueue.enqueue(conn, "x", {}, queue="mail", delay=3600)
    make_dead_letters(conn, 1, queue="reports")

    out = ok(database_url, "stats")

    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == [
        "QUEUE",
        "PRIORITY",
        "STATUS",
        "TASKS",
        "READY",
        "SCHEDULED",
        "OLDEST",
        "READY",
    ]
    depth = [r[:6] for r in rows[1:]]
    assert ["mail", "high", "queued", "1", "1", "0"] in depth
    assert ["mail", "normal", "queued", "1", "0", "1"] in depth
    assert not [r for r in depth if "completed" in r], "counted in throughput instead"
    assert ["reports", "normal", "failed", "1", "0", "0"] in depth
    assert "finished in the last 60s:" in out
    assert ["mail", "2", "0"] in rows
    assert ["reports", "0", "1"] in rows


def test_stats_json_has_depth_and_throughput(database_url, conn):
    make_completed(conn, None, queue="mail")
    pgqueue.enqueue(conn, "x", {}, queue="mail")
    make_dead_letters(conn, 2, queue="reports")

    data = ok_json(database_url, "stats")

    assert {(d["queue"], d["status"], d["tasks"]) for d in data["depth"]} == {
        ("mail", "queued", 1),
        ("reports", "failed", 2),
    }
    assert sorted(data["throughput"], key=lambda t: t["queue"]) == [
        {"queue": "mail", "completed": 1, "failed": 0},
        {"queue": "reports", "completed": 0, "failed": 2},
    ]


def test_stats_of_an_empty_database_says_there_is_nothing(database_url):
    out = ok(database_url, "stats")

    assert out.splitlines()[0] == "no tasks"
    assert ok_json(database_url, "stats")["depth"] == []


def test_throughput_counts_tasks_finished_within_the_window_sync_and_async(database_url, conn):
    t0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    for queue in ("a", "a", "b"):
        pgqueue.enqueue(conn, "x", {}, queue=queue, max_attempts=1)
    claimed = pgqueue.claim(conn, ["a", "b"], limit=3, worker_id="w", now=t0)
    pgqueue.complete(conn, claimed[0].lease, None, now=t0)
    pgqueue.fail(conn, claimed[1].lease, "no", now=t0 + timedelta(seconds=10))
    pgqueue.cancel_leased(conn, claimed[2].lease, "stop", now=t0)

    def counts(rows: list[Any]) -> dict[str, tuple[int, int]]:
        return {r.queue: (r.completed, r.failed) for r in rows}

    within = pgqueue.throughput(conn, now=t0 + timedelta(seconds=30))
    assert counts(within) == {"a": (1, 1)}  # the cancelled task of queue b is not counted
    assert counts(pgqueue.throughput(conn, now=t0 + timedelta(seconds=65))) == {"a": (0, 1)}
    assert pgqueue.throughput(conn, now=t0 + timedelta(seconds=200)) == []
    assert pgqueue.throughput(conn, now=t0 - timedelta(seconds=1)) == []
    assert pgqueue.throughput(conn, window_seconds=300, now=t0 + timedelta(seconds=200)) == within

    async def from_aio() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            return await aio.throughput(aconn, now=t0 + timedelta(seconds=30))

    assert asyncio.run(from_aio()) == within


@pytest.mark.parametrize("window", [0, -1, float("nan"), True])
def test_throughput_rejects_a_window_that_is_not_a_positive_number(conn, window):
    with pytest.raises(pgqueue.ValidationError, match="window_seconds"):
        pgqueue.throughput(conn, window_seconds=window)


# --- the dead-letter queue -----------------------------------------------------------------------


def test_dlq_list_shows_only_dead_letters_with_the_gist_of_their_error(database_url, conn):
    pgqueue.enqueue(conn, "fine", {}, queue="other")
    (dead,) = make_dead_letters(
        conn, 1, error="Traceback (most recent call last):\n  File 'x'\nKeyError: 'customer'"
    )

    lines = ok(database_url, "dlq", "list").splitlines()

    assert lines[0].split() == ["ID", "TYPE", "QUEUE", "ATTEMPTS", "FINISHED", "LAST", "ERROR"]
    assert len(lines) == 2
    assert lines[1].startswith(str(dead))
    assert lines[1].endswith("KeyError: 'customer'")


def test_dlq_list_json_filters_by_type_and_queue(database_url, conn):
    a = make_dead_letters(conn, 2, type="a", queue="q1")
    make_dead_letters(conn, 1, type="b", queue="q1")
    make_dead_letters(conn, 1, type="a", queue="q2")

    data = ok_json(database_url, "dlq", "list", "--type", "a", "--queue", "q1")

    assert sorted(d["task_id"] for d in data) == sorted(str(i) for i in a)
    assert {d["status"] for d in data} == {"failed"}
    assert len(ok_json(database_url, "dlq", "list", "--limit", "3")) == 3


def test_dlq_list_with_no_dead_letters_says_so(database_url, conn):
    pgqueue.enqueue(conn, "x", {})

    assert ok(database_url, "dlq", "list").strip() == "no dead letters"


def test_dlq_show_prints_payload_last_error_and_attempts(database_url, conn):
    (dead,) = make_dead_letters(conn, 1, error="first line\nsecond line")

    out = ok(database_url, "dlq", "show", str(dead))
    data = ok_json(database_url, "dlq", "show", str(dead))

    assert "attempts:" in out and "1/1" in out
    assert '"n": 0' in out
    assert "first line" in out and "second line" in out
    assert data == pgqueue.get_task(conn, dead).to_dict()


def test_dlq_show_of_a_task_that_is_not_a_dead_letter_is_an_error(database_url, conn):
    task_id = pgqueue.enqueue(conn, "x", {}).id

    result = invoke(database_url, "dlq", "show", str(task_id))

    assert result.exit_code == 1
    assert isinstance(result.exception, pgqueue.InvalidTaskState)
    assert "not a dead letter" in str(result.exception)


def test_dlq_replay_by_id_requeues_with_fresh_attempts(database_url, conn):
    first, second = make_dead_letters(conn, 2)

    out = ok(database_url, "dlq", "replay", str(first))

    assert out.strip() == "replayed 1 dead letter"
    task = pgqueue.get_task(conn, first)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.QUEUED, 0)
    assert pgqueue.get_task(conn, second).status is pgqueue.TaskStatus.FAILED


def test_dlq_replay_json_lists_the_replayed_ids(database_url, conn):
    ids = make_dead_letters(conn, 3)

    data = ok_json(database_url, "dlq", "replay", *map(str, ids))

    assert data["replayed"] == 3
    assert sorted(data["ids"]) == sorted(map(str, ids))


def test_dlq_replay_of_ids_that_are_not_all_dead_letters_replays_none_and_names_each(
    database_url, conn
):
    (dead,) = make_dead_letters(conn, 1)
    queued = pgqueue.enqueue(conn, "x", {}).id
    unknown = uuid.UUID(int=7)

    proc = run_cli(database_url, "dlq", "replay", str(dead), str(queued), str(unknown))

    line = one_line_error(proc, 1)
    assert "2 of 3" in line and "none was replayed" in line
    assert f"{queued} (status 'queued')" in line
    assert f"{unknown} (no such task)" in line
    assert proc.stdout == ""
    assert pgqueue.get_task(conn, dead).status is pgqueue.TaskStatus.FAILED


@pytest.mark.parametrize("command", ["replay", "discard"])
def test_dlq_replay_or_discard_of_a_completed_task_is_an_error_naming_it_and_its_status(
    database_url, conn, command
):
    task_id = make_completed(conn, None)

    extra = ["--yes"] if command == "discard" else []
    proc = run_cli(database_url, "dlq", command, str(task_id), *extra)

    line = one_line_error(proc, 1)
    assert f"task {task_id}: not a dead letter" in line
    assert "(status is 'completed')" in line
    assert proc.stdout == ""
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.COMPLETED


def test_dlq_replay_with_a_malformed_id_replays_nothing(database_url, conn):
    (dead,) = make_dead_letters(conn, 1)

    proc = run_cli(database_url, "dlq", "replay", str(dead), "nope")

    assert one_line_error(proc, 2) == (
        "error: Invalid value for '[ID]...': 'nope' is not a task id (a UUID) "
        "(see `pgqueue dlq replay --help`)"
    )
    assert pgqueue.get_task(conn, dead).status is pgqueue.TaskStatus.FAILED


def test_dlq_replay_by_type_and_queue_leaves_other_dead_letters(database_url, conn):
    wanted = make_dead_letters(conn, 3, type="a", queue="q1")
    other_type = make_dead_letters(conn, 1, type="b", queue="q1")
    other_queue = make_dead_letters(conn, 1, type="a", queue="q2")

    data = ok_json(database_url, "dlq", "replay", "--type", "a", "--queue", "q1")

    assert sorted(data["ids"]) == sorted(map(str, wanted))
    left = {t.id for t in pgqueue.list_tasks(conn, status="failed")}
    assert left == {*other_type, *other_queue}


def test_dlq_replay_all_of_2500_dead_letters_in_batches_with_a_progress_bar(
    database_url, conn, monkeypatch
):
    make_dead_letters(conn, 2500)
    batches: list[tuple[int, int]] = []
    real_replay = pgqueue.operations.replay

    def counting_replay(conn: Any, ids: Any = None, **kwargs: Any) -> list[uuid.UUID]:
        replayed = real_replay(conn, ids, **kwargs)
        batches.append((kwargs["limit"], len(replayed)))
        return replayed

    monkeypatch.setattr(pgqueue.operations, "replay", counting_replay)
    # Let the bar draw as it would on a terminal (the runner's stderr is not one).
    monkeypatch.setattr("pgqueue.cli._is_terminal", lambda stream: True)
    monkeypatch.setattr("typer._click._termui_impl.isatty", lambda stream: True)

    result = invoke(database_url, "dlq", "replay", "--all", "--batch-size", "1000")

    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip() == "replayed 2500 dead letters"
    assert batches == [(1000, 1000), (1000, 1000), (1000, 500), (1000, 0)]
    assert "replaying dead letters" in result.stderr
    assert "2500/2500" in result.stderr
    stats = pgqueue.queue_stats(conn)
    assert [(s.status, s.tasks) for s in stats] == [("queued", 2500)]
    assert {t.attempts for t in pgqueue.list_tasks(conn, limit=2500)} == {0}


def test_dlq_replay_draws_no_progress_bar_when_stderr_is_not_a_terminal(database_url, conn):
    make_dead_letters(conn, 5)

    result = invoke(database_url, "dlq", "replay", "--all", "--batch-size", "2")

    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip() == "replayed 5 dead letters"
    assert result.stderr == ""


def test_dlq_discard_with_yes_deletes_the_selected_dead_letters(database_url, conn):
    doomed = make_dead_letters(conn, 3, type="a")
    kept = make_dead_letters(conn, 2, type="b")

    data = ok_json(database_url, "dlq", "discard", "--type", "a", "--yes")

    assert data["discarded"] == 3
    assert sorted(data["ids"]) == sorted(map(str, doomed))
    assert {t.id for t in pgqueue.list_tasks(conn)} == set(kept)


def test_dlq_discard_asks_first_and_declining_keeps_everything(database_url, conn, monkeypatch):
    ids = make_dead_letters(conn, 2)
    monkeypatch.setattr("pgqueue.cli._is_terminal", lambda stream: True)
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))

    result = run_main(database_url, "dlq", "discard", "--all")

    assert result.code == 1
    assert result.stderr.startswith("Permanently delete all 2 dead letter(s)? [y/N]: ")
    assert result.stderr.endswith("error: aborted: nothing was discarded\n")
    assert result.stdout == ""
    assert {t.id for t in pgqueue.list_tasks(conn)} == set(ids)


def test_dlq_discard_goes_ahead_once_confirmed(database_url, conn, monkeypatch):
    ids = make_dead_letters(conn, 2)
    monkeypatch.setattr("pgqueue.cli._is_terminal", lambda stream: True)

    result = invoke(database_url, "dlq", "discard", str(ids[0]), input="y\n")

    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout == "discarded 1 dead letter\n"
    assert [t.id for t in pgqueue.list_tasks(conn)] == [ids[1]]


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["plain", "json"])
def test_dlq_discard_without_a_terminal_or_yes_is_a_usage_error_saying_to_pass_yes(
    database_url, conn, json_flag
):
    ids = make_dead_letters(conn, 1)

    proc = run_cli(database_url, *json_flag, "dlq", "discard", "--all", input="y\n")

    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "pass --yes" in proc.stderr and "nothing was discarded" in proc.stderr
    assert [t.id for t in pgqueue.list_tasks(conn)] == ids


def test_dlq_discard_with_a_terminal_that_ends_without_an_answer_aborts(
    database_url, conn, monkeypatch
):
    ids = make_dead_letters(conn, 1)
    monkeypatch.setattr("pgqueue.cli._is_terminal", lambda stream: True)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    result = run_main(database_url, "dlq", "discard", "--all")

    assert result.code == 1
    assert result.line == "error: aborted: nothing was discarded"
    assert result.stdout == ""
    assert [t.id for t in pgqueue.list_tasks(conn)] == ids


# --- --json, before or after the command, and errors under it ----------------------------------


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    # Through get_command, not the commands dict: the root builds each command from its
    # module only when asked for it (pgqueue/cli/root.py).
    for name in getattr(command, "list_commands", lambda ctx: [])(None):
        sub = command.get_command(None, name)
        yield (*path, name), sub
        yield from _commands(sub, (*path, name))


def test_every_command_and_group_accepts_json_after_its_name():
    import typer.main

    tree = dict(_commands(typer.main.get_command(app)))

    assert {"status", "worker", "serve", "demo", "dlq", "queue"} <= {p[0] for p in tree}
    lacking = [
        " ".join(p)
        for p, c in tree.items()
        if "--json" not in [o for x in c.params for o in getattr(x, "opts", [])]
    ]
    assert lacking == []


def test_json_after_the_command_is_the_same_answer_as_before_it(database_url, conn):
    make_dead_letters(conn, 1)
    task_id = pgqueue.enqueue(conn, "x", {"k": 1}).id

    for args in (["status", str(task_id)], ["dlq", "list"], ["queue", "list"], ["limit", "list"]):
        before = run_main(database_url, "--json", *args)
        after = run_main(database_url, *args, "--json")
        assert (after.code, after.stderr) == (0, ""), (args, after)
        assert json.loads(after.stdout) == json.loads(before.stdout), args


ERROR_CASES = [
    pytest.param(["status"], 2, "usage", "TASK_ID", id="missing-argument"),
    pytest.param(["status", "x", "--bogus"], 2, "usage", None, id="unknown-option"),
    pytest.param(["enqueue", "x", "--payload", "[1]"], 2, "usage", "--payload", id="bad-value"),
    pytest.param(["enqueue", " "], 2, "invalid_request", "type", id="library-validation"),
    pytest.param(["status", str(uuid.UUID(int=9))], 1, "not_found", None, id="not-found"),
    pytest.param(["list", "--queue", ""], 2, "invalid_request", "queue", id="bad-filter"),
]


@pytest.mark.parametrize(("args", "exit_code", "kind", "field"), ERROR_CASES)
@pytest.mark.parametrize("where", ["before", "after"])
def test_under_json_an_error_is_one_json_document_on_stderr_with_the_plain_exit_code(
    database_url, conn, args, exit_code, kind, field, where
):
    plain = run_main(database_url, *args)
    flagged = ["--json", *args] if where == "before" else [*args, "--json"]

    as_json = run_main(database_url, *flagged)

    assert (plain.code, as_json.code) == (exit_code, exit_code), (plain, as_json)
    assert as_json.stdout == ""
    (line,) = as_json.stderr.splitlines()
    body = json.loads(line)
    assert body["error"] == kind
    assert body["exit_code"] == exit_code
    assert body.get("field") == field
    assert "error: " + body["message"] == plain.line
    assert pgqueue.list_tasks(conn) == []


def test_under_json_a_task_in_the_wrong_status_names_it_and_its_status(database_url, conn):
    task_id = make_completed(conn, None)

    result = run_main(database_url, "cancel", str(task_id), "--json")

    assert result.code == 1 and result.stdout == ""
    body = json.loads(result.stderr)
    assert (body["error"], body["task_id"], body["status"]) == (
        "conflict",
        str(task_id),
        "completed",
    )


# --- the worker's and the embedded server's settings --------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", "q" * 201], ids=["empty", "blank", "too-long"])
def test_worker_refuses_a_queue_name_no_task_can_have_before_connecting(name):
    # The URL points nowhere: the refusal must come before any connection is tried.
    result = run_main("postgresql://u@127.0.0.1:1/x", "worker", "anything:tasks", "--queue", name)

    assert result.code == 2, result
    assert result.line.startswith("error: queue: "), result.line
    assert result.stdout == ""
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.WorkerConfig(queues=["default", name])
    assert info.value.field == "queue"


def test_an_unsupported_embedded_postgres_version_names_the_setting_and_the_versions(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DATABASE_URL"}
    env.update(PGQUEUE_HOME=str(tmp_path), PGQUEUE_EMBEDDED_PG_VERSION="17")

    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", "embedded", "url"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    line = one_line_error(proc, 1)
    assert line == (
        "error: PGQUEUE_EMBEDDED_PG_VERSION=17: the embedded PostgreSQL comes in versions "
        "16 or 18 (set PGQUEUE_EMBEDDED_PG_VERSION to one of them, or unset it for 18)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing was created


# --- serve ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "args", "auth"),
    [
        (None, [], "authentication: off (no PGQUEUE_API_TOKENS; listening on loopback only)"),
        ("t1" * 16 + ",t2" + "x" * 30, ["--host", "::1"], "authentication: on (2 tokens"),
        (
            None,
            ["--host", "0.0.0.0", "--allow-unauthenticated", "--allowed-host", "q.internal"],
            "authentication: OFF",
        ),
    ],
    ids=["loopback", "tokens", "unauthenticated"],
)
def test_serve_says_its_urls_the_masked_database_and_authentication_before_uvicorn(
    monkeypatch, request, tokens, args, auth
):
    started: list[str] = []
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: started.append(sys.stdout.getvalue()))
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", "unused")  # serve sets it for its processes
    monkeypatch.delenv("PGQUEUE_API_TOKENS_FILE", raising=False)
    if tokens:
        monkeypatch.setenv("PGQUEUE_API_TOKENS", tokens)
    else:
        monkeypatch.delenv("PGQUEUE_API_TOKENS", raising=False)
    url = "postgresql://app:s3cret@db.example:5432/jobs"

    result = run_main(url, "serve", "--port", "8123", *args)
    as_json = run_main(url, "serve", "--port", "8123", *args, "--json")

    assert result.code == 0, result
    assert len(started) == 2 and started[0] == result.stdout  # all of it before uvicorn ran
    host = {"::1": "[::1]", "0.0.0.0": "0.0.0.0"}.get(args[1] if args else "", "127.0.0.1")
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["API:", f"http://{host}:8123/api/v1"]
    assert lines[1].split() == ["dashboard:", f"http://{host}:8123/dashboard/"]
    assert lines[2].split() == ["database:", "postgresql://app:***@db.example:5432/jobs"]
    assert lines[3].startswith(auth), lines[3]
    hosts = {"loopback": "loopback names only", "tokens": "any", "unauthenticated": "q.internal"}
    assert lines[4].startswith(f"Host header:    {hosts[request.node.callspec.id]}"), lines[4]
    assert "s3cret" not in result.stdout + as_json.stdout
    data = json.loads(as_json.stdout)
    assert data["dashboard_url"] == f"http://{host}:8123/dashboard/"
    assert data["authentication"] is bool(tokens)


# --- where the database is the problem -----------------------------------------------------------


def test_an_unreachable_database_is_one_line_that_hides_the_password():
    proc = run_cli("postgresql://postgres:secret@127.0.0.1:1/x", "list")

    line = one_line_error(proc, 1)
    assert "cannot connect" in line
    assert "127.0.0.1" in line
    assert "secret" not in proc.stdout + proc.stderr


def test_a_database_without_the_schema_says_to_run_migrate(empty_database_url):
    proc = run_cli(empty_database_url, "stats")

    assert "pgqueue migrate" in one_line_error(proc, 1)


def test_migrate_says_what_it_did_and_that_a_second_run_has_nothing_to_do(empty_database_url):
    first = run_cli(empty_database_url, "migrate")
    again = run_cli(empty_database_url, "migrate")

    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert "(was not installed)" in first.stdout, first.stdout
    assert "(already up to date, nothing to do)" in again.stdout, again.stdout


@pytest.mark.parametrize("command", [("stats",), ("worker", "pgqueue.demo:tasks")])
def test_with_the_embedded_fallback_off_a_missing_url_is_refused_and_starts_no_server(
    tmp_path, command
):
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DATABASE_URL"}
    env.update(PGQUEUE_EMBEDDED="off", PGQUEUE_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    line = one_line_error(proc, 1)
    assert "no database URL" in line and "PGQUEUE_EMBEDDED=off" in line, line
    assert list(tmp_path.iterdir()) == []  # no embedded server was started


def test_the_library_refuses_a_missing_url_too_with_the_embedded_fallback_off(monkeypatch):
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    monkeypatch.setenv("PGQUEUE_EMBEDDED", "off")
    with pytest.raises(pgqueue.ConfigurationError, match="PGQUEUE_EMBEDDED=off"):
        pgqueue.Client()
    monkeypatch.setenv("PGQUEUE_EMBEDDED", "sometimes")
    with pytest.raises(pgqueue.ConfigurationError, match="must be on or off"):
        pgqueue.Client()


def test_debug_shows_the_traceback(empty_database_url):
    proc = run_cli(empty_database_url, "--debug", "list")

    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "SchemaNotReady" in proc.stderr


def test_help_lists_the_operator_commands():
    result = runner.invoke(app, ["--help"])

    assert result.exit_code == 0
    for command in ("enqueue", "status", "list", "cancel", "stats", "dlq", "migrate"):
        assert command in result.stdout
