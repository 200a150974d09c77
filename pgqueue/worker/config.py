"""How a worker runs, checked when it is built: a bad setting fails at construction, before
the worker has touched the database, rather than as an odd behaviour hours later."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import uuid

from pgqueue.enqueue import check_name
from pgqueue.errors import ConfigurationError, ValidationError
from pgqueue.pooling import connection_kwargs, resolve_pooler
from pgqueue.worker.maintenance import MaintenanceConfig


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
    # Loopback unless told otherwise: the port has no authentication (docs/security.md).
    metrics_host: str = "127.0.0.1"
    maintenance: MaintenanceConfig = dataclasses.field(default_factory=MaintenanceConfig)
    # Recycle the worker when more than this many sync handlers run on past their timeout
    # (their threads cannot be killed; each holds its slot until it returns): stop claiming,
    # let the other tasks finish within the grace period, record the overrunning ones timed
    # out and exit with EXIT_RECYCLE for the supervisor to start a fresh process. None: never.
    max_overrunning: int | None = None
    # Warn (worker.loop_blocked, naming the async handler) when the event loop runs none of
    # its timers for longer than this many seconds: an async handler calling blocking code
    # stalls every task, heartbeat and claim of the worker meanwhile. 0 or None: no watchdog.
    loop_block_threshold: float | None = 0.1
    # Where handlers that name no executor run: "thread" (plain functions in threads, async
    # ones on the event loop) or "process" (every one in a pool of child processes).
    executor: str = "thread"
    # The process executor (pgqueue/worker/processes.py). Children in the pool (None: the
    # CPUs this process may use, at most the concurrency).
    process_pool_size: int | None = None
    # Seconds after a process task's timeout before its child is killed (a type's own
    # hard_timeout wins), and after a cancel before a handler that did not stop is.
    hard_timeout: float = 5.0
    # Replace a child after this many tasks (None: never), or, between tasks, once its
    # resident memory passes max_memory_per_child MB; kill it (failing its task) the moment
    # it passes memory_limit MB.
    max_tasks_per_child: int | None = None
    max_memory_per_child: float | None = None
    memory_limit: float | None = None
    # What stands between the worker and PostgreSQL (pgqueue/pooling.py): "transaction" for a
    # transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy), whose connections may hold
    # no session state: nothing prepared, no LISTEN through it, and, without a listen_url,
    # polling that adapts to the traffic (claimer.py) and for cancels (cancels.py). None:
    # PGQUEUE_POOLER, else "none"; the worker stores what it resolved.
    pooler: str | None = None
    # A direct URL (bypassing the pooler) used for LISTEN only. None: PGQUEUE_LISTEN_URL,
    # else the database URL, unless the pooler is "transaction" (then no LISTEN at all).
    listen_url: str | None = None

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValidationError("queues", "give at least one queue")
        for queue in self.queues:  # the rule enqueue applies: a queue no task can have
            check_name("queue", queue)
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
        if self.max_overrunning is not None and self.max_overrunning < 0:
            raise ValidationError(
                "max_overrunning", f"must be 0 or more (or None), not {self.max_overrunning}"
            )
        if self.loop_block_threshold is not None and not self.loop_block_threshold >= 0:
            raise ValidationError(
                "loop_block_threshold",
                f"must be 0 (off) or more seconds, not {self.loop_block_threshold}",
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValidationError("metrics_port", f"must be 0 to 65535, not {self.metrics_port}")
        self._check_processes()
        if self.pooler is not None:
            try:
                self.pooler = resolve_pooler(self.pooler)
            except ConfigurationError as exc:
                raise ValidationError("pooler", str(exc).removeprefix("pooler ")) from None
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    def _check_processes(self) -> None:
        if self.executor == "async":
            raise ValidationError(
                "executor",
                "'async' is for async def handlers only; a worker's default is 'thread' "
                "(plain functions in threads, async ones on the event loop) or 'process'",
            )
        if self.executor not in ("thread", "process"):
            raise ValidationError(
                "executor", f"must be 'thread' or 'process', not {self.executor!r}"
            )
        size = self.process_pool_size
        if size is not None and not 1 <= size <= self.concurrency:
            raise ValidationError(
                "process_pool_size",
                f"must be 1 to the concurrency ({self.concurrency}), not {size}: a child runs "
                "one task at a time, and the worker runs at most concurrency at once",
            )
        if not 0 < self.hard_timeout < math.inf:
            raise ValidationError(
                "hard_timeout", f"must be positive seconds, not {self.hard_timeout}"
            )
        if self.max_tasks_per_child is not None and self.max_tasks_per_child < 1:
            raise ValidationError(
                "max_tasks_per_child", f"must be at least 1, not {self.max_tasks_per_child}"
            )
        for name in ("max_memory_per_child", "memory_limit"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValidationError(name, f"must be positive megabytes, not {value}")
        soft, hard = self.max_memory_per_child, self.memory_limit
        if soft is not None and hard is not None and soft >= hard:
            raise ValidationError(
                "max_memory_per_child",
                f"must be below memory_limit ({hard:g} MB), not {soft:g} MB: a child is "
                "recycled between tasks at the first, and killed mid-task at the second",
            )

    @property
    def connection_kwargs(self) -> dict[str, object]:
        """What the worker passes to every connection it opens on the database URL (its pool,
        the handlers' pools, a process child's): behind a transaction pooler, no preparing."""
        return connection_kwargs(self.pooler or "none")

    @property
    def process_children(self) -> int:
        """How many children the process executor runs."""
        if self.process_pool_size is not None:
            return self.process_pool_size
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(cpus, self.concurrency))
