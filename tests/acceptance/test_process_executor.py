"""The process executor in real ``pgqueue worker`` processes against PostgreSQL.

The handlers (``process_handlers.py`` beside this file) run in the worker's child processes
and commit a row to ``runs`` as they start (and some as they end), so the tests see each
execution, the process that ran it, and runs cut short. Every wait polls the database, the
processes or the worker's JSON log for a condition, with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from process_handlers import add, async_add, double
from psycopg.rows import dict_row
from test_worker_processes import FAST, WorkerProcess, Workers, wait_for_exit, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(240)]

REGISTRY = "process_handlers:tasks"
JSON = ("--log-format", "json")

SIDE_TABLES = """
CREATE TABLE runs (
    task_id    uuid        NOT NULL,
    type       text        NOT NULL,
    attempt    int         NOT NULL,
    pid        int         NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz,
    note       text        NOT NULL DEFAULT ''
);
CREATE TABLE tx_writes (task_id uuid NOT NULL, attempt int NOT NULL);
"""

FINAL = {pgqueue.TaskStatus.COMPLETED, pgqueue.TaskStatus.FAILED, pgqueue.TaskStatus.CANCELLED}


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SIDE_TABLES)
    return conn


def start(workers: Workers, url: str, *options: str, name: str | None = None) -> WorkerProcess:
    return workers.start(url, *FAST, *JSON, *options, registry=REGISTRY, name=name)


def runs(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM runs WHERE task_id = %s ORDER BY attempt", (task_id,))
        return cur.fetchall()


def finished(
    conn: psycopg.Connection[Any],
    task_id: uuid.UUID,
    worker: WorkerProcess,
    workers: Workers,
    timeout: float = 60,
) -> pgqueue.Task:
    """The task once it is final (completed, dead-lettered or cancelled)."""

    def final() -> pgqueue.Task | None:
        task = pgqueue.get_task(conn, task_id)
        return task if task.status in FINAL else None

    result: pgqueue.Task = wait_until(
        final, timeout=timeout, what=f"task {task_id} to finish", workers=workers, alive=[worker]
    )
    return result


def running(
    conn: psycopg.Connection[Any], task_id: uuid.UUID, worker: WorkerProcess, workers: Workers
) -> dict[str, Any]:
    """The task's first run, once its handler has started."""
    found: list[dict[str, Any]] = wait_until(
        lambda: runs(conn, task_id),
        timeout=60,
        what=f"task {task_id}'s handler to start",
        workers=workers,
        alive=[worker],
    )
    return found[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def events(worker: WorkerProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e["event"] == name]


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


# --- time limits ---------------------------------------------------------------------------


def test_a_handler_catches_the_soft_limit_and_the_attempt_is_recorded_as_timed_out(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url)
    task_id = pgqueue.enqueue(db, "soft_limit", {}, max_attempts=1).id

    task = finished(db, task_id, worker, workers)

    # It caught TimeLimitExceeded (should_stop() had turned true) and returned a value, yet the
    # attempt counts as timed out, and its policy (one attempt) dead-letters it.
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 1)
    assert task.last_error == "timed out after 1 s"
    [run] = runs(db, task_id)
    assert run["note"] == "caught TimeLimitExceeded after 1 s; stop=True"
    [timed_out] = events(worker, "task.timed_out")
    assert timed_out["task_id"] == str(task_id) and timed_out["killed"] is False
    assert timed_out["type"] == "soft_limit" and timed_out["attempt"] == 1


