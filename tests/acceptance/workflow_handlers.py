"""Function tasks for test_workflows_processes.py (``workflow_handlers:tasks``): a chain's steps
and a chord's members and callback, each reporting which process ran it."""

from __future__ import annotations

import os
import time
from typing import Any

from pgqueue import TaskContext, TaskRegistry

tasks = TaskRegistry()


@tasks.task(name="wf_add")
def wf_add(x: int, y: int) -> int:
    return x + y


@tasks.task(name="wf_square")
def wf_square(n: int, ctx: TaskContext) -> dict[str, Any]:
    time.sleep(0.02)  # long enough for both workers to take members
    return {"n": n * n, "pid": os.getpid(), "attempt": ctx.attempt}


@tasks.task(name="wf_collect")
def wf_collect(parts: list[dict[str, Any]], label: str, ctx: TaskContext) -> dict[str, Any]:
    return {
        "label": label,
        "squares": [p["n"] for p in parts],
        "pids": sorted({p["pid"] for p in parts}),
        "parents": [str(p.task_id) for p in ctx.parents],
    }


@tasks.task(name="wf_slow")
def wf_slow(n: int, ctx: TaskContext) -> dict[str, Any]:
    time.sleep(1.0)  # long enough to be killed in the middle of one
    return {"n": n, "pid": os.getpid(), "attempt": ctx.attempt}


@tasks.task(name="wf_nap")
def wf_nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@tasks.task(name="wf_after")
def wf_after(slept: float) -> str:
    return f"after {slept} s"
