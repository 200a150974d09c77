"""The process executor's other side: the fork server, and the children that run handlers.

**The fork server** is started once per worker, before the worker has a connection or a
thread (forked from it then, so it holds the registry the worker imported), or, where the
worker could no longer be forked safely, spawned as a fresh interpreter that imports the
registry by its ``module:attribute``. It is single-threaded and opens nothing, so it can
fork at any time: every child, the first ones and each replacement after a crash, a kill or
a recycle, is a fork of it (a few milliseconds), whatever the worker holds by then. It hands
each child's socket to the worker (``socket.send_fds``), kills a child when asked (it is the
one that reaps them, so a pid it is asked to kill is still that child's), and reports each
exit status. If importing the registry left a thread or a socket open in it, it spawns
each child instead (``supervisor.fork_hazard``'s rule, slower).

**A child** runs one task at a time in its main thread, where signals are delivered: the
timeout is a ``setitimer`` alarm whose handler raises :class:`~pgqueue.TimeLimitExceeded`
in the handler's code, a cancel is ``SIGUSR1`` raising :class:`~pgqueue.TaskCancelled`.
A reader thread takes the worker's messages, so that ``stop`` reaches a running handler
(``ctx.should_stop()``); the end of its socket means the worker is gone, and the child
exits at once. ``ctx.connection`` is a connection of the child's own, opened on first use
and kept between tasks: when the handler succeeds having used it, the child writes the
completion in that transaction, fenced by the lease like any completion, and commits, so
the handler's writes and the completion commit together or not at all.

Both kinds die with their parent (``PR_SET_PDEATHSIG`` on Linux; a child also exits at the
end of its socket), ignore SIGINT and SIGTERM (the worker decides when they stop: a Ctrl-C
or a ``kill -TERM`` of the process group must not cut their tasks short), and never run
the worker's exit handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, cast

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue import log, tracing
from pgqueue.errors import ConfigurationError, TaskCancelled, TimeLimitExceeded
from pgqueue.executor import (
    Cancelled,
    Completed,
    Failed,
    Outcome,
    TaskContext,
    _commit_async,
    _commit_sync,
    _encode_result,
    _from_exception,
    _rollback_async,
    _rollback_sync,
    describe,
)
from pgqueue.models import ClaimedTask
from pgqueue.pooling import connection_kwargs
from pgqueue.registry import Handler, TaskRegistry
from pgqueue.supervisor import fork_hazard
from pgqueue.worker.process_wire import (
    frame,
    outcome_message,
    packet,
    progress_message,
    read_frame,
    task_from,
)

PR_SET_PDEATHSIG = 1
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_GRACE_SECONDS = 2.0
# A child sends its handler's progress reports to the worker at most this often (seconds);
# the worker coalesces the database's writes further (pgqueue.progress.PROGRESS_INTERVAL).
CHILD_PROGRESS_INTERVAL = 0.1
# Spawn every child instead of forking it (for measuring, and for an application whose
# imports do not survive a fork): what the server also does when it finds fork unsafe.
ENV_CHILD_START = (
    "PGQUEUE_PROCESS_CHILD_START"  # the fork server's wait for its children at exit, before SIGKILL
)

_SPAWNED_SERVER = (
    "from pgqueue.worker.process_child import spawned_fork_server; spawned_fork_server()"
)
_SPAWNED_CHILD = "from pgqueue.worker.process_child import spawned_child; spawned_child()"


@dataclasses.dataclass(frozen=True)
class ChildSettings:
    """What every child needs that it cannot find in the task: sent once to the fork server."""

    database_url: str
    worker_id: str
    max_result_bytes: int | None
    log: tuple[str, str, str | None] | None  # pgqueue.log.configuration() in the worker
    sys_path: list[str]
    registry: str | None  # module:attribute, for a spawned fork server or child
    parent_pid: int  # the worker: the fork server dies with it
    # The worker's resolved pooler mode: behind a transaction pooler, ctx.connection
    # prepares nothing either (pgqueue.pooling.connection_kwargs).
    pooler: str = "none"

    def message(self) -> dict[str, Any]:
        return {"op": "init", **dataclasses.asdict(self)}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ChildSettings:
        log_setting = message["log"]
        return cls(
            database_url=message["database_url"],
            worker_id=message["worker_id"],
            max_result_bytes=message["max_result_bytes"],
            log=None if log_setting is None else (log_setting[0], log_setting[1], log_setting[2]),
            sys_path=list(message["sys_path"]),
            registry=message["registry"],
            parent_pid=message["parent_pid"],
            pooler=message.get("pooler") or "none",
        )


# --- shared by both kinds of process --------------------------------------------------------


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def import_registry(spec: str) -> TaskRegistry:
    """``module:attribute`` naming a TaskRegistry, or a function of no arguments returning one
    (which can set its framework up first: Django's ``process_registry``)."""
    module_name, _, attribute = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import the registry {spec}: {exc}") from exc
    if not isinstance(obj, TaskRegistry) and callable(obj):
        obj = obj()
    if not isinstance(obj, TaskRegistry):
        raise ConfigurationError(f"{spec} is a {type(obj).__name__}, not a pgqueue.TaskRegistry")
    return obj


def _apply(settings: ChildSettings) -> None:
    """In a spawned process: the worker's import path and log configuration."""
    sys.path[:] = settings.sys_path
    if settings.log is not None:
        log.configure(*settings.log)


def _exit_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back around a fork, so that the new process ignores them
    before it can be interrupted by one (the parent gets one that arrived meanwhile)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)


