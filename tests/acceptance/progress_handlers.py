"""Handlers that report progress from the process executor's children, for
test_progress_processes.py (``progress_handlers:tasks``).

A handler reports a first stage, then waits until the test inserts a row into the side table
``go`` (created by the test) for its task, then reports in a tight loop for a while and
returns how many reports it made, so that the test can compare the stored report with it.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

from pgqueue import TaskContext, TaskRegistry

tasks = TaskRegistry()

LONGEST = 120.0  # a handler never let go gives up, so that a broken test cannot hang
FLOOD_SECONDS = 1.2


def _let_go(ctx: TaskContext) -> bool:
    with psycopg.connect(
        os.environ["PGQUEUE_DATABASE_URL"], autocommit=True, prepare_threshold=None
    ) as conn:
        return bool(conn.execute("SELECT 1 FROM go WHERE task_id = %s", (ctx.task_id,)).fetchone())


@tasks.handler("report", executor="process")
def report(payload: dict[str, Any], ctx: TaskContext) -> int:
    ctx.set_progress({"stage": "waiting", "pid": os.getpid()})
    deadline = time.monotonic() + LONGEST
    while not _let_go(ctx) and time.monotonic() < deadline:
        time.sleep(0.02)
    began, n = time.monotonic(), 0
    while time.monotonic() - began < FLOOD_SECONDS:
        n += 1
        ctx.set_progress({"n": n})
    return n


@tasks.handler("areport", executor="process")
async def areport(payload: dict[str, Any], ctx: TaskContext) -> int:
    ctx.set_progress({"stage": "waiting", "pid": os.getpid()})
    deadline = time.monotonic() + LONGEST
    while not await asyncio.to_thread(_let_go, ctx) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    began, n = time.monotonic(), 0
    while time.monotonic() - began < FLOOD_SECONDS:
        n += 1
        ctx.set_progress({"n": n})
    return n


@tasks.handler("report_in_transaction", executor="process")
def report_in_transaction(payload: dict[str, Any], ctx: TaskContext) -> str:
    ctx.set_progress({"shipped": 0})
    ctx.connection.execute("INSERT INTO go (task_id) VALUES (%s)", (ctx.task_id,))
    ctx.set_progress({"shipped": 1})  # held back by the interval: committed with the outcome
    return "shipped"


@tasks.handler("report_too_much", executor="process", max_attempts=1)
def report_too_much(payload: dict[str, Any], ctx: TaskContext) -> str:
    ctx.set_progress({"done": 1})
    ctx.set_progress({"log": "x" * 5000})  # raises: the attempt fails, the report stays
    return "unreachable"


@tasks.handler("report_until_limit", executor="process", timeout=1, hard_timeout=30, max_attempts=1)
def report_until_limit(payload: dict[str, Any], ctx: TaskContext) -> int:
    began, n = time.monotonic(), 0
    while time.monotonic() - began < LONGEST:  # until the time limit is raised in here
        n += 1
        ctx.set_progress({"n": n, "note": "x" * 2000})
    return n
