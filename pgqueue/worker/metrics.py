"""Prometheus metrics and a liveness endpoint for one worker process (``--metrics-port``).

The worker and its maintenance call one-line hooks on a :class:`WorkerMetrics`. The base
class does nothing, so a worker without a metrics port pays a no-op method call per event
and never imports prometheus_client (an optional dependency: the ``api`` extra).
:class:`PrometheusWorkerMetrics` counts into a registry of its own and serves it, with
``/healthz``, from a small HTTP server in a daemon thread:

- ``GET /metrics``: the exposition. Queue depth and oldest ready age are read from the
  ``pgqueue.backlog`` view (queued and running rows only) at scrape time, at most once
  every QUEUE_DEPTH_MAX_AGE seconds, on a connection of the server thread's own; when that
  read fails, those two gauges are left out of the scrape and the rest is served.
- ``GET /healthz``: 200 while the worker's event loop runs (a task on it stamps a heartbeat
  every second), 503 once the stamp is older than HEALTHZ_STALE_SECONDS.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from pgqueue.errors import ConfigurationError
from pgqueue.log import event
from pgqueue.models import ClaimedTask, FailOutcome, FailResult
from pgqueue.operations import backlog
from pgqueue.worker.results import MaintenanceResult

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

T = TypeVar("T")

HEARTBEAT_SECONDS = 1.0
# /healthz fails once the event loop has not run the heartbeat for this long: a loop blocked
# this long (an async handler calling blocking code) claims, heartbeats and completes nothing.
HEALTHZ_STALE_SECONDS = 5.0
# Scrapes within this many seconds of the last depth read reuse it: the view counts the
# whole table, and every worker with a metrics port may be scraped.
QUEUE_DEPTH_MAX_AGE = 5.0
QUEUE_DEPTH_TIMEOUT_SECONDS = 3
# The metrics port's server (_MetricsServer): at most this many connections open at once (a
# scrape and a probe need two), this many seconds for a
# request's head to arrive and for its reply to be taken, a head at most this large, and at
# most this many threads rendering /metrics.
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT_SECONDS = 5.0
MAX_HEAD_BYTES = 16 * 1024
RENDER_THREADS = 2
PRIORITIES = ("high", "normal", "low")
# Seconds. Handlers run from milliseconds to minutes; a claim round is a few milliseconds.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    """The hooks the worker calls; each does nothing here (metrics off)."""

    def start(self) -> None:
        """Called on the worker's event loop before it starts."""

    def stop(self) -> None:
        """Called when the worker has stopped."""

    def task_started(self, task: ClaimedTask) -> None:
        pass

    def task_finished(self, task: ClaimedTask, seconds: float) -> None:
        """The handler returned or raised after ``seconds``."""

    def task_completed(self, task: ClaimedTask) -> None:
        pass

    def tasks_completed(self, tasks: Iterable[ClaimedTask]) -> None:
        """Completions recorded by one batch (a generator: left unread here)."""

    def task_failed(self, task: ClaimedTask, result: FailResult | None) -> None:
        """The handler raised; ``result`` says what the recorded failure did (None: the
        lease was lost and nothing was recorded)."""

    def claim_timed(self, claim: Awaitable[T]) -> Awaitable[T]:
        return claim

    def lease_swept(self, result: MaintenanceResult) -> None:
        pass

    def database_error(self, service: str, kind: str) -> None:
        """``service`` met a database error of ``kind`` (worker/database.py's KINDS) and will
        retry."""

    def handler_overrun(self, task: ClaimedTask, overrunning: int) -> None:
        """A sync handler's timeout passed while its thread runs on; ``overrunning`` such
        threads now."""

    def handler_overrun_ended(self, task: ClaimedTask, overrunning: int) -> None:
        """An overrunning thread returned (or was abandoned at exit)."""

    def loop_blocked(self, type: str, seconds: float) -> None:
        """The event loop did not run for ``seconds`` (the watchdog's thread may call this);
        ``type`` is the async handler's that held it, "" when unknown."""

    # The process executor's children (pgqueue/worker/processes.py).

    def child_started(self) -> None:
        pass

    def child_died(self) -> None:
        """A child exited or was killed by something other than the worker (a crash)."""

    def child_recycled(self, reason: str) -> None:
        """Replaced between tasks (max_tasks_per_child, max_memory_per_child)."""

    def child_killed(self, reason: str) -> None:
        """Killed by the worker: time, memory, cancel, lease, shutdown."""


