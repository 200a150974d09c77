"""The core API on a caller's connection, written once for sync and async code.

Every function takes the connection first: a psycopg 3 ``Connection`` or a SQLAlchemy 2
``Session``/``Connection``. None of them commits: the caller's transaction decides. Pass
``now=`` only in tests, to control the clock instead of sleeping.

Each operation is a builder: it validates its arguments and returns the sans-IO op
(:mod:`pgqueue.queries`). ``@operation`` binds it to the sync driver, which is the function
this package exports, and to the async one, its ``.aio``, which :mod:`pgqueue.aio` exports
under the same name; so an operation is written, documented and validated in one place.

The operations are written in rooms by concern, as the statements are (``pgqueue.queries``),
and all of them are exported here, where their users find them:

================  =============================================================================
room              operations
================  =============================================================================
``submitting``    enqueue, enqueue_many, enqueue_columns, check_arguments (insert_prepared)
``tasks``         get_task, list_tasks, cancel, replay, discard, count_dead_letters
``dependencies``  parents, children, workflow, cancel_workflow, wait_workflow
``waiting``       wait
``stats``         queue_stats, overview, backlog, throughput, throughput_series,
                  recent_failures, busiest_keys, oldest_snapshot
``queues``        pause_queue, resume_queue, remove_queue, list_queues, set_queue_retention,
                  set_limit, clear_limit, list_limits, promote_aged, prune
``schedules``     run_schedule, list_schedules
``claiming``      claim, expire, sweep_expired
``leased``        complete, complete_many, fail, cancel_leased, snooze, heartbeat, release
``checks``        the argument checks, bounds and defaults the rooms share
================  =============================================================================
"""

from __future__ import annotations

from pgqueue.operations.checks import (
    DAY,
    DEFAULT_COMPLETED_RETENTION,
    DEFAULT_DEAD_RETENTION,
    DEFAULT_LEASE_SECONDS,
    MAX_BATCH,
    MAX_LEASE_SECONDS,
    MAX_RATE,
    MAX_RUNNING,
    check_filters,
    check_lease,
    check_limit,
    check_retry_after,
    check_seconds,
    check_window,
    limit_target,
    limit_values,
    parse_status,
    parse_task_id,
    parse_workflow_id,
    retention_value,
)
from pgqueue.operations.claiming import claim, expire, sweep_expired
from pgqueue.operations.dependencies import (
    cancel_workflow,
    children,
    parents,
    wait_workflow,
    wait_workflow_loop,
    workflow,
)
from pgqueue.operations.leased import (
    cancel_leased,
    complete,
    complete_many,
    fail,
    heartbeat,
    release,
    snooze,
)
from pgqueue.operations.queues import (
    clear_limit,
    list_limits,
    list_queues,
    pause_queue,
    promote_aged,
    prune,
    remove_queue,
    resume_queue,
    set_limit,
    set_queue_retention,
)
from pgqueue.operations.schedules import list_schedules, run_schedule
from pgqueue.operations.stats import (
    DEFAULT_BUSIEST_KEYS,
    MAX_BUSIEST_KEYS,
    MAX_SERIES_MINUTES,
    backlog,
    busiest_keys,
    oldest_snapshot,
    overview,
    queue_stats,
    recent_failures,
    throughput,
    throughput_series,
)
from pgqueue.operations.submitting import (
    as_specs,
    check_arguments,
    enqueue,
    enqueue_columns,
    enqueue_many,
    insert_prepared,
)
from pgqueue.operations.tasks import (
    cancel,
    count_dead_letters,
    discard,
    get_task,
    list_args,
    list_tasks,
    replay,
)
from pgqueue.operations.waiting import wait

__all__ = [
    "DAY",
    "DEFAULT_BUSIEST_KEYS",
    "DEFAULT_COMPLETED_RETENTION",
    "DEFAULT_DEAD_RETENTION",
    "DEFAULT_LEASE_SECONDS",
    "MAX_BATCH",
    "MAX_BUSIEST_KEYS",
    "MAX_LEASE_SECONDS",
    "MAX_RATE",
    "MAX_RUNNING",
    "MAX_SERIES_MINUTES",
    "as_specs",
    "backlog",
    "busiest_keys",
    "cancel",
    "cancel_leased",
    "cancel_workflow",
    "check_arguments",
    "check_filters",
    "check_lease",
    "check_limit",
    "check_retry_after",
    "check_seconds",
    "check_window",
    "children",
    "claim",
    "clear_limit",
    "complete",
    "complete_many",
    "count_dead_letters",
    "discard",
    "enqueue",
    "enqueue_columns",
    "enqueue_many",
    "expire",
    "fail",
    "get_task",
    "heartbeat",
    "insert_prepared",
    "limit_target",
    "limit_values",
    "list_args",
    "list_limits",
    "list_queues",
    "list_schedules",
    "list_tasks",
    "oldest_snapshot",
    "overview",
    "parents",
    "parse_status",
    "parse_task_id",
    "parse_workflow_id",
    "pause_queue",
    "promote_aged",
    "prune",
    "queue_stats",
    "recent_failures",
    "release",
    "remove_queue",
    "replay",
    "resume_queue",
    "retention_value",
    "run_schedule",
    "set_limit",
    "set_queue_retention",
    "snooze",
    "sweep_expired",
    "throughput",
    "throughput_series",
    "wait",
    "wait_workflow",
    "wait_workflow_loop",
    "workflow",
]

# An operation says it is this package's (help(), pickle, the docs), where its users import it
# from and where it always was, not the room it is written in; its .aio twin says pgqueue.aio.
for _name in __all__:
    _value = globals()[_name]
    if hasattr(_value, "aio"):
        _value.__module__ = __name__
del _name, _value
