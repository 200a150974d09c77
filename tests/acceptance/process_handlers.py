"""Handlers that run in the process executor's children, for test_process_executor.py
(``process_handlers:tasks``).

Every handler first commits a row to the side table ``runs`` (created by the test) on an
autocommit connection of its own: which attempt ran, in which process, when it started and,
for those that get that far, when it ended. So a test can see each execution, the child that
ran it, and a run cut short by a kill or a crash.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import time
from typing import Any

import psycopg

from pgqueue import TaskCancelled, TaskContext, TaskRegistry, TimeLimitExceeded

tasks = TaskRegistry()

_conn: psycopg.Connection[Any] | None = None
LONGEST = 120.0  # a handler never stopped gives up, so that a broken test cannot hang


def _connection() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(
            os.environ["PGQUEUE_DATABASE_URL"], autocommit=True, prepare_threshold=None
        )
    return _conn


def record(ctx: TaskContext, note: str = "") -> None:
    _connection().execute(
        "INSERT INTO runs (task_id, type, attempt, pid, note) VALUES (%s, %s, %s, %s, %s)",
        (ctx.task_id, ctx.type, ctx.attempt, os.getpid(), note),
    )


def ended(ctx: TaskContext, note: str = "") -> None:
    _connection().execute(
        "UPDATE runs SET ended_at = clock_timestamp(), note = note || %s "
        "WHERE task_id = %s AND attempt = %s",
        (note, ctx.task_id, ctx.attempt),
    )


@tasks.handler("pid", executor="process")
def pid(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    record(ctx)
    return {"pid": os.getpid(), "parents": ctx.parent_results, "worker": ctx.worker_id}


@tasks.handler("soft_limit", executor="process", timeout=1, hard_timeout=30)
def soft_limit(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Sleeps past its timeout, catches the soft limit and cleans up."""
    record(ctx)
    try:
        time.sleep(LONGEST)
    except TimeLimitExceeded as exc:
        ended(ctx, f"caught {type(exc).__name__} after {exc.seconds} s; stop={ctx.should_stop()}")
        return "cleaned up"
    return "never"


@tasks.handler("busy_loop", executor="process", timeout=1, hard_timeout=1, max_attempts=1)
def busy_loop(payload: dict[str, Any], ctx: TaskContext) -> None:
    """A busy loop that swallows the soft limit and goes on: only the kill stops it."""
    record(ctx)
    deadline = time.monotonic() + LONGEST
    n = 0
    while time.monotonic() < deadline:
        try:
            while time.monotonic() < deadline:
                n += 1
        except TimeLimitExceeded:
            continue


@tasks.handler("stuck_in_c", executor="process", timeout=1, hard_timeout=1, max_attempts=1)
def stuck_in_c(payload: dict[str, Any], ctx: TaskContext) -> None:
    """A call into C that never returns to Python while the alarm is blocked."""
    record(ctx)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGUSR1})
    ctypes.CDLL(None).sleep(int(LONGEST))


@tasks.handler("segfault", executor="process", max_attempts=2)
def segfault(payload: dict[str, Any], ctx: TaskContext) -> None:
    record(ctx)
    ctypes.string_at(0)


@tasks.handler("exit3", executor="process", max_attempts=2)
def exit3(payload: dict[str, Any], ctx: TaskContext) -> None:
    record(ctx)
    os._exit(3)


@tasks.handler("sleep", executor="process", hard_timeout=2)
def sleep(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Sleeps ``seconds``; with ``stubborn``, swallows a cancel and keeps going (then only the
    kill after hard_timeout stops it); records how it ended."""
    record(ctx)
    deadline = time.monotonic() + payload.get("seconds", LONGEST)
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except TaskCancelled:
            ended(ctx, f"cancelled; stop={ctx.should_stop()} cancel={ctx.cancel_requested}")
            if not payload.get("stubborn"):
                raise
    ended(ctx, f"slept; stop={ctx.should_stop()}")
    return "slept"


@tasks.handler("hog", executor="process", max_attempts=1)
def hog(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Holds ``mb`` megabytes (touched, so resident) until killed."""
    record(ctx)
    block = bytearray(payload["mb"] * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(LONGEST)


_kept: list[bytearray] = []


@tasks.handler("grow", executor="process")
def grow(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Keeps ``mb`` more megabytes for the child's life (a leak), and returns its pid."""
    record(ctx)
    block = bytearray(payload["mb"] * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _kept.append(block)
    return os.getpid()


@tasks.handler("tx_write", executor="process")
def tx_write(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Writes through ctx.connection (the transaction that records the completion), then
    fails if asked to."""
    record(ctx)
    ctx.connection.execute(
        "INSERT INTO tx_writes (task_id, attempt) VALUES (%s, %s)", (ctx.task_id, ctx.attempt)
    )
    if payload.get("fail"):
        raise RuntimeError("failed after writing")
    return "written"


@tasks.handler("tx_slow_commit", executor="process")
def tx_slow_commit(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Writes a row whose deferred trigger makes the commit (the completion's) take a second,
    the task's row locked meanwhile."""
    record(ctx)
    ctx.connection.execute("INSERT INTO slow_commits (task_id) VALUES (%s)", (ctx.task_id,))
    return "committed"


@tasks.handler("cpu", executor="process")
def cpu(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Pure-Python hashing for about ``seconds`` of one core, start and end recorded."""
    record(ctx)
    digest = b"pgqueue"
    deadline = time.process_time() + payload["seconds"]
    while time.process_time() < deadline:
        for _ in range(1000):
            digest = hashlib.sha256(digest).digest()
    ended(ctx)
    return digest.hex()[:8]


@tasks.task(name="add", executor="process")
def add(a: int, b: int, ctx: TaskContext) -> int:
    """A function task, its arguments by name."""
    record(ctx)
    return a + b


@tasks.task(name="double", executor="process")
def double(x: int, ctx: TaskContext) -> int:
    record(ctx)
    return 2 * x


@tasks.task(name="async_add", executor="process")
async def async_add(a: int, b: int, ctx: TaskContext) -> dict[str, Any]:
    """An async function in a child: its own loop, its own connection."""
    record(ctx)
    conn = await ctx.aconnection()
    cur = await conn.execute("SELECT %s::int + %s::int", (a, b))
    row = await cur.fetchone()
    return {"sum": row[0] if row else None, "pid": os.getpid()}


@tasks.handler("in_thread")
def in_thread(payload: dict[str, Any], ctx: TaskContext) -> int:
    """No executor named: the worker's default (thread, unless --executor process)."""
    record(ctx)
    return os.getpid()
