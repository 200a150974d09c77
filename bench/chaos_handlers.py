"""Handlers for the chaos run (``python -m bench.chaos``): each leaves evidence of every
execution, so the run can count what was lost, what ran twice and why.

* Every execution first writes a row to ``chaos.executions`` in a commit of its own (task id,
  lease token, attempt, pid), before doing anything else. A task that ran twice has two rows;
  two rows with the same lease token would be a double delivery the lease did not explain.
* A task with parents (a workflow step, issue 16) also records, in that row, what it received
  from its parents: ``ctx.parent_results`` for a ``handler(payload, ctx)`` type
  (``chaos.step``, which is also every chord's callback), the argument the worker filled in
  for a function task (``chaos.link``, a chain's links). The run checks it against the
  parents' stored results, in depends_on order (None for a parent that did not complete).
* Half the ``chaos.work`` tasks (``mode = "tx"``), and half the workflow steps, also write
  their effect to ``chaos.effects`` through ``ctx.aconnection()``: in the transaction that
  records their completion. For those, "exactly once" is checkable: one effect row per
  completed task, and none from an attempt whose lease was lost (its late completion is
  fenced and rolled back together with the effect).
* The fault types do what production does to a queue: ``chaos.hang`` blocks its worker's event
  loop past the lease on its first attempt (a blocking call in an async handler: the heartbeat
  stops too), ``chaos.suicide`` kills its own process on its first attempt, and the poison
  types never succeed (``chaos.poison`` raises, ``chaos.suicide_always`` kills its process
  every time); only those two may end dead-lettered. In a workflow, a ``chaos.poison`` step
  is the parent whose dependants must be cancelled (or, run-anyway ones, run).

The side connection is a small pool per worker process from ``CHAOS_DATABASE_URL``, which
checks connections before lending them: the run terminates backends and restarts the server.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

import pgqueue

tasks = pgqueue.TaskRegistry()

# Normal tasks must survive every fault of the run, and a fault can fail an attempt (its side
# connection was terminated, say): many attempts, retried fast.
SURVIVE = pgqueue.RetryPolicy(max_attempts=25, base=0.2, factor=2.0, cap=2.0)
# Poison tasks: few attempts, fast, so they reach the dead-letter queue within the scenario.
POISON = pgqueue.RetryPolicy(max_attempts=3, base=0.1, factor=2.0, cap=0.5)

_pool: AsyncConnectionPool | None = None


async def _side_pool() -> AsyncConnectionPool:
    global _pool
    if _pool is None:
        pool = AsyncConnectionPool(
            os.environ["CHAOS_DATABASE_URL"],
            min_size=1,
            max_size=8,
            kwargs={"autocommit": True, "application_name": "chaos-handler"},
            check=AsyncConnectionPool.check_connection,
            open=False,
        )
        await pool.open()
        _pool = pool
    return _pool


async def _record_start(ctx: pgqueue.TaskContext, received: list[Any] | None = None) -> None:
    """The execution's row; ``received``: what a step got from its parents (None: no parents)."""
    pool = await _side_pool()
    async with pool.connection(timeout=10) as conn:
        await conn.execute(
            "INSERT INTO chaos.executions (task_id, lease_token, attempt, pid, received)"
            " VALUES (%s, %s, %s, %s, %s)",
            (
                ctx.task_id,
                ctx.lease.token,
                ctx.attempt,
                os.getpid(),
                None if received is None else Jsonb(received),
            ),
        )


async def _step_work(ctx: pgqueue.TaskContext, ms: int, mode: str) -> None:
    await asyncio.sleep(ms / 1000)
    if mode == "tx":
        conn = await ctx.aconnection()
        await conn.execute(
            "INSERT INTO chaos.effects (task_id, lease_token) VALUES (%s, %s)",
            (ctx.task_id, ctx.lease.token),
        )


@tasks.handler("chaos.work", retry=SURVIVE)
async def work(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """A few milliseconds of waiting, like a call to another service."""
    await _record_start(ctx)
    await _step_work(ctx, payload["ms"], payload["mode"])


@tasks.handler("chaos.step", retry=SURVIVE)
async def workflow_step(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> dict[str, Any]:
    """A workflow step by type name (a group's or chord's member, a chord's callback, a DAG's
    node, a clean-up step): records what its parents gave it (``ctx.parent_results``), works
    like ``chaos.work``, and returns its own identity for its dependants to receive."""
    await _record_start(ctx, list(ctx.parent_results) if ctx.parents else None)
    await _step_work(ctx, payload["ms"], payload["mode"])
    return {"task": str(ctx.task_id), "i": payload["i"]}


@tasks.task(name="chaos.link", retry=SURVIVE)
async def link(
    prev: dict[str, Any] | None, i: int, ms: int, mode: str, ctx: pgqueue.TaskContext
) -> dict[str, Any]:
    """A chain's link as a function task (``chaos_link.s(i=..., ...)``): ``prev`` is the
    previous link's result, filled in by the worker (the first link has no parent and binds
    ``prev=None``)."""
    await _record_start(ctx, [prev] if ctx.parents else None)
    await _step_work(ctx, ms, mode)
    return {"task": str(ctx.task_id), "i": i}


@tasks.handler("chaos.hang", retry=SURVIVE)
async def hang(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """First attempt: a blocking sleep in an async handler, longer than the lease. The whole
    worker process stalls (no heartbeat either), so its leases expire and its tasks run
    elsewhere; when it wakes, its late outcomes must be fenced off."""
    await _record_start(ctx)
    if ctx.attempt == 1:
        time.sleep(payload["hang_s"])  # blocking on purpose: this is the fault


@tasks.handler("chaos.suicide", retry=SURVIVE)
async def suicide(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """First attempt: the process dies on the spot (a segfault in a C extension, an OOM kill)."""
    await _record_start(ctx)
    if ctx.attempt == 1:
        os._exit(137)


@tasks.handler("chaos.suicide_always", retry=POISON)
async def suicide_always(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Kills its process on every attempt: must end dead-lettered, not loop forever."""
    await _record_start(ctx)
    os._exit(137)


@tasks.handler("chaos.poison", retry=POISON)
async def poison(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Always fails: must end dead-lettered after its attempts."""
    await _record_start(ctx)
    raise RuntimeError(f"poison task {ctx.task_id} fails on purpose (attempt {ctx.attempt})")
