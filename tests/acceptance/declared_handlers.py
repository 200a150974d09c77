"""Handlers that declare their attempts (``declared_handlers:tasks``), for
test_declared_attempts.py.

Both always fail, so that a task's attempts run out exactly as its type declares.
"""

from __future__ import annotations

from typing import Any

from pgqueue import RetryPolicy
from pgqueue.executor import TaskContext
from pgqueue.registry import TaskRegistry

tasks = TaskRegistry()


@tasks.handler("once", max_attempts=1)
def once(payload: dict[str, Any], ctx: TaskContext) -> None:
    raise ValueError("doomed always fails")


@tasks.handler("five", retry=RetryPolicy(max_attempts=5, base=0, factor=1, cap=0))
def five(payload: dict[str, Any], ctx: TaskContext) -> None:
    raise ValueError("fails every time")
