"""The core API for async code: the functions of :mod:`pgqueue.operations`, awaited.

Pass a psycopg ``AsyncConnection`` or a SQLAlchemy ``AsyncSession``/``AsyncConnection``
(``postgresql+psycopg`` dialect). Nothing here commits. Each name is the async twin of the
operation of the same name, bound from the one definition (validation, SQL and docs) in
:mod:`pgqueue.operations`; only the driver differs.
"""

from __future__ import annotations

from pgqueue import operations as _ops
from pgqueue.queries.driver import arun as arun  # re-exported: drive your own ops

enqueue = _ops.enqueue.aio
enqueue_many = _ops.enqueue_many.aio
enqueue_columns = _ops.enqueue_columns.aio
get_task = _ops.get_task.aio
list_tasks = _ops.list_tasks.aio
cancel = _ops.cancel.aio
replay = _ops.replay.aio
discard = _ops.discard.aio
count_dead_letters = _ops.count_dead_letters.aio
queue_stats = _ops.queue_stats.aio
overview = _ops.overview.aio
backlog = _ops.backlog.aio
busiest_keys = _ops.busiest_keys.aio
oldest_snapshot = _ops.oldest_snapshot.aio
run_schedule = _ops.run_schedule.aio
list_schedules = _ops.list_schedules.aio
promote_aged = _ops.promote_aged.aio
pause_queue = _ops.pause_queue.aio
resume_queue = _ops.resume_queue.aio
remove_queue = _ops.remove_queue.aio
list_queues = _ops.list_queues.aio
set_queue_retention = _ops.set_queue_retention.aio
set_limit = _ops.set_limit.aio
clear_limit = _ops.clear_limit.aio
list_limits = _ops.list_limits.aio
throughput = _ops.throughput.aio
claim = _ops.claim.aio
complete = _ops.complete.aio
complete_many = _ops.complete_many.aio
fail = _ops.fail.aio
cancel_leased = _ops.cancel_leased.aio
snooze = _ops.snooze.aio
expire = _ops.expire.aio
heartbeat = _ops.heartbeat.aio
release = _ops.release.aio
sweep_expired = _ops.sweep_expired.aio
prune = _ops.prune.aio
throughput_series = _ops.throughput_series.aio
recent_failures = _ops.recent_failures.aio

# Waiting for a result.
wait = _ops.wait.aio

# Function tasks.
check_arguments = _ops.check_arguments.aio

# Dependencies between tasks.
parents = _ops.parents.aio
children = _ops.children.aio
workflow = _ops.workflow.aio
cancel_workflow = _ops.cancel_workflow.aio
wait_workflow = _ops.wait_workflow.aio