NO_METRICS = WorkerMetrics()


def create(
    port: int | None, *, host: str, queues: Iterable[str], database_url: str
) -> WorkerMetrics:
    """The worker's metrics: the no-op hooks when ``port`` is None."""
    if port is None:
        return NO_METRICS
    return PrometheusWorkerMetrics(port, host=host, queues=queues, database_url=database_url)


class _Histogram:
    """Observations by bucket: what prometheus_client's Histogram counts, without its locks
    (about 2 us an observation there, a fifth of that here). Written on the event loop."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: bound >= value
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, labelled as prometheus_client labels them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), list(self.counts), strict=True):
            total += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(total)))
        return out


class _TypeStats:
    """One (queue, type)'s counts, plain attributes bumped on the event loop."""

    __slots__ = ("completed", "dead", "duration", "failed", "overruns", "retried", "started")

    def __init__(self) -> None:
        self.started = self.completed = self.failed = self.retried = self.dead = 0
        self.overruns = 0
        self.duration = _Histogram(DURATION_BUCKETS)


# (attribute of _TypeStats, metric name without _total, help)
TASK_COUNTERS = (
    ("started", "pgqueue_worker_tasks_started", "Task attempts started"),
    ("completed", "pgqueue_worker_tasks_completed", "Tasks whose completion was recorded"),
    (
        "failed",
        "pgqueue_worker_tasks_failed",
        "Attempts whose handler raised (Retry, a timeout and a missing handler included)",
    ),
    ("retried", "pgqueue_worker_tasks_retried", "Failed attempts recorded for a retry"),
    ("dead", "pgqueue_worker_tasks_dead", "Failed last attempts: tasks dead-lettered"),
    (
        "overruns",
        "pgqueue_worker_handler_overruns",
        "Sync handlers whose timeout passed while their thread ran on (the attempt is "
        "recorded failed once the thread returns; the task keeps its slot meanwhile)",
    ),
)


