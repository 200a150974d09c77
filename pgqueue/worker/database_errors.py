"""What a service of the worker does with a database error: say what kind it is, log it
without flooding the log, count it, and wait a backoff before the retry.

:class:`ErrorStreak` is one service's run of consecutive errors; Database.call keeps one per
service (and subject) for the statements it runs, and the listener and maintenance, which
hold a connection across several statements and so keep loops of their own, one each.
PROGRAMMING_ERRORS is what none of them retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from pgqueue.errors import DatabaseUnavailable
from pgqueue.log import event
from pgqueue.worker.metrics import NO_METRICS, WorkerMetrics

# The wait before the retry after a streak's first error, doubled after each error up to
# the most: short enough that a blip costs nothing, long enough that an error that repeats
# (a broken trigger until someone fixes it) costs the database one statement every 5 s.
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0
# Without a connection, a retry is a refused connect that costs the server nothing, and the
# sooner one goes after the database is back (a restart, a failover), the sooner the worker
# claims again: at most a second apart.
BACKOFF_MAX_CONNECTION = 1.0
# A streak that goes on is summarised at least this often, however slowly it doubles.
SUMMARY_SECONDS = 60.0

# Errors of the worker's own code. Not retried: running the same code again cannot mend them,
# and a loop that retried them would hide a bug behind a worker that looks alive (a heartbeat
# that retries a TypeError forever renews no lease, and every task it holds runs twice). They
# propagate to the service, which ends: the claimer's ends the worker (exit 1), another
# service's stops the worker gracefully with exit code 1 (Worker._service_ended), a task's
# outcome write's is ``worker.internal_error`` (runner.py). The supervisor, systemd or
# Kubernetes restarts the worker, and the traceback says where the bug is. Every other
# exception, raised by psycopg or by pgqueue around the statement (decoding a row, a schema a
# migration is changing under the worker), is the database's or the data's, and is retried.
PROGRAMMING_ERRORS: tuple[type[Exception], ...] = (
    AssertionError,
    AttributeError,
    NameError,
    TypeError,
)

# What kind of error it was, for the log and the metric's ``kind`` label (a closed set):
CONNECTION = "connection"  # no connection: lost, refused, none free in the pool in time
# contention a retry mends: serialization failure, deadlock, lock or statement timeout
CONFLICT = "conflict"
STATEMENT = "statement"  # the server refused the statement: a trigger, a pooler, the schema
CLIENT = "client"  # raised in this process around the statement: decoding a row, say
KINDS = (CONNECTION, CONFLICT, STATEMENT, CLIENT)


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of ``exc``, or of the psycopg error pgqueue translated into it (the
    driver raises DatabaseUnavailable and SchemaNotReady ``from`` the original)."""
    state = getattr(exc, "sqlstate", None)
    if state is None and exc.__cause__ is not None:
        state = getattr(exc.__cause__, "sqlstate", None)
    return state if isinstance(state, str) else None


def kind_of(exc: BaseException) -> str:
    """One of KINDS."""
    state = sqlstate_of(exc)
    if isinstance(exc, PoolTimeout | DatabaseUnavailable | psycopg.InterfaceError):
        return CONNECTION
    if state is None:
        return CONNECTION if isinstance(exc, psycopg.OperationalError) else CLIENT
    if state.startswith(("08", "57P")):  # connection exceptions; the server ended the session
        return CONNECTION
    if state.startswith("40") or state in ("55P03", "57014"):
        return CONFLICT
    return STATEMENT


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ErrorStreak:
    """The consecutive errors of one service (or of one subject of it: a task, a schedule),
    until a success ends them: what to log, what to count, and how long to wait.

    ``failed`` logs the first error and then a summary each time the streak doubles (2, 4,
    8, ... errors) or a minute has passed, counts every error in the worker's metrics, and
    returns the backoff; ``recovered`` logs the streak's end (``worker.database_recovered``)
    if there was one. ``event_name`` is the service's own where it had one before every
    service logged this way (``worker.listen_lost``, ``maintenance.error``), so that log
    searches written for those still find them."""

    def __init__(
        self,
        service: str,
        *,
        worker: str | None,
        metrics: WorkerMetrics = NO_METRICS,
        subject: Mapping[str, Any] | None = None,
        event_name: str = "worker.database_error",
    ) -> None:
        self.service = service
        self.failures = 0
        self.retry_at = 0.0  # time.monotonic() from which a retry may go
        self._worker = worker
        self._metrics = metrics
        self._subject = dict(subject or {})
        self._event_name = event_name
        self._started = 0.0
        self._logged_at = 0.0

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {} if self._worker is None else {"worker": self._worker}
        fields["service"] = self.service
        fields.update(self._subject)
        return fields

    def failed(self, exc: BaseException) -> float:
        """Count and maybe log ``exc``; the seconds to wait before the retry."""
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self._started = now
        kind = kind_of(exc)
        ceiling = BACKOFF_MAX_CONNECTION if kind == CONNECTION else BACKOFF_MAX
        delay = min(BACKOFF_FIRST * (1 << min(self.failures - 1, 16)), ceiling)
        self.retry_at = now + delay
        self._metrics.database_error(self.service, kind)
        doubled = (self.failures & (self.failures - 1)) == 0  # 1, 2, 4, 8, ...
        if doubled or now - self._logged_at >= SUMMARY_SECONDS:
            self._logged_at = now
            name = self._event_name
            if isinstance(exc, PoolTimeout) and name == "worker.database_error":
                name = "worker.database_unreachable"  # no connection to be had in time
            fields = self._fields()
            fields.update(
                kind=kind,
                error_class=type(exc).__name__,
                sqlstate=sqlstate_of(exc),
                error=first_line(exc),
                failures=self.failures,
            )
            if self.failures > 1:
                fields["since_s"] = round(now - self._started, 1)
            fields["retry_in_s"] = round(delay, 2)
            level = logging.WARNING if kind in (CONNECTION, CONFLICT) else logging.ERROR
            event(name, level, **fields)
        return delay

    def remaining(self) -> float:
        """Seconds until a retry may go (0: now)."""
        return max(self.retry_at - time.monotonic(), 0.0) if self.failures else 0.0

    def recovered(self) -> None:
        """A success: the streak, if any, is over."""
        if not self.failures:
            return
        event(
            "worker.database_recovered",
            **self._fields(),
            failures=self.failures,
            since_s=round(time.monotonic() - self._started, 1),
        )
        self.failures = 0
        self.retry_at = 0.0


async def pause(seconds: float, *until: asyncio.Event) -> None:
    """Sleep ``seconds``, or less if one of ``until`` is (or gets) set; cancellable."""
    if seconds <= 0 or any(e.is_set() for e in until):
        return
    if not until:
        await asyncio.sleep(seconds)
        return
    waits = [asyncio.ensure_future(e.wait()) for e in until]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
