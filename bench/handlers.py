"""No-op handlers for benchmarks: they measure the queue's overhead, not the work."""

from typing import Any

import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.handler("bench.noop")
async def noop(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    return None


@tasks.handler("bench.noop_sync")
def noop_sync(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    return None
