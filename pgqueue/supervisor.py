"""Several worker processes under one command (``pgqueue worker --processes N``).

Each child is a complete worker (its own event loop, connections and handler threads), so
the GIL does not cap a multi-core machine and one child's crash (a segfault, ``os._exit``, an
OOM kill) does not take the others down: the supervisor restarts it, with a backoff if it
keeps dying. SIGTERM/SIGINT are passed on to every child (graceful); a second signal is
passed on too, which makes the children stop at once.

How a child starts. **fork** (Linux): the supervisor has imported pgqueue, the
worker and the application's registry once, and each child is forked from that state, so it
starts in milliseconds instead of importing everything again in a fresh interpreter (on two
cores, N children doing that at once took a second or more). A child opens its connections
and starts its threads after the fork; the supervisor has neither at that moment (it checks,
before every fork: no other thread, no open socket). **spawn**: each child is a fresh
``python -m pgqueue worker ... --processes 1``, as before. Spawn is used where fork is not
safe (macOS: its system libraries do not survive a fork of a process that used them; Windows
has no fork), when that check finds a thread or a socket (the application's module opened
one at import), or when ``PGQUEUE_WORKER_START_METHOD=spawn`` says so. Each child's
``worker.process_started`` event names the method.

A child that dies (a signal, or an exit code other than 0) leaves tasks running under its
lease owner, which nobody renews. The supervisor gave each child its worker id
(``HOST:SUPERVISOR_PID:SLOT.GENERATION``: the owner of every lease it takes), so before the
restart it fails them at once (``task_fail_owner``: each an attempt spent, retried or
dead-lettered as any failure), on a connection opened for that write alone and closed before
the next fork, within a couple of seconds; if the database does not answer in time, the
leases expire as before and the lease sweep takes the tasks back.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from pgqueue.config import EXIT_RECYCLE
from pgqueue.errors import ConfigurationError
from pgqueue.log import event

RESTART_BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0

ENV_START_METHOD = "PGQUEUE_WORKER_START_METHOD"
START_METHODS = ("fork", "spawn")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The most a dead child's take-back may hold up its restart: the connect (libpq's shortest
# timeout is 2 s), then the statement in what is left, at least half a second.
GIVE_BACK_SECONDS = 2.0
TASK_IDS_LOGGED = 20  # of a dead child's tasks, in worker.process_exited


class Child(Protocol):
    """A started child, as the supervisor watches it (``subprocess.Popen`` is one)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


def start_method() -> str:
    """How children start here: ``PGQUEUE_WORKER_START_METHOD`` if set, else fork on Linux
    and spawn elsewhere. Read (and refused if bad) before any child starts."""
    raw = os.environ.get(ENV_START_METHOD, "").strip().lower()
    if not raw:
        return "fork" if sys.platform == "linux" else "spawn"
    if raw not in START_METHODS:
        raise ConfigurationError(f"{ENV_START_METHOD} must be fork or spawn, not {raw!r}")
    if raw == "fork" and not hasattr(os, "fork"):
        raise ConfigurationError(f"{ENV_START_METHOD}=fork: this platform has no fork")
    return raw


def fork_hazard(allowed: Collection[int] = ()) -> str | None:
    """Why forking this process now would be unsafe, or None: a thread besides this one (a
    fork copies only the calling thread; a lock another one held stays locked in the child)
    or an open socket (a database connection, say: two processes would talk over one).
    Standard input, output and error are shared on purpose, whatever they are (under
    systemd, a socket to the journal), as a spawned child shares them; so are the
    ``allowed`` descriptors (the process executor's fork server: its own control socket,
    which each child closes first)."""
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        return f"a thread is running ({', '.join(sorted(others))})"
    fds = Path("/proc/self/fd")
    if fds.is_dir():
        tasks = Path("/proc/self/task")
        if tasks.is_dir() and len(list(tasks.iterdir())) > 1:
            return "a thread not started by Python is running"
        for fd in fds.iterdir():
            if int(fd.name) <= 2 or int(fd.name) in allowed:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith("socket:"):
                    return f"file descriptor {fd.name} is an open socket"
    return None


def death_cause(code: int) -> str | None:
    """What a child's exit code says about its end: None for a clean exit (0), else why it
    died, as its tasks' errors name it."""
    if code == 0:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process died: {name}"
    return f"worker process exited with code {code}"


