"""The supervisor's process plumbing (pgqueue/supervisor.py): which start method, when forking
is refused, and what a forked child runs and returns. The supervised fleet itself, with real
workers, is tested in tests/acceptance/test_supervised_children.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

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


def _signal_the_supervisor_then_wait(slot: int) -> int:
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
