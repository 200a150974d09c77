"""``pgqueue worker --processes N`` as real processes: how its children start.

On Linux the supervisor forks its children from its own state (the worker and the registry
imported once); it must hold no connection and run no thread then, and every behaviour of a
supervised fleet must hold as with children started as fresh interpreters (spawn, still used
when forking is unsafe): a dead child is replaced, SIGTERM drains every child, the logs name
each one. The helpers and the handlers are test_worker_processes.py's.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_worker_processes import (
    FAST,
    SIDE_TABLES,
    WorkerProcess,
    Workers,
    all_in_status,
    enqueue,
    executions,
    has_started,
    task,
    wait_for_exit,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform != "linux", reason="children are forked on Linux only"),
]


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test database's autocommit connection, with the handlers' side tables."""
    conn.execute(SIDE_TABLES)
    return conn


def events(worker: WorkerProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e["event"] == name]


def children_started(worker: WorkerProcess) -> dict[int, dict[str, Any]]:
    """The supervisor's children that have started their worker, by pid: the event of their
    start (``worker.process_started``), which names the worker id the supervisor gave it."""
    started = {e["worker"] for e in events(worker, "worker.started")}
    return {e["pid"]: e for e in events(worker, "worker.process_started") if e["worker"] in started}


def pids_of(worker: WorkerProcess, name: str) -> set[int]:
    """The pids of the children whose worker logged the event ``name``."""
    pid_of = {e["worker"]: e["pid"] for e in events(worker, "worker.process_started")}
    return {pid_of[e["worker"]] for e in events(worker, name)}


def drained_by_two_children(
    db: psycopg.Connection[Any],
    database_url: str,
    workers: Workers,
    ids: list[Any],
    *,
    start_timeout: float,
    registry: str = "handlers:tasks",
) -> tuple[WorkerProcess, dict[int, dict[str, Any]]]:
    """A supervisor of two children started, both children's start events seen, and the tasks
    ``ids`` completed: the supervisor and its children's start events, by pid."""
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--log-format", "json", *FAST),
        name="supervisor",
        registry=registry,
    )
    children = wait_until(
        lambda: len(children_started(supervisor)) == 2 and children_started(supervisor),
        timeout=start_timeout,
        what="both children to start their worker",
        workers=workers,
        alive=[supervisor],
    )
    wait_until(
        lambda: all_in_status(db, ids, "completed"),
        timeout=30,
        what="the tasks to complete",
        workers=workers,
        alive=[supervisor],
    )
    assert isinstance(children, dict)
    return supervisor, children


def sockets_and_threads(pid: int) -> tuple[list[str], int]:
    """The open sockets (beyond stdin, stdout and stderr) and the thread count of ``pid``."""
    sockets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if int(fd.name) > 2 and target.startswith("socket:"):
            sockets.append(f"{fd.name} -> {target}")
    return sockets, len(list(Path(f"/proc/{pid}/task").iterdir()))


@pytest.mark.slow
def test_children_are_forked_each_with_its_own_connections_and_the_supervisor_holds_none(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    ids = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(20)))
    supervisor, children = drained_by_two_children(db, database_url, workers, ids, start_timeout=30)
    assert {e["start"] for e in children.values()} == {"fork"}
    assert sorted(e["slot"] for e in children.values()) == [0, 1]
    assert supervisor.pid not in children
    ran = {pid for task_id in ids for _, pid in executions(db, task_id)}
    assert ran <= set(children), "a task ran outside the children"
    # Each child listens on a connection of its own; the supervisor has none, nor a thread.
    listening = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query = 'LISTEN pgqueue'"
    ).fetchone()
    assert listening is not None and listening[0] == 2
    assert sockets_and_threads(supervisor.pid) == ([], 1)
    # The logs name each child: the worker id its supervisor gave it (HOST:PID:SLOT.N), which
    # the supervisor's start event pairs with the child's pid.
    assert pids_of(supervisor, "worker.started") == set(children)
    prefix = f":{supervisor.pid}:"
    assert sorted(e["worker"].partition(prefix)[2] for e in children.values()) == ["0.1", "1.2"]
    assert not events(supervisor, "worker.fork_unsafe")

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 30)[0] == 0


