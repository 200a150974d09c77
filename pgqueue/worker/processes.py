"""The process executor, the worker's side: a pool of child processes running handlers.

A task type declared with ``executor="process"`` (or every type, under ``pgqueue worker
--executor process``) runs in a child process, one task per child at a time, so that:

- **time limits are real**: at the task's ``timeout`` the child raises
  :class:`~pgqueue.TimeLimitExceeded` in the handler (the soft limit, which it may catch to
  clean up); ``hard_timeout`` seconds later the worker kills the child, whatever it is doing
  (a busy loop, a call stuck in C), and replaces it;
- **a crash costs one task**: a child that segfaults, calls ``os._exit`` or is killed (the
  OOM killer) fails only its own task, at once and through the ordinary failure path
  (fenced by the lease, counted as an attempt), with the exit code or signal as its error;
- **memory is bounded**: a child is recycled after ``max_tasks_per_child`` tasks, or between
  tasks once its resident memory passes ``max_memory_per_child``, and killed (its task
  failed) the moment it passes ``memory_limit``, sampled every 100 ms;
- **CPU-bound handlers use every core** instead of sharing one GIL.

The worker keeps the lease: the task stays in ``slots.running`` (so it is heartbeated, and
hears cancels and a lost lease) until its child has answered or is dead, and only then is
its outcome written. A child never runs a task whose outcome the worker has already
written, so no task runs twice at once on its account. Tasks beyond the children's number
wait in the worker, leases renewed, for a free child; their time limits start with it.

The children are forked by a fork server (pgqueue/worker/process_child.py) started before
the worker opens a connection or a thread (:meth:`ProcessPool.prepare`), so a replacement
starts in milliseconds however many threads and sockets the worker has by then.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from typing import Any, Protocol

from pgqueue import log, tracing
from pgqueue.errors import ConfigurationError, ValidationError
from pgqueue.executor import Cancelled, Failed, Lost, Outcome, TaskContext
from pgqueue.log import event
from pgqueue.models import ClaimedTask
from pgqueue.registry import Handler, TaskRegistry
from pgqueue.supervisor import ENV_START_METHOD, ForkedChild, fork_hazard, start_method
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.process_child import (
    _SPAWNED_SERVER,
    ChildSettings,
    ForkServer,
    _exit_now,
    signals_held,
)
from pgqueue.worker.process_wire import HEADER, frame, outcome_from, packet, task_message
from pgqueue.worker.state import Slots, StopRequest

MB = 1024 * 1024
# How often the watcher looks at busy children: a stop reaches one, and a deadline kills
# one, this late at most; memory is sampled every other round.
WATCH_SECONDS = 0.05
# After asking the fork server to kill a child: how long before killing it directly.
KILL_CONFIRM_SECONDS = 5.0
# A child that exited but whose socket stays open (a grandchild inherited it) is dead anyway.
EOF_WAIT_SECONDS = 1.0
START_TIMEOUT_SECONDS = 120.0  # a spawned child imports the application: allow for a slow one
RESTART_BACKOFF_MAX = 30.0
SERVER_EXIT_SECONDS = 5.0


class ChildStartFailed(Exception):
    pass


class _Process(Protocol):
    """The fork server's process: a ForkedChild or a subprocess.Popen."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


@dataclasses.dataclass(eq=False)
class _Server:
    process: _Process
    control: socket.socket
    method: str  # how it started: fork or spawn
    ready: asyncio.Future[dict[str, Any]] | None = None
    gone: bool = False


@dataclasses.dataclass(eq=False)
class ChildProcess:
    """One child, as the worker keeps it."""

    pid: int
    server: _Server
    writer: asyncio.StreamWriter
    ready: asyncio.Future[None]
    dead: asyncio.Future[None]
    result: asyncio.Future[dict[str, Any] | None] | None = None
    task: ClaimedTask | None = None
    tasks: int = 0
    code: int | None = None  # its exit code (negative: the signal), once reported
    exited: bool = False
    eof: bool = False
    kill_reason: str | None = None  # time, memory, cancel, lease, shutdown
    # The task it runs now, as the watcher sees it.
    ctx: TaskContext | None = None
    hard: float = 0.0
    kill_at: float | None = None  # time.monotonic()
    told_stop: bool = False
    told_shutdown: bool = False
    memory_error: str = ""
    retiring: bool = False