class PrometheusWorkerMetrics(WorkerMetrics):
    """The hooks bump plain counters on the event loop and a scrape (on the server's thread)
    turns them into metric families: no lock taken, under a microsecond a task in all
    (prometheus_client's own Counter and Histogram took 4 us)."""

    def __init__(self, port: int, *, host: str, queues: Iterable[str], database_url: str) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigurationError(
                "--metrics-port needs the prometheus_client package: "
                "pip install 'pgqueue-jobs[api]' (or prometheus-client)"
            ) from None
        self.port = port
        self.host = host
        self._by_type: dict[tuple[str, str], _TypeStats] = {}
        self.claims = _Histogram(CLAIM_BUCKETS)
        self.sweeps = {"swept": 0, "skipped": 0}
        self.swept_requeued = 0
        self.swept_dead = 0
        self.overrunning = 0
        # By handler type ("": unknown); bumped by the loop watchdog's thread only.
        self.loop_blocks: dict[str, tuple[int, float]] = {}
        self.children = {"started": 0, "died": 0}
        self.children_recycled: dict[str, int] = {}
        self.children_killed: dict[str, int] = {}
        self.database_errors: dict[tuple[str, str], int] = {}  # by (service, kind)
        self.depth = _QueueDepth(database_url, list(queues))
        self.registry = CollectorRegistry()  # not the global one: nothing else gets in
        self.registry.register(self)
        self.last_beat = time.monotonic()
        self._beat_task: asyncio.Task[None] | None = None
        self._server: _MetricsServer | None = None

    # --- the hooks ---------------------------------------------------------------------------

    def _of(self, task: ClaimedTask) -> _TypeStats:
        stats = self._by_type.get((task.queue, task.type))
        if stats is None:
            stats = self._by_type[task.queue, task.type] = _TypeStats()
        return stats

    def task_started(self, task: ClaimedTask) -> None:
        self._of(task).started += 1

    def task_finished(self, task: ClaimedTask, seconds: float) -> None:
        self._of(task).duration.observe(seconds)

    def task_completed(self, task: ClaimedTask) -> None:
        self._of(task).completed += 1

    def tasks_completed(self, tasks: Iterable[ClaimedTask]) -> None:
        for task in tasks:
            self._of(task).completed += 1

    def task_failed(self, task: ClaimedTask, result: FailResult | None) -> None:
        stats = self._of(task)
        stats.failed += 1
        if result is not None and result.outcome is FailOutcome.RETRYING:
            stats.retried += 1
        elif result is not None and result.outcome is FailOutcome.DEAD:
            stats.dead += 1

    def claim_timed(self, claim: Awaitable[T]) -> Awaitable[T]:
        return self._timed(claim)

    async def _timed(self, claim: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await claim
        finally:
            self.claims.observe(time.perf_counter() - started)

    def lease_swept(self, result: MaintenanceResult) -> None:
        self.sweeps["skipped" if result.skipped else "swept"] += 1
        self.swept_requeued += result.requeued
        self.swept_dead += result.dead

    def database_error(self, service: str, kind: str) -> None:
        key = (service, kind)
        self.database_errors[key] = self.database_errors.get(key, 0) + 1

    def handler_overrun(self, task: ClaimedTask, overrunning: int) -> None:
        self._of(task).overruns += 1
        self.overrunning = overrunning

    def handler_overrun_ended(self, task: ClaimedTask, overrunning: int) -> None:
        self.overrunning = overrunning

    def loop_blocked(self, type: str, seconds: float) -> None:
        n, total = self.loop_blocks.get(type, (0, 0.0))
        self.loop_blocks[type] = (n + 1, total + seconds)

    def child_started(self) -> None:
        self.children["started"] += 1

    def child_died(self) -> None:
        self.children["died"] += 1

    def child_recycled(self, reason: str) -> None:
        self.children_recycled[reason] = self.children_recycled.get(reason, 0) + 1

    def child_killed(self, reason: str) -> None:
        self.children_killed[reason] = self.children_killed.get(reason, 0) + 1

    # --- the exposition --------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return []  # no read at registration; names are not checked for clashes either

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        by_type = sorted(self._by_type.copy().items())  # copy(): one step under the GIL
        labels = ["queue", "type"]
        for attribute, name, help in TASK_COUNTERS:
            family = CounterMetricFamily(name, help, labels=labels)
            for key, stats in by_type:
                family.add_metric(key, getattr(stats, attribute))
            yield family
        duration = HistogramMetricFamily(
            "pgqueue_worker_task_duration_seconds",
            "Handler run time, from start to return or raise",
            labels=labels,
        )
        for key, stats in by_type:
            duration.add_metric(key, stats.duration.buckets(), stats.duration.sum)
        yield duration
        yield HistogramMetricFamily(
            "pgqueue_worker_claim_duration_seconds",
            "Database time of one claim round",
            buckets=self.claims.buckets(),
            sum_value=self.claims.sum,
        )
        sweeps = CounterMetricFamily(
            "pgqueue_worker_lease_sweeps",
            "Expired-lease sweep rounds run by this worker (result=skipped: another worker "
            "held the maintenance lock)",
            labels=["result"],
        )
        for result, n in self.sweeps.copy().items():
            sweeps.add_metric([result], n)
        yield sweeps
        yield CounterMetricFamily(
            "pgqueue_worker_lease_sweep_requeued",
            "Tasks with an expired lease that this worker's sweep put back in the queue",
            value=self.swept_requeued,
        )
        yield CounterMetricFamily(
            "pgqueue_worker_lease_sweep_dead",
            "Tasks with an expired lease on their last attempt that this worker's sweep "
            "dead-lettered",
            value=self.swept_dead,
        )
        yield self._database_errors()
        yield GaugeMetricFamily(
            "pgqueue_worker_handlers_overrunning",
            "Sync handlers past their timeout whose threads still run: each holds its slot "
            "and its task's lease until it returns (see --max-overrunning)",
            value=self.overrunning,
        )
        blocks = sorted(self.loop_blocks.copy().items())
        blocked = CounterMetricFamily(
            "pgqueue_worker_loop_blocked",
            "Times the event loop did not run for longer than --loop-block-threshold, by the "
            'type of the async handler that held it ("": none identified)',
            labels=["type"],
        )
        blocked_seconds = CounterMetricFamily(
            "pgqueue_worker_loop_blocked_seconds",
            "Seconds the event loop spent blocked past its due timers, by handler type",
            labels=["type"],
        )
        for type_, (n, seconds) in blocks:
            blocked.add_metric([type_], n)
            blocked_seconds.add_metric([type_], seconds)
        yield blocked
        yield blocked_seconds
        yield CounterMetricFamily(
            "pgqueue_worker_children_started",
            "Child processes of the process executor started (the first ones and replacements)",
            value=self.children["started"],
        )
        yield CounterMetricFamily(
            "pgqueue_worker_children_died",
            "Child processes that died by themselves (a crash, os._exit, the OOM killer)",
            value=self.children["died"],
        )
        for name, help, counts in (
            (
                "pgqueue_worker_children_recycled",
                "Child processes replaced between tasks (reason: max_tasks_per_child, "
                "max_memory_per_child)",
                self.children_recycled,
            ),
            (
                "pgqueue_worker_children_killed",
                "Child processes the worker killed (reason: time, memory, cancel, lease, shutdown)",
                self.children_killed,
            ),
        ):
            family = CounterMetricFamily(name, help, labels=["reason"])
            for reason, n in sorted(counts.copy().items()):
                family.add_metric([reason], n)
            yield family
        yield from self.depth.collect()

    def _database_errors(self) -> Metric:
        from prometheus_client.metrics_core import CounterMetricFamily

        family = CounterMetricFamily(
            "pgqueue_worker_database_errors",
            "Database errors the worker's services met and retried, by service (claimer, "
            "completer, heartbeat, listener, maintenance, scheduler, runner, release, "
            "cancel_poll) and kind (connection, conflict, statement, client: see "
            "pgqueue/worker/database_errors.py)",
            labels=["service", "kind"],
        )
        for (service, kind), n in sorted(self.database_errors.copy().items()):
            family.add_metric([service, kind], n)
        return family

    # --- the server ----------------------------------------------------------------------

    def start(self) -> None:
        """Bind the port and serve; start the event loop's heartbeat."""
        self.last_beat = time.monotonic()
        self._beat_task = asyncio.get_running_loop().create_task(
            self._beat(), name="metrics-heartbeat"
        )
        try:
            self._server = _MetricsServer(self, self.host, self.port)
        except OSError as exc:
            self._beat_task.cancel()
            raise ConfigurationError(
                f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        self.port = self._server.port  # the one bound, for port 0
        event("worker.metrics_serving", host=self.host, port=self.port)

    def stop(self) -> None:
        if self._beat_task is not None:
            self._beat_task.cancel()
            self._beat_task = None
        if self._server is not None:
            self._server.close()
            self._server = None
        self.depth.close()

    async def _beat(self) -> None:
        while True:
            self.last_beat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    def healthy(self) -> tuple[bool, float]:
        """(alive, seconds since the event loop last stamped its heartbeat)."""
        age = time.monotonic() - self.last_beat
        return age <= HEALTHZ_STALE_SECONDS, age

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _MetricsServer:
    """The port's HTTP server: an asyncio loop of its own in one daemon thread (never the
    worker's loop, whose stalls /healthz reports), so that a connection costs a socket, not
    a thread. A request's head must arrive within REQUEST_TIMEOUT_SECONDS and fit in
    MAX_HEAD_BYTES; at most MAX_CONNECTIONS are open at once (beyond, a new one closes the
    one that has waited longest for its head, or itself when none is waiting). /metrics is
    rendered on at most RENDER_THREADS threads (a scrape may read the database), /healthz on
    the server's thread, so that a slow depth read never delays it."""

    def __init__(self, metrics: PrometheusWorkerMetrics, host: str, port: int) -> None:
        import concurrent.futures
        import socket

        self.metrics = metrics
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, on the caller's thread, so that a port in use fails the worker's start.
        self._socket = socket.create_server((host.strip("[]"), port), family=family, backlog=64)
        self.port = int(self._socket.getsockname()[1])
        self._render = concurrent.futures.ThreadPoolExecutor(
            RENDER_THREADS, thread_name_prefix="pgqueue-metrics-render"
        )
        self._open = 0
        self._heading: dict[asyncio.StreamWriter, None] = {}  # waiting for their head, oldest first
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="pgqueue-metrics", daemon=True
        )
        self._thread.start()
        ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(ready))
        finally:
            self._loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self._socket, limit=MAX_HEAD_BYTES
        )
        ready.set()
        async with server:
            await self._stopped.wait()

    def close(self) -> None:
        """Stop listening and close every connection; returns within about a second."""
        if self._stopped is not None and self._loop.is_running():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=1)
        self._render.shutdown(wait=False, cancel_futures=True)
        self._socket.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            if not self._heading:
                writer.transport.abort()  # every slot is rendering or replying
                return
            # Make room by closing the connection that has waited longest for its head: a
            # scraper sends its head at once, so a flood of slow ones never locks it out.
            oldest = next(iter(self._heading))
            del self._heading[oldest]
            oldest.transport.abort()
        self._open += 1
        self._heading[writer] = None
        try:
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_SECONDS
                )
            finally:
                self._heading.pop(writer, None)
            status, body, content_type = await self._respond(head)
            writer.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n"
                % (status, _REASONS[status], content_type.encode(), len(body))
                + body
            )
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # too slow, too large, or gone: closed below, nothing to answer
        finally:
            self._open -= 1
            writer.transport.abort()  # no lingering: the reply was drained, or is not owed

    async def _respond(self, head: bytes) -> tuple[int, bytes, str]:
        """(status, body, content type) for a request's head."""
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if method != b"GET":
            return 405, b"only GET: try /metrics or /healthz\n", "text/plain"
        if path == b"/healthz":
            alive, age = self.metrics.healthy()
            text = "ok\n" if alive else f"event loop stalled for {age:.1f} s\n"
            return (200 if alive else 503), text.encode(), "text/plain; charset=utf-8"
        if path == b"/metrics":
            loop = asyncio.get_running_loop()
            body, content_type = await loop.run_in_executor(self._render, self.metrics.exposition)
            return 200, body, content_type
        return 404, b"not found: try /metrics or /healthz\n", "text/plain"


