"""Queues as a whole: what waits in them (``stats``, ``schedules``) and their settings, which
live in the database and so hold for every worker (``queue pause/resume/list/retention/remove``).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated

import typer

from pgqueue import config
from pgqueue import operations as ops
from pgqueue.cli.database import connection
from pgqueue.cli.output import emit
from pgqueue.cli.parsing import parse_duration, show_duration
from pgqueue.formatting import age, table, timestamp
from pgqueue.models import OldestSnapshot, QueueState

commands = typer.Typer()
group = typer.Typer(
    help="Queues: pause and resume claiming, across every worker (settings live in the database).",
    no_args_is_help=True,
)

QueueNameArg = Annotated[str, typer.Argument(metavar="QUEUE", help="The queue's name.")]
SCHEDULE_COLUMNS = ("name", "cron", "timezone", "type", "queue", "last_tick", "next_tick")


@commands.command()
def stats(
    window: Annotated[
        float,
        typer.Option(
            "--window", min=1.0, metavar="SECONDS", help="Throughput over the last SECONDS."
        ),
    ] = 60.0,
    keys: Annotated[
        int,
        typer.Option(
            "--keys",
            min=1,
            max=ops.MAX_BUSIEST_KEYS,
            metavar="N",
            help="Show the N busiest concurrency keys (running + ready).",
        ),
    ] = ops.DEFAULT_BUSIEST_KEYS,
) -> None:
    """Queued, running, waiting and dead-lettered tasks by queue and priority, and throughput.

    Per queue and priority: queued tasks (ready or scheduled) with the oldest ready task's age,
    running ones, those waiting for their parents (a workflow's later steps) and dead letters;
    then tasks finished in the last minute (completed ones are counted there: counting all that
    are kept would read the whole table; SELECT * FROM pgqueue.queue_depth does); then, where
    tasks have concurrency keys, the busiest keys (running + ready) with their tasks running and
    ready (N+: the key has 1,000 or more queued tasks, counted no further, of which N are
    ready)."""
    with connection() as conn:
        depth = ops.overview(conn)
        finished = ops.throughput(conn, window_seconds=window)
        paused = sorted(q.name for q in ops.list_queues(conn) if q.paused)
        held = ops.oldest_snapshot(conn)
        busiest = ops.busiest_keys(conn, limit=keys)
    warn = config.snapshot_warn_seconds()
    parts = [
        table(
            ["QUEUE", "PRIORITY", "STATUS", "TASKS", "READY", "SCHEDULED", "OLDEST READY"],
            [
                [
                    s.queue,
                    s.priority,
                    s.status,
                    s.tasks,
                    s.ready,
                    s.scheduled,
                    age(s.oldest_ready_age_seconds),
                ]
                for s in depth
            ],
        )
        if depth
        else "no tasks",
        "",
        f"finished in the last {window:g}s:",
        table(
            ["QUEUE", "COMPLETED", "FAILED"],
            [[t.queue, t.completed, t.failed] for t in finished],
        )
        if finished
        else "none",
    ]
    if busiest:  # only where tasks have keys: nothing to say to those that use none
        parts += [
            "",
            "busiest concurrency keys (running + ready):",
            table(
                ["QUEUE", "KEY", "RUNNING", "READY"],
                [
                    [k.queue, k.key, k.running, f"{k.ready}+" if k.ready_capped else k.ready]
                    for k in busiest
                ],
            ),
        ]
    if paused:  # a growing backlog there is expected: say why before anyone wonders
        parts += ["", "paused (no worker claims from them): " + ", ".join(paused)]
    if held is not None and (held.seconds is None or held.seconds >= 1):
        parts += ["", _snapshot_line(held, warn)]
    emit(
        {
            "depth": [dataclasses.asdict(s) for s in depth],
            "throughput": [dataclasses.asdict(t) for t in finished],
            "window_seconds": window,
            "paused_queues": paused,
            "oldest_snapshot": None if held is None else dataclasses.asdict(held),
            "oldest_snapshot_warning": held is not None and held.warns(warn),
            "busiest_keys": [dataclasses.asdict(k) for k in busiest],
        },
        "\n".join(parts),
    )


def _snapshot_line(held: OldestSnapshot, warn: float) -> str:
    """Cleanup held back is the first sign of a bloating queue: say by whom, and what to do
    once it has gone on too long."""
    how_long = age(held.seconds) if held.seconds is not None else "age unknown"
    line = (
        f"oldest snapshot holding back cleanup: {how_long}, {held.xid_age} transactions, "
        f"{held.kind} {held.holder}" + (f", {held.state}" if held.state else "")
    )
    if held.warns(warn):
        line += (
            f"\nWARNING: over {age(warn)}: vacuum cannot clean pgqueue.tasks until it ends "
            "(docs/how-to/dba.md: When the database holds an old snapshot)"
        )
    return line


# A running worker's scheduler declares each of its schedules (updates the row) at least every
# 5 s; one not declared for this long is declared by no running worker: removed from the
# code, renamed, or its workers are all stopped (or run with --no-scheduler). Generous, for
# a scheduler backing off from database errors and for this host's clock against the
# database's.
STALE_AFTER_SECONDS = 300.0


@commands.command()
def schedules() -> None:
    """Periodic tasks the workers declared: cron, time zone, last tick and next run.

    DECLARED says when a worker last declared each schedule (running workers do so every
    few seconds); STALE marks those no running worker has declared for 5 minutes: their code
    no longer declares them, or none of their workers runs its scheduler. Their rows stay
    until deleted (DELETE FROM pgqueue.schedules WHERE name = ...); --json gives ``stale``."""
    with connection() as conn:
        rows = ops.list_schedules(conn)
    now = datetime.now(UTC)
    for row in rows:
        row["stale"] = (now - row["updated_at"]).total_seconds() > STALE_AFTER_SECONDS
    stale = [r["name"] for r in rows if r["stale"]]
    human = (
        table(
            [
                "NAME",
                "CRON",
                "TIME ZONE",
                "TYPE",
                "QUEUE",
                "LAST TICK",
                "NEXT RUN",
                "DECLARED",
                "STATE",
            ],
            [
                [
                    *(r[k] for k in SCHEDULE_COLUMNS),
                    age((now - r["updated_at"]).total_seconds()) + " ago",
                    "STALE" if r["stale"] else "active",
                ]
                for r in rows
            ],
        )
        if rows
        else "no schedules (workers record theirs when they start)"
    )
    if stale:
        human += (
            f"\nSTALE: declared by no running worker for {age(STALE_AFTER_SECONDS)} (removed "
            "from the code, renamed, or no worker runs its scheduler): no tick is enqueued; "
            "delete the rows of removed ones with DELETE FROM pgqueue.schedules WHERE name = '...'"
        )
    emit(rows, human)


def _queue_line(state: QueueState) -> str:
    if state.paused:
        return f"queue {state.name!r} is paused (since {timestamp(state.paused_at)})"
    return f"queue {state.name!r} is running"


def _queue_dict(state: QueueState) -> dict[str, object]:
    return {
        "name": state.name,
        "paused": state.paused,
        "paused_at": state.paused_at.isoformat() if state.paused_at else None,
        "updated_at": state.updated_at.isoformat() if state.updated_at else None,
        "completed_retention": state.completed_retention,
        "dead_retention": state.dead_retention,
    }


def _duration_or_default(seconds: float | None) -> str:
    """No retention of a queue's own means the workers' --completed-retention and
    --dead-retention apply, which the database does not know."""
    return "default" if seconds is None else show_duration(seconds)


@group.command("pause")
def queue_pause(
    name: QueueNameArg,
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Pause it even though it has no tasks and no settings yet (without this, "
            "such a name is refused: most often it is a typo).",
        ),
    ] = False,
) -> None:
    """Stop every worker from claiming this queue's tasks until it is resumed. Running tasks
    finish; submitting still works; it stays paused across restarts (`queue remove` forgets
    its settings)."""
    with connection() as conn:
        queue = ops.pause_queue(conn, name, create=create)
    emit(_queue_dict(queue), _queue_line(queue) + ": workers claim none of its tasks")


@group.command("resume")
def queue_resume(name: QueueNameArg) -> None:
    """Let workers claim this queue's tasks again (idle workers are woken at once)."""
    with connection() as conn:
        queue = ops.resume_queue(conn, name, missing_ok=False)
    emit(_queue_dict(queue), _queue_line(queue))


@group.command("remove")
def queue_remove(name: QueueNameArg) -> None:
    """Forget this queue's settings (paused, retention): a paused queue runs again, with the
    workers' retention. Its tasks are not touched."""
    with connection() as conn:
        removed = ops.remove_queue(conn, name)
    emit(
        {"name": name, "removed": removed},
        f"queue {name!r}: settings removed" if removed else f"queue {name!r} had no settings",
    )


@group.command("list")
def queue_list() -> None:
    """Queues with tasks (in any status) or a setting: paused or running, and their
    retention."""
    with connection() as conn:
        states = ops.list_queues(conn)
    human = (
        table(
            ["QUEUE", "STATE", "PAUSED SINCE", "KEEP FINISHED", "KEEP DEAD LETTERS"],
            [
                [
                    q.name,
                    "paused" if q.paused else "running",
                    q.paused_at,
                    _duration_or_default(q.completed_retention),
                    _duration_or_default(q.dead_retention),
                ]
                for q in states
            ],
        )
        if states
        else "no queues"
    )
    emit([_queue_dict(q) for q in states], human)


@group.command("retention")
def queue_retention(
    name: QueueNameArg,
    completed: Annotated[
        float | None,
        typer.Option(
            "--completed",
            parser=parse_duration,
            metavar="DURATION",
            help="Keep completed and cancelled tasks this long (e.g. 6h, 7d).",
        ),
    ] = None,
    dead: Annotated[
        float | None,
        typer.Option(
            "--dead",
            parser=parse_duration,
            metavar="DURATION",
            help="Keep dead letters this long (e.g. 30d).",
        ),
    ] = None,
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Set it even though the queue has no tasks and no settings yet (without "
            "this, such a name is refused: most often it is a typo).",
        ),
    ] = False,
) -> None:
    """Set how long this queue's finished tasks are kept, in place of the workers' defaults
    (--completed-retention, --dead-retention). Both are set at once: one left out goes back
    to the default. Pruning applies it from its next round on."""
    with connection() as conn:
        q = ops.set_queue_retention(conn, name, completed=completed, dead=dead, create=create)
    emit(
        _queue_dict(q),
        f"queue {q.name!r} keeps finished tasks {_duration_or_default(q.completed_retention)}"
        f" and dead letters {_duration_or_default(q.dead_retention)}",
    )
