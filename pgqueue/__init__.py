"""pgqueue: a job queue for Python that lives in PostgreSQL.

Submit work in your own transaction::

    import pgqueue

    with psycopg.connect(url) as conn:          # or a SQLAlchemy Session
        save_order(conn, order)
        pgqueue.enqueue(conn, "send_receipt", {"order_id": order.id}, priority="high")
    # committed: the task exists and idle workers are woken; rolled back: it never existed

Async code uses the same functions from ``pgqueue.aio``. Scripts without a transaction of
their own use ``pgqueue.Client(url)``.
"""

from pgqueue.client import Client
from pgqueue.cron import Schedule
from pgqueue.enqueue import prepare
from pgqueue.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidArgument,
    InvalidDatabaseURL,
    InvalidPayload,
    InvalidPriority,
    InvalidResult,
    InvalidTaskState,
    LeaseLost,
    PayloadTooLarge,
    PgQueueError,
    QueueNotFound,
    ResultTooLarge,
    SchemaNotReady,
    TaskNotFound,
    UnsupportedConnection,
    ValidationError,
    WaitInTransaction,
    WaitTimeout,
)
from pgqueue.executor import TaskContext
from pgqueue.function_tasks import TaskFunction
from pgqueue.handle import TaskHandle
from pgqueue.models import (
    ClaimedTask,
    EnqueueResult,
    FailOutcome,
    FailResult,
    KeyReuse,
    Lease,
    Limit,
    LimitKind,
    OldestSnapshot,
    Priority,
    QueueBacklog,
    QueueState,
    QueueStats,
    QueueThroughput,
    RetryPolicy,
    SweepResult,
    Task,
    TaskStatus,
)
from pgqueue.operations import (
    backlog,
    cancel,
    cancel_leased,
    check_arguments,
    claim,
    clear_limit,
    complete,
    complete_many,
    count_dead_letters,
    discard,
    enqueue,
    enqueue_many,
    fail,
    get_task,
    heartbeat,
    list_limits,
    list_queues,
    list_schedules,
    list_tasks,
    oldest_snapshot,
    overview,
    pause_queue,
    promote_aged,
    prune,
    queue_stats,
    recent_failures,
    release,
    remove_queue,
    replay,
    resume_queue,
    run_schedule,
    set_limit,
    set_queue_retention,
    sweep_expired,
    throughput,
    throughput_series,
    wait,
)
from pgqueue.registry import Cancel, Retry, TaskRegistry
from pgqueue.version import __version__
from pgqueue.worker import Worker, WorkerConfig

__all__ = [
    "Cancel",
    "ClaimedTask",
    "Client",
    "ConfigurationError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "FailOutcome",
    "FailResult",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidDatabaseURL",
    "InvalidPayload",
    "InvalidPriority",
    "InvalidResult",
    "InvalidTaskState",
    "KeyReuse",
    "Lease",
    "LeaseLost",
    "Limit",
    "LimitKind",
    "OldestSnapshot",
    "PayloadTooLarge",
    "PgQueueError",
    "Priority",
    "QueueBacklog",
    "QueueNotFound",
    "QueueState",
    "QueueStats",
    "QueueThroughput",
    "ResultTooLarge",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "SchemaNotReady",
    "SweepResult",
    "Task",
    "TaskContext",
    "TaskFunction",
    "TaskHandle",
    "TaskNotFound",
    "TaskRegistry",
    "TaskStatus",
    "UnsupportedConnection",
    "ValidationError",
    "WaitInTransaction",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "__version__",
    "backlog",
    "cancel",
    "cancel_leased",
    "check_arguments",
    "claim",
    "clear_limit",
    "complete",
    "complete_many",
    "count_dead_letters",
    "discard",
    "enqueue",
    "enqueue_many",
    "fail",
    "get_task",
    "heartbeat",
    "list_limits",
    "list_queues",
    "list_schedules",
    "list_tasks",
    "oldest_snapshot",
    "overview",
    "pause_queue",
    "prepare",
    "promote_aged",
    "prune",
    "queue_stats",
    "recent_failures",
    "release",
    "remove_queue",
    "replay",
    "resume_queue",
    "run_schedule",
    "set_limit",
    "set_queue_retention",
    "sweep_expired",
    "throughput",
    "throughput_series",
    "wait",
]

# Issue 15, part C: a handler's Snooze, and what records it; the expiry pass.
from pgqueue.models import SnoozeResult
from pgqueue.operations import expire, snooze
from pgqueue.registry import Snooze

__all__ += ["Snooze", "SnoozeResult", "expire", "snooze"]
