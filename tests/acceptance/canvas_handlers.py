"""Function tasks for test_canvas_processes.py (``canvas_handlers:tasks``): steps that add,
subtract and fail, and an error handler that returns what it received."""

from __future__ import annotations

from typing import Any

from pgqueue import TaskContext, TaskRegistry

tasks = TaskRegistry()


@tasks.task(name="cv_add")
def cv_add(x: int, y: int, ctx: TaskContext) -> dict[str, Any]:
    return {"sum": x + y, "parents": len(ctx.parents)}


@tasks.task(name="cv_sub")
def cv_sub(x: int, y: int) -> int:
    return x - y


@tasks.task(name="cv_fail", max_attempts=1)
def cv_fail(reason: str) -> None:
    raise ValueError(reason)


@tasks.task(name="cv_alert")
def cv_alert(failed: dict[str, Any], channel: str) -> dict[str, Any]:
    return {"channel": channel, "failed": failed}


@tasks.task(name="cv_alert_async")
async def cv_alert_async(failed: dict[str, Any] | None, channel: str) -> dict[str, Any]:
    return {"channel": channel, "failed": failed}