def needed(registry: TaskRegistry, config: WorkerConfig) -> bool:
    """Whether a worker of this registry and config runs any handler in a child."""
    if config.executor == "process":
        return True
    return any(h is not None and h.executor == "process" for h in map(registry.get, registry.types))


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (Linux: /proc), None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def registry_spec(registry: TaskRegistry) -> str | None:
    """Where a new process imports ``registry`` from: where load() found it, else the module
    attribute that holds it (the application's ``module:tasks``); None when only ``__main__``
    (a script, which a new interpreter cannot import) holds it, or nothing does."""
    if registry.origin is not None:
        return registry.origin
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if name == "__main__" or not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            if value is registry:
                return f"{name}:{attribute}"
    return None


def _kill_reason(ctx: TaskContext) -> str:
    """Why a child is killed at its deadline: the grace after a cancel or a lost lease, or
    the hard limit after the timeout."""
    if ctx.cancel_requested:
        return "cancel"
    return "lease" if ctx.lease_lost else "time"


def _signal_name(code: int | None) -> str:
    """The signal that ended a child ("" if none did: it exited, or nobody knows)."""
    if code is None or code >= 0:
        return ""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "worker child died: its fork server exited"
    if code < 0:
        return f"worker child died: {_signal_name(code)}"
    return f"worker child exited with code {code}"