_REASONS = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 503: b"Service Unavailable"}


class _QueueDepth:
    """The depth gauges of the worker's queues, read at scrape time (on the server's
    thread, on a connection of its own)."""

    def __init__(self, database_url: str, queues: list[str]) -> None:
        self.database_url = database_url
        self.queues = queues
        self.errors = 0  # reads that failed (read and written under the lock)
        self._lock = threading.Lock()  # scrapes may come concurrently
        self._conn: psycopg.Connection[Any] | None = None
        self._read_at: float | None = None  # never read yet: the first scrape reads
        self._rows: dict[tuple[str, str], tuple[int, float]] | None = None

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        rows, errors = self._read()
        yield CounterMetricFamily(
            "pgqueue_worker_queue_depth_errors",
            "Reads of the queue depth that failed (the depth gauges were left out of the scrape)",
            value=errors,
        )
        if rows is None:
            return
        depth = GaugeMetricFamily(
            "pgqueue_worker_queue_depth",
            "Queued tasks that are due now (waiting for a worker), by queue and priority",
            labels=["queue", "priority"],
        )
        oldest = GaugeMetricFamily(
            "pgqueue_worker_queue_oldest_ready_age_seconds",
            "How long the oldest due task has waited (0: none is waiting)",
            labels=["queue", "priority"],
        )
        for (queue, priority), (ready, age) in sorted(rows.items()):
            depth.add_metric([queue, priority], ready)
            oldest.add_metric([queue, priority], age)
        yield depth
        yield oldest

    def _read(self) -> tuple[dict[tuple[str, str], tuple[int, float]] | None, int]:
        with self._lock:
            now = time.monotonic()
            if self._read_at is not None and now - self._read_at < QUEUE_DEPTH_MAX_AGE:
                return self._rows, self.errors
            self._read_at = now
            try:
                self._rows = self._query()
            except Exception as exc:  # never fail the scrape: leave the gauges out
                self._rows = None
                self.close()
                self.errors += 1
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                event(
                    "worker.metrics_queue_depth_error",
                    logging.WARNING,
                    error=message or type(exc).__name__,
                    retry_in_s=QUEUE_DEPTH_MAX_AGE,
                )
            return self._rows, self.errors

    def _query(self) -> dict[tuple[str, str], tuple[int, float]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.database_url,
                autocommit=True,
                connect_timeout=QUEUE_DEPTH_TIMEOUT_SECONDS,
                application_name="pgqueue-worker-metrics",
                prepare_threshold=None,  # one read per scrape gains nothing; a pooler breaks it
            )
        with self._conn.transaction():
            timeout = QUEUE_DEPTH_TIMEOUT_SECONDS * 1000
            self._conn.execute(f"SET LOCAL statement_timeout = {timeout}")
            stats = backlog(self._conn, list(self.queues))
        # Every queue of the worker has all three priorities, at 0 when empty: a drained
        # queue reads 0 rather than vanishing, which alerts and autoscalers need.
        rows = {(q, p): (0, 0.0) for q in self.queues for p in PRIORITIES}
        for s in stats:
            if s.queue in self.queues:
                rows[s.queue, s.priority] = (s.ready, s.oldest_ready_age_seconds or 0.0)
        return rows

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
