"""pgqueue: a job queue for Python that lives in PostgreSQL.

Submit work in your own transaction::

    import pgqueue

    with psycopg.connect(url) as conn:          # or a SQLAlchemy Session
        save_order(conn, order)
        pgqueue.enqueue(conn, "send_receipt", {"order_id": order.id}, priority="high")
    # committed: the task exists and idle workers are woken; rolled back: it never existed

Async code uses the same functions from ``pgqueue.aio``. Scripts without a transaction of
their own use ``pgqueue.Client(url)``.

Importing the package loads nothing but this file: each name is imported from its module the
first time it is used (PEP 562), so that ``import pgqueue`` (and every ``pgqueue`` command,
whose package this is) pays only for what it touches. ``pgqueue.Worker`` is the worker and
its dependencies; ``pgqueue.enqueue`` the core and psycopg; neither loads the other.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import TYPE_CHECKING

from pgqueue.version import __version__

if TYPE_CHECKING:  # the names as mypy and editors see them; at run time, __getattr__
    from pgqueue.arguments import UndecodableArgument
    from pgqueue.client import Client
    from pgqueue.cron import Schedule
    from pgqueue.defaults import configure
    from pgqueue.enqueue import prepare
    from pgqueue.errors import (
        ConfigurationError,
        DatabaseUnavailable,
        DependencyCycle,
        DependencyError,
        Fail,
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
        TaskCancelled,
        TaskFailed,
        TaskInterrupted,
        TaskNotFound,
        TaskWasCancelled,
        TimeLimitExceeded,
        UnknownParent,
        UnsupportedConnection,
        ValidationError,
        WaitInTransaction,
        WaitTimeout,
        WorkflowCancelled,
        WorkflowFailed,
        WorkflowNotFound,
        WorkflowWaitTimeout,
    )
    from pgqueue.executor import TaskContext
    from pgqueue.function_tasks import TaskFunction
    from pgqueue.handle import AsyncResult, TaskHandle
    from pgqueue.hooks import ChildException, TaskFailure
    from pgqueue.models import (
        ClaimedTask,
        EnqueueResult,
        FailOutcome,
        FailResult,
        KeyReuse,
        KeyStats,
        Lease,
        Limit,
        LimitKind,
        OldestSnapshot,
        Parent,
        Priority,
        QueueBacklog,
        QueueState,
        QueueStats,
        QueueThroughput,
        RetryPolicy,
        SnoozeResult,
        SweepResult,
        Task,
        TaskStatus,
        WorkflowInfo,
        WorkflowStatus,
        WorkflowTask,
    )
    from pgqueue.operations import (
        backlog,
        busiest_keys,
        cancel,
        cancel_leased,
        cancel_workflow,
        check_arguments,
        children,
        claim,
        clear_limit,
        complete,
        complete_many,
        count_dead_letters,
        discard,
        enqueue,
        enqueue_columns,
        enqueue_many,
        expire,
        fail,
        get_task,
        heartbeat,
        list_limits,
        list_queues,
        list_schedules,
        list_tasks,
        oldest_snapshot,
        overview,
        parents,
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
        snooze,
        sweep_expired,
        throughput,
        throughput_series,
        wait,
        wait_workflow,
        workflow,
    )
    from pgqueue.registry import Cancel, Retry, Snooze, TaskRegistry
    from pgqueue.worker import Worker, WorkerConfig
    from pgqueue.workflows import (
        Chain,
        Chord,
        Group,
        Step,
        WorkflowHandle,
        chain,
        chord,
        group,
        step,
    )

# Where each public name lives, by module; read by __getattr__.
_HOMES: dict[str, tuple[str, ...]] = {
    "pgqueue.client": ("Client",),
    "pgqueue.cron": ("Schedule",),
    "pgqueue.defaults": ("configure",),
    "pgqueue.enqueue": ("prepare",),
    "pgqueue.errors": (
        "ConfigurationError",
        "DatabaseUnavailable",
        "DependencyCycle",
        "DependencyError",
        "Fail",
        "IdempotencyConflict",
        "InvalidArgument",
        "InvalidDatabaseURL",
        "InvalidPayload",
        "InvalidPriority",
        "InvalidResult",
        "InvalidTaskState",
        "LeaseLost",
        "PayloadTooLarge",
        "PgQueueError",
        "QueueNotFound",
        "ResultTooLarge",
        "SchemaNotReady",
        "TaskCancelled",
        "TaskFailed",
        "TaskInterrupted",
        "TaskNotFound",
        "TaskWasCancelled",
        "TimeLimitExceeded",
        "UnknownParent",
        "UnsupportedConnection",
        "ValidationError",
        "WaitInTransaction",
        "WaitTimeout",
        "WorkflowCancelled",
        "WorkflowFailed",
        "WorkflowNotFound",
        "WorkflowWaitTimeout",
    ),
    "pgqueue.executor": ("TaskContext",),
    "pgqueue.arguments": ("UndecodableArgument",),
    "pgqueue.hooks": ("ChildException", "TaskFailure"),
    "pgqueue.function_tasks": ("TaskFunction",),
    "pgqueue.handle": ("AsyncResult", "TaskHandle"),
    "pgqueue.workflows": (
        "Chain",
        "Chord",
        "Group",
        "Step",
        "WorkflowHandle",
        "chain",
        "chord",
        "group",
        "step",
    ),
    "pgqueue.models": (
        "ClaimedTask",
        "EnqueueResult",
        "FailOutcome",
        "FailResult",
        "KeyReuse",
        "KeyStats",
        "Lease",
        "Limit",
        "LimitKind",
        "OldestSnapshot",
        "Parent",
        "Priority",
        "QueueBacklog",
        "QueueState",
        "QueueStats",
        "QueueThroughput",
        "RetryPolicy",
        "SweepResult",
        "Task",
        "TaskStatus",
        "SnoozeResult",
        "WorkflowInfo",
        "WorkflowStatus",
        "WorkflowTask",
    ),
    "pgqueue.operations": (
        "backlog",
        "busiest_keys",
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
        "enqueue_columns",
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
        "children",
        "parents",
        "expire",
        "snooze",
        "cancel_workflow",
        "wait_workflow",
        "workflow",
    ),
    "pgqueue.registry": (
        "Cancel",
        "Retry",
        "TaskRegistry",
        "Snooze",
    ),
    "pgqueue.worker": (
        "Worker",
        "WorkerConfig",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use and kept here after that; a
    submodule (``pgqueue.operations``), as the eager package made them available."""
    home = _HOME_OF.get(name)
    if home is not None:
        value = getattr(_load(home), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return _load(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load(module: str) -> types.ModuleType:
    """``module``, imported as an import statement would (``importlib.import_module`` would
    hide it and its cost from ``python -X importtime``, the measure these imports are for)."""
    __import__(module)
    return sys.modules[module]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Facade(types.ModuleType):
    """Keeps a public name from being shadowed by the submodule of the same name: importing
    ``pgqueue/enqueue.py`` binds ``pgqueue.enqueue`` to that module, which the eager package
    then rebound to the function; lazily, nothing would."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _HOME_OF and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade


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
    "KeyStats",
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
    "busiest_keys",
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
    "enqueue_columns",
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

# A handler's Snooze, and what records it; the expiry pass.
__all__ += ["Snooze", "SnoozeResult", "expire", "snooze"]

# Dependencies between tasks.
__all__ += ["DependencyCycle", "DependencyError", "Parent", "UnknownParent", "children", "parents"]

# Workflows (chain, group, chord of steps).
__all__ += ["Chain", "Chord", "Group", "Step", "WorkflowHandle", "chain", "chord", "group", "step"]

# Operating workflows (status, cancel, wait).
__all__ += [
    "WorkflowCancelled",
    "WorkflowFailed",
    "WorkflowInfo",
    "WorkflowNotFound",
    "WorkflowStatus",
    "WorkflowTask",
    "WorkflowWaitTimeout",
    "cancel_workflow",
    "wait_workflow",
    "workflow",
]

# The process executor: what a handler in a child process sees when it is told to stop.
__all__ += ["TaskCancelled", "TaskInterrupted", "TimeLimitExceeded"]

# Calls without a connection (fn.delay, fn.apply_async) and a result to ask (Celery's habits).
__all__ += ["AsyncResult", "TaskFailed", "TaskWasCancelled", "configure"]

# A function task's typed arguments: a stored argument that cannot become its annotated type.
__all__ += ["UndecodableArgument"]

# Retry control and hooks: a handler's Fail, what the hooks are given.
__all__ += ["ChildException", "Fail", "TaskFailure"]