def test_a_busy_loop_and_a_call_stuck_in_c_are_killed_at_the_hard_limit_while_others_run(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "3", "--concurrency", "3")
    busy = pgqueue.enqueue(db, "busy_loop", {}).id
    stuck = pgqueue.enqueue(db, "stuck_in_c", {}).id
    runs_of = {t: running(db, t, worker, workers) for t in (busy, stuck)}
    # Meanwhile the third child runs other tasks, one after another.
    others = [pgqueue.enqueue(db, "pid", {}).id for _ in range(3)]
    done_others = [finished(db, t, worker, workers) for t in others]

    for task_id in (busy, stuck):
        task = finished(db, task_id, worker, workers)
        assert task.status is pgqueue.TaskStatus.FAILED and task.attempts == 1
        assert task.last_error == "timed out after 1 s; killed after the hard limit (1 s)"
        # Stopped within the hard limit (1 s after the 1 s timeout) and one second more.
        run = runs_of[task_id]
        assert task.finished_at is not None
        took = (task.finished_at - run["started_at"]).total_seconds()
        assert took < 1 + 1 + 1, f"{task.type} ran {took:.2f} s"
        assert not alive(run["pid"]), "the killed child is still running"
    assert all(t.status is pgqueue.TaskStatus.COMPLETED for t in done_others)
    assert all(t.finished_at is not None for t in done_others)
    last_kill = max(pgqueue.get_task(db, t).finished_at for t in (busy, stuck))  # type: ignore[type-var]
    assert any(t.finished_at < last_kill for t in done_others)  # type: ignore[operator]

    # Each killed child was replaced: three children again, new tasks run in them.
    after = [pgqueue.enqueue(db, "pid", {}).id for _ in range(3)]
    assert all(
        finished(db, t, worker, workers).status is pgqueue.TaskStatus.COMPLETED for t in after
    )
    killed = events(worker, "worker.child_killed")
    assert sorted(e["type"] for e in killed) == ["busy_loop", "stuck_in_c"]
    assert {e["reason"] for e in killed} == {"time"}


# --- crashes -------------------------------------------------------------------------------


def test_a_crashing_child_costs_only_its_own_task_at_once(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    # A lease of 60 s: a crash recorded by lease expiry would take a minute per attempt.
    worker = start(
        workers, database_url, "--process-pool-size", "2", "--lease-seconds", "60",
        "--metrics-port", str(_free_port()), "--metrics-host", "127.0.0.1",
    )  # fmt: skip
    innocent = pgqueue.enqueue(db, "sleep", {"seconds": 3}).id
    running(db, innocent, worker, workers)
    segv = pgqueue.enqueue(db, "segfault", {}).id
    exit3 = pgqueue.enqueue(db, "exit3", {}).id

    for task_id, error in (
        (segv, "worker child died: SIGSEGV"),
        (exit3, "worker child exited with code 3"),
    ):
        task = finished(db, task_id, worker, workers)
        # Every attempt was counted and recorded at once, then the task was dead-lettered.
        assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 2)
        assert task.last_error is not None and task.last_error.startswith(error), task
        assert f"running task {task_id} ({task.type}, attempt 2)" in task.last_error
        first, second = runs(db, task_id)
        assert task.finished_at is not None
        # No lease expiry between: the retry started within the backoff, the end just after.
        assert (second["started_at"] - first["started_at"]).total_seconds() < 30
        assert (task.finished_at - second["started_at"]).total_seconds() < 30

    # The task in the other child lost nothing: one run, one attempt, completed.
    task = finished(db, innocent, worker, workers)
    assert (task.status, task.attempts, task.result) == (pgqueue.TaskStatus.COMPLETED, 1, "slept")
    assert len(runs(db, innocent)) == 1
    died = events(worker, "worker.child_died")
    assert sorted((e["type"], e["attempt"], e["exit_code"], e["signal"]) for e in died) == [
        ("exit3", 1, 3, ""),
        ("exit3", 2, 3, ""),
        ("segfault", 1, -signal.SIGSEGV, "SIGSEGV"),
        ("segfault", 2, -signal.SIGSEGV, "SIGSEGV"),
    ]
    metrics = _scrape(worker)
    assert metrics["pgqueue_worker_children_died_total"] == 4
    assert metrics["pgqueue_worker_children_started_total"] >= 2 + 4