def ignore_stop_signals() -> None:
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)


# --- the fork server -----------------------------------------------------------------------


class ForkServer:
    """Forks children on request and reaps them (see the module's docstring)."""

    def __init__(self, control: socket.socket, registry: TaskRegistry | None) -> None:
        self._control = control
        self._registry = registry
        self._children: set[int] = set()
        self._spawn_children = False
        self._settings: ChildSettings | None = None
        self._wake_r = self._wake_w = -1

    def serve(self) -> int:
        """Until the worker says exit or goes away; the exit code."""
        ignore_stop_signals()
        try:
            first = self._control.recv(1 << 20)
        except OSError:
            first = b""
        if not first:
            return 0  # the worker is gone
        settings = self._settings = ChildSettings.from_message(json.loads(first))
        die_with_parent(settings.parent_pid)
        try:
            if self._registry is None:
                _apply(settings)
                assert settings.registry is not None
                self._registry = import_registry(settings.registry)
        except BaseException as exc:
            self._send({"op": "error", "message": str(exc) or type(exc).__name__})
            return 1
        # What is here now stays for the process's life: the children's collections need not
        # scan it, and leaving it alone keeps its pages shared with the server.
        gc.freeze()
        if os.environ.get(ENV_CHILD_START, "").strip().lower() == "spawn":
            hazard: str | None = f"{ENV_CHILD_START}=spawn"
        else:
            hazard = fork_hazard(allowed={self._control.fileno()})
        self._spawn_children = hazard is not None
        if hazard is not None and settings.registry is None:
            message = (
                f"the process executor's children must be spawned ({hazard}), and this "
                "registry has no module:attribute a new process could import it by"
            )
            self._send({"op": "error", "message": message})
            return 1
        self._send({"op": "ready", "children": "spawn" if hazard else "fork", "reason": hazard})
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        try:
            self._loop()
        finally:
            self._stop_children()
        return 0

    def _loop(self) -> None:
        while True:
            watched: list[Any] = [self._control, self._wake_r]
            readable, _, _ = select.select(watched, [], [])
            if self._wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._reap()
            if self._control not in readable:
                continue
            try:
                data = self._control.recv(1 << 16)
            except OSError:  # reset: the worker was killed with a message unread
                data = b""
            if not data:
                return  # the worker is gone
            message = json.loads(data)
            op = message["op"]
            if op == "fork":
                pid, ours = self._start_child()
                self._children.add(pid)
                reply = packet({"op": "forked", "seq": message["seq"], "pid": pid})
                socket.send_fds(self._control, [reply], [ours.fileno()])
                ours.close()
            elif op == "kill":
                if message["pid"] in self._children:  # not reaped: still that child
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(message["pid"], signal.SIGKILL)
            elif op == "exit":
                return

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the worker is gone: nobody to tell
            self._control.send(packet(message))

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._children.discard(pid)
            self._send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def _start_child(self) -> tuple[int, socket.socket]:
        """A new child, and the worker's end of its socket."""
        assert self._settings is not None and self._registry is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if self._spawn_children:
            theirs.set_inheritable(True)
            ours.sendall(frame(self._settings.message()))  # the child's first read
            argv = [sys.executable, "-c", _SPAWNED_CHILD, str(theirs.fileno()), str(os.getpid())]
            pid = os.posix_spawn(sys.executable, argv, os.environ)
            theirs.close()
            return pid, ours
        server = os.getpid()
        with signals_held():
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    ours.close()
                    self._control.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(self._wake_r)
                    os.close(self._wake_w)
                    ignore_stop_signals()
                    code = Child(theirs, self._registry, self._settings, server).run()
                except BaseException:
                    traceback.print_exc()
                finally:
                    _exit_now(code)
        theirs.close()
        return pid, ours

    def _stop_children(self) -> None:
        """At exit: the children told to exit get a moment to, the rest are killed."""
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        while self._children and time.monotonic() < deadline:
            self._reap()
            if self._children:
                select.select([self._wake_r], [], [], 0.05)
        for pid in list(self._children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self._children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return
            self._children.discard(pid)
            self._send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def spawned_fork_server() -> NoReturn:
    """The entry point of a spawned fork server: ``-c ... CONTROL_FD``."""
    code = 1
    try:
        control = socket.socket(fileno=int(sys.argv[1]))
        code = ForkServer(control, None).serve()
    except BaseException:
        traceback.print_exc()
    _exit_now(code)


def spawned_child() -> NoReturn:
    """The entry point of a spawned child: ``-c ... SOCKET_FD FORK_SERVER_PID``; its first
    message is the settings, written by the fork server."""
    code = 1
    try:
        ignore_stop_signals()
        sock = socket.socket(fileno=int(sys.argv[1]))
        message = read_frame(sock)
        if message is not None:
            settings = ChildSettings.from_message(message)
            _apply(settings)
            assert settings.registry is not None
            code = Child(sock, import_registry(settings.registry), settings, int(sys.argv[2])).run()
    except BaseException:
        traceback.print_exc()
    _exit_now(code)


# --- a child -------------------------------------------------------------------------------


class _OwnConnection:
    """``ctx.connection`` in a child: one connection, opened on first use and checked before
    each loan (the server may have dropped it while it sat idle), kept between tasks. It
    stands where the worker's handler pool does (TaskContext asks for getconn/putconn)."""

    def __init__(self, url: str, pooler: str = "none") -> None:
        self._url = url
        self._kwargs = connection_kwargs(pooler)
        self._conn: psycopg.Connection[Any] | None = None

    def getconn(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None:
            try:
                ConnectionPool.check_connection(conn)
            except Exception:
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if conn is None:
            conn = self._conn = psycopg.connect(self._url, connect_timeout=10, **self._kwargs)
        return conn

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except Exception:
                with contextlib.suppress(Exception):
                    conn.close()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()


class _OwnAsyncConnection:
    """``await ctx.aconnection()`` in a child: as :class:`_OwnConnection`, async."""

    def __init__(self, url: str, pooler: str = "none") -> None:
        self._url = url
        self._kwargs = connection_kwargs(pooler)
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def getconn(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is not None:
            try:
                await AsyncConnectionPool.check_connection(conn)
            except Exception:
                with contextlib.suppress(Exception):
                    await conn.close()
                conn = None
        if conn is None:
            conn = self._conn = await psycopg.AsyncConnection.connect(
                self._url, connect_timeout=10, **self._kwargs
            )
        return conn

    async def putconn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:
                await conn.rollback()
            except Exception:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()


@dataclasses.dataclass
class _Current:
    """The task a child runs now, as its signal handlers and reader thread see it."""

    task: ClaimedTask
    ctx: TaskContext
    timeout: float | None
    armed: bool = False  # the handler's own code runs: an interrupt may be raised in it
    timed_out: bool = False
    cancelled: bool = False
    interrupted: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    job: asyncio.Task[Any] | None = None


class _ProgressSender:
    """A child's ``ctx.set_progress``: each report to the worker (which coalesces the
    database's writes), but at most one per CHILD_PROGRESS_INTERVAL, always the latest, so
    that a handler reporting in a tight loop cannot flood the worker's event loop; a report
    held back is sent by a timer, and the last one by ``close`` before the outcome (when
    the handler's code has ended, so that no interrupt can cut the message short)."""

    def __init__(self, send: Callable[[dict[str, Any]], None], task_id: str) -> None:
        self._send = send
        self._task_id = task_id
        self._lock = threading.Lock()
        self._pending: str | None = None
        self._sent_at = -float("inf")
        self._timer: threading.Timer | None = None
        self._closed = False

    def report(self, progress_json: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending = progress_json
            if self._timer is not None:
                return  # the timer sends the latest
            # Sent by a timer's thread even when due now: the handler's thread is the main
            # one, where a time limit or a cancel is raised, and an exception raised inside
            # sendall would leave half a message on the stream.
            wait = max(self._sent_at + CHILD_PROGRESS_INTERVAL - time.monotonic(), 0.0)
            self._timer = threading.Timer(wait, self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if not self._closed:
                self._send_pending()

    def _send_pending(self) -> None:
        text, self._pending = self._pending, None
        if text is not None:
            self._sent_at = time.monotonic()
            self._send(progress_message(self._task_id, text))

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._send_pending()
            self._closed = True


class Child:
    """One child's life: ready, then tasks until told to exit (see the module's docstring)."""

    def __init__(
        self, sock: socket.socket, registry: TaskRegistry, settings: ChildSettings, parent: int
    ) -> None:
        self._sock = sock
        self._registry = registry
        self._settings = settings
        self._parent = parent
        self._lock = threading.Lock()  # the current task, between the two threads
        self._send_lock = threading.Lock()  # a progress timer's thread sends too
        self._read_lock = threading.Lock()  # who reads the socket: main, or reader (_running)
        self._running = False
        self._reading = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self.current: _Current | None = None
        self._conn = _OwnConnection(settings.database_url, settings.pooler)
        self._aconn = _OwnAsyncConnection(settings.database_url, settings.pooler)
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> int:
        """The main thread reads the worker's messages itself between tasks (a run then
        starts without waking another thread); while a task runs, the reader thread does,
        for its stop. The end of the socket is the worker gone (or closing it to be rid of
        this child): exit at once."""
        die_with_parent(self._parent)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.signal(signal.SIGUSR1, self._on_cancel)
        fields = log.TaskFields()  # also on handlers the application configured itself
        for logger in (logging.getLogger(), log.logger):
            for handler in logger.handlers:
                handler.addFilter(fields)
        threading.Thread(target=self._read, name="pgqueue-child-reader", daemon=True).start()
        self._send({"op": "ready", "pid": os.getpid()})
        while True:
            message = self._receive()
            if message["op"] == "exit":
                break
            if message["op"] != "run":
                continue  # a stop that crossed the result of its task: nothing runs now
            with self._read_lock:
                self._running = True
            self._reading.set()
            try:
                task, outcome, timed_out = self._run(message)
            finally:
                self._handover()
            if callable(outcome):
                outcome = self._commit(task, outcome)
            self._send(outcome_message(task.id, outcome, timed_out=timed_out))
        self._conn.close()
        if self._loop is not None:
            self._loop.run_until_complete(self._aconn.close())
        return 0

    def _receive(self) -> dict[str, Any]:
        """The next message, read by the main thread; the end of the socket (or a reset, the
        worker killed with data unread) is the worker gone: exit at once, quietly."""
        try:
            message = read_frame(self._sock)
        except (OSError, ValueError):
            message = None
        if message is None:
            _exit_now(0)
        return message

    def _commit(self, task: ClaimedTask, commit: Callable[[], Outcome]) -> Outcome:
        """Write the completion in the handler's transaction, once the worker has heard that
        it is coming (``committing``): from then on its heartbeat does not take the lease the
        commit clears for a lost one."""
        self._send({"op": "committing", "task_id": str(task.id)})
        while self._receive()["op"] != "commit":
            pass  # a stop for the task, which has finished anyway
        return commit()

    def _handover(self) -> None:
        """Take reading back from the reader thread (never in the middle of a message)."""
        with self._read_lock:
            self._running = False
        os.write(self._wake_w, b"x")

    def _send(self, message: dict[str, Any]) -> None:
        try:
            with self._send_lock:
                self._sock.sendall(frame(message))
        except OSError:
            _exit_now(0)  # the worker is gone

    def _read(self) -> None:
        """The reader thread: while a task runs, the worker's stop messages."""
        watched: list[Any] = [self._sock, self._wake_r]
        while True:
            self._reading.wait()
            self._reading.clear()
            while True:
                readable, _, _ = select.select(watched, [], [])
                if self._wake_r in readable:
                    os.read(self._wake_r, 4096)
                with self._read_lock:
                    if not self._running:
                        break  # the main thread reads again
                    # Readable now, not only when select looked: the main thread may have
                    # read what woke it (a run) before this task began.
                    if not select.select([self._sock], [], [], 0)[0]:
                        continue
                    try:
                        message = read_frame(self._sock)
                    except (OSError, ValueError):
                        message = None
                if message is None:
                    _exit_now(0)
                if message["op"] == "stop":
                    self._stop(message["task_id"], message["reason"])

    def _stop(self, task_id: str, reason: str) -> None:
        with self._lock:
            current = self.current
            if current is None or str(current.task.id) != task_id:
                return  # finished meanwhile
            ctx = current.ctx
            if reason == "cancel":
                ctx.cancel_requested = True
                current.cancelled = True
            elif reason == "lease_lost":
                ctx.lease_lost = True
            loop = current.loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # closed
                    loop.call_soon_threadsafe(ctx.stop)
                    if current.cancelled and current.job is not None:
                        loop.call_soon_threadsafe(current.job.cancel)
            else:
                ctx.stop()
                if current.cancelled and current.armed:
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    # The interrupts, raised in the main thread wherever the handler's code is. Each checks
    # that the handler's own code is still what runs (armed): one arriving a moment late,
    # after the handler returned, is dropped.

    def _on_alarm(self, signum: int, frame: Any) -> None:
        current = self.current
        if current is not None and current.armed and not current.timed_out:
            current.timed_out = True
            current.ctx.timed_out = True
            current.ctx.stop()
            raise TimeLimitExceeded(current.timeout or 0)

    def _on_cancel(self, signum: int, frame: Any) -> None:
        current = self.current
        if current is not None and current.armed and current.cancelled and not current.interrupted:
            current.interrupted = True
            raise TaskCancelled()

    # --- one task ------------------------------------------------------------------------

    def _run(
        self, message: dict[str, Any]
    ) -> tuple[ClaimedTask, Outcome | Callable[[], Outcome], bool]:
        """The task's outcome, or the commit that will make it (the handler succeeded having
        written through its context's connection), and whether it timed out."""
        task = task_from(message["task"])
        ctx = TaskContext(
            task,
            worker_id=self._settings.worker_id,
            sync_pool=cast(Any, lambda: self._conn),
            async_pool=cast(Any, self._async_pool),
        )
        progress = _ProgressSender(self._send, str(task.id))
        ctx._progress_sink = progress
        current = _Current(task, ctx, message["timeout"])
        handler = self._registry.get(task.type)
        with self._lock:
            self.current = current
        try:
            with (
                tracing.attached(message.get("carrier")),
                log.task_fields(task.id, task.type, task.attempts),
            ):
                if handler is None:
                    outcome: Outcome | Callable[[], Outcome] = Failed(
                        f"no handler is registered for task type {task.type!r} in the "
                        "worker's child process"
                    )
                elif handler.is_async:
                    outcome = self._run_async(handler, current)
                else:
                    outcome = self._run_sync(handler, current)
        finally:
            with self._lock:
                self.current = None
            progress.close()  # its last report reaches the worker before the outcome
        return task, outcome, current.timed_out

    async def _async_pool(self) -> _OwnAsyncConnection:
        return self._aconn

    def _run_sync(self, handler: Handler, current: _Current) -> Outcome | Callable[[], Outcome]:
        task, ctx = current.task, current.ctx
        value: Any = None
        error: BaseException | None = None
        try:
            try:
                current.armed = True
                if current.timeout is not None:
                    signal.setitimer(signal.ITIMER_REAL, current.timeout)
                if current.cancelled:  # a stop that came before the handler started
                    current.interrupted = True
                    raise TaskCancelled()
                value = handler.fn(task.payload, ctx)
            finally:
                current.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:  # the handler's, or an interrupt raised between
            error = exc
        if current.timed_out or error is not None:
            _rollback_sync(ctx)
            return self._failure(current, error)
        outcome = _encode_result(value, task, self._settings.max_result_bytes)
        if ctx._conn is not None and isinstance(outcome, Completed):
            completed = outcome
            return lambda: _commit_sync(ctx, completed)
        _rollback_sync(ctx)
        return outcome

    def _run_async(self, handler: Handler, current: _Current) -> Outcome | Callable[[], Outcome]:
        task, ctx = current.task, current.ctx
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        loop = self._loop
        scope: asyncio.Timeout | None = None

        async def call() -> Any:
            nonlocal scope
            current.job = asyncio.current_task()
            if current.cancelled:
                raise asyncio.CancelledError
            if current.timeout is None:
                return await handler.fn(task.payload, ctx)
            async with asyncio.timeout(current.timeout) as scope:
                return await handler.fn(task.payload, ctx)

        with self._lock:
            current.loop = loop
        value: Any = None
        error: BaseException | None = None
        try:
            value = loop.run_until_complete(call())
        except BaseException as exc:
            error = exc
        with self._lock:
            current.loop = None
            current.job = None
        if scope is not None and scope.expired():
            current.timed_out = ctx.timed_out = True
        if current.timed_out or error is not None:
            loop.run_until_complete(_rollback_async(ctx))
            return self._failure(current, error)
        outcome = _encode_result(value, task, self._settings.max_result_bytes)
        if ctx._aconn is not None and isinstance(outcome, Completed):
            completed = outcome
            return lambda: loop.run_until_complete(_commit_async(ctx, completed))
        loop.run_until_complete(_rollback_async(ctx))
        return outcome

    @staticmethod
    def _failure(current: _Current, error: BaseException | None) -> Outcome:
        """The outcome of a handler that raised, or ran past its timeout (whatever it did
        after: it was told to stop)."""
        if current.timed_out:
            return Failed(f"timed out after {current.timeout} s")
        if current.cancelled and isinstance(error, TaskCancelled | asyncio.CancelledError):
            return Cancelled("cancellation requested")
        if isinstance(error, Exception):
            return _from_exception(error)
        assert error is not None
        return Failed(describe(error))  # SystemExit, KeyboardInterrupt, a CancelledError
