"""Function tasks (``function_handlers:tasks``), for test_function_tasks_processes.py.

Declared with ``@tasks.task``: ordinary parameters (positional-only, keyword-only, defaults),
the context injected by annotation, an async one, and declared queue, priority and attempts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pgqueue import TaskContext, TaskRegistry

tasks = TaskRegistry()


@tasks.task(name="receipt", queue="mail", priority="high", max_attempts=4)
def receipt(
    order_id: int, /, note: str = "", *, resend: bool = False, ctx: TaskContext | None = None
) -> dict[str, Any]:
    assert ctx is not None
    return {
        "order_id": order_id,
        "note": note,
        "resend": resend,
        "task_id": str(ctx.task_id),
        "type": ctx.type,
        "attempt": ctx.attempt,
    }


@tasks.task(name="async_sum", queue="mail")
async def async_sum(numbers: list[int], ctx: TaskContext, *, scale: int = 1) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"sum": sum(numbers) * scale, "task_id": str(ctx.task_id)}