class ProcessPool:
    """The children of one worker (see the module's docstring). ``prepare`` starts the fork
    server (before the worker opens anything), ``open`` the children, ``run`` runs one task
    in one of them, ``terminate`` kills those running given tasks, ``close`` stops them all.
    """

    def __init__(
        self,
        config: WorkerConfig,
        registry: TaskRegistry,
        database_url: str,
        *,
        metrics: WorkerMetrics,
        stop: StopRequest,
        max_result_bytes: int | None,
        slots: Slots | None = None,
    ) -> None:
        self._config = config
        self._registry = registry
        self._database_url = database_url
        self._metrics = metrics
        self._stop = stop
        self._slots = slots
        self._max_result_bytes = max_result_bytes
        self.size = config.process_children
        self._server: _Server | None = None
        self._why_spawned: str | None = None
        self._children: dict[int, ChildProcess] = {}
        self._idle: collections.deque[ChildProcess] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[ChildProcess]] = collections.deque()
        self._forks: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self._early_exits: dict[int, int] = {}
        self._seq = itertools.count()
        self._helpers: set[asyncio.Task[Any]] = set()
        self._starting = 0
        self._busy: set[ChildProcess] = set()
        self._backoff = 0.0
        self._closing = False
        # Seconds from asking for a child to its first word, for each child started.
        self.start_seconds: list[float] = []

    def takes(self, handler: Handler) -> bool:
        return handler.executor_under(self._config.executor) == "process"

    # --- the fork server -------------------------------------------------------------------

    def prepare(self) -> None:
        """Start the fork server: forked from this process if that is safe now (no thread,
        no open socket: call it before the worker opens any), else spawned, importing the
        registry by its ``module:attribute``. Idempotent."""
        if self._server is not None:
            return
        method = start_method()
        if method == "fork":
            hazard = fork_hazard()
        elif os.environ.get(ENV_START_METHOD):
            hazard = f"{ENV_START_METHOD}=spawn"
        else:
            hazard = "this platform's fork is not safe after its system libraries are used"
        spec = registry_spec(self._registry)
        settings = ChildSettings(
            database_url=self._database_url,
            worker_id=self._config.worker_id,
            max_result_bytes=self._max_result_bytes,
            log=log.configuration(),
            sys_path=list(sys.path),
            registry=spec,
            parent_pid=os.getpid(),
            pooler=self._config.pooler or "none",
        )
        if hazard is None:
            server = _fork_server(self._registry)
        elif spec is None:
            raise ConfigurationError(
                f"the process executor must spawn its children here ({hazard}), and a "
                "spawned process imports the registry by MODULE:ATTRIBUTE; this one is "
                "defined in __main__ (or nowhere importable): define it in a module, or run "
                "the worker with Worker.run() before any thread or connection is opened"
            )
        else:
            server = _spawn_server()
        self._why_spawned = hazard
        server.control.send(packet(settings.message()))
        server.control.setblocking(False)
        self._server = server

    async def _attach(self) -> dict[str, Any]:
        """Listen to the fork server, and wait for its ready (or its error)."""
        server = self._server
        assert server is not None
        loop = asyncio.get_running_loop()
        server.ready = loop.create_future()
        loop.add_reader(server.control.fileno(), self._on_control, server)
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            return await server.ready

    def _on_control(self, server: _Server) -> None:
        """What the fork server says: a child forked (with its socket), one that exited."""
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(server.control, 1 << 16, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                self._server_lost(server)
                return
            message = json.loads(data)
            op = message["op"]
            if op == "forked":
                waiting = self._forks.pop(message["seq"], None)
                if waiting is not None and not waiting.done() and fds:
                    waiting.set_result((message["pid"], fds[0]))
                else:
                    for fd in fds:
                        os.close(fd)
            elif op == "exited":
                child = self._children.get(message["pid"])
                if child is None:
                    self._early_exits[message["pid"]] = message["code"]
                else:
                    self._exited(child, message["code"])
            elif server.ready is not None and not server.ready.done():
                if op == "ready":
                    server.ready.set_result(message)
                else:
                    server.ready.set_exception(ConfigurationError(message["message"]))

    def _server_lost(self, server: _Server) -> None:
        """The fork server's socket ended: it exited (or was killed). Its children die with
        it (PR_SET_PDEATHSIG), each dead once its own socket ends; a new server replaces it."""
        if server.gone:
            return
        server.gone = True
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(server.control.fileno())
        for waiting in self._forks.values():
            if not waiting.done():
                waiting.set_exception(ChildStartFailed("the fork server exited"))
        self._forks.clear()
        if server.ready is not None and not server.ready.done():
            server.ready.set_exception(
                ConfigurationError("the process pool's fork server exited before it was ready")
            )
        for child in list(self._children.values()):
            if child.server is server:
                self._maybe_dead(child)
        if not self._closing and server is self._server:
            event(
                "worker.fork_server_died",
                logging.ERROR,
                pid=server.process.pid,
                note="its children die with it; a new fork server is spawned",
            )
            self._helper(self._restart_server(server))

    async def _restart_server(self, old: _Server) -> None:
        await _reap(old)
        self._server = None
        delay = 0.5
        while not self._closing:
            try:
                self.prepare()  # spawned: this process has threads and sockets by now
                await self._attach()
                break
            except Exception as exc:
                self._server = None
                event("worker.fork_server_start_failed", logging.ERROR, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_BACKOFF_MAX)
        self._refill()

    def _send_server(self, message: dict[str, Any]) -> bool:
        server = self._server
        if server is None or server.gone:
            return False
        try:
            server.control.send(packet(message))
        except OSError:
            return False
        return True

    # --- the children ------------------------------------------------------------------------

    async def open(self) -> None:
        """Start the fork server if ``prepare`` did not, then the children; returns once
        every child is ready (raises ConfigurationError if the registry cannot be imported
        in a spawned server, or the children do not start)."""
        self.prepare()
        began = time.monotonic()
        ready = await self._attach()
        try:
            await asyncio.gather(*(self._add_child() for _ in range(self.size)))
        except ChildStartFailed as exc:
            raise ConfigurationError(
                f"the process executor's children did not start: {exc}"
            ) from None
        assert self._server is not None
        event(
            "worker.process_pool_started",
            children=self.size,
            fork_server=self._server.method,
            children_start=ready["children"],
            reason=self._why_spawned or ready["reason"] or "",
            start_ms=round((time.monotonic() - began) * 1000, 1),
            memory_limit_mb=self._config.memory_limit or "",
            max_memory_per_child_mb=self._config.max_memory_per_child or "",
            max_tasks_per_child=self._config.max_tasks_per_child or "",
        )
        if ready["children"] == "spawn":
            event(
                "worker.fork_unsafe",
                logging.WARNING,
                reason=ready["reason"],
                start="spawn",
                note="each child of the process executor is a new interpreter, slower to "
                "replace than a fork",
            )
        self._helper(self._watch())

    async def _add_child(self) -> ChildProcess:
        """Ask the fork server for a child and wait for its first word."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        seq = next(self._seq)
        forked: asyncio.Future[tuple[int, int]] = loop.create_future()
        self._forks[seq] = forked
        if not self._send_server({"op": "fork", "seq": seq}):
            self._forks.pop(seq, None)
            raise ChildStartFailed("the fork server is not running")
        pid, fd = await forked
        sock = socket.socket(fileno=fd)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        assert self._server is not None
        child = ChildProcess(
            pid=pid,
            server=self._server,
            writer=writer,
            ready=loop.create_future(),
            dead=loop.create_future(),
        )
        self._children[pid] = child
        self._helper(self._pump(child, reader))
        if pid in self._early_exits:
            self._exited(child, self._early_exits.pop(pid))
        first: set[asyncio.Future[None]] = {child.ready, child.dead}
        await asyncio.wait(
            first, timeout=START_TIMEOUT_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if not child.ready.done():
            self._kill(child, "start")
            raise ChildStartFailed(
                f"child {pid} did not start: {describe_exit(child.code)}"
                if child.dead.done()
                else f"child {pid} did not start within {START_TIMEOUT_SECONDS:g} s"
            )
        seconds = time.monotonic() - began
        self.start_seconds.append(seconds)
        self._metrics.child_started()
        event("worker.child_started", logging.DEBUG, pid=pid, start_ms=round(seconds * 1000, 2))
        self._give(child)
        return child

    async def _pump(self, child: ChildProcess, reader: asyncio.StreamReader) -> None:
        """The child's messages: its ready, then a result per task."""
        try:
            while True:
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                message = json.loads(await reader.readexactly(size))
                if message["op"] == "ready":
                    if not child.ready.done():
                        child.ready.set_result(None)
                elif message["op"] == "committing":
                    self._committing(child, message["task_id"])
                elif message["op"] == "progress":
                    self._progress(child, message)
                elif message["op"] == "result":
                    waiting, task = child.result, child.task
                    if (
                        waiting is not None
                        and not waiting.done()
                        and task is not None
                        and message["task_id"] == str(task.id)
                    ):
                        waiting.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception as exc:  # a message we cannot read: this child cannot be trusted
            event("worker.internal_error", logging.ERROR, pid=child.pid, error=repr(exc))
            self._kill(child, "protocol")
        finally:
            child.eof = True
            self._maybe_dead(child)

    def _progress(self, child: ChildProcess, message: dict[str, Any]) -> None:
        """A handler's progress report, for the worker's writer of its task (checked again
        here: a child's word is not trusted); one that is not acceptable is dropped."""
        task, ctx = child.task, child.ctx
        if task is None or ctx is None or message["task_id"] != str(task.id):
            return  # its task ended meanwhile
        with contextlib.suppress(ValidationError):
            ctx.set_progress(message["progress"])

    def _committing(self, child: ChildProcess, task_id: str) -> None:
        """The child is about to write its task's completion in the handler's transaction:
        the task's outcome is being recorded (``recording``) before the child may commit, so
        that a heartbeat finding the lease cleared by that commit does not take it for a
        lost one."""
        task = child.task
        if task is None or str(task.id) != task_id:
            return  # killed or released meanwhile: it will not commit
        running = self._slots.running.get(task.id) if self._slots is not None else None
        if running is not None:
            running.recording = True
        self._send(child, {"op": "commit", "task_id": task_id})

    def _exited(self, child: ChildProcess, code: int) -> None:
        child.exited = True
        child.code = code
        if not child.eof:  # a grandchild may hold its socket: do not wait for that
            asyncio.get_running_loop().call_later(EOF_WAIT_SECONDS, child.writer.close)
        self._maybe_dead(child)

    def _maybe_dead(self, child: ChildProcess) -> None:
        """Dead: its exit reported (or its server gone) and its socket ended, so that any
        result it sent before dying has been read first."""
        if child.dead.done() or not child.eof or not (child.exited or child.server.gone):
            return
        child.dead.set_result(None)
        self._children.pop(child.pid, None)
        with contextlib.suppress(ValueError):
            self._idle.remove(child)
        child.writer.close()
        if child.result is not None and not child.result.done():
            child.result.set_result(None)  # run() records it, and why
        elif (
            child.task is None
            and child.kill_reason is None
            and not child.retiring
            and child.ready.done()
            and not self._closing
        ):  # died between tasks: the OOM killer, say
            self._metrics.child_died()
            event(
                "worker.child_died",
                logging.WARNING,
                pid=child.pid,
                exit_code=child.code,
                signal=_signal_name(child.code),
                error=describe_exit(child.code),
                note="idle: no task lost",
            )
        self._refill()

    def _refill(self) -> None:
        """Start children until there are ``size`` of them, alive or starting."""
        if self._closing or self._server is None or self._server.gone:
            return
        if self._stop.stopping and not self._waiters:
            return  # the worker claims no more: only tasks waiting now need a child
        live = sum(
            1
            for c in self._children.values()
            if c.ready.done() and not c.retiring and not c.dead.done()
        )
        for _ in range(self.size - live - self._starting):
            self._starting += 1
            self._helper(self._start_one())

    async def _start_one(self) -> None:
        failed = False
        try:
            if self._backoff:
                await asyncio.sleep(self._backoff)
            await self._add_child()
            self._backoff = 0.0
        except ChildStartFailed as exc:
            failed = True
            self._backoff = min(max(self._backoff * 2, 0.5), RESTART_BACKOFF_MAX)
            event(
                "worker.child_start_failed",
                logging.ERROR,
                error=str(exc),
                retry_in_s=self._backoff,
            )
        finally:
            self._starting -= 1
        if failed:
            self._refill()

    def _helper(self, coroutine: Any) -> None:
        job = asyncio.get_running_loop().create_task(coroutine)
        self._helpers.add(job)
        job.add_done_callback(self._helpers.discard)

    def _kill(self, child: ChildProcess, reason: str) -> None:
        """SIGKILL the child (through its fork server, the only process that could have
        reaped it, so the pid is still the child's); directly if the server does not
        confirm its death in time. Its death resolves its result."""
        if child.kill_reason is None:
            child.kill_reason = reason
        if child.dead.done():
            return
        if child.server is self._server and self._send_server({"op": "kill", "pid": child.pid}):
            asyncio.get_running_loop().call_later(KILL_CONFIRM_SECONDS, self._kill_directly, child)
        else:
            self._kill_directly(child)

    def _kill_directly(self, child: ChildProcess) -> None:
        if not child.exited:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signal.SIGKILL)

    def _send(self, child: ChildProcess, message: dict[str, Any]) -> None:
        if not child.writer.is_closing():
            child.writer.write(frame(message))

    def _give(self, child: ChildProcess) -> None:
        """A free child, to the first task waiting for one, else to the idle ones."""
        if child.dead.done() or child.retiring:
            return
        while self._waiters:
            waiting = self._waiters.popleft()
            if not waiting.done():
                waiting.set_result(child)
                return
        self._idle.append(child)

    async def _take(self, ctx: TaskContext) -> ChildProcess | Outcome:
        """A free child, waiting for one if need be; an outcome instead if the task is to
        stop before one is free (cancelled, its lease lost, released at shutdown)."""
        while self._idle:
            child = self._idle.popleft()
            if not child.dead.done():
                return child
        waiting: asyncio.Future[ChildProcess] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiting)
        stopped = asyncio.ensure_future(ctx.stopped())
        taken = False
        try:
            either: set[asyncio.Future[Any]] = {waiting, stopped}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            taken = waiting.done() and not ctx.should_stop()
        finally:
            stopped.cancel()
            if not waiting.done():
                waiting.cancel()
            elif not taken:
                self._give(waiting.result())  # got one, but must not use it: pass it on
        if taken:
            return waiting.result()
        if ctx.cancel_requested:
            return Cancelled("cancellation requested before a child process was free to run it")
        return Lost()  # the lease was lost, or the worker released it

    # --- one task ------------------------------------------------------------------------

    async def run(self, task: ClaimedTask, ctx: TaskContext, handler: Handler) -> Outcome:
        """Run ``task`` in a child; its outcome once the child has answered or is dead."""
        taken = await self._take(ctx)
        if not isinstance(taken, ChildProcess):
            return taken
        child = taken
        hard = handler.hard_timeout or self._config.hard_timeout
        try:
            reply = await self._run_in(child, task, ctx, handler.timeout, hard)
        except BaseException:  # released at shutdown (terminate() killed it first)
            if not child.dead.done():
                self._kill(child, "shutdown")
            self._after(child)
            raise
        outcome = self._outcome(child, task, ctx, reply, handler.timeout, hard)
        self._after(child)
        return outcome

    async def _run_in(
        self,
        child: ChildProcess,
        task: ClaimedTask,
        ctx: TaskContext,
        timeout: float | None,
        hard: float,
    ) -> dict[str, Any] | None:
        """Send the task and wait for the child's answer (None: it died). The watcher
        (:meth:`_watch`) tells the child to stop when the worker hears why, and kills it past
        the hard limit, so that a task costs no timer of its own."""
        child.task, child.ctx, child.hard = task, ctx, hard
        child.kill_reason = None
        child.told_stop = child.told_shutdown = False
        result = child.result = asyncio.get_running_loop().create_future()
        if child.dead.done():  # died after it was handed over: nothing to wait for
            result.set_result(None)
        carrier = tracing.current_carrier()
        self._send(
            child, {"op": "run", "task": task_message(task), "timeout": timeout, "carrier": carrier}
        )
        child.kill_at = None if timeout is None else time.monotonic() + timeout + hard
        self._busy.add(child)
        try:
            reply: dict[str, Any] | None = await result
        finally:
            self._busy.discard(child)
        return reply

    async def _watch(self) -> None:
        """Every WATCH_SECONDS, each busy child: past its deadline, killed; its task to stop
        (a cancel, a lost lease, the worker stopping), told; over the memory limit (every
        other round), killed."""
        limit = self._config.memory_limit
        rounds = 0
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            rounds += 1
            now = time.monotonic()
            memory = limit is not None and rounds % 2 == 0
            for child in list(self._busy):
                self._watch_one(child, now, limit if memory else None)

    def _watch_one(self, child: ChildProcess, now: float, limit_mb: float | None) -> None:
        task, ctx, result = child.task, child.ctx, child.result
        if task is None or ctx is None or result is None or result.done():
            return
        if child.kill_reason is not None:
            return  # dying
        if child.kill_at is not None and now >= child.kill_at:
            self._killed(child, task, _kill_reason(ctx))
            return
        if not child.told_stop and ctx.should_stop():
            child.told_stop = True
            reason = (
                "cancel" if ctx.cancel_requested else "lease_lost" if ctx.lease_lost else "stop"
            )
            self._send(child, {"op": "stop", "task_id": str(task.id), "reason": reason})
            if reason != "stop":  # then killed if it has not stopped within hard_timeout
                grace = now + child.hard
                child.kill_at = grace if child.kill_at is None else min(child.kill_at, grace)
        if not child.told_shutdown and self._stop.stopping:
            child.told_shutdown = True
            self._send(child, {"op": "stop", "task_id": str(task.id), "reason": "shutdown"})
        if limit_mb is not None:
            rss = rss_bytes(child.pid)
            if rss is not None and rss > limit_mb * MB:
                child.memory_error = f"memory limit exceeded ({rss / MB:.0f} MB > {limit_mb:g} MB)"
                self._killed(child, task, "memory")

    def _killed(self, child: ChildProcess, task: ClaimedTask, reason: str) -> None:
        self._kill(child, reason)
        self._metrics.child_killed(reason)
        event(
            "worker.child_killed",
            logging.WARNING,
            pid=child.pid,
            reason=reason,
            task_id=task.id,
            type=task.type,
            attempt=task.attempts,
        )

    def _outcome(
        self,
        child: ChildProcess,
        task: ClaimedTask,
        ctx: TaskContext,
        reply: dict[str, Any] | None,
        timeout: float | None,
        hard: float,
    ) -> Outcome:
        fields: dict[str, Any] = {
            "task_id": task.id,
            "type": task.type,
            "attempt": task.attempts,
            "pid": child.pid,
        }
        if reply is not None:
            if reply["timed_out"]:
                ctx.timed_out = True
                event("task.timed_out", logging.WARNING, **fields, timeout_s=timeout, killed=False)
            return outcome_from(reply)
        reason = child.kill_reason
        if reason == "time":
            ctx.timed_out = True
            event(
                "task.timed_out",
                logging.WARNING,
                **fields,
                timeout_s=timeout,
                hard_timeout_s=hard,
                killed=True,
            )
            return Failed(f"timed out after {timeout} s; killed after the hard limit ({hard} s)")
        if reason == "memory":
            return Failed(f"{child.memory_error} (pid {child.pid})")
        if reason == "cancel":
            return Cancelled(
                f"cancellation requested; the handler had not stopped {hard} s later, and its "
                "process was killed"
            )
        if reason in ("lease", "shutdown"):
            return Lost()
        what = describe_exit(child.code)
        self._metrics.child_died()
        event(
            "worker.child_died",
            logging.ERROR,
            **fields,
            exit_code=child.code,
            signal=_signal_name(child.code),
            error=what,
        )
        return Failed(
            f"{what} (pid {child.pid}, running task {task.id} ({task.type}, attempt "
            f"{task.attempts}))"
        )

    def _after(self, child: ChildProcess) -> None:
        """The child's task is over: it is free again, recycled, or (dead) replaced."""
        child.task = child.ctx = None
        child.result = None
        if child.dead.done() or child.kill_reason is not None:
            self._refill()
            return
        child.tasks += 1
        limit = self._config.max_tasks_per_child
        soft = self._config.max_memory_per_child
        rss = rss_bytes(child.pid) if soft is not None else None
        if limit is not None and child.tasks >= limit:
            self._retire(child, "max_tasks_per_child", rss)
        elif soft is not None and rss is not None and rss > soft * MB:
            self._retire(child, "max_memory_per_child", rss)
        else:
            self._give(child)

    def _retire(self, child: ChildProcess, reason: str, rss: int | None) -> None:
        child.retiring = True
        self._send(child, {"op": "exit"})
        self._metrics.child_recycled(reason)
        event(
            "worker.child_recycled",
            pid=child.pid,
            reason=reason,
            tasks=child.tasks,
            rss_mb="" if rss is None else round(rss / MB, 1),
        )
        self._refill()

    # --- stopping ----------------------------------------------------------------------------

    async def terminate(self, task_ids: set[uuid.UUID]) -> None:
        """Kill the children running these tasks and wait until they are dead: the
        worker's release of their leases must not let another worker start a task whose
        child still runs."""
        children = self._children.values()
        victims = [c for c in children if c.task is not None and c.task.id in task_ids]
        for child in victims:
            assert child.task is not None
            self._killed(child, child.task, "shutdown")
        if victims:
            deaths: list[asyncio.Future[None]] = [c.dead for c in victims]
            await asyncio.wait(deaths, timeout=KILL_CONFIRM_SECONDS + 1)

    async def close(self) -> None:
        """Stop every child and the fork server (idle children exit, busy ones are killed)."""
        self._closing = True
        for job in list(self._helpers):
            job.cancel()
        for child in list(self._children.values()):
            if child.task is not None:
                self._kill(child, "shutdown")
            else:
                self._send(child, {"op": "exit"})
        server = self._server
        if server is None:
            return
        self._send_server({"op": "exit"})
        await _reap(server)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(server.control.fileno())
        server.control.close()
        for child in list(self._children.values()):
            child.writer.close()


async def _reap(server: _Server) -> None:
    """Wait for the fork server to exit (it kills what is left of its children first), and
    kill it if it does not."""
    deadline = time.monotonic() + SERVER_EXIT_SECONDS
    while server.process.poll() is None:
        if time.monotonic() > deadline:
            server.process.send_signal(signal.SIGKILL)
            deadline = float("inf")
        await asyncio.sleep(0.02)


def _fork_server(registry: TaskRegistry) -> _Server:
    """The fork server, forked from this process (which must have no thread and no open
    socket: fork_hazard), holding the registry already imported."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with signals_held():
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                code = ForkServer(theirs, registry).serve()
            except BaseException:
                traceback.print_exc()
            finally:
                _exit_now(code)
    theirs.close()
    return _Server(ForkedChild(pid), ours, "fork")


def _spawn_server() -> _Server:
    """The fork server as a new interpreter, which imports the registry itself."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPAWNED_SERVER, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stdin=subprocess.DEVNULL,
    )
    theirs.close()
    return _Server(proc, ours, "spawn")