def test_a_child_over_the_memory_limit_is_killed_and_its_task_failed(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "1", "--memory-limit", "200")
    task_id = pgqueue.enqueue(db, "hog", {"mb": 400}).id

    task = finished(db, task_id, worker, workers)

    assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 1)
    assert task.last_error is not None
    assert re.match(r"memory limit exceeded \(\d+ MB > 200 MB\)", task.last_error), task
    [run] = runs(db, task_id)
    assert not alive(run["pid"])
    [killed] = events(worker, "worker.child_killed")
    assert (killed["reason"], killed["task_id"]) == ("memory", str(task_id))
    # The replacement runs the next task.
    after = pgqueue.enqueue(db, "pid", {}).id
    assert finished(db, after, worker, workers).status is pgqueue.TaskStatus.COMPLETED


# --- recycling -----------------------------------------------------------------------------


def test_children_are_recycled_after_max_tasks_and_past_their_memory(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(
        workers, database_url, "--process-pool-size", "1", "--max-tasks-per-child", "2",
        name="by_count",
    )  # fmt: skip
    pids = []
    for _ in range(6):  # one at a time: the one child runs them in order
        task_id = pgqueue.enqueue(db, "pid", {}).id
        pids.append(finished(db, task_id, worker, workers).result["pid"])
    assert len(set(pids)) == 3 and pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]
    recycled = events(worker, "worker.child_recycled")
    assert [e["reason"] for e in recycled][:2] == ["max_tasks_per_child"] * 2
    assert not any(alive(p) for p in {pids[0], pids[2]})
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(worker, timeout=60)[0] == 0

    # A child that leaks past max_memory_per_child is replaced before its next task.
    leaky = start(
        workers, database_url, "--process-pool-size", "1", "--max-memory-per-child", "150",
        name="by_memory",
    )  # fmt: skip
    grown = []
    for _ in range(2):
        task_id = pgqueue.enqueue(db, "grow", {"mb": 200}).id
        grown.append(finished(db, task_id, leaky, workers).result)
    assert grown[0] != grown[1]
    [recycled_event] = [e for e in events(leaky, "worker.child_recycled") if e["pid"] == grown[0]]
    assert recycled_event["reason"] == "max_memory_per_child"
    assert recycled_event["rss_mb"] > 150


# --- cancel and stop -----------------------------------------------------------------------


def test_a_cancel_interrupts_a_running_process_task(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "2")
    polite = pgqueue.enqueue(db, "sleep", {}).id
    stubborn = pgqueue.enqueue(db, "sleep", {"stubborn": True}).id
    for task_id in (polite, stubborn):
        running(db, task_id, worker, workers)
        assert pgqueue.cancel(db, task_id).cancel_requested

    # The polite handler got TaskCancelled where it slept (should_stop() true too), and let it
    # go; the stubborn one swallowed it and was killed hard_timeout (2 s) later.
    task = finished(db, polite, worker, workers)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.CANCELLED, 1)
    assert runs(db, polite)[0]["note"] == "cancelled; stop=True cancel=True"
    task = finished(db, stubborn, worker, workers)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.CANCELLED, 1)
    [run] = runs(db, stubborn)
    assert run["note"] == "cancelled; stop=True cancel=True"
    assert not alive(run["pid"])
    [killed] = events(worker, "worker.child_killed")
    assert (killed["reason"], killed["task_id"]) == ("cancel", str(stubborn))


def test_a_graceful_stop_lets_process_tasks_finish_then_kills_and_releases_the_rest(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "2", "--grace-period", "4")
    short = pgqueue.enqueue(db, "sleep", {"seconds": 2}).id
    long = pgqueue.enqueue(db, "sleep", {"seconds": 100}).id
    pids = {running(db, t, worker, workers)["pid"] for t in (short, long)}
    server = children_of(worker.pid) - pids

    worker.proc.send_signal(signal.SIGTERM)
    code, _ = wait_for_exit(worker, timeout=60)

    assert code == 0, worker.stderr()
    task = pgqueue.get_task(db, short)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "slept")
    # The handler heard the stop (should_stop() turned true) and still finished in the grace.
    assert runs(db, short)[0]["note"] == "slept; stop=True"
    # The long one was killed at the end of the grace period and given back, uncounted.
    task = pgqueue.get_task(db, long)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.QUEUED, 0), task
    [released] = events(worker, "task.released")
    assert released["task_id"] == str(long) and released["released"] is True
    assert runs(db, long)[0]["ended_at"] is None
    # No child, and no fork server, outlives the worker.
    assert not [p for p in pids | server if alive(p)]


