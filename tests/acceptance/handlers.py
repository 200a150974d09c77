"""Handlers for the worker processes started by test_worker_processes.py.

The workers import this module as ``handlers:tasks`` (the tests put this directory on
PYTHONPATH). Every handler first records its execution in the side table ``executions``
(created by the test) through its own autocommit connection, so that the record is committed
before the handler goes on: duplicate runs and runs cut short by a crash or a kill stay
visible. The database URL comes from ``PGQUEUE_DATABASE_URL``, which the CLI reads too.
That connection never prepares a statement: in the pooler pass the URL leads through a
transaction-mode pooler, where the tests' own connections follow pgqueue's rule.

Payload knobs:

- ``sleep``: ``seconds`` to sleep, in small steps; ``on_stop`` says what to do once
  ``ctx.should_stop()`` turns true: ``"return"`` (default: return early, saying so),
  ``"cancel"`` (raise Cancel) or ``"ignore"`` (never look at it).
- ``tx_write``: writes a row to ``tx_writes`` through ``ctx.connection`` (the transaction that
  also records the completion), then raises while ``ctx.attempt <= fail_attempts``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from pgqueue.executor import TaskContext
from pgqueue.registry import Cancel, TaskRegistry

tasks = TaskRegistry()

_local = threading.local()
RECORD_RETRY_SECONDS = 60.0


def _database_url() -> str:
    url = os.environ.get("PGQUEUE_DATABASE_URL", "").strip()
    if not url:
        raise RuntimeError("PGQUEUE_DATABASE_URL is not set for the test handlers")
    return url


def _connection() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(
            _database_url(), autocommit=True, connect_timeout=5, prepare_threshold=None
        )
        _local.conn = conn
    return conn


def record(ctx: TaskContext) -> None:
    """Commit one row saying this attempt started in this process.

    Retries across connection failures (the server-restart test stops PostgreSQL under the
    worker), so a record is never silently skipped.
    """
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    while True:
        try:
            _connection().execute(
                "INSERT INTO executions (task_id, attempt, pid) VALUES (%s, %s, %s)",
                (ctx.task_id, ctx.attempt, os.getpid()),
            )
            return
        except psycopg.OperationalError:
            stale = getattr(_local, "conn", None)
            _local.conn = None
            if stale is not None:
                stale.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@tasks.handler("noop")
def noop(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    record(ctx)
    return {"attempt": ctx.attempt}


@tasks.handler("sleep")
def sleep(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    record(ctx)
    seconds = float(payload["seconds"])
    on_stop = payload.get("on_stop", "return")
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        if on_stop != "ignore" and ctx.should_stop():
            if on_stop == "cancel":
                raise Cancel(f"stopped after {elapsed:.2f} s on request")
            return {"slept": elapsed, "stopped": True}
        time.sleep(min(0.02, seconds - elapsed))
    return {"slept": time.monotonic() - started, "stopped": False}


@tasks.handler("span")
def span(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Records when it started and ended (server clock) in ``spans``: the limit tests count
    how many ran at once and how many started per window from these rows."""
    conn = _connection()
    conn.execute(
        "INSERT INTO spans (task_id, pid, started_at) VALUES (%s, %s, clock_timestamp())",
        (ctx.task_id, os.getpid()),
    )
    time.sleep(float(payload.get("seconds", 0)))
    conn.execute(
        "UPDATE spans SET ended_at = clock_timestamp() WHERE task_id = %s AND ended_at IS NULL",
        (ctx.task_id,),
    )


@tasks.handler("crash")
def crash(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Ends its process after ``after`` seconds (0), with exit code ``code`` (1)."""
    record(ctx)
    time.sleep(float(payload.get("after", 0)))  # the tasks claimed with it start meanwhile
    os._exit(int(payload.get("code", 1)))  # the whole worker process dies, as with a segfault


@tasks.handler("block")
def block(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Blocks (ignoring should_stop) on the first attempt only, so a rerun finishes quickly."""
    record(ctx)
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 300)))
    return {"attempt": ctx.attempt}


@tasks.handler("fail")
def fail(payload: dict[str, Any], ctx: TaskContext) -> None:
    record(ctx)
    raise RuntimeError(f"fail handler refuses attempt {ctx.attempt}")


@tasks.handler("tx_write")
def tx_write(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    record(ctx)
    ctx.connection.execute(
        "INSERT INTO tx_writes (task_id, attempt) VALUES (%s, %s)", (ctx.task_id, ctx.attempt)
    )
    if ctx.attempt <= int(payload.get("fail_attempts", 0)):
        raise RuntimeError(f"tx_write fails attempt {ctx.attempt} after writing")
    return {"written_on_attempt": ctx.attempt}


@tasks.handler("tx_write_async")
async def tx_write_async(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """``tx_write`` for async handlers, through ``await ctx.aconnection()``."""
    record(ctx)
    conn = await ctx.aconnection()
    await conn.execute(
        "INSERT INTO tx_writes (task_id, attempt) VALUES (%s, %s)", (ctx.task_id, ctx.attempt)
    )
    if ctx.attempt <= int(payload.get("fail_attempts", 0)):
        raise RuntimeError(f"tx_write fails attempt {ctx.attempt} after writing")
    return {"written_on_attempt": ctx.attempt}
