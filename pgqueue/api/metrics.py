"""The API's Prometheus metrics: its requests and submissions, and the queue gauges it serves
on ``/metrics``.

The collectors live in a registry of each app's own, not the process-wide default one, so
that several apps in one process (two mounts, or a test suite) neither collide nor mix their
counts.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pgqueue import models
from pgqueue.models import TaskStatus

# How many queue names keep a submission counter of their own, per app; the rest share
# OTHER_QUEUES. A queue's name comes from the client, and each name would otherwise add series
# for the life of the process.
MAX_SUBMITTED_QUEUES = 100
OTHER_QUEUES = "(other)"


class QueueLabels:
    """The ``queue`` label of a counter filled from requests: the first ``limit`` distinct
    names keep their own series (in an ordinary deployment, every queue there is), and any
    later one is counted as OTHER_QUEUES (as is a queue of that very name), so that a client
    submitting to a million made-up names adds one series, not a million, while the total
    still adds up.

    First come rather than "queues that exist in the database": a submission creates its
    queue, so existence bounds nothing; and checking would cost a query per submit. A name
    keeps its series once given one, so that a counter never moves between series."""

    def __init__(self, limit: int = MAX_SUBMITTED_QUEUES) -> None:
        self.limit = limit
        self.named: set[str] = set()

    def __call__(self, queue: str) -> str:
        if queue in self.named:
            return queue
        if len(self.named) < self.limit and queue != OTHER_QUEUES:
            self.named.add(queue)
            return queue
        return OTHER_QUEUES


class ApiMetrics:
    """One app's collectors; the gauges are filled from the database on each scrape."""

    def __init__(self) -> None:
        """Every collector, declared with its help text: long, as a list of them is, and
        clearer in one place than split by kind."""
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pgqueue_api_requests_total",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pgqueue_api_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=self.registry,
        )
        self.submitted = Counter(
            "pgqueue_api_tasks_submitted_total",
            f"Tasks submitted (queues beyond the first {MAX_SUBMITTED_QUEUES} named: "
            f"queue={OTHER_QUEUES!r})",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.submitted_queue = QueueLabels()
        self.depth = Gauge(
            "pgqueue_queue_depth",
            "Queued, running, waiting and dead-lettered tasks by queue, priority and status",
            ["queue", "priority", "status"],
            registry=self.registry,
        )
        self.ready = Gauge(
            "pgqueue_queue_ready",
            "Queued tasks that are due now",
            ["queue", "priority"],
            registry=self.registry,
        )
        self.oldest = Gauge(
            "pgqueue_queue_oldest_ready_age_seconds",
            "Age of the oldest ready task",
            ["queue", "priority"],
            registry=self.registry,
        )
        self.paused = Gauge(
            "pgqueue_queue_paused",
            "1 while a queue is paused (no worker claims from it)",
            ["queue"],
            registry=self.registry,
        )
        # Limits (pgqueue limit): what each allows and what it uses now, so that a type held
        # back by its limit shows as such next to its growing backlog.
        self.limit_max_running = Gauge(
            "pgqueue_limit_max_running",
            "A limit's most tasks running at once across the fleet",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_running = Gauge(
            "pgqueue_limit_running_tasks",
            "Tasks running under a limit now (expired leases count until swept)",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_rate = Gauge(
            "pgqueue_limit_rate_starts",
            "A limit's most starts per window",
            ["kind", "name", "per_seconds"],
            registry=self.registry,
        )
        self.limit_recent_starts = Gauge(
            "pgqueue_limit_recent_starts",
            "Starts under a rate limit within its window now",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_per_key = Gauge(
            "pgqueue_limit_per_key_max_running",
            "A limit's most tasks running at once per concurrency key across the fleet",
            ["kind", "name"],
            registry=self.registry,
        )
        self.limit_keys_at_cap = Gauge(
            "pgqueue_limit_keys_at_cap",
            "Concurrency keys with their per-key most tasks running under a limit now",
            ["kind", "name"],
            registry=self.registry,
        )
        # The busiest concurrency keys only (operations.DEFAULT_BUSIEST_KEYS of them): a key is
        # a tenant, and a label per tenant would grow the series without bound.
        self.key_tasks = Gauge(
            "pgqueue_key_tasks",
            "Tasks of the busiest concurrency keys (running + ready) by queue, key and state "
            "(running, or ready: queued and due, counted up to 1000 per key)",
            ["queue", "key", "state"],
            registry=self.registry,
        )

        # The oldest snapshot holding back vacuum of pgqueue.tasks (0 while none is), and the
        # threshold the dashboard and `pgqueue stats` warn at, for an alert rule to compare.
        self.snapshot_age = Gauge(
            "pgqueue_oldest_snapshot_seconds",
            "How long the oldest snapshot holding back cleanup of pgqueue.tasks has been open",
            registry=self.registry,
        )
        self.snapshot_xids = Gauge(
            "pgqueue_oldest_snapshot_xid_age",
            "How many transactions old the oldest snapshot holding back cleanup is",
            registry=self.registry,
        )
        self.snapshot_warn = Gauge(
            "pgqueue_oldest_snapshot_warn_seconds",
            "The snapshot age past which pgqueue warns (PGQUEUE_SNAPSHOT_WARN_SECONDS)",
            registry=self.registry,
        )

    def count_submitted(self, queue: str, outcome: str) -> None:
        """One submission to ``queue`` (created, replayed or refused), under a bounded label."""
        self.submitted.labels(self.submitted_queue(queue), outcome).inc()

    def show_snapshot(self, held: models.OldestSnapshot | None, warn_seconds: float) -> None:
        self.snapshot_age.set(0 if held is None else held.seconds or 0)
        self.snapshot_xids.set(0 if held is None else held.xid_age)
        self.snapshot_warn.set(warn_seconds)

    def show(
        self,
        depth: Iterable[models.QueueStats],
        queues: Iterable[models.QueueState],
        limits: Iterable[models.Limit],
        keys: Iterable[models.KeyStats] = (),
    ) -> None:
        """Replace the gauges with this reading, so that a queue, a limit or a key gone since
        the last scrape (or no longer among the busiest) disappears rather than showing its
        last value for ever."""
        self.depth.clear()
        self.ready.clear()
        self.oldest.clear()
        self.paused.clear()
        self.key_tasks.clear()
        for gauge in (
            self.limit_max_running,
            self.limit_running,
            self.limit_rate,
            self.limit_recent_starts,
            self.limit_per_key,
            self.limit_keys_at_cap,
        ):
            gauge.clear()
        for x in limits:
            target = (x.kind.value, x.name)
            self.limit_running.labels(*target).set(x.running)
            if x.max_running is not None:
                self.limit_max_running.labels(*target).set(x.max_running)
            if x.rate_limit is not None and x.rate_period is not None:
                self.limit_rate.labels(*target, f"{x.rate_period:g}").set(x.rate_limit)
                self.limit_recent_starts.labels(*target).set(x.recent_starts)
            if x.per_key_max_running is not None:
                self.limit_per_key.labels(*target).set(x.per_key_max_running)
                self.limit_keys_at_cap.labels(*target).set(x.keys_at_cap)
        for k in keys:
            self.key_tasks.labels(k.queue, k.key, "running").set(k.running)
            self.key_tasks.labels(k.queue, k.key, "ready").set(k.ready)
        for q in queues:
            self.paused.labels(q.name).set(1 if q.paused else 0)
        for d in depth:
            self.depth.labels(d.queue, d.priority, d.status).set(d.tasks)
            if d.status == TaskStatus.QUEUED:
                self.ready.labels(d.queue, d.priority).set(d.ready)
                self.oldest.labels(d.queue, d.priority).set(d.oldest_ready_age_seconds or 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