def test_a_worker_killed_with_sigkill_leaves_no_child_behind(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "3")
    busy = [pgqueue.enqueue(db, "sleep", {}).id for _ in range(2)]
    pids = {running(db, t, worker, workers)["pid"] for t in busy}
    [server] = children_of(worker.pid)
    processes = {server} | children_of(server)  # the fork server, 2 busy children, 1 idle
    assert len(processes) == 4 and pids < processes, processes

    os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its process group

    wait_until(
        lambda: not [p for p in processes if alive(p)],
        timeout=30,
        what=f"the worker's processes {sorted(processes)} to die with it",
    )
    # Quietly: a child reading its socket as the worker died says nothing (on the same log).
    assert "Traceback" not in worker.stderr(), worker.stderr()


# --- what a handler had in a thread ---------------------------------------------------------


def test_writes_on_ctx_connection_commit_with_the_completion_and_roll_back_with_a_failure(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url)
    ok = pgqueue.enqueue(db, "tx_write", {}).id
    doomed = pgqueue.enqueue(db, "tx_write", {"fail": True}, max_attempts=2).id

    task = finished(db, ok, worker, workers)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "written")
    task = finished(db, doomed, worker, workers)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 2)
    assert task.last_error is not None and task.last_error.startswith(
        "RuntimeError: failed after writing"
    )
    written = db.execute("SELECT task_id, attempt FROM tx_writes").fetchall()
    assert written == [(ok, 1)]  # the failed attempts' writes were rolled back
    assert len(runs(db, doomed)) == 2
    completed = [e for e in events(worker, "task.completed") if e["task_id"] == str(ok)]
    assert completed[0]["transactional"] is True  # written by the child, in its transaction


