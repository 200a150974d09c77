"""The process executor's pool driven directly, in this process, on a real database: what it
promises the worker's other services, which a worker process shows only when timing is
unlucky.

The pool's fork server is spawned here (the test process has connections open, so it cannot
be forked); it imports this module's registry by ``test_process_pool:tasks``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

import pgqueue
from pgqueue.executor import Recorded, TaskContext
from pgqueue.worker import WorkerConfig
from pgqueue.worker.metrics import NO_METRICS
from pgqueue.worker.processes import ProcessPool
from pgqueue.worker.state import Running, Slots, StopRequest

tasks = pgqueue.TaskRegistry()


@tasks.handler("tx_select", executor="process")
def tx_select(payload: dict[str, Any], ctx: TaskContext) -> str:
    ctx.connection.execute("SELECT 1")
    return "ok"


def test_a_transactional_completion_is_marked_recording_before_the_child_commits(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The child commits the completion itself, which clears the lease: the worker's
    heartbeat must not take that for a lost lease. So the child says it is about to commit
    and waits for the pool's word, which the pool gives only once the task is marked
    ``recording`` (what the heartbeat and the cancels skip)."""
    task_id = pgqueue.enqueue(conn, "tx_select", {}).id
    [claimed] = pgqueue.claim(conn, ["default"], limit=1, worker_id="pool-test")
    slots = Slots()
    config = WorkerConfig(concurrency=1, process_pool_size=1, worker_id="pool-test")
    pool = ProcessPool(
        config,
        tasks,
        database_url,
        metrics=NO_METRICS,
        stop=StopRequest(),
        max_result_bytes=None,
        slots=slots,
    )
    pool.prepare()

    async def run() -> tuple[Any, bool]:
        await pool.open()
        try:
            ctx = TaskContext(claimed, worker_id="pool-test")
            running = Running(claimed, ctx, time.monotonic())
            slots.running[claimed.id] = running
            outcome = await pool.run(claimed, ctx, tasks.get("tx_select"))  # type: ignore[arg-type]
            return outcome, running.recording
        finally:
            await pool.close()

    outcome, recording = asyncio.run(run())

    assert outcome == Recorded('"ok"')
    assert recording is True
    task = pgqueue.get_task(conn, task_id)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "ok")
