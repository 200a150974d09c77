"""The worker's own connections, and the retry every statement of its services goes through.

Database errors never crash the worker. Every statement a service runs goes through
:meth:`Database.call`, under the service's name, and every error it meets is handled alike:
a dropped connection, an outage, a serialization failure, a lock or statement timeout, a
prepared statement a pooler in transaction mode mixed up, a broken trigger, a row that does
not decode. It is logged (the first of a streak, then a summary as the streak doubles, and at
least once a minute: never a line per retry), counted in ``/metrics``
(``pgqueue_worker_database_errors_total{service,kind}``) and retried with a backoff that
doubles from 0.1 s to 5 s (database_errors.py), and the lease fence decides afterwards whose
outcome counts. Shared by all the services so that one pool serves them (a worker holds 2 to
4 connections whatever its concurrency) and an error is ridden out, logged and counted the
same way everywhere; the listener and maintenance, which hold a connection across several
statements, keep loops of their own around the same :class:`ErrorStreak`.

What is not retried: cancellation (a stop), and the errors of the worker's own code
(database_errors.PROGRAMMING_ERRORS, which says why).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database_errors import (
    CONNECTION,
    PROGRAMMING_ERRORS,
    ErrorStreak,
    kind_of,
    pause,
)
from pgqueue.worker.metrics import NO_METRICS, WorkerMetrics
from pgqueue.worker.state import StopRequest

T = TypeVar("T")

# A statement about one task (its failure, cancel or snooze, named by ``subject``) that fails
# this many times for a reason other than the connection gives up, as it did before any retry:
# an error that repeats on one task's row is that row's, and retrying it for ever would hold
# the task's slot and renew its lease for ever. Given up, the task's lease expires and the
# sweep counts the attempt; the worker carries on. Connection errors are retried without end.
TASK_STATEMENT_TRIES = 8

# A worker holds 2 to 4 connections whatever its concurrency.
POOL_MIN, POOL_MAX = 2, 4


class Database:
    """The pool is made by ``open``, once the worker has seen the database up, not when the
    worker is built: a worker may be built long before it runs, or never run."""

    def __init__(
        self,
        database_url: str,
        config: WorkerConfig,
        stop: StopRequest,
        metrics: WorkerMetrics = NO_METRICS,
    ) -> None:
        self.database_url = database_url
        self.pool: AsyncConnectionPool[Any] | None = None
        self._config = config
        self._stop = stop
        self._metrics = metrics
        # The streaks going on, by service and subject: none while all is well.
        self._streaks: dict[tuple[Any, ...], ErrorStreak] = {}

    async def open(self) -> AsyncConnectionPool[Any]:
        """The pool, opening: with one connection first (what the first claim needs), the
        second once :meth:`started` (a server process fewer to start beside the claim)."""
        self.pool = AsyncConnectionPool(
            self.database_url,
            min_size=1,
            max_size=POOL_MAX,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": 10},
            name="pgqueue-worker",
        )
        await self.pool.open(wait=False)
        return self.pool

    async def started(self) -> None:
        """The first claim is done: the pool's own size from now on."""
        if self.pool is not None:
            await self.pool.resize(POOL_MIN, POOL_MAX)

    def backing_off(self, service: str, subject: Mapping[str, Any] | None = None) -> bool:
        """Whether ``service`` (about ``subject``) is waiting out the backoff of an error."""
        streak = self._streaks.get(_key(service, subject))
        return streak is not None and streak.remaining() > 0

    async def call(
        self,
        service: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        attempts: int | None = None,
        subject: Mapping[str, Any] | None = None,
    ) -> T | None:
        """Run ``fn(conn)`` on a pooled connection for ``service``, retrying any error with
        backoff (see the module); ``subject`` names what the statement is about in the log
        (a task's ``task_id``, ``type`` and ``attempt``; a schedule), and its errors make a
        streak of their own. Returns None if it gave up: after ``attempts`` tries, or at a
        forced stop.

        A call of a service in a streak first waits out its backoff, so that a loop that
        calls again at once (the claimer, woken by a NOTIFY) does not spin; a stop request
        cuts that wait short (a stopping worker does not wait for it), a forced stop every
        wait. Only PROGRAMMING_ERRORS propagate, and cancellation."""
        assert self.pool is not None
        key = _key(service, subject)
        stop = self._stop
        tries = 0
        while True:
            streak = self._streaks.get(key)
            if streak is not None:
                await pause(streak.remaining(), stop.forced, *(() if tries else (stop.requested,)))
            tries += 1
            try:
                async with self.pool.connection(timeout=10) as conn:
                    result = await fn(conn)
            except PROGRAMMING_ERRORS:
                raise
            except Exception as exc:
                if streak is None:
                    streak = self._streaks[key] = ErrorStreak(
                        service,
                        worker=self._config.worker_id,
                        metrics=self._metrics,
                        subject=subject,
                    )
                streak.failed(exc)
                if (attempts is not None and tries >= attempts) or stop.force:
                    return None
                if (
                    subject is not None
                    and tries >= TASK_STATEMENT_TRIES
                    and kind_of(exc) != CONNECTION
                ):
                    return None  # this task's own trouble: see TASK_STATEMENT_TRIES
                continue
            if streak is not None and self._streaks.pop(key, None) is streak:
                streak.recovered()
            return result


def _key(service: str, subject: Mapping[str, Any] | None) -> tuple[Any, ...]:
    return (service, *subject.items()) if subject else (service,)
