"""Handlers for the fair-claim benchmark (``python -m bench.fair_keys``): each execution
records its own start and finish, so that every figure the benchmark reports comes from what
the handlers saw, not from pgqueue's tables or counters.

One line per execution, appended (``O_APPEND``, one ``write``: lines of several processes
never interleave) to ``$FAIR_RECORDS/<pid>.log`` when the handler returns:
``task_id key start finish pid``, times from ``time.time()`` (the clock every process of the
machine shares, the producer's too). ``key`` is the payload's ``k`` ("-" for an unkeyed
task): the handler does not ask pgqueue which key it ran under. The handler sleeps
``$FAIR_SLEEP_MS`` milliseconds (asyncio: thousands wait on one event loop, as I/O-bound
work does).

The start is taken at the handler's first line, after the claim committed; the finish in a
``finally``, before the worker writes the completion. So a key's interval here lies inside
the time pgqueue counted it as running: more handlers of one key at once than its limit is a
violation pgqueue's count cannot hide.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pgqueue

tasks = pgqueue.TaskRegistry()

_fd: int | None = None
_pid = 0


def _record(ctx: pgqueue.TaskContext, key: str, start: float) -> None:
    global _fd, _pid
    pid = os.getpid()
    if _fd is None or _pid != pid:
        _pid = pid
        path = os.path.join(os.environ["FAIR_RECORDS"], f"{pid}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{ctx.task_id.hex} {key} {start:.6f} {time.time():.6f} {pid}\n".encode())


SLEEP = float(os.environ.get("FAIR_SLEEP_MS", "10")) / 1000


@tasks.handler("fair.work")
async def work(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """A keyed task of the limited type (``payload["k"]``: its key)."""
    start = time.time()
    try:
        await asyncio.sleep(SLEEP)
    finally:
        _record(ctx, str(payload.get("k", "-")), start)


@tasks.handler("fair.plain")
async def plain(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """An unkeyed task of a type without a limit (the fair claim's unkeyed turn)."""
    start = time.time()
    try:
        await asyncio.sleep(SLEEP)
    finally:
        _record(ctx, "-", start)
