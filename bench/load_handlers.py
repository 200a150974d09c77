"""Handlers for the load benchmarks (design_load, soak): async, so that thousands can wait at
once on one event loop without a thread each, which is how a real I/O-bound task behaves."""

import asyncio
from typing import Any

import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.handler("bench.sleep")
async def sleep(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Stands in for ~5 s of waiting on something else (an API, a mail server)."""
    await asyncio.sleep(float(payload.get("sleep", 0)))


@tasks.handler("bench.noop")
async def noop(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """No work at all: what is measured is the queue's own cost."""
    return None
