"""Handlers with rate limits declared on their decorators (``rate_handlers:tasks``), for
test_rate_limit_processes.py. Each holds its slot a while, so that no one worker could keep
up with the rate alone."""

from __future__ import annotations

import time
from typing import Any

from pgqueue.executor import TaskContext
from pgqueue.registry import TaskRegistry

tasks = TaskRegistry()


@tasks.handler("paced", rate_limit="10/s")
def paced(payload: dict[str, Any], ctx: TaskContext) -> None:
    time.sleep(payload.get("seconds", 0.3))


@tasks.handler("bursty", rate_limit="2/s", rate_burst=4)
def bursty(payload: dict[str, Any], ctx: TaskContext) -> None:
    time.sleep(payload.get("seconds", 0.1))


@tasks.handler("held", rate_limit="10/s")
def held(payload: dict[str, Any], ctx: TaskContext) -> None:
    time.sleep(payload.get("seconds", 3))