@pytest.mark.slow
def test_a_forked_child_killed_with_sigkill_is_replaced_and_its_task_completes_elsewhere(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    (blocked,) = enqueue(db, {"type": "block", "priority": "high"})
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--concurrency", "1", "--lease-seconds", "2"),
        *("--log-format", "json", *FAST),
        name="supervisor",
    )
    wait_until(
        lambda: has_started(db, blocked),
        timeout=30,
        what="a child to start the block task",
        workers=workers,
        alive=[supervisor],
    )
    [(_, victim)] = executions(db, blocked)
    others = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(6)))
    os.kill(victim, signal.SIGKILL)

    wait_until(
        lambda: all_in_status(db, [blocked, *others], "completed"),
        timeout=45,
        what="the killed child's task and the others to complete",
        workers=workers,
        alive=[supervisor],
    )
    rerun = task(db, blocked)
    assert rerun.attempts == 2 and rerun.result == {"attempt": 2}
    # Failed by the supervisor when it saw the child die, not by the lease sweep.
    assert "worker process died: SIGKILL on attempt 1" in (rerun.last_error or "")
    [_, (_, rerun_by)] = executions(db, blocked)
    assert rerun_by != victim

    exited = wait_until(
        lambda: [e for e in events(supervisor, "worker.process_exited") if e["pid"] == victim],
        timeout=10,
        what="the supervisor to report the killed child",
        workers=workers,
        alive=[supervisor],
    )
    assert exited[0]["exit_code"] == -signal.SIGKILL
    slot = exited[0]["slot"]
    replacement = wait_until(
        lambda: [
            e
            for e in events(supervisor, "worker.process_started")
            if e["slot"] == slot and e["pid"] != victim
        ],
        timeout=10,
        what="a replacement in the killed child's slot",
        workers=workers,
        alive=[supervisor],
    )
    assert replacement[0]["start"] == "fork"
    wait_until(
        lambda: replacement[0]["pid"] in pids_of(supervisor, "worker.started"),
        timeout=20,
        what="the replacement to start its worker",
        workers=workers,
        alive=[supervisor],
    )

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 30)[0] == 0


@pytest.mark.slow
def test_sigterm_to_the_supervisor_drains_every_forked_child(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    sleepers = enqueue(
        db, *({"type": "sleep", "priority": "high", "payload": {"seconds": 2}} for _ in range(3))
    )
    waiting = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(5)))
    supervisor = workers.start(
        database_url,
        *("--processes", "3", "--concurrency", "1", "--grace-period", "20"),
        *("--log-format", "json", *FAST),
        name="supervisor",
    )
    wait_until(
        lambda: all(has_started(db, t) for t in sleepers),
        timeout=30,
        what="each child to start a sleep task",
        workers=workers,
        alive=[supervisor],
    )
    children = set(children_started(supervisor))
    assert {pid for t in sleepers for _, pid in executions(db, t)} == children

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 25)[0] == 0

    for task_id in sleepers:
        done = task(db, task_id)
        assert (done.status, done.attempts) == ("completed", 1), task_id
        assert done.result is not None and done.result["stopped"] is False, task_id
    for task_id in waiting:
        untouched = task(db, task_id)
        assert (untouched.status, untouched.attempts) == ("queued", 0)
    stopped = pids_of(supervisor, "worker.stopped")
    assert stopped == children, "every child must stop its worker, not be killed"
    for pid in children:
        assert not Path(f"/proc/{pid}").exists(), f"child {pid} outlived its supervisor"


@pytest.mark.slow
def test_children_start_as_fresh_interpreters_with_start_method_spawn(
    db: psycopg.Connection[Any],
    database_url: str,
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_WORKER_START_METHOD", "spawn")
    ids = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(10)))
    supervisor, children = drained_by_two_children(db, database_url, workers, ids, start_timeout=60)
    assert {e["start"] for e in children.values()} == {"spawn"}
    for pid in children:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert command_line[1:4] == [b"-m", b"pgqueue", b"worker"], command_line
        assert b"--processes" in command_line and b"1" in command_line

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 30)[0] == 0


SOCKET_AT_IMPORT = """
import socket

from handlers import tasks

# An application module that opens a connection when it is imported: a forked child would
# share it with its siblings.
held = socket.socket()
"""


@pytest.mark.slow
def test_a_registry_that_opened_a_socket_at_import_gets_spawned_children(
    db: psycopg.Connection[Any], database_url: str, workers: Workers, tmp_path: Path
) -> None:
    (tmp_path / "socket_handlers.py").write_text(SOCKET_AT_IMPORT, encoding="utf-8")
    ids = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(10)))
    supervisor, children = drained_by_two_children(
        db, database_url, workers, ids, start_timeout=60, registry="socket_handlers:tasks"
    )
    assert {e["start"] for e in children.values()} == {"spawn"}
    [warning] = events(supervisor, "worker.fork_unsafe")  # said once, not per child
    assert "socket" in warning["reason"] and warning["start"] == "spawn"

    supervisor.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(supervisor, 30)[0] == 0