SLOW_COMMIT = """
CREATE TABLE slow_commits (task_id uuid NOT NULL);
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(1.2); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commits
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


def test_a_completion_committed_by_the_child_is_not_taken_for_a_lost_lease(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    """The child writes the completion in the handler's transaction; a heartbeat that meets
    that commit (here each one does: the commit holds the task's row for 1.2 s, and the
    heartbeat beats every second) waits for it and then finds the lease gone. The worker knew
    the commit was coming, so it neither logs the task's lease lost nor stops it. (Without
    that, whether it did depended on which of the child's answer and the heartbeat's the
    worker read first: about half the tasks.)"""
    db.execute(SLOW_COMMIT)
    worker = start(
        workers, database_url, "--lease-seconds", "3", "--concurrency", "1",
        "--process-pool-size", "1",
    )  # fmt: skip
    ids = [pgqueue.enqueue(db, "tx_slow_commit", {}).id for _ in range(6)]

    for task_id in ids:
        task = finished(db, task_id, worker, workers)
        assert (task.status, task.attempts, task.result) == (
            pgqueue.TaskStatus.COMPLETED,
            1,
            "committed",
        )
    assert db.execute("SELECT count(*) FROM slow_commits").fetchone() == (6,)

    # The worker logs a completion just after its commit, which the test may see first.
    def logged() -> list[dict[str, Any]]:
        wanted = set(map(str, ids))
        return [e for e in events(worker, "task.completed") if e["task_id"] in wanted]

    wait_until(
        lambda: len(logged()) == 6,
        timeout=30,
        what="the six completions in the worker's log",
        workers=workers,
        alive=[worker],
    )
    assert all(e["transactional"] for e in logged())
    assert events(worker, "task.lease_lost") == []


def test_function_tasks_and_a_chain_run_in_child_processes(
    database_url: str, db: psycopg.Connection[Any], connect: Any, workers: Workers
) -> None:
    worker = start(workers, database_url)
    summed = add.enqueue(db, 2, 3).id
    asynced = async_add.enqueue(db, 4, 5).id
    tx = connect(autocommit=False)
    chain = pgqueue.chain(double.s(3), add.s(b=1)).enqueue(tx)
    tx.commit()
    threaded = pgqueue.enqueue(db, "in_thread", {}).id

    assert finished(db, summed, worker, workers).result == 5
    result = finished(db, asynced, worker, workers).result
    assert result["sum"] == 9 and result["pid"] != worker.pid
    for t in chain.tasks:
        finished(db, t.id, worker, workers)
    assert [pgqueue.get_task(db, t.id).result for t in chain.tasks] == [6, 7]
    # All in children; a handler naming no executor stays in the worker's threads.
    child_pids = {
        r["pid"] for t in (summed, asynced, *(t.id for t in chain.tasks)) for r in runs(db, t)
    }
    assert worker.pid not in child_pids
    assert finished(db, threaded, worker, workers).result == worker.pid
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(worker, timeout=60)[0] == 0

    # With --executor process, it runs in a child too.
    everything = start(workers, database_url, "--executor", "process", name="all_in_children")
    moved = pgqueue.enqueue(db, "in_thread", {}).id
    assert finished(db, moved, everything, workers).result not in (worker.pid, everything.pid)


def test_cpu_bound_tasks_run_in_parallel_in_two_children(
    database_url: str, db: psycopg.Connection[Any], workers: Workers
) -> None:
    worker = start(workers, database_url, "--process-pool-size", "2")
    ids = [pgqueue.enqueue(db, "cpu", {"seconds": 1.0}).id for _ in range(2)]
    for task_id in ids:
        assert finished(db, task_id, worker, workers).status is pgqueue.TaskStatus.COMPLETED
    first, second = (runs(db, t)[0] for t in ids)
    assert first["pid"] != second["pid"]
    # Each needed a second of CPU; both were running at once.
    assert max(first["started_at"], second["started_at"]) < min(
        first["ended_at"], second["ended_at"]
    )


def test_a_fork_server_spawned_where_fork_is_refused_runs_tasks_too(
    database_url: str, db: psycopg.Connection[Any], workers: Workers, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PGQUEUE_WORKER_START_METHOD", "spawn")
    worker = start(workers, database_url, "--process-pool-size", "1")
    task = finished(db, add.enqueue(db, 20, 22).id, worker, workers)
    assert task.result == 42
    [started] = events(worker, "worker.process_pool_started")
    assert started["fork_server"] == "spawn" and started["children_start"] == "fork"


def test_the_handler_s_spans_in_a_child_are_children_of_the_execution_span(
    database_url: str, db: psycopg.Connection[Any], workers: Workers, tmp_path: Path,
    monkeypatch: Any,
) -> None:  # fmt: skip
    spans_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("PGQUEUE_TRACING", "1")
    monkeypatch.setenv("PROCESS_TRACE_FILE", str(spans_file))
    worker = workers.start(database_url, *FAST, *JSON, registry="process_tracing_handlers:tasks")
    task = finished(db, pgqueue.enqueue(db, "traced", {}).id, worker, workers)

    def both() -> dict[str, dict[str, Any]] | None:
        lines = spans_file.read_text().splitlines() if spans_file.exists() else []
        spans = {s["name"]: s for s in map(json.loads, lines)}
        return spans if {"pgqueue.execute traced", "inside the handler"} <= set(spans) else None

    spans = wait_until(both, timeout=30, what="both spans", workers=workers, alive=[worker])
    execution, inside = spans["pgqueue.execute traced"], spans["inside the handler"]
    assert (execution["pid"], inside["pid"]) == (worker.pid, task.result)
    assert inside["trace_id"] == execution["trace_id"]
    assert inside["parent"] == execution["span_id"]


# --- helpers -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(worker: WorkerProcess) -> dict[str, float]:
    [serving] = events(worker, "worker.metrics_serving")
    url = f"http://127.0.0.1:{serving['port']}/metrics"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out
