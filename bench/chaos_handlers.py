"""Handlers for the chaos run (``python -m bench.chaos``): each leaves evidence of every
execution, so the run can count what was lost, what ran twice and why.

* Every execution first writes a row to ``chaos.executions`` in a commit of its own (task id,
  lease token, attempt, pid), before doing anything else. A task that ran twice has two rows;
  two rows with the same lease token would be a double delivery the lease did not explain.
* A task with parents (a workflow step) also records, in that row, what it received
  from its parents: ``ctx.parent_results`` for a ``handler(payload, ctx)`` type
  (``chaos.step``, which is also every chord's callback), the argument the worker filled in
  for a function task (``chaos.link``, a chain's links). The run checks it against the
  parents' stored results, in depends_on order (None for a parent that did not complete).
* Half the ``chaos.work`` tasks (``mode = "tx"``), and half the workflow steps, also write
  their effect to ``chaos.effects`` through ``ctx.aconnection()``: in the transaction that
  records their completion. For those, "exactly once" is checkable: one effect row per
  completed task, and none from an attempt whose lease was lost (its late completion is
  fenced and rolled back together with the effect).
* The executor scenario's handlers run in the process executor's children (the workers run
  with ``--executor process``) and record each execution's end too (``ended_at``, in a
  ``finally``: a child that dies records none) and, at its start, every other execution of the
  same task that has no end and whose process is still running (``live_others``: two
  executions of one task at once). A row's ``pid`` is the process that ran the handler (a
  child), ``worker_pid`` the worker that imported this module (a child's worker: it is forked
  from it), ``proc_start`` that process's start time (``/proc/PID/stat``), so a reused pid is
  not taken for it. ``chaos.proc_work`` is the innocent process task (a sync handler; half
  write their effect through ``ctx.connection``, committed by the child with the completion);
  ``chaos.proc_<fault>`` misbehave on their first attempt and must then complete,
  ``chaos.proc_<fault>_always`` on every attempt (poison: dead-lettered, the cause in
  ``last_error``): ``segv`` (``ctypes.string_at(0)``), ``exit3`` (``os._exit(3)``), ``hang``
  (SIGALRM blocked, then a libc ``sleep`` past the hard limit), ``memory`` (300 MB touched,
  held until the worker's ``--memory-limit`` kills the child) and ``busy`` (a Python loop past
  the soft limit).
* In the failover scenarios the workers also get ``CHAOS_JOURNAL``, a file outside the
  database: every execution first appends a line to it (task id, lease token, attempt, pid,
  the time). A failover with asynchronous replication loses the newest commits, the rows of
  ``chaos.executions`` among them, so an execution that ran and was then forgotten by the
  promoted standby is still counted there.
* The keyed scenario's ``chaos.keyed`` is ``chaos.work`` with a concurrency key (the payload's
  ``k``, which the producer also gives pgqueue): its type has a per-key limit, and each of its
  executions appends a ``start`` line to ``CHAOS_KEYED_JOURNAL`` (a file outside the
  database, like ``CHAOS_JOURNAL``) before anything else, and an ``end`` line in a
  ``finally`` (a process killed in the handler writes none: it ended at the kill at the
  latest). The run counts, from these lines alone, the moments a key had more handlers
  running than its limit.
* The fault types do what production does to a queue: ``chaos.hang`` blocks its worker's event
  loop past the lease on its first attempt (a blocking call in an async handler: the heartbeat
  stops too), ``chaos.suicide`` kills its own process on its first attempt, and the poison
  types never succeed (``chaos.poison`` raises, ``chaos.suicide_always`` kills its process
  every time); only those two may end dead-lettered. In a workflow, a ``chaos.poison`` step
  is the parent whose dependants must be cancelled (or, run-anyway ones, run).

The side connections come from a small pool per worker process (``SidePool``) from
``CHAOS_DATABASE_URL``, which checks a connection before lending it (the run terminates
backends, restarts the server and fails it over) and replaces a lost one at once: not
psycopg_pool's, whose reconnection backs off (1 s, doubling), so that the run's recovery times
are pgqueue's, not the harness's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgqueue

tasks = pgqueue.TaskRegistry()

# Normal tasks must survive every fault of the run, and a fault can fail an attempt (its side
# connection was terminated, say): many attempts, retried fast.
SURVIVE = pgqueue.RetryPolicy(max_attempts=25, base=0.2, factor=2.0, cap=2.0)
# Poison tasks: few attempts, fast, so they reach the dead-letter queue within the scenario.
POISON = pgqueue.RetryPolicy(max_attempts=3, base=0.1, factor=2.0, cap=0.5)

SIDE_IDLE = 8  # idle side connections a worker process keeps
_conn: psycopg.Connection[Any] | None = None  # a process task's side connection (sync)
_conn_pid = 0
_journal_fd: int | None = None  # CHAOS_JOURNAL, opened for appending on the first execution
_keyed_fd: int | None = None  # CHAOS_KEYED_JOURNAL, likewise
# The worker's pid: this module is imported by the worker, and its process executor's children
# are forked (through its fork server) from it, so they inherit the worker's value.
WORKER_PID = os.getpid()
MB = 1024 * 1024


def proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time (clock ticks since boot) from /proc, or None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def still_running(pid: int, started: int | None) -> bool:
    """Whether the process that had this pid and start time still runs (a zombie or a dead
    process does not; a reused pid has another start time)."""
    stat = proc_stat(pid)
    return stat is not None and stat[1] == started and stat[0] not in ("Z", "X")


def _me() -> tuple[int, int | None]:
    pid = os.getpid()
    stat = proc_stat(pid)
    return pid, None if stat is None else stat[1]


INSERT_EXECUTION = (
    "INSERT INTO chaos.executions"
    " (task_id, lease_token, attempt, pid, worker_pid, proc_start, received)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
# The other executions of the task that have not recorded their end (the run's own clock).
OPEN_EXECUTIONS = (
    "SELECT attempt, pid, proc_start FROM chaos.executions WHERE task_id = %s"
    " AND ended_at IS NULL AND NOT (pid = %s AND lease_token = %s)"
)
LIVE_OTHERS = (
    "UPDATE chaos.executions SET live_others = %s"
    " WHERE task_id = %s AND lease_token = %s AND pid = %s"
)
ENDED = (
    "UPDATE chaos.executions SET ended_at = clock_timestamp()"
    " WHERE task_id = %s AND lease_token = %s AND pid = %s"
)


def _live(rows: list[tuple[int, int, int | None]]) -> list[str]:
    return [f"attempt {a} pid {p}" for a, p, started in rows if still_running(p, started)]


def _journal(ctx: pgqueue.TaskContext, pid: int) -> None:
    """One line in ``CHAOS_JOURNAL`` (if set) for this execution: appended with O_APPEND in
    one write, so lines from several processes never interleave."""
    global _journal_fd
    path = os.environ.get("CHAOS_JOURNAL")
    if not path:
        return
    if _journal_fd is None:
        _journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = {
        "task_id": str(ctx.task_id),
        "lease": str(ctx.lease.token),
        "attempt": ctx.attempt,
        "pid": pid,
        "worker_pid": WORKER_PID,
        "at": time.time(),
    }
    os.write(_journal_fd, (json.dumps(line) + "\n").encode())


def _keyed_journal(ctx: pgqueue.TaskContext, key: str, what: str) -> None:
    """A ``start`` or ``end`` line of a keyed execution in ``CHAOS_KEYED_JOURNAL``, in one
    O_APPEND write (lines of several processes never interleave)."""
    global _keyed_fd
    if _keyed_fd is None:
        path = os.environ["CHAOS_KEYED_JOURNAL"]
        _keyed_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = {
        "e": what,
        "task_id": str(ctx.task_id),
        "lease": str(ctx.lease.token),
        "attempt": ctx.attempt,
        "key": key,
        "pid": os.getpid(),
        "at": time.time(),
    }
    os.write(_keyed_fd, (json.dumps(line) + "\n").encode())


class SidePool:
    """The handlers' side connections of one process and event loop. ``connection`` lends an
    idle one once it answers (an empty statement, psycopg_pool's own check), else opens one,
    one attempt at a time and 0.2 s apart, until ``timeout``; a connection that broke in use
    is not kept. psycopg_pool's pool, used before, backs off from 1 s, doubling, after a
    failed attempt: after a failover its first connection came up to 10 s after the promoted
    standby accepted them (a handler's 10.8 s wait, seen), which the run counted as pgqueue's
    recovery time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.idle: list[psycopg.AsyncConnection[Any]] = []
        self.opening = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with asyncio.timeout(timeout):
            conn = await self._get()
        try:
            yield conn
        finally:
            if conn.closed or conn.broken or len(self.idle) >= SIDE_IDLE:
                await conn.close()
            else:
                self.idle.append(conn)

    async def _get(self) -> psycopg.AsyncConnection[Any]:
        while True:
            while self.idle:
                conn = self.idle.pop()
                try:
                    await conn.execute("")
                    return conn
                except psycopg.Error:
                    await conn.close()
            async with self.opening:
                try:
                    return await psycopg.AsyncConnection.connect(
                        self.url,
                        autocommit=True,
                        connect_timeout=5,
                        application_name="chaos-handler",
                    )
                except psycopg.OperationalError:
                    await asyncio.sleep(0.2)


_pool: SidePool | None = None


async def _side_pool() -> SidePool:
    """This process's and event loop's pool (a child of the process executor makes its own:
    what it inherited belongs to its worker)."""
    global _pool
    if _pool is None or _pool.pid != os.getpid() or _pool.loop is not asyncio.get_running_loop():
        _pool = SidePool(os.environ["CHAOS_DATABASE_URL"])
    return _pool


async def _record_start(
    ctx: pgqueue.TaskContext, received: list[Any] | None = None, spans: bool = False
) -> None:
    """The execution's row; ``received``: what a step got from its parents (None: no parents);
    ``spans``: also look for other executions of the task still running (the executor
    scenario's; its end is then recorded by ``_record_end``)."""
    pid, started = _me()
    _journal(ctx, pid)
    pool = await _side_pool()
    async with pool.connection(timeout=10) as conn:
        await conn.execute(
            INSERT_EXECUTION,
            (
                ctx.task_id,
                ctx.lease.token,
                ctx.attempt,
                pid,
                WORKER_PID,
                started,
                None if received is None else Jsonb(received),
            ),
        )
        if spans:
            cur = await conn.execute(OPEN_EXECUTIONS, (ctx.task_id, pid, ctx.lease.token))
            live = _live(await cur.fetchall())
            if live:
                await conn.execute(LIVE_OTHERS, (live, ctx.task_id, ctx.lease.token, pid))


async def _record_end(ctx: pgqueue.TaskContext) -> None:
    pool = await _side_pool()
    async with pool.connection(timeout=10) as conn:
        await conn.execute(ENDED, (ctx.task_id, ctx.lease.token, os.getpid()))


def _side() -> psycopg.Connection[Any]:
    """This process's own side connection (a process task's: sync), opened again after a
    fork or a loss."""
    global _conn, _conn_pid
    if _conn is None or _conn.closed or _conn.broken or _conn_pid != os.getpid():
        _conn = psycopg.connect(
            os.environ["CHAOS_DATABASE_URL"],
            autocommit=True,
            connect_timeout=5,
            application_name="chaos-handler",
        )
        _conn_pid = os.getpid()
    return _conn


def _sync_start(ctx: pgqueue.TaskContext) -> None:
    """``_record_start(spans=True)`` for a sync handler in a child."""
    pid, started = _me()
    _journal(ctx, pid)
    conn = _side()
    conn.execute(
        INSERT_EXECUTION,
        (ctx.task_id, ctx.lease.token, ctx.attempt, pid, WORKER_PID, started, None),
    )
    live = _live(conn.execute(OPEN_EXECUTIONS, (ctx.task_id, pid, ctx.lease.token)).fetchall())
    if live:
        conn.execute(LIVE_OTHERS, (live, ctx.task_id, ctx.lease.token, pid))


def _sync_end(ctx: pgqueue.TaskContext) -> None:
    _side().execute(ENDED, (ctx.task_id, ctx.lease.token, os.getpid()))


async def _step_work(ctx: pgqueue.TaskContext, ms: int, mode: str) -> None:
    await asyncio.sleep(ms / 1000)
    if mode == "tx":
        conn = await ctx.aconnection()
        await conn.execute(
            "INSERT INTO chaos.effects (task_id, lease_token) VALUES (%s, %s)",
            (ctx.task_id, ctx.lease.token),
        )


@tasks.handler("chaos.work", retry=SURVIVE)
async def work(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """A few milliseconds of waiting, like a call to another service. In the executor
    scenario (``spans``: in a child) its end is recorded too."""
    spans = bool(payload.get("spans"))
    await _record_start(ctx, spans=spans)
    try:
        await _step_work(ctx, payload["ms"], payload["mode"])
    finally:
        if spans:
            await _record_end(ctx)


@tasks.handler("chaos.step", retry=SURVIVE)
async def workflow_step(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> dict[str, Any]:
    """A workflow step by type name (a group's or chord's member, a chord's callback, a DAG's
    node, a clean-up step): records what its parents gave it (``ctx.parent_results``), works
    like ``chaos.work``, and returns its own identity for its dependants to receive."""
    await _record_start(ctx, list(ctx.parent_results) if ctx.parents else None)
    await _step_work(ctx, payload["ms"], payload["mode"])
    return {"task": str(ctx.task_id), "i": payload["i"]}


@tasks.task(name="chaos.link", retry=SURVIVE)
async def link(
    prev: dict[str, Any] | None, i: int, ms: int, mode: str, ctx: pgqueue.TaskContext
) -> dict[str, Any]:
    """A chain's link as a function task (``chaos_link.s(i=..., ...)``): ``prev`` is the
    previous link's result, filled in by the worker (the first link has no parent and binds
    ``prev=None``)."""
    await _record_start(ctx, [prev] if ctx.parents else None)
    await _step_work(ctx, ms, mode)
    return {"task": str(ctx.task_id), "i": i}


@tasks.handler("chaos.hang", retry=SURVIVE)
async def hang(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """First attempt: a blocking sleep in an async handler, longer than the lease. The whole
    worker process stalls (no heartbeat either), so its leases expire and its tasks run
    elsewhere; when it wakes, its late outcomes must be fenced off."""
    await _record_start(ctx)
    if ctx.attempt == 1:
        time.sleep(payload["hang_s"])  # blocking on purpose: this is the fault


@tasks.handler("chaos.keyed", retry=SURVIVE)
async def keyed(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """``chaos.work`` under a per-key limit, its start and end journaled outside the
    database first and last (the keyed scenario's evidence of how many ran per key)."""
    _keyed_journal(ctx, payload["k"], "start")
    try:
        await _record_start(ctx)
        await _step_work(ctx, payload["ms"], payload["mode"])
    finally:
        _keyed_journal(ctx, payload["k"], "end")


@tasks.handler("chaos.suicide", retry=SURVIVE)
async def suicide(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """First attempt: the process dies on the spot (a segfault in a C extension, an OOM kill)."""
    await _record_start(ctx)
    if ctx.attempt == 1:
        os._exit(137)


@tasks.handler("chaos.suicide_always", retry=POISON)
async def suicide_always(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Kills its process on every attempt: must end dead-lettered, not loop forever."""
    await _record_start(ctx)
    os._exit(137)


@tasks.handler("chaos.poison", retry=POISON)
async def poison(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Always fails: must end dead-lettered after its attempts."""
    spans = bool(payload.get("spans"))
    await _record_start(ctx, spans=spans)
    try:
        raise RuntimeError(f"poison task {ctx.task_id} fails on purpose (attempt {ctx.attempt})")
    finally:
        if spans:
            await _record_end(ctx)


# --- the executor scenario: handlers in the process executor's children ----------------------


@tasks.handler("chaos.proc_work", retry=SURVIVE, executor="process", timeout=30)
def proc_work(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """The innocent process task: a few milliseconds of waiting; ``mode = "tx"`` writes its
    effect through ``ctx.connection``, committed by the child with the completion."""
    _sync_start(ctx)
    try:
        time.sleep(payload["ms"] / 1000)
        if payload["mode"] == "tx":
            ctx.connection.execute(
                "INSERT INTO chaos.effects (task_id, lease_token) VALUES (%s, %s)",
                (ctx.task_id, ctx.lease.token),
            )
    finally:
        _sync_end(ctx)


def _segv() -> None:
    ctypes.string_at(0)


def _exit3() -> None:
    os._exit(3)


def _hang() -> None:
    """Stuck in C with the soft limit's SIGALRM blocked: only the hard limit's kill ends it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    ctypes.CDLL(None).sleep(30)
    raise RuntimeError("a call stuck in C outlived the hard limit by 28 s")


def _memory() -> None:
    """300 MB touched (a repeated byte is written out), held until the memory limit kills."""
    held = b"\x01" * (300 * MB)
    time.sleep(5)
    raise RuntimeError(f"{len(held) // MB} MB held for 5 s without being killed")


def _busy() -> None:
    """A Python loop past the soft limit (1 s): TimeLimitExceeded must interrupt it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pass
    raise RuntimeError("a busy loop ran 20 s past its soft limit")


# kind -> (the fault, timeout, hard_timeout, the text its dead-lettered task's last_error must
# contain). A type's own limits, so the process scenario needs no worker --hard-timeout.
PROCESS_FAULTS: dict[str, tuple[Callable[[], None], float, float, tuple[str, ...]]] = {
    "segv": (_segv, 30, 2, ("worker child died: SIGSEGV",)),
    "exit3": (_exit3, 30, 2, ("worker child exited with code 3",)),
    "hang": (_hang, 1, 1, ("timed out after 1", "killed after the hard limit")),
    "memory": (_memory, 30, 2, ("memory limit exceeded",)),
    "busy": (_busy, 1, 5, ("timed out after 1",)),
}


def _process_fault(
    kind: str, always: bool
) -> Callable[[dict[str, Any], pgqueue.TaskContext], None]:
    fault = PROCESS_FAULTS[kind][0]

    def handler(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        _sync_start(ctx)
        try:
            if always or ctx.attempt == 1:
                fault()
            time.sleep(0.01)
        finally:  # a child that dies records no end
            _sync_end(ctx)

    handler.__name__ = handler.__qualname__ = f"proc_{kind}" + ("_always" if always else "")
    return handler


for _kind, (_fault, _timeout, _hard, _texts) in PROCESS_FAULTS.items():
    for _always in (False, True):
        tasks.handler(
            f"chaos.proc_{_kind}" + ("_always" if _always else ""),
            retry=POISON if _always else SURVIVE,
            executor="process",
            timeout=_timeout,
            hard_timeout=_hard,
        )(_process_fault(_kind, _always))
