"""Per-queue settings and the housekeeping they govern: pause, resume, forget, list,
retention and the prune that applies it, limits on a type or a queue, the starvation policy.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from pgqueue.enqueue import check_name
from pgqueue.errors import QueueNotFound
from pgqueue.models import Limit, QueueState, TaskStatus
from pgqueue.operations.checks import (
    DEFAULT_COMPLETED_RETENTION,
    DEFAULT_DEAD_RETENTION,
    check_limit,
    check_seconds,
    limit_target,
    limit_values,
    retention_value,
)
from pgqueue.queries import queues
from pgqueue.queries.driver import Op, mapped, operation


@operation
def promote_aged(
    *, after_seconds: float, limit: int = 1000, now: datetime | None = None
) -> Op[list[uuid.UUID]]:
    """The starvation policy, one batch: queued tasks ready for ``after_seconds`` move up one
    priority and wait another ``after_seconds`` before the next step. Workers run this in
    their maintenance (``--promote-after``); call it yourself to run it elsewhere."""
    seconds = check_seconds("after_seconds", after_seconds)
    op = queues.task_promote(seconds, check_limit(limit), now)
    return mapped(op, lambda promoted: [task_id for task_id, *_ in promoted])


@operation
def pause_queue(queue: str, *, create: bool = True, now: datetime | None = None) -> Op[QueueState]:
    """Stop every worker from claiming tasks of ``queue`` (from their next claim: within a
    poll interval, across processes and hosts) until it is resumed; it stays paused across
    restarts. Tasks already running finish. Submitting to a paused queue still works.

    ``create=False`` refuses (:class:`~pgqueue.QueueNotFound`) a queue with no tasks and no
    settings, which is most often a typo that would stay paused, unnoticed, for good; the
    CLI and the HTTP API pass it unless told ``--create`` / ``?create=true``. Code names its
    queues itself, and pausing one before its first task is ordinary there."""
    return _pause(check_name("queue", queue), create, now)


def _pause(queue: str, create: bool, now: datetime | None) -> Op[QueueState]:
    yield from _known_unless_created(queue, create, "pause it")
    return (yield from queues.queue_pause(queue, now))


def _known_unless_created(queue: str, create: bool, doing: str) -> Op[None]:
    """Refuse a setting on a queue nobody knows (no tasks, no settings) unless ``create``:
    such a name is most often a typo, and its setting would sit there unnoticed."""
    if not create and not (yield from queues.queue_known(queue)):
        raise QueueNotFound(
            queue,
            f"to {doing} before its first task, say so: create=True (CLI: --create, "
            "HTTP: ?create=true)",
        )


@operation
def resume_queue(
    queue: str, *, missing_ok: bool = True, now: datetime | None = None
) -> Op[QueueState]:
    """Let workers claim from ``queue`` again; idle workers are woken when you commit.

    ``missing_ok=False`` refuses (:class:`~pgqueue.QueueNotFound`) a queue with no tasks and
    no settings, as :func:`pause_queue` does without ``create``: resuming a typo would report
    success while the real queue stays paused. The CLI and the HTTP API pass it."""
    return _resume(check_name("queue", queue), missing_ok, now)


def _resume(queue: str, missing_ok: bool, now: datetime | None) -> Op[QueueState]:
    state = yield from queues.queue_resume(queue, now)
    if state.updated_at is None and not missing_ok and not (yield from queues.queue_known(queue)):
        raise QueueNotFound(queue, "nothing to resume (`pgqueue queue list` shows the queues)")
    return state


@operation
def remove_queue(queue: str) -> Op[bool]:
    """Forget the settings of ``queue`` (paused, retention): a paused one runs again, with
    the workers' retention. Its tasks are not touched. Whether it had any settings."""
    return queues.queue_remove(check_name("queue", queue))


@operation
def list_queues() -> Op[list[QueueState]]:
    """Queues with tasks (in any status) or a setting, and whether each is paused."""
    return queues.queue_list()


