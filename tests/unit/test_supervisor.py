"""The supervisor's process plumbing (pgqueue/supervisor.py): which start method, when forking
is refused, and what a forked child runs and returns. The supervised fleet itself, with real
workers, is tested in tests/acceptance/test_supervised_children.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgqueue import supervisor
from pgqueue.errors import ConfigurationError

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="children are forked on Linux")


@linux_only
def test_children_are_forked_on_linux_unless_the_environment_says_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(supervisor.ENV_START_METHOD, raising=False)
    assert supervisor.start_method() == "fork"
    for raw, method in ((" Spawn ", "spawn"), ("fork", "fork"), ("", "fork")):
        monkeypatch.setenv(supervisor.ENV_START_METHOD, raw)
        assert supervisor.start_method() == method


def test_a_bad_start_method_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(supervisor.ENV_START_METHOD, "thread")
    with pytest.raises(ConfigurationError, match="must be fork or spawn, not 'thread'"):
        supervisor.start_method()


HAZARD = """
import socket, sys, threading
from pgqueue.supervisor import fork_hazard
if sys.argv[1] == "socket":
    held = socket.socket()
elif sys.argv[1] == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="app-thread", daemon=True).start()
print(fork_hazard())
"""


@linux_only
@pytest.mark.parametrize(
    ("opened", "reason"),
    [
        ("nothing", "None"),
        ("socket", "is an open socket"),
        ("thread", "a thread is running (app-thread)"),
    ],
)
def test_forking_is_refused_while_a_socket_or_a_thread_is_open(opened: str, reason: str) -> None:
    # In a fresh interpreter: the test run's own process may hold either.
    out = subprocess.run(
        [sys.executable, "-c", HAZARD, opened],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout.strip()
    assert reason in out, out


def _returns() -> int:
    return 3


def _exits() -> int:
    raise SystemExit(5)


def _exits_with_none() -> int:
    raise SystemExit(None)


def _raises() -> int:
    raise RuntimeError("boom")


@linux_only
@pytest.mark.parametrize(
    ("run", "code"), [(_returns, 3), (_exits, 5), (_exits_with_none, 0), (_raises, 1)]
)
def test_a_forked_child_exits_with_what_it_returned_or_raised(
    run: Callable[[], int], code: int
) -> None:
    child = supervisor.fork(run)
    assert child.wait() == code
    assert child.poll() == code


@linux_only
def test_a_forked_child_starts_with_the_default_stop_signal_handlers() -> None:
    """Not the supervisor's (which would signal the child's siblings); a SIGTERM then ends it
    as it ends a fresh interpreter."""
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:

        def run() -> int:
            plain = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            interrupt = signal.getsignal(signal.SIGINT) is signal.default_int_handler
            return 0 if plain and interrupt else 1

        assert supervisor.fork(run).wait() == 0

        def wait_forever() -> int:
            signal.pause()
            return 0

        child = supervisor.fork(wait_forever)
        child.send_signal(signal.SIGTERM)
        assert child.wait() == -signal.SIGTERM
        child.send_signal(signal.SIGTERM)  # reaped: nothing to signal, no error
    finally:
        signal.signal(signal.SIGTERM, previous)


@linux_only
def test_a_child_reaped_by_another_poll_keeps_its_exit_code() -> None:
    child = supervisor.fork(lambda: 7)
    _, status = os.waitpid(child.pid, 0)  # as the signal handler's poll does, meanwhile
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.wait() == 7


@linux_only
def test_a_child_reaped_elsewhere_is_not_waited_for_forever() -> None:
    child = supervisor.fork(lambda: 7)
    os.waitpid(child.pid, 0)
    assert child.wait() == 0  # its code is lost; as subprocess.Popen answers then


def _signal_the_supervisor_then_wait(slot: int, worker_id: str) -> int:
    if slot == 0:
        os.kill(os.getppid(), signal.SIGTERM)
    # Until the supervisor passes a stop signal on, which ends the child; one it never passes
    # on shows as an exit code of 0 (and the supervisor does not wait for it forever).
    time.sleep(20)
    return 0


@linux_only
@pytest.mark.timeout(60)
def test_no_child_is_started_after_a_stop_signal_so_none_is_left_unsignalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGTERM while the children are being forked: the supervisor starts no more of them
    (a child started after the signal would never get it, and the supervisor would wait for
    it forever). The test runs inside pytest's process, where earlier tests may have left
    threads (the fork check would then spawn, and this fleet has no command to spawn): the
    fork is forced, its children run only the function below."""
    monkeypatch.setattr(supervisor, "fork_hazard", lambda: None)
    saved = {sig: signal.getsignal(sig) for sig in supervisor.STOP_SIGNALS}
    try:
        fleet = supervisor.Supervisor(
            [], 6, run_forked=_signal_the_supervisor_then_wait, method="fork"
        )
        assert fleet.run() == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert fleet.signals == 1
    # Each child started was passed the signal (which ends it: no handler of its own).
    assert {child.returncode for child in fleet.children.values()} == {-signal.SIGTERM}


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (0, None),
        (3, "worker process exited with code 3"),
        (-signal.SIGSEGV, "worker process died: SIGSEGV"),
        (-signal.SIGKILL, "worker process died: SIGKILL"),
        (-200, "worker process died: signal 200"),
    ],
)
def test_an_exit_code_says_whether_and_how_a_child_died(code: int, cause: str | None) -> None:
    assert supervisor.death_cause(code) == cause


