"""Starting a claimed task and recording what became of it.

The executor (pgqueue/executor.py) turns a handler's run into exactly one outcome and knows
nothing of the worker; this is the worker's side of it: the task's slot and context, its log
events and metrics, and where each outcome is written. A completion, the common outcome, goes
to the completer's next batch; a failure, a cancellation or a retry is written here and now,
fenced by the lease, since what to log depends on what the database did with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from pgqueue import aio, tracing
from pgqueue.config import max_snoozes
from pgqueue.error_text import split_error
from pgqueue.errors import LeaseLost
from pgqueue.executor import (
    Cancelled,
    Completed,
    DaemonThreadPool,
    ElsewhereRunner,
    Executor,
    Failed,
    Lost,
    Outcome,
    Recorded,
    Snoozed,
    TaskContext,
)
from pgqueue.hooks import FailureOutcome, TaskFailure, run_hooks
from pgqueue.log import event, logger, task_fields
from pgqueue.models import ClaimedTask, FailOutcome, FailResult, Lease
from pgqueue.queries.driver import arun
from pgqueue.queries.leased import task_fail
from pgqueue.registry import TaskRegistry
from pgqueue.worker.completer import Completer
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.handler_pools import HandlerPools
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.overruns import Overruns
from pgqueue.worker.state import PendingCompletion, Running, Slots

T = TypeVar("T")


class Runner:
    """The handler threads are made by ``open`` when the worker runs, and told to end by
    ``close`` (daemon threads: one stuck in a handler cannot hold the process)."""

    def __init__(
        self,
        config: WorkerConfig,
        registry: TaskRegistry,
        *,
        db: Database,
        metrics: WorkerMetrics,
        slots: Slots,
        completer: Completer,
        pools: HandlerPools,
        max_result_bytes: int | None = None,
        overruns: Overruns | None = None,
        stalled: Callable[[], float] | None = None,
        processes: ElsewhereRunner | None = None,
    ) -> None:
        self.processed = 0  # outcomes recorded here (the completer counts its own)
        self._config = config
        self._registry = registry
        self._db = db
        self._metrics = metrics
        self._slots = slots
        self._running = slots.running
        self._completer = completer
        self._pools = pools
        self._max_result_bytes = max_result_bytes
        self._overruns = overruns
        self._stalled = stalled
        self._processes = processes
        self._threads: DaemonThreadPool | None = None
        self._executor: Executor | None = None
        self._max_snoozes = max_snoozes()  # PGQUEUE_MAX_SNOOZES, checked at start

    def open(self) -> None:
        self._threads = DaemonThreadPool(self._config.concurrency)
        self._executor = Executor(
            self._threads,
            max_result_bytes=self._max_result_bytes,
            on_overrun=self._overrun,
            stalled=self._stalled,
            elsewhere=self._processes,
        )

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown()

    def start(self, task: ClaimedTask) -> None:
        """Take a slot for ``task`` and run it in a job of its own, so the claimer can start
        the rest of its batch at once."""
        ctx = TaskContext(
            task,
            worker_id=self._config.worker_id,
            sync_pool=self._pools.get_sync,
            async_pool=self._pools.get_async,
        )
        running = Running(task, ctx, time.monotonic())
        self._running[task.id] = running
        running.job = asyncio.create_task(self._execute(running))

    async def _execute(self, running: Running) -> None:
        task, ctx = running.task, running.ctx
        assert self._executor is not None
        if logger.isEnabledFor(logging.INFO):  # per task: skip building the fields when off
            event(
                "task.started",
                task_id=task.id,
                type=task.type,
                attempt=task.attempts,
                max_attempts=task.max_attempts,
                queue=task.queue,
            )
        self._metrics.task_started(task)
        try:
            handler = self._registry.get(task.type)
            with (
                tracing.execution_span(
                    task_id=task.id,
                    type=task.type,
                    queue=task.queue,
                    attempt=task.attempts,
                    trace_context=task.trace_context,
                ) as span,
                task_fields(task.id, task.type, task.attempts),
            ):
                outcome = await self._executor.run(task, ctx, handler)
                if isinstance(outcome, Failed | Lost):
                    tracing.record_failure(span, getattr(outcome, "error", "lease lost"))
            if ctx.overrunning_since is not None and self._overruns is not None:
                self._overruns.ended(running)  # its thread returned: now the timeout counts
            if not running.released:
                running.recording = True
                await self._record(running, outcome)
        except asyncio.CancelledError:
            pass  # released at shutdown; the task is back in the queue
        except Exception as exc:  # a bug of ours: never let it kill the loop
            event(
                "worker.internal_error",
                logging.ERROR,
                task_id=task.id,
                type=task.type,
                attempt=task.attempts,
                error=repr(exc),
            )
        finally:
            self._running.pop(task.id, None)
            self._slots.changed()

    def _overrun(self, ctx: TaskContext, timeout: float) -> None:
        """The executor's word that a sync handler's timeout passed while its thread runs
        on: the task stays in ``running`` (its slot, its lease renewed) until it returns."""
        running = self._running.get(ctx.task_id)
        if running is not None and self._overruns is not None:
            self._overruns.started(running, timeout)

    async def record_abandoned(self, running: Running) -> None:
        """The worker exits while this task's handler overruns its timeout: record the
        timeout now (fenced by the lease, retried or dead-lettered by the row's policy), as
        the thread's return would have; the process's exit ends the thread. A release would
        give the attempt back, and a handler that always hangs would then run forever."""
        if self._overruns is None:
            return
        timeout = self._overruns.timeout_of(running.task.id)
        self._overruns.abandoned(running)
        running.recording = True
        await self._record(running, Failed(f"timed out after {timeout} s"))

    async def _record(self, running: Running, outcome: Outcome) -> None:
        task, ctx = running.task, running.ctx
        duration = time.monotonic() - running.started
        self._metrics.task_finished(task, duration)
        if isinstance(outcome, Completed):  # the hot path: queue it for the batched write
            self._completer.add(PendingCompletion(task, outcome.result_json, duration))
            return
        fields: dict[str, Any] = {
            "task_id": task.id,
            "type": task.type,
            "attempt": task.attempts,
            "duration_ms": round(duration * 1000, 1),
        }
        if isinstance(outcome, Recorded):
            self.processed += 1
            self._metrics.task_completed(task)
            event("task.completed", **fields, transactional=True)
            return
        if isinstance(outcome, Lost) or ctx.lease_lost:
            event("task.lease_lost", logging.WARNING, **fields)
            return
        if isinstance(outcome, Cancelled):
            ok = await self._db.call(
                "runner",
                lambda c: _fenced(_cancel(c, task.lease, outcome.reason)),
                subject=_subject(task),
            )
            event("task.cancelled" if ok else "task.lease_lost", **fields, reason=outcome.reason)
            return
        if isinstance(outcome, Snoozed):
            await self._record_snooze(task, outcome, fields)
            return
        assert isinstance(outcome, Failed)
        await self._record_failure(task, outcome, fields)

    async def _record_snooze(
        self, task: ClaimedTask, outcome: Snoozed, fields: dict[str, Any]
    ) -> None:
        """Queued again later without spending the attempt, or, at the bound, a
        failed attempt (task_snooze says which)."""
        bound = self._max_snoozes
        result = await self._db.call(
            "runner",
            lambda c: _fenced(
                aio.snooze(c, task.lease, outcome.after, reason=outcome.reason, max_snoozes=bound)
            ),
            subject=_subject(task),
        )
        if result is None or result is False:
            event("task.lease_lost", logging.WARNING, **fields, note="while snoozing")
            return
        self.processed += 1
        if result.cancelled:
            event("task.cancelled", **fields, reason="cancellation requested", note="snoozed")
        elif result.snoozed:
            event(
                "task.snoozed",
                **fields,
                after_s=outcome.after,
                snoozes=result.snoozes,
                max_snoozes=bound,
                reason=outcome.reason,
            )
        else:
            failed = result.failed
            dead = failed is not None and failed.outcome is FailOutcome.DEAD
            event(
                "task.dead" if dead else "task.retried",
                logging.ERROR if dead else logging.WARNING,
                **fields,
                max_attempts=task.max_attempts,
                error=f"snoozed {bound} times (max_snoozes={bound}): counted as a failed attempt",
            )

    async def _record_failure(
        self, task: ClaimedTask, outcome: Failed, fields: dict[str, Any]
    ) -> None:
        # The row's policy decides, not this worker's registry: it is what the caller gave,
        # or the type's declaration (applied at enqueue, or at the claim for a task enqueued
        # before it), so the attempts logged, listed and enforced are the same number.
        result = await self._db.call(
            "runner", lambda c: _fenced(_fail(c, task.lease, outcome)), subject=_subject(task)
        )
        self._metrics.task_failed(task, result or None)
        summary = split_error(outcome.error).headline or "error"
        if result is None or result is False:
            event("task.lease_lost", logging.WARNING, **fields, error=summary)
            return  # nothing was written: no hook runs (the task is someone else's now)
        self._log_failure(task, result, fields, summary)
        await self._call_hooks(task, outcome, result)

    def _log_failure(
        self, task: ClaimedTask, result: FailResult, fields: dict[str, Any], summary: str
    ) -> None:
        if result.outcome is FailOutcome.CANCELLED:
            self.processed += 1
            event("task.cancelled", **fields, reason="cancellation requested", error=summary)
        elif result.outcome is FailOutcome.DEAD:
            self.processed += 1
            event(
                "task.dead", logging.ERROR, **fields, max_attempts=task.max_attempts, error=summary
            )
        else:
            self.processed += 1
            wait = (result.retry_at.timestamp() - time.time()) if result.retry_at else 0
            event(
                "task.retried",
                logging.WARNING,
                **fields,
                max_attempts=task.max_attempts,
                retry_in_s=round(max(wait, 0), 2),
                error=summary,
            )

    async def _call_hooks(self, task: ClaimedTask, outcome: Failed, result: FailResult) -> None:
        """The registry's and the type's hooks for a failed attempt, once it is written
        (pgqueue/hooks.py): nothing they do or raise changes the outcome. The task is still
        marked ``recording`` meanwhile, so its heartbeat and cancels leave it be."""
        kind: FailureOutcome = (
            "dead"
            if result.outcome is FailOutcome.DEAD
            else "cancelled"
            if result.outcome is FailOutcome.CANCELLED
            else "retrying"
        )
        hooks = self._registry.hooks(self._registry.get(task.type), kind)
        if not hooks:
            return
        failure = TaskFailure(
            task_id=task.id,
            type=task.type,
            queue=task.queue,
            attempt=task.attempts,
            max_attempts=task.max_attempts,
            exception=outcome.exception,
            error=outcome.error,
            outcome=kind,
            retry_at=result.retry_at,
        )
        await run_hooks(hooks, failure)


def _subject(task: ClaimedTask) -> dict[str, Any]:
    """What a database error of this task's outcome write names (and keys its streak by)."""
    return {"task_id": task.id, "type": task.type, "attempt": task.attempts}


async def _fail(conn: Any, lease: Lease, outcome: Failed) -> FailResult:
    if outcome.dead:  # no retry would mend it: dead-letter now, attempts left or not
        return await arun(conn, task_fail(lease, outcome.error, dead=True))
    return await aio.fail(conn, lease, outcome.error, retry_after=outcome.retry_after)


async def _cancel(conn: Any, lease: Lease, reason: str) -> bool:
    await aio.cancel_leased(conn, lease, reason)
    return True


async def _fenced(write: Awaitable[T]) -> T | Literal[False]:
    """The write's result, or False when the lease was lost (the write did nothing)."""
    try:
        return await write
    except LeaseLost:
        return False