def give_back(database_url: str, owner: str, cause: str, pid: int) -> list[dict[str, Any]]:
    """Fail every task still running under ``owner``, a child that died (``task_fail_owner``);
    the tasks failed. On a connection of its own, closed before this returns (the next fork
    must find no socket open), within about GIVE_BACK_SECONDS."""
    import psycopg

    from pgqueue.queries import claiming
    from pgqueue.queries.driver import run

    started = time.monotonic()
    conn = psycopg.connect(
        database_url,
        autocommit=True,
        connect_timeout=int(GIVE_BACK_SECONDS),
        application_name="pgqueue-supervisor",
        # One statement, then closed: preparing gains nothing, and behind a transaction
        # pooler a prepared statement is what breaks.
        prepare_threshold=None,
    )
    try:
        left = max(GIVE_BACK_SECONDS - (time.monotonic() - started), 0.5)
        with conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {int(left * 1000)}")
            return run(conn, claiming.task_fail_owner(owner, cause, pid=pid))
    finally:
        conn.close()


class ForkedChild:
    """A child forked by :func:`fork`: ``Popen``'s poll, wait and send_signal, by pid.

    The supervisor's signal handler polls too, possibly while ``wait`` is blocked on the
    same child: whichever reaps it records the code, and the other finds it recorded (its
    own waitpid then fails with ECHILD)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped by the other caller meanwhile
            if self.returncode is None:  # or by someone else: gone, its code unknown
                self.returncode = 0  # what subprocess.Popen says then
            return
        if pid and self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(status)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped, so the pid is still this child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """SIGTERM/SIGINT held back around the fork: a child must not run the supervisor's
    handler (it would signal its siblings) before it has put back the defaults. One that
    arrives meanwhile is delivered to the supervisor right after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def fork(run: Callable[[], int]) -> ForkedChild:
    """``run()`` in a forked child, whose exit code is what it returns. The child runs the
    exit handlers registered before the fork (atexit), as a spawned child would have run
    those its own imports registered (the app's task module, say, imported once by the
    supervisor here), then exits with ``os._exit``, leaving the supervisor's buffers alone."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # What the supervisor imported stays out of the children's collections (kept for the
    # process's life anyway): they neither scan it nor, by touching it, copy its pages.
    gc.freeze()
    with _stop_signals_blocked():
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                # As in a fresh interpreter, until the worker installs its own handlers.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
                code = run()
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # sys.exit("message"), as the interpreter would show it
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    atexit._run_exitfuncs()
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(code)
    return ForkedChild(pid)


class Supervisor:
    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str] | None = None,
        slot_args: Callable[[int, str], Sequence[str]] | None = None,
        run_forked: Callable[[int, str], int] | None = None,
        method: str = "spawn",
        database_url: str | None = None,
    ) -> None:
        """``command`` (with ``env``) starts a child by spawn; ``slot_args(slot, worker_id)``
        gives the arguments added to the command of the child in that slot (and of its
        replacements), such as a metrics port of its own, and the worker id this supervisor
        chose for it, which the child must take. With ``method`` fork, a child runs
        ``run_forked(slot, worker_id)`` instead, in a fork of this process, and exits with
        its result (spawn again while :func:`fork_hazard` finds a reason). With a
        ``database_url``, the tasks a dead child still held are failed at once (see the
        module's docstring)."""
        if method == "fork" and run_forked is None:
            raise ValueError("fork needs run_forked")
        self.command = list(command)
        self.slot_args = slot_args
        self.env = dict(env) if env is not None else None
        self.run_forked = run_forked
        self.method = method
        self.processes = processes
        self.database_url = database_url
        self.children: dict[int, Child] = {}
        self.worker_ids: dict[int, str] = {}  # each slot's current child's
        self.started_at: dict[int, float] = {}
        self.backoff: dict[int, float] = {}
        self.restart_at: dict[int, float] = {}
        self.signals = 0
        self._hazard: str | None = None  # the last reason not to fork, logged once each
        self._id_prefix = f"{socket.gethostname()}:{os.getpid()}"
        self._generation = 0  # children started so far, in any slot

    def _method_now(self) -> str:
        if self.method != "fork":
            return self.method
        hazard = fork_hazard()
        if hazard is not None and hazard != self._hazard:
            event("worker.fork_unsafe", logging.WARNING, reason=hazard, start="spawn")
        self._hazard = hazard
        return "spawn" if hazard is not None else "fork"

    def _start(self, slot: int) -> None:
        method = self._method_now()
        # Chosen here, so that this supervisor knows whose leases a dead child leaves: unique
        # on this host while this supervisor runs, and never reused by a replacement.
        self._generation += 1
        worker_id = f"{self._id_prefix}:{slot}.{self._generation}"
        proc: Child
        if method == "fork":
            assert self.run_forked is not None
            run, at = self.run_forked, slot
            proc = fork(lambda: run(at, worker_id))
        else:
            extra = list(self.slot_args(slot, worker_id)) if self.slot_args else []
            proc = subprocess.Popen([*self.command, *extra], env=self.env)
        self.children[slot] = proc
        self.worker_ids[slot] = worker_id
        self.started_at[slot] = time.monotonic()
        event("worker.process_started", slot=slot, pid=proc.pid, worker=worker_id, start=method)
        if self.signals:
            # The handler ran after the caller's look at self.signals and before the child
            # was in self.children (so it was not told): tell it now.
            proc.send_signal(signal.SIGTERM if self.signals == 1 else signal.SIGINT)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if self.signals == 1 else signal.SIGINT)

    def _give_back(self, slot: int, pid: int, code: int) -> list[dict[str, Any]]:
        """The tasks the dead child of ``slot`` still held, failed at once; none after a clean
        exit (a graceful stop released them), without a database URL, or when the database
        did not answer in time (their leases expire instead: logged)."""
        cause = death_cause(code)
        if cause is None or self.database_url is None:
            return []
        owner = self.worker_ids[slot]
        try:
            failed = give_back(self.database_url, owner, cause, pid)
        except Exception as exc:  # never the supervisor's end: the lease sweep is the fallback
            text = str(exc).strip().splitlines()
            event(
                "worker.give_back_failed",
                logging.WARNING,
                slot=slot,
                pid=pid,
                worker=owner,
                error_class=type(exc).__name__,
                sqlstate=getattr(exc, "sqlstate", None),
                error=text[0] if text else type(exc).__name__,
                note="its tasks wait for their leases to expire",
            )
            return []
        for task in failed:
            outcome = {"failed": "dead", "cancelled": "cancelled"}.get(task["status"], "retrying")
            if task["never_started"]:
                outcome = "requeued_unstarted"
            event(
                "task.failed_by_child_death",
                logging.WARNING,
                task_id=task["id"],
                type=task["type"],
                attempt=task["attempts"],
                max_attempts=task["max_attempts"],
                outcome=outcome,
                worker=owner,
                pid=pid,
                error=cause,
            )
            if outcome == "dead":  # as every other path that dead-letters a task says it
                event(
                    "task.dead",
                    logging.ERROR,
                    task_id=task["id"],
                    type=task["type"],
                    attempt=task["attempts"],
                    max_attempts=task["max_attempts"],
                    error=cause,
                )
        return failed

    def _exited(self, slot: int, proc: Child, code: int, *, restart_in: float | None) -> None:
        """A child's end: its tasks given back (bounded), then reported."""
        failed = self._give_back(slot, proc.pid, code)
        owner = self.worker_ids[slot]
        fields: dict[str, Any] = {"slot": slot, "pid": proc.pid, "worker": owner, "exit_code": code}
        if restart_in is not None:
            fields["restart_in_s"] = round(restart_in, 2)
        fields["tasks_given_back"] = len(failed)
        if failed:
            fields["task_ids"] = ",".join(str(t["id"]) for t in failed[:TASK_IDS_LOGGED])
        event("worker.process_exited", logging.WARNING, **fields)

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        # All at once: each child's start (its connections, its schema check) runs beside
        # the others'. None after a stop signal: it would never be passed one.
        for slot in range(self.processes):
            if not self.signals:
                self._start(slot)
        while True:
            if self.signals:
                for slot, proc in self.children.items():
                    last = proc.wait()
                    if death_cause(last) is not None and slot not in self.restart_at:
                        # Killed while it drained (an OOM kill, say): what it held, too.
                        self._exited(slot, proc, last, restart_in=None)
                return 0
            now = time.monotonic()
            for slot, proc in list(self.children.items()):
                code = proc.poll()
                if code is None or slot in self.restart_at:
                    continue
                if code == EXIT_RECYCLE:  # it asked to be replaced: not a crash
                    self.backoff.pop(slot, None)
                    self.restart_at[slot] = now
                    event("worker.process_recycled", slot=slot, pid=proc.pid, exit_code=code)
                    continue
                lived = now - self.started_at[slot]
                delay = (
                    0.5
                    if lived >= STABLE_AFTER
                    else min(self.backoff.get(slot, 0.25) * 2, RESTART_BACKOFF_MAX)
                )
                self.backoff[slot] = delay
                # Counted from the exit: the take-back (before the restart, so that the
                # replacement's claims may take its tasks at once) runs within the delay.
                self.restart_at[slot] = now + delay
                self._exited(slot, proc, code, restart_in=delay)
            for slot, when in list(self.restart_at.items()):
                if time.monotonic() >= when and not self.signals:
                    del self.restart_at[slot]
                    self._start(slot)
            time.sleep(0.1)