POISON = uuid.UUID("00000000-0000-4000-8000-000000000003")


def _dies_in_slot_0(directory: Path) -> Callable[[int, str], int]:
    def run(slot: int, worker_id: str) -> int:
        (directory / str(slot)).write_text(worker_id)  # the id the child was given
        if slot == 0:
            # Not before its sibling has written its id: the death stops the fleet, and a
            # sibling signalled before it wrote would leave nothing to compare.
            deadline = time.monotonic() + 30
            while not (directory / "1").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(3)
        signal.pause()  # until the stop signal, which ends it (no handler of its own)
        return 0

    return run


@linux_only
@pytest.mark.timeout(60)
@pytest.mark.parametrize("answers", [True, False])
def test_a_dead_childs_tasks_are_given_back_under_its_worker_id_before_its_restart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers: bool
) -> None:
    """The supervisor chose each child's worker id (its lease owner); when one dies, its
    tasks are failed under that id, naming the cause, before a replacement starts; a
    database that does not answer is logged, and the supervisor goes on. The fork is forced,
    as in the test above; the database is a stand-in that stops the fleet."""
    monkeypatch.setattr(supervisor, "fork_hazard", lambda: None)
    calls: list[tuple[str, str, str, int, bool]] = []
    events: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(supervisor, "event", lambda name, *_, **f: events.append((name, f)))

    def give_back(url: str, owner: str, cause: str, pid: int) -> list[dict[str, Any]]:
        replaced = fleet.children[0].pid != pid
        calls.append((url, owner, cause, pid, replaced))
        if len(calls) > 1:
            return []
        os.kill(os.getpid(), signal.SIGTERM)  # stop the fleet after the first death
        if not answers:
            raise OSError("connection timeout expired")
        row = {"id": POISON, "type": "poison", "status": "failed", "attempts": 2}
        return [{**row, "max_attempts": 2, "never_started": False}]

    monkeypatch.setattr(supervisor, "give_back", give_back)
    saved = {sig: signal.getsignal(sig) for sig in supervisor.STOP_SIGNALS}
    try:
        fleet = supervisor.Supervisor(
            [], 2, run_forked=_dies_in_slot_0(tmp_path), method="fork", database_url="db"
        )
        assert fleet.run() == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    prefix = f"{socket.gethostname()}:{os.getpid()}"
    given = {0: f"{prefix}:0.1", 1: f"{prefix}:1.2"}
    assert {slot: (tmp_path / str(slot)).read_text() for slot in (0, 1)} == given
    url, owner, cause, pid, replaced = calls[0]
    assert (url, owner, cause, replaced) == (
        "db",
        given[0],
        "worker process exited with code 3",
        False,
    )
    # The sibling, ended by the stop signal before its worker could handle it: given back too.
    assert calls[1][1:3] == (given[1], "worker process died: SIGTERM")
    exited = [f for name, f in events if name == "worker.process_exited"]
    assert (exited[0]["worker"], exited[0]["pid"], exited[0]["exit_code"]) == (given[0], pid, 3)
    if answers:
        assert exited[0]["tasks_given_back"] == 1 and exited[0]["task_ids"] == str(POISON)
        [(_, death)] = [(n, f) for n, f in events if n == "task.failed_by_child_death"]
        assert (death["task_id"], death["type"], death["attempt"]) == (POISON, "poison", 2)
        assert death["outcome"] == "dead"
        assert [f["task_id"] for n, f in events if n == "task.dead"] == [POISON]
    else:
        assert exited[0]["tasks_given_back"] == 0
        [failed] = [f for name, f in events if name == "worker.give_back_failed"]
        assert failed["worker"] == given[0] and "timeout" in failed["error"]
