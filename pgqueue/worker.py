"""The worker: claim tasks sized to free slots, run them, record outcomes, survive the database.

One worker process runs one asyncio loop with these parts:

- the **claimer** claims as many ready tasks as it has free slots, in one statement; it wakes
  on a NOTIFY from an enqueue, on a freed slot, or on a jittered poll (the fallback);
- the **listener** holds a LISTEN connection and re-establishes it after any disconnect
  (then wakes the claimer, since notifications sent meanwhile are gone);
- the **completer** writes completions in batches (one statement for all that finished
  meanwhile), each fenced by its lease token;
- the **heartbeat** renews every lease the worker holds, learns of cancellation requests
  and lost leases, and tells the handlers through their context;
- **maintenance** (expired-lease sweep, retention pruning), one runner per database.

Database errors never crash the loop: every statement is retried with backoff, and the
lease fence decides afterwards whose outcome counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue import aio, tracing
from pgqueue.config import resolve_database_url
from pgqueue.cron import Schedule
from pgqueue.errors import DatabaseUnavailable, LeaseLost, ValidationError
from pgqueue.executor import (
    Cancelled,
    Completed,
    DaemonThreadPool,
    Executor,
    Failed,
    Lost,
    Outcome,
    Recorded,
    TaskContext,
)
from pgqueue.log import event, logger
from pgqueue.maintenance import Maintenance, MaintenanceConfig
from pgqueue.models import ClaimedTask, EnqueueResult, FailOutcome, Lease
from pgqueue.queries import arun, claim_round, limits_probe, task_claim, task_complete_many
from pgqueue.registry import TaskRegistry
from pgqueue.worker_metrics import create as create_metrics

T = TypeVar("T")

RETRYABLE = (psycopg.OperationalError, psycopg.errors.AdminShutdown, DatabaseUnavailable)
# A worker that saw no limits takes the one-statement claim, and looks for limits again this
# often (a worker that saw some looks at every claim).
LIMITS_RECHECK_SECONDS = 1.0
# A stop signal this soon after the previous one is its echo (see Worker._on_signal).
SIGNAL_ECHO_SECONDS = 1.0


@dataclasses.dataclass
class WorkerConfig:
    """How a worker runs. The defaults suit tasks of seconds to minutes."""

    queues: list[str] = dataclasses.field(default_factory=lambda: ["default"])
    concurrency: int = 10
    lease_seconds: float = 30.0
    # Also how late a scheduled task may start: nothing announces that one has become due, so
    # an idle worker finds it at its next poll (0.4 to 0.6 s with the jitter below).
    poll_interval: float = 0.5
    grace_period: float = 30.0
    # Most tasks one claim statement may take: a claim's cost is mostly per statement (its
    # commit, the index walk), so large batches make short tasks cheap (26k/s vs 20k/s for
    # no-op tasks at 100); with long tasks, free slots limit the batch anyway.
    max_claim_batch: int = 500
    # How long a starting worker waits for a database that is down or starting up (a
    # restart, a failover, a worker scheduled before its database) before it gives up.
    startup_timeout: float = 60.0
    # Run the registry's periodic schedules (TaskRegistry.periodic). Safe in every worker:
    # each tick is enqueued once across all of them.
    scheduler: bool = True
    worker_id: str = ""
    # Serve Prometheus metrics and /healthz on this port (None: off; 0: any free port).
    # Needs prometheus_client, imported only then.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    maintenance: MaintenanceConfig = dataclasses.field(default_factory=MaintenanceConfig)

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValidationError("queues", "give at least one queue")
        if self.concurrency < 1:
            raise ValidationError("concurrency", f"must be at least 1, not {self.concurrency}")
        if self.lease_seconds < 1:
            raise ValidationError(
                "lease_seconds", f"must be at least 1 s, not {self.lease_seconds}"
            )
        if self.poll_interval <= 0:
            raise ValidationError("poll_interval", "must be positive")
        if self.grace_period < 0:
            raise ValidationError("grace_period", "must be >= 0")
        if self.startup_timeout < 0:
            raise ValidationError("startup_timeout", "must be >= 0")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValidationError("metrics_port", f"must be 0 to 65535, not {self.metrics_port}")
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass
class _Running:
    task: ClaimedTask
    ctx: TaskContext
    started: float
    job: asyncio.Task[None] | None = None
    released: bool = False
    recording: bool = False  # the outcome is being written: the row may leave 'running'


@dataclasses.dataclass
class _PendingCompletion:
    task: ClaimedTask
    result_json: str | None
    duration: float


class Worker:
    """Runs the handlers of ``registry`` for tasks of ``config.queues``."""

    def __init__(
        self,
        registry: TaskRegistry,
        database_url: str | None = None,
        config: WorkerConfig | None = None,
    ) -> None:
        self.registry = registry
        self.database_url = resolve_database_url(database_url)
        self.config = config or WorkerConfig()
        self._queues = set(self.config.queues)
        self._running: dict[uuid.UUID, _Running] = {}
        self._pending: list[_PendingCompletion] = []
        self._stopping = False
        self._force = False
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._pending_ready = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._handler_pool_lock = asyncio.Lock()
        self._sync_handler_pool_lock = threading.Lock()
        self._stop_requested = asyncio.Event()
        self._force_requested = asyncio.Event()
        self._pool: AsyncConnectionPool[Any] | None = None
        self._signalled_at: float | None = None  # when the last stop signal was taken
        self._limited = False  # whether pgqueue.limits had rows at the last look
        self._limits_checked = -LIMITS_RECHECK_SECONDS
        self._handler_pool: AsyncConnectionPool[Any] | None = None
        self._sync_handler_pool: ConnectionPool[Any] | None = None
        self._threads: DaemonThreadPool | None = None
        self.processed = 0
        self.metrics = create_metrics(
            self.config.metrics_port,
            host=self.config.metrics_host,
            queues=self.config.queues,
            database_url=self.database_url,
        )

    # --- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (graceful; a second signal stops at once)."""
        asyncio.run(self.run_async(install_signal_handlers=True))

    def request_stop(self, *, force: bool = False) -> None:
        """Stop claiming and finish within the grace period (``force``: release at once)."""
        if self._stopping and not force:
            force = True  # a second request means now
        if force:
            self._force = True
            self._force_requested.set()
        if not self._stopping:
            event(
                "worker.stopping",
                worker=self.config.worker_id,
                running=len(self._running),
                grace_period_s=self.config.grace_period,
            )
        self._stopping = True
        self._stop_requested.set()
        self._wake.set()
        self._slot_freed.set()

    def _on_signal(self) -> None:
        """SIGTERM/SIGINT: stop gracefully; another one later means now. One that arrives
        within SIGNAL_ECHO_SECONDS of the first is the same request arriving twice, not a
        second request: signalling a process group (systemd's default KillMode, Ctrl-C in a
        terminal, ``kill -TERM -PGID``) reaches a supervised worker directly and again
        through its supervisor, and must not cut the grace period short."""
        now = time.monotonic()
        if self._signalled_at is not None and now - self._signalled_at < SIGNAL_ECHO_SECONDS:
            return
        self._signalled_at = now
        self.request_stop()

    async def run_async(self, *, install_signal_handlers: bool = False) -> None:
        self.metrics.start()  # /metrics and /healthz, with a metrics port only
        try:
            await self._run(install_signal_handlers)
        finally:
            self.metrics.stop()

    async def _run(self, install_signal_handlers: bool) -> None:
        cfg = self.config
        await self._wait_for_database()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        self._pool = AsyncConnectionPool(
            self.database_url,
            min_size=2,
            max_size=4,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": 10},
            name="pgqueue-worker",
        )
        await self._pool.open(wait=False)
        self._threads = DaemonThreadPool(cfg.concurrency)
        executor = Executor(self._threads)
        event(
            "worker.started",
            worker=cfg.worker_id,
            queues=",".join(cfg.queues),
            concurrency=cfg.concurrency,
            lease_s=cfg.lease_seconds,
            handlers=",".join(self.registry.types),
        )
        helpers = [
            asyncio.create_task(self._listen(), name="listener"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._complete_loop(), name="completer"),
        ]
        if cfg.scheduler and self.registry.schedules:
            helpers.append(asyncio.create_task(self._scheduler(), name="scheduler"))
        if cfg.maintenance.enabled:
            maintenance = Maintenance(cfg.maintenance, metrics=self.metrics)
            helpers.append(
                asyncio.create_task(
                    maintenance.run(self._pool, self._stop_requested), name="maintenance"
                )
            )
        await self._check_server()
        try:
            await self._claim_loop(executor)
            await self._drain()
        finally:
            for t in helpers:
                t.cancel()
            for t in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await self._close()
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            event("worker.stopped", worker=cfg.worker_id, processed=self.processed)

    async def _wait_for_database(self) -> None:
        """Refuse a schema behind head, waiting up to ``startup_timeout`` for a database that
        is down or starting up. A running worker rides out an outage; one that starts during
        it should too, rather than exit and be restarted in a loop by its supervisor (whose
        backoff grows to minutes). A refusal that waiting cannot cure (wrong password, no
        such database) still fails at once."""
        from pgqueue import migrate  # alembic is slow to import: only when a worker starts

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout
        delay = 0.2
        while True:
            try:
                await asyncio.to_thread(migrate.check, self.database_url)
                return
            except DatabaseUnavailable as exc:
                if not exc.transient or loop.time() + delay > deadline:
                    raise
                event(
                    "worker.database_unreachable",
                    logging.WARNING,
                    worker=self.config.worker_id,
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                    gives_up_in_s=round(deadline - loop.time(), 1),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _check_server(self) -> None:
        """Warn about server settings that hurt a queue table over time."""

        async def autovacuum(conn: Any) -> str:
            cur = await conn.execute("SELECT current_setting('autovacuum')")
            row = await cur.fetchone()
            return str(row[0]) if row else "on"

        if await self._with_db(autovacuum, attempts=1) == "off":
            event(
                "worker.autovacuum_off",
                logging.WARNING,
                worker=self.config.worker_id,
                note="the server has autovacuum off: every claim and completion leaves a dead "
                "row, and pgqueue.tasks will grow and slow down unless it is vacuumed",
            )

    async def _close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown()
        for pool in (self._handler_pool, self._pool):
            if pool is not None:
                with contextlib.suppress(Exception):
                    await pool.close(timeout=2)
        if self._sync_handler_pool is not None:
            sync_pool = self._sync_handler_pool
            with contextlib.suppress(Exception):
                await asyncio.to_thread(sync_pool.close, 2)

    async def _drain(self) -> None:
        """Shutdown: let running tasks finish within the grace period, release the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.grace_period
        while not self._force:
            jobs = [r.job for r in self._running.values() if r.job is not None and not r.job.done()]
            remaining = deadline - loop.time()
            if not jobs or remaining <= 0:
                break
            forced = asyncio.ensure_future(self._force_requested.wait())
            await asyncio.wait(
                [*jobs, forced], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
        leftovers = [r for r in self._running.values() if not r.released]
        if leftovers:
            for r in leftovers:
                r.released = True
                r.ctx.stop()
            leases = [r.task.lease for r in leftovers]
            released = await self._with_db(lambda c: aio.release(c, leases), attempts=3) or set()
            for r in leftovers:
                event(
                    "task.released",
                    task_id=r.task.id,
                    type=r.task.type,
                    attempt=r.task.attempts,
                    released=r.task.id in released,
                )
                if r.job is not None:
                    r.job.cancel()
        await self._flush_completions(final=True)

    # --- database access with retry --------------------------------------------------------

    async def _with_db(
        self, fn: Callable[[Any], Awaitable[T]], *, attempts: int | None = None
    ) -> T | None:
        """Run ``fn(conn)`` on a pooled connection, retrying connection failures with backoff.

        Returns None if it gave up (only with ``attempts``, or when forced to stop).
        """
        assert self._pool is not None
        delay = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                async with self._pool.connection(timeout=10) as conn:
                    return await fn(conn)
            except RETRYABLE as exc:
                event(
                    "worker.database_error",
                    logging.WARNING,
                    worker=self.config.worker_id,
                    error=str(exc).strip().splitlines()[0]
                    if str(exc).strip()
                    else type(exc).__name__,
                    retry_in_s=round(delay, 2),
                )
            except Exception as exc:  # PoolTimeout and friends: the database is unreachable
                if type(exc).__name__ != "PoolTimeout":
                    raise
                event(
                    "worker.database_unreachable",
                    logging.WARNING,
                    worker=self.config.worker_id,
                    retry_in_s=round(delay, 2),
                )
            if (attempts is not None and tries >= attempts) or self._force:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # --- claiming --------------------------------------------------------------------------

    async def _claim_loop(self, executor: Executor) -> None:
        cfg = self.config
        while not self._stopping:
            # Completions waiting to be written still hold leases: past one batch of them,
            # they count against the slots, so a slow database slows claiming down instead
            # of letting the worker pile up leases (and heartbeat work) without bound.
            backlog = max(0, len(self._pending) - cfg.concurrency)
            free = cfg.concurrency - len(self._running) - backlog
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            want = min(free, cfg.max_claim_batch)
            self._wake.clear()  # before the claim, so a NOTIFY during it is not missed
            claimed = await self._with_db(
                lambda c: self.metrics.claim_timed(self._claim(c, want)),  # noqa: B023 - awaited here
                attempts=1,
            )
            if claimed is None:  # database trouble: back off a little, then poll again
                await self._sleep_or_wake(min(cfg.poll_interval, 1.0))
                continue
            for task in claimed:
                self._start(task, executor)
            if self._stopping:
                break
            if len(claimed) == want:
                continue  # probably more waiting
            await self._sleep_or_wake(cfg.poll_interval * random.uniform(0.8, 1.2))

    async def _claim(self, conn: Any, want: int) -> list[ClaimedTask]:
        """One claim. Where no limit existed at the last look, the ordinary claim alone, one
        statement: it leaves limited tasks alone anyway, so a limit set since then is never
        broken, only its tasks wait until the next look (LIMITS_RECHECK_SECONDS at most).
        Otherwise a probe first, and only when a limited task may be waiting, the claim that
        honours the limits, in a transaction of its own (it takes the limits lock)."""
        cfg = self.config
        queues, owner, lease = cfg.queues, cfg.worker_id, cfg.lease_seconds
        now = time.monotonic()
        if self._limited or now - self._limits_checked >= LIMITS_RECHECK_SECONDS:
            probe = await arun(conn, limits_probe(queues))
            self._limited, self._limits_checked = probe.limited, now
            if probe.waiting:
                op = claim_round(
                    queues=queues, limit=want, owner=owner, lease_seconds=lease, probed=probe
                )
                claimed, _ = await arun(conn, op, atomic=True)
                return claimed
        return await arun(
            conn, task_claim(queues=queues, limit=want, owner=owner, lease_seconds=lease)
        )

    def _slots_changed(self) -> None:
        """A slot of ours freed: the claimer may claim again, and with limits in play the
        freed slot may be a limit's, which no notification announces: look at once."""
        self._slot_freed.set()
        if self._limited:
            self._wake.set()

    async def _sleep_or_wake(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    # --- running ---------------------------------------------------------------------------

    def _start(self, task: ClaimedTask, executor: Executor) -> None:
        ctx = TaskContext(
            task,
            worker_id=self.config.worker_id,
            sync_pool=self._get_sync_handler_pool,
            async_pool=self._get_handler_pool,
        )
        running = _Running(task, ctx, time.monotonic())
        self._running[task.id] = running
        running.job = asyncio.create_task(self._execute(running, executor))

    async def _execute(self, running: _Running, executor: Executor) -> None:
        task, ctx = running.task, running.ctx
        if logger.isEnabledFor(logging.INFO):  # per task: skip building the fields when off
            event(
                "task.started",
                task_id=task.id,
                type=task.type,
                attempt=task.attempts,
                max_attempts=task.max_attempts,
                queue=task.queue,
            )
        self.metrics.task_started(task)
        try:
            handler = self.registry.get(task.type)
            with tracing.execution_span(
                task_id=task.id,
                type=task.type,
                queue=task.queue,
                attempt=task.attempts,
                trace_context=task.trace_context,
            ) as span:
                outcome = await executor.run(task, ctx, handler)
                if isinstance(outcome, Failed | Lost):
                    tracing.record_failure(span, getattr(outcome, "error", "lease lost"))
            if not running.released:
                running.recording = True
                await self._record(running, outcome)
            if ctx.overrun is not None:
                event(
                    "task.handler_overrun",
                    logging.WARNING,
                    task_id=task.id,
                    type=task.type,
                    attempt=task.attempts,
                    note="timed out but its thread is still running; its slot stays taken",
                )
                with contextlib.suppress(Exception):
                    await ctx.overrun
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
            self._slots_changed()

    async def _record(self, running: _Running, outcome: Outcome) -> None:
        task, ctx = running.task, running.ctx
        duration = time.monotonic() - running.started
        self.metrics.task_finished(task, duration)
        if isinstance(outcome, Completed):  # the hot path: queue it for the batched write
            self._pending.append(_PendingCompletion(task, outcome.result_json, duration))
            self._pending_ready.set()
            return
        fields: dict[str, Any] = {
            "task_id": task.id,
            "type": task.type,
            "attempt": task.attempts,
            "duration_ms": round(duration * 1000, 1),
        }
        if isinstance(outcome, Recorded):
            self.processed += 1
            self.metrics.task_completed(task)
            event("task.completed", **fields, transactional=True)
            return
        if isinstance(outcome, Lost) or ctx.lease_lost:
            event("task.lease_lost", logging.WARNING, **fields)
            return
        if isinstance(outcome, Cancelled):
            ok = await self._with_db(lambda c: _fenced(_cancel(c, task.lease, outcome.reason)))
            event("task.cancelled" if ok else "task.lease_lost", **fields, reason=outcome.reason)
            return
        assert isinstance(outcome, Failed)
        handler = self.registry.get(task.type)
        policy = handler.retry if handler is not None else None
        result = await self._with_db(
            lambda c: _fenced(
                aio.fail(
                    c, task.lease, outcome.error, retry_after=outcome.retry_after, policy=policy
                )
            )
        )
        self.metrics.task_failed(task, result or None)
        summary = outcome.error.strip().splitlines()[-1] if outcome.error.strip() else "error"
        if result is None or result is False:
            event("task.lease_lost", logging.WARNING, **fields, error=summary)
        elif result.outcome is FailOutcome.CANCELLED:
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

    # --- completions -----------------------------------------------------------------------

    async def _complete_loop(self) -> None:
        while True:
            await self._pending_ready.wait()
            await self._flush_completions()

    async def _flush_completions(self, final: bool = False) -> None:
        """Write pending completions, a batch per statement.

        Items leave ``_pending`` only once their write is done, so the heartbeat keeps their
        leases alive meanwhile, and the lock makes shutdown's final flush wait for a write in
        flight instead of finding the list empty and letting the process exit under it.
        """
        async with self._flush_lock:
            while self._pending:
                batch = self._pending[:1000]
                items = [(p.task.lease, p.result_json) for p in batch]
                done = await self._with_db(
                    lambda c: arun(c, task_complete_many(items)),  # noqa: B023 - awaited here
                    attempts=5 if final else None,
                )
                del self._pending[: len(batch)]  # appends only ever go to the end
                self.processed += len(done or ())
                self.metrics.tasks_completed(p.task for p in batch if done and p.task.id in done)
                all_recorded = done is not None and len(done) == len(batch)
                if all_recorded and not logger.isEnabledFor(logging.INFO):
                    continue  # nothing to log: skip the per-task loop
                for p in batch:
                    fields: dict[str, Any] = {
                        "task_id": p.task.id,
                        "type": p.task.type,
                        "attempt": p.task.attempts,
                        "duration_ms": round(p.duration * 1000, 1),
                    }
                    if done is None:
                        event(
                            "task.outcome_unrecorded",
                            logging.ERROR,
                            **fields,
                            note="completed, but the database was unreachable at shutdown; "
                            "the task will run again when its lease expires",
                        )
                    elif p.task.id in done:
                        event("task.completed", **fields)
                    else:
                        event(
                            "task.lease_lost",
                            logging.WARNING,
                            **fields,
                            note="completed, but the lease was lost first; the task runs again",
                        )
            self._pending_ready.clear()
            self._slots_changed()  # the claimer may be waiting for completions to drain

    # --- heartbeats and notifications ------------------------------------------------------

    async def _heartbeat(self) -> None:
        cfg = self.config
        interval = max(cfg.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            held = {r.task.id: r for r in self._running.values() if not r.released}
            leases: list[Lease] = [r.task.lease for r in held.values()]
            leases += [p.task.lease for p in self._pending]
            if not leases:
                continue
            result = await self._with_db(
                lambda c: aio.heartbeat(c, leases, lease_seconds=cfg.lease_seconds),  # noqa: B023 - awaited in this iteration
                attempts=1,
            )
            if result is None:
                continue  # try again next round; the lease is a multiple of the interval
            for task_id, running in held.items():
                if task_id not in self._running or running.recording:
                    continue  # its outcome was (being) written while the heartbeat was in flight
                if task_id not in result.held:
                    if not running.ctx.lease_lost:
                        running.ctx.lease_lost = True
                        running.ctx.stop()
                        event(
                            "task.lease_lost",
                            logging.WARNING,
                            task_id=task_id,
                            type=running.task.type,
                            attempt=running.task.attempts,
                            note="heartbeat found the lease gone; the outcome will be dropped",
                        )
                    continue
                running.ctx.lease_expires_at = result.held[task_id]
                if task_id in result.cancel_requested and not running.ctx.cancel_requested:
                    running.ctx.cancel_requested = True
                    running.ctx.stop()
                    event(
                        "task.cancel_requested",
                        task_id=task_id,
                        type=running.task.type,
                        attempt=running.task.attempts,
                    )

    async def _listen(self) -> None:
        delay = 0.2
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.database_url, autocommit=True, connect_timeout=10
                )
                async with conn:
                    await conn.execute("LISTEN pgqueue")
                    self._wake.set()  # anything sent while we were deaf is lost: look now
                    delay = 0.2
                    async for note in conn.notifies():
                        if note.payload in self._queues or note.payload == "*":
                            self._wake.set()
            except psycopg.Error as exc:
                event(
                    "worker.listen_lost",
                    logging.WARNING,
                    worker=self.config.worker_id,
                    error=str(exc).strip().splitlines()[0]
                    if str(exc).strip()
                    else type(exc).__name__,
                    retry_in_s=delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # --- periodic tasks --------------------------------------------------------------------------

    async def _scheduler(self) -> None:
        """Enqueue each schedule's due ticks, then sleep until the next tick of any of them."""
        schedules = self.registry.schedules
        while True:
            for schedule in schedules:

                async def run(conn: Any, s: Schedule = schedule) -> list[EnqueueResult]:
                    return await aio.run_schedule(conn, s, registry=self.registry)

                try:
                    results = await self._with_db(run, attempts=1)
                except Exception as exc:  # a bad schedule must not stop the others
                    event("schedule.error", logging.ERROR, schedule=schedule.name, error=str(exc))
                    continue
                for result in results or []:
                    if result.created:
                        event(
                            "schedule.enqueued",
                            schedule=schedule.name,
                            task_id=result.task.id,
                            type=result.task.type,
                            tick=result.task.visible_after.isoformat(),
                        )
            now = datetime.now(UTC)
            wake = min(s.next_after(now) for s in schedules)
            await asyncio.sleep(min(max((wake - now).total_seconds(), 0.005), 5.0))

    # --- handler connections -----------------------------------------------------------------

    # Handlers that write in their task's transaction get connections from these pools,
    # created on first use so that workers whose handlers never ask hold no extra connections.

    async def _get_handler_pool(self) -> AsyncConnectionPool[Any]:
        async with self._handler_pool_lock:
            if self._handler_pool is None:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.database_url,
                    min_size=0,
                    max_size=self.config.concurrency,
                    open=False,
                    kwargs={"connect_timeout": 10},
                    # Checked before each loan: a connection the server dropped while it sat
                    # in the pool (a restart, pg_terminate_backend) would otherwise fail the
                    # next handler's transaction and cost its task an attempt.
                    check=AsyncConnectionPool.check_connection,
                    name="pgqueue-handlers",
                )
                await pool.open(wait=False)
                self._handler_pool = pool
            return self._handler_pool

    def _get_sync_handler_pool(self) -> ConnectionPool[Any]:
        with self._sync_handler_pool_lock:  # called from handler threads
            if self._sync_handler_pool is None:
                self._sync_handler_pool = ConnectionPool(
                    self.database_url,
                    min_size=0,
                    max_size=self.config.concurrency,
                    kwargs={"connect_timeout": 10},
                    check=ConnectionPool.check_connection,  # as for the async pool above
                    name="pgqueue-sync-handlers",
                    open=True,
                )
            return self._sync_handler_pool


async def _cancel(conn: Any, lease: Lease, reason: str) -> bool:
    await aio.cancel_leased(conn, lease, reason)
    return True


async def _fenced(write: Awaitable[T]) -> T | Literal[False]:
    """The write's result, or False when the lease was lost (the write did nothing)."""
    try:
        return await write
    except LeaseLost:
        return False
