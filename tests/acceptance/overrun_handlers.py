"""Handlers that outlive their timeouts, for test_handler_overrun.py's worker processes.

The workers import this module as ``overrun_handlers:tasks`` (the tests put this directory on
PYTHONPATH). Every handler records its execution in the side table ``runs`` (created by the
test, see RUNS) through its own autocommit connection: a row when it starts and its end time
when it returns, both from the server's clock, so that the test sees whether two executions
of one task overlapped, and when each ended, however slow the machine.

Payload knobs: ``seconds`` to block (in one ``time.sleep``, never looking at
``ctx.should_stop()``, as a handler stuck in a library call would), ``attempts``: the
attempts that block (default: all; the others return at once).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from pgqueue.executor import TaskContext
from pgqueue.registry import TaskRegistry

tasks = TaskRegistry()

RUNS = """
CREATE TABLE runs (
    task_id    uuid        NOT NULL,
    attempt    int         NOT NULL,
    pid        int         NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz,
    timed_out  boolean,
    seq        bigserial   PRIMARY KEY
);
CREATE TABLE tx_writes (
    task_id uuid NOT NULL,
    attempt int  NOT NULL
);
"""


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(
        os.environ["PGQUEUE_DATABASE_URL"],
        autocommit=True,
        connect_timeout=5,
        prepare_threshold=None,
    )


def _blocks(payload: dict[str, Any], ctx: TaskContext) -> bool:
    attempts = payload.get("attempts")
    return attempts is None or ctx.attempt in attempts


def _run(payload: dict[str, Any], ctx: TaskContext, work: Any = None) -> dict[str, Any]:
    """Record the start, block (or not), record the end and whether ctx said timed out."""
    with _connect() as conn:
        row = conn.execute(
            "INSERT INTO runs (task_id, attempt, pid) VALUES (%s, %s, %s) RETURNING seq",
            (ctx.task_id, ctx.attempt, os.getpid()),
        ).fetchone()
        assert row is not None
        if work is not None:
            work()
        if _blocks(payload, ctx):
            time.sleep(float(payload["seconds"]))
        conn.execute(
            "UPDATE runs SET ended_at = clock_timestamp(), timed_out = %s WHERE seq = %s",
            (ctx.timed_out, row[0]),
        )
    return {"attempt": ctx.attempt}


@tasks.handler("stuck", timeout=2, max_attempts=2)
def stuck(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Blocks past its 2 s timeout, then returns a value (which must not count)."""
    return _run(payload, ctx)


@tasks.handler("stuck_tx", timeout=1, max_attempts=1)
def stuck_tx(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Writes through ctx.connection, blocks past its timeout, returns: the write must be
    rolled back and the attempt recorded timed out."""

    def write() -> None:
        ctx.connection.execute(
            "INSERT INTO tx_writes (task_id, attempt) VALUES (%s, %s)", (ctx.task_id, ctx.attempt)
        )

    return _run(payload, ctx, write)


@tasks.handler("hang")
def hang(payload: dict[str, Any], ctx: TaskContext) -> None:
    """No timeout: blocks for ``seconds`` in one call (a shutdown must not wait for it)."""
    _run(payload, ctx)


@tasks.handler("loop_blocker")
async def loop_blocker(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """An async handler calling blocking code: the whole event loop stops meanwhile."""
    time.sleep(float(payload["seconds"]))
    return {"blocked_s": payload["seconds"]}


@tasks.handler("loop_blocker_timed", timeout=1, max_attempts=1)
async def loop_blocker_timed(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Blocks the loop past its 1 s timeout, then returns: must not be recorded completed."""
    time.sleep(float(payload["seconds"]))
    return {"blocked_s": payload["seconds"]}
