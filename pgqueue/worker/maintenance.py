"""Built-in maintenance: the expired-lease sweep, retention pruning, the starvation policy's
promotion, ANALYZE after a burst, and cancelling tasks whose expiry passed.

On by default in every worker, so crash recovery never depends on a user scheduling it.
Each batch runs in its own short transaction that first takes a transaction-level advisory
lock; whoever gets it does the batch, the others skip. So any number of workers can run
maintenance, one does the work at a time, and nothing is held between batches (which also
keeps it safe behind PgBouncer in transaction mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from typing import Any

import psycopg

from pgqueue.errors import ValidationError
from pgqueue.log import event
from pgqueue.models import TaskStatus
from pgqueue.operations import DEFAULT_COMPLETED_RETENTION, DEFAULT_DEAD_RETENTION
from pgqueue.queries import claiming, driver, maintenance, queues
from pgqueue.worker.database_errors import PROGRAMMING_ERRORS, ErrorStreak
from pgqueue.worker.metrics import NO_METRICS, WorkerMetrics
from pgqueue.worker.results import MaintenanceResult

__all__ = ["Maintenance", "MaintenanceConfig", "MaintenanceResult"]

# After ANALYZE was refused (see Maintenance.analyze_once), try again this much later: a DBA
# may have granted MAINTAIN meanwhile.
ANALYZE_RETRY_SECONDS = 600.0
# The starvation policy's period: long enough that priorities mean something under a normal
# backlog, short enough that a low task is not left behind a steady high stream for long (it
# is high after two periods, then ahead of every newer high task).
DEFAULT_PROMOTE_AFTER = 300.0


@dataclasses.dataclass(frozen=True)
class MaintenanceConfig:
    """Defaults: sweep every 5 s, prune every 60 s, keep completed and cancelled tasks 24 h
    and dead letters 14 days, and move a task that has waited 5 minutes up one priority
    (``promote_after``; 0 turns the starvation policy off: strict priority).

    A prune round deletes batches of ``batch_size`` (each its own short transaction) until one
    comes back short, up to ``max_batches``: 500,000 rows a round, so a single worker keeps up
    with 8,000 finished tasks a second, far beyond the design's 350/s peak.
    """

    enabled: bool = True
    sweep_interval: float = 5.0
    prune_interval: float = 60.0
    completed_retention: float = DEFAULT_COMPLETED_RETENTION
    dead_retention: float = DEFAULT_DEAD_RETENTION
    batch_size: int = 1000
    max_batches: int = 500
    promote_after: float = DEFAULT_PROMOTE_AFTER

    def __post_init__(self) -> None:
        if self.promote_after < 0:
            raise ValidationError("promote_after", f"must be >= 0 s, not {self.promote_after}")
        for name in ("sweep_interval", "prune_interval", "completed_retention", "dead_retention"):
            if getattr(self, name) <= 0:
                raise ValidationError(name, f"must be positive, not {getattr(self, name)}")
        if self.batch_size < 1 or self.max_batches < 1:
            raise ValidationError("batch_size", "batch_size and max_batches must be at least 1")


class Maintenance:
    """Each ``*_once`` is one step on a connection it is given, so that a test (or a role
    check) can drive it alone; ``run`` is only the loop that times them."""

    def __init__(
        self, config: MaintenanceConfig | None = None, *, metrics: WorkerMetrics = NO_METRICS
    ) -> None:
        self.config = config or MaintenanceConfig()
        self.metrics = metrics
        self._analyze_denied_at: float | None = None  # when ANALYZE was last skipped for us

    async def _locked_batch(self, conn: psycopg.AsyncConnection[Any], op: driver.Op[Any]) -> Any:
        """Run ``op`` in a transaction holding the maintenance lock; None if someone else has it."""
        async with conn.transaction():
            if not await driver.arun(conn, maintenance.maintenance_try_lock()):
                return None
            return await driver.arun(conn, op)

    async def sweep_once(self, conn: psycopg.AsyncConnection[Any]) -> MaintenanceResult:
        out = MaintenanceResult()
        for _ in range(self.config.max_batches):
            swept = await self._locked_batch(
                conn, claiming.task_sweep_expired(self.config.batch_size)
            )
            if swept is None:
                out.skipped = True
                break
            out.requeued += len(swept.requeued)
            out.dead += len(swept.dead)
            out.cancelled += len(swept.cancelled)
            for task_id in swept.dead:
                type_, attempt = swept.details.get(task_id, ("?", 0))
                event(
                    "task.dead",
                    logging.ERROR,
                    task_id=task_id,
                    type=type_,
                    attempt=attempt,
                    error="lease expired on the last attempt",
                )
            for task_id in swept.requeued:
                type_, attempt = swept.details.get(task_id, ("?", 0))
                event(
                    "task.lease_expired",
                    logging.WARNING,
                    task_id=task_id,
                    type=type_,
                    attempt=attempt,
                    note="worker stopped renewing the lease; requeued",
                )
            if swept.total < self.config.batch_size:
                break
        self.metrics.lease_swept(out)
        if out.requeued or out.dead or out.cancelled:
            event(
                "maintenance.sweep", requeued=out.requeued, dead=out.dead, cancelled=out.cancelled
            )
        return out

    async def expire_once(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Cancel, reason 'expired', the waiting tasks whose expiry passed before any
        attempt was spent (see task_expire), in bounded batches. Every sweep: the claim
        already skips them, so this only makes them final, and an expired task is cancelled
        within a sweep interval of its expiry."""
        expired = 0
        for _ in range(self.config.max_batches):
            batch = await self._locked_batch(conn, claiming.task_expire(self.config.batch_size))
            if batch is None:
                break
            expired += len(batch)
            for row in batch[:20]:  # the first few, by name
                event(
                    "task.expired",
                    task_id=row["id"],
                    type=row["type"],
                    attempt=row["attempts"],
                    queue=row["queue"],
                    expires_at=row["expires_at"].isoformat(),
                )
            if len(batch) < self.config.batch_size:
                break
        if expired:
            event("maintenance.expire", expired=expired)
        return expired

    async def analyze_once(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Refresh the table's statistics if a burst made them stale (see stats_staleness).

        A role that may not analyze the table (before PostgreSQL 17 only the table's or the
        database's owner may; from 17, whoever holds MAINTAIN on it) gets no error from
        ANALYZE, only a warning, and nothing is analyzed. That is reported once, as
        ``maintenance.analyze_not_permitted``, and then not tried again for
        ANALYZE_RETRY_SECONDS (autovacuum keeps the statistics meanwhile): otherwise every
        round would claim an analyze that never happened.
        """
        now = time.monotonic()
        if self._analyze_denied_at is not None and now - self._analyze_denied_at < (
            ANALYZE_RETRY_SECONDS
        ):
            return 0
        skipped: list[str] = []

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            # ANALYZE of one table warns only when it skips it (the permission check).
            if (diag.severity_nonlocalized or diag.severity) == "WARNING":
                skipped.append(diag.message_primary or "skipped")

        conn.add_notice_handler(on_notice)
        try:
            changed = await self._locked_batch(conn, maintenance.analyze_if_stale())
        finally:
            conn.remove_notice_handler(on_notice)
        if changed and skipped:
            if self._analyze_denied_at is None:
                event(
                    "maintenance.analyze_not_permitted",
                    logging.WARNING,
                    changed_rows=changed,
                    error=skipped[0],
                    note="this role may not ANALYZE pgqueue.tasks; autovacuum keeps its "
                    "statistics (PostgreSQL 17+: GRANT MAINTAIN, see `pgqueue grant`)",
                )
            self._analyze_denied_at = now
            return 0
        if changed:
            self._analyze_denied_at = None
            event("maintenance.analyze", changed_rows=changed)
        return int(changed or 0)

    async def promote_once(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """The starvation policy (see task_promote in sql/queues.sql), in bounded batches."""
        if not self.config.promote_after:
            return 0
        promoted = 0
        for _ in range(self.config.max_batches):
            batch = await self._locked_batch(
                conn, queues.task_promote(self.config.promote_after, self.config.batch_size)
            )
            if batch is None:
                break
            promoted += len(batch)
            for task_id, queue, type_, priority in batch[:20]:  # the first few, by name
                event(
                    "task.promoted",
                    task_id=task_id,
                    type=type_,
                    queue=queue,
                    priority=priority.label,
                    note=f"waited {self.config.promote_after:g} s",
                )
            if len(batch) < self.config.batch_size:
                break
        if promoted:
            event("maintenance.promote", promoted=promoted)
        return promoted

    async def prune_once(self, conn: psycopg.AsyncConnection[Any]) -> MaintenanceResult:
        out = MaintenanceResult()
        plans = [
            ([TaskStatus.COMPLETED, TaskStatus.CANCELLED], self.config.completed_retention),
            ([TaskStatus.FAILED], self.config.dead_retention),
        ]
        for statuses, older_than in plans:
            for _ in range(self.config.max_batches):
                n = await self._locked_batch(
                    conn, queues.task_prune(statuses, older_than, self.config.batch_size)
                )
                if n is None:
                    out.skipped = True
                    break
                out.pruned += n
                if n < self.config.batch_size:
                    break
        # Stopped workers' start marks: one small row each, gone an hour after their last claim.
        await self._locked_batch(conn, claiming.lease_starts_prune())
        if out.pruned:
            event("maintenance.prune", pruned=out.pruned)
        return out

    async def run(self, pool: Any, stop: asyncio.Event, *, worker: str | None = None) -> None:
        """Loop until ``stop`` is set. Any error of a round but PROGRAMMING_ERRORS (see
        worker/database.py) is logged as ``maintenance.error`` (the first of a streak, then
        summaries), counted (``service=maintenance``), and the next round waits for the
        backoff if that is longer than the sweep interval; every step is safe to run again."""
        loop = asyncio.get_running_loop()
        next_prune = loop.time() + random.uniform(0, self.config.prune_interval)
        first = True  # a worker starting on a fresh backlog checks the statistics at once
        errors = ErrorStreak(
            "maintenance", worker=worker, metrics=self.metrics, event_name="maintenance.error"
        )
        while not stop.is_set():
            if not first:
                wait = self.config.sweep_interval * random.uniform(0.8, 1.2)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, errors.remaining())):
                        await stop.wait()
                if stop.is_set():
                    return
            try:
                async with pool.connection(timeout=10) as conn:
                    await self.analyze_once(conn)
                    if not first:
                        await self.sweep_once(conn)
                        await self.expire_once(conn)
                        await self.promote_once(conn)
                    if not first and loop.time() >= next_prune:
                        next_prune = loop.time() + self.config.prune_interval
                        await self.prune_once(conn)
            except PROGRAMMING_ERRORS:
                raise
            except Exception as exc:
                errors.failed(exc)
            else:
                errors.recovered()
            first = False
