"""`pgqueue workflow show / cancel / wait` against real PostgreSQL, in the style of
test_cli.py: successful runs in-process, error paths through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

from typer.testing import CliRunner

import pgqueue
from pgqueue.cli import app
from pgqueue.enqueue import new_task_id

runner = CliRunner()


def ok(url: str, *args: str) -> str:
    result = runner.invoke(app, ["--database-url", url, *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return str(result.stdout)


def run_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def chord(conn: Any, max_attempts: int = 3) -> tuple[uuid.UUID, list[uuid.UUID], uuid.UUID]:
    wf = new_task_id()
    heads = [
        pgqueue.prepare("m", {"i": i}, workflow_id=wf, max_attempts=max_attempts) for i in range(2)
    ]
    cb = pgqueue.prepare("cb", {}, depends_on=heads, workflow_id=wf)
    pgqueue.enqueue_many(conn, [*heads, cb])
    return wf, [h.id for h in heads], cb.id


def finish(conn: Any) -> None:
    for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w"):
        pgqueue.complete(conn, t.lease, t.payload.get("i", "cb"))
    for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w"):
        pgqueue.complete(conn, t.lease, {"done": True})


def test_workflow_show_lists_tasks_with_their_parents(conn: Any, database_url: str) -> None:
    wf, heads, cb = chord(conn)
    out = ok(database_url, "workflow", "show", str(wf))
    assert "running" in out and "ATTEMPTS" in out and "PARENTS" in out
    line = next(row for row in out.splitlines() if row.startswith(str(cb)))
    assert "waiting" in line and str(heads[0]) in line and str(heads[1]) in line
    data = json.loads(ok(database_url, "workflow", "show", str(wf), "--json"))
    assert data["status"] == "running" and data["counts"]["waiting"] == 1
    assert [t["task_id"] for t in data["tasks"]] == [*map(str, heads), str(cb)]
    assert data["tasks"][2]["parents"] == [str(h) for h in heads]
    assert data["tasks"][0]["children"] == [str(cb)]


def test_workflow_cancel_cancels_what_has_not_finished(conn: Any, database_url: str) -> None:
    wf, _, cb = chord(conn)
    data = json.loads(ok(database_url, "--json", "workflow", "cancel", str(wf)))
    assert data["status"] == "cancelled" and data["counts"]["cancelled"] == 3
    assert pgqueue.get_task(conn, cb).status is pgqueue.TaskStatus.CANCELLED


def test_workflow_wait_prints_the_result_or_exits_like_a_task_wait(
    conn: Any, database_url: str
) -> None:
    wf, _, _ = chord(conn)
    timed_out = run_cli(database_url, "workflow", "wait", str(wf), "--timeout", "0.2")
    assert timed_out.returncode == 3, timed_out.stderr
    assert str(wf) in timed_out.stderr and "Traceback" not in timed_out.stderr
    finish(conn)
    assert json.loads(ok(database_url, "workflow", "wait", str(wf), "--timeout", "5")) == {
        "done": True
    }
    data = json.loads(ok(database_url, "--json", "workflow", "wait", str(wf)))
    assert data == {"workflow_id": str(wf), "result": {"done": True}}


def test_workflow_wait_on_a_failed_workflow_exits_1_naming_the_task(
    conn: Any, database_url: str
) -> None:
    wf, heads, _ = chord(conn, max_attempts=1)
    for t in pgqueue.claim(conn, ["default"], limit=10, worker_id="w"):
        pgqueue.fail(conn, t.lease, "boom")
    proc = run_cli(database_url, "--json", "workflow", "wait", str(wf), "--timeout", "5")
    assert proc.returncode == 1, proc.stderr
    body = json.loads(proc.stderr)
    assert body["error"] == "workflow_failed" and body["workflow_id"] == str(wf)
    assert body["task_id"] in {str(h) for h in heads}


def test_unknown_workflow_is_not_found_with_exit_code_1(database_url: str) -> None:
    ghost = uuid.uuid4()
    for command in ("show", "cancel", "wait"):
        proc = run_cli(database_url, "--json", "workflow", command, str(ghost))
        assert proc.returncode == 1, proc.stderr
        body = json.loads(proc.stderr)
        assert body["error"] == "not_found" and body["workflow_id"] == str(ghost), command
    proc = run_cli(database_url, "workflow", "show", str(ghost))
    assert proc.stderr.strip() == f"error: no workflow with id '{ghost}'"
