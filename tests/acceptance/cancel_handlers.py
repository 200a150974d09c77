"""Long handlers that stop as soon as they are told to (``cancel_handlers:tasks``), for
test_prompt_cancel.py.

Each raises Cancel with the wall-clock time at which it saw the stop, so that the test can
measure from its DELETE to the handler (one machine: one clock).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pgqueue import Cancel
from pgqueue.executor import TaskContext
from pgqueue.registry import TaskRegistry

tasks = TaskRegistry()

LONGEST = 300.0  # a handler that is never told gives up, so a broken test cannot hang a worker


@tasks.handler("poll")
def poll(payload: dict[str, Any], ctx: TaskContext) -> None:
    """A sync handler polling should_stop() every 10 ms."""
    deadline = time.monotonic() + LONGEST
    while not ctx.should_stop():
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    raise Cancel(f"saw stop at {time.time():.6f}")


@tasks.handler("wait")
async def wait(payload: dict[str, Any], ctx: TaskContext) -> None:
    """An async handler awaiting ctx.stopped()."""
    try:
        await asyncio.wait_for(ctx.stopped(), LONGEST)
    except TimeoutError:
        return
    raise Cancel(f"saw stop at {time.time():.6f}")
