"""Handlers for the workers that test_worker_behind_pooler.py runs behind a transaction-mode
PgBouncer (``pooler_handlers:tasks``).

Every write goes through ``ctx.connection`` (the worker's handler pool, or a process child's
own connection), so that the handlers' connections are exercised behind the pooler too: the
same INSERT, run more than five times on one connection, is what psycopg would prepare. Each
row holds the wall-clock time at which the handler started (one machine: one clock), and is
committed with the task's completion.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pgqueue import Cancel, TaskContext, TaskRegistry

tasks = TaskRegistry()
# The process executor's (a registry of its own: a worker whose registry has a process task
# starts a pool of children, which the other tests need not pay for).
process_tasks = TaskRegistry()
# Every kind at once: plain tasks, a schedule ticking every second (into a queue of its own:
# only a worker given --queue periodic runs them) and function tasks for workflows.
everything = TaskRegistry()
everything.periodic("pooled_beat", "* * * * * *", queue="periodic")

LONGEST = 300.0  # a held task nobody cancels gives up, so a broken test cannot hang a worker

SIDE_TABLE = """
CREATE TABLE pooled_starts (
    task_id uuid             NOT NULL,
    type    text             NOT NULL,
    pid     int              NOT NULL,
    started double precision NOT NULL
)
"""


def _record(ctx: TaskContext, started: float) -> None:
    ctx.connection.execute(
        "INSERT INTO pooled_starts (task_id, type, pid, started) VALUES (%s, %s, %s, %s)",
        (ctx.task_id, ctx.type, os.getpid(), started),
    )


@tasks.handler("pooled")
@everything.handler("pooled")
def pooled(payload: dict[str, Any], ctx: TaskContext) -> None:
    _record(ctx, time.time())


@process_tasks.handler("pooled_process", executor="process")
def pooled_process(payload: dict[str, Any], ctx: TaskContext) -> None:
    _record(ctx, time.time())


@everything.handler("pooled_beat")
def pooled_beat(payload: dict[str, Any], ctx: TaskContext) -> None:
    _record(ctx, time.time())


@tasks.handler("held")
def held(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Runs until told to stop; says when it saw the stop (its Cancel reason)."""
    deadline = time.monotonic() + LONGEST
    while not ctx.should_stop():
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    raise Cancel(f"saw stop at {time.time():.6f}")


@everything.task(name="pooled_add")
def pooled_add(x: int, y: int) -> int:
    return x + y