@operation
def set_queue_retention(
    queue: str,
    *,
    completed: float | None = None,
    dead: float | None = None,
    create: bool = True,
    now: datetime | None = None,
) -> Op[QueueState]:
    """Keep this queue's completed and cancelled tasks ``completed`` seconds, and its dead
    letters ``dead`` seconds, instead of the workers' defaults (None: the default). Both are
    set at once; pruning applies them from its next round on, to tasks already finished too.

    ``create=False`` refuses (:class:`~pgqueue.QueueNotFound`) a queue with no tasks and no
    settings, as :func:`pause_queue` does, and the CLI and the HTTP API pass it unless told
    ``--create`` / ``?create=true``: a mistyped name would otherwise keep a retention that
    applies to nothing, while the real queue keeps the default."""
    return _set_retention(
        check_name("queue", queue),
        retention_value("completed", completed),
        retention_value("dead", dead),
        create,
        now,
    )


def _set_retention(
    queue: str, completed: float | None, dead: float | None, create: bool, now: datetime | None
) -> Op[QueueState]:
    yield from _known_unless_created(queue, create, "set its retention")
    return (yield from queues.queue_set_retention(queue, completed, dead, now))


@operation
def set_limit(
    *,
    type: str | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    rate: int | None = None,
    per: float = 1.0,
    per_key_max_running: int | None = None,
    burst: int | None = None,
    now: datetime | None = None,
) -> Op[Limit]:
    """Limit the tasks of one ``type`` (or one ``queue``) across every worker: at most
    ``max_running`` at once, at most ``rate`` starts per ``per`` seconds, at most
    ``per_key_max_running`` at once per concurrency key (so that one tenant's backlog cannot
    take every slot), or any of them together. The limit is set as a whole (a part left None
    is no limit of that kind) and is enforced in the database, so it holds however many
    worker processes and hosts run; claims obey it from the next one on. 0 stops the tasks
    (with ``per_key_max_running``, the tasks that have a key) without pausing the queue.
    ``max_running`` and ``per_key_max_running`` are integers from 0 to 1,000,000, ``rate``
    from 0 to 10,000.

    With ``burst`` (1 to 10,000), the rate's starts are spaced evenly: one every ``per /
    rate`` seconds, and after a quiet spell at most ``burst`` at once (a token bucket of that
    size). Without it, the rate is a sliding window: at most ``rate`` starts in any
    ``per``-second window, which lets them all start at once. A limit set here is the
    operator's: a ``rate_limit`` declared on the type's decorator never overwrites it."""
    kind, name = limit_target(type, queue)
    running, rate_limit, period, per_key, rate_burst = limit_values(
        max_running, rate, per, per_key_max_running, burst
    )
    return queues.limit_set(kind, name, running, rate_limit, period, rate_burst, per_key, now=now)


@operation
def clear_limit(*, type: str | None = None, queue: str | None = None) -> Op[bool]:
    """Remove the limit on a type or queue (its tasks are claimed as any others); whether
    there was one."""
    return queues.limit_clear(*limit_target(type, queue))


@operation
def list_limits(*, now: datetime | None = None) -> Op[list[Limit]]:
    """Every limit, with the tasks running under it, its starts in the rate window, and its
    concurrency keys with tasks running and at their per-key cap."""
    return queues.limit_list(now)


@operation
def prune(
    *,
    completed_after: float = DEFAULT_COMPLETED_RETENTION,
    dead_after: float = DEFAULT_DEAD_RETENTION,
    limit: int = 1000,
    now: datetime | None = None,
) -> Op[int]:
    """Delete completed/cancelled tasks older than ``completed_after`` seconds and dead letters
    older than ``dead_after`` (or their queue's own retention, :func:`set_queue_retention`);
    at most ``limit`` of each per call. Returns how many went."""
    check_limit(limit)
    return _prune(completed_after, dead_after, limit, now)


def _prune(completed_after: float, dead_after: float, limit: int, now: datetime | None) -> Op[int]:
    finished = [TaskStatus.COMPLETED, TaskStatus.CANCELLED]
    done: int = yield from queues.task_prune(finished, completed_after, limit, now)
    dead: int = yield from queues.task_prune([TaskStatus.FAILED], dead_after, limit, now)
    return done + dead
