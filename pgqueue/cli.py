"""The ``pgqueue`` command line: thin over the library, with tables for people and --json.

Each command parses its arguments, calls :mod:`pgqueue.operations` on a connection from a
:class:`~pgqueue.client.Client`, and formats the answer; there is no SQL here. Errors are one
line on stderr: usage errors (bad arguments, values the library rejects) exit with 2, every
other error with 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Annotated, Any, TextIO

import typer

from pgqueue import operations as ops
from pgqueue.client import Client
from pgqueue.config import DEFAULT_QUEUE, ENV_DATABASE_URL, redact, resolve_database_url
from pgqueue.errors import InvalidTaskState, PgQueueError, TaskNotFound, ValidationError
from pgqueue.formatting import MISSING, age, headline, key_values, table, timestamp
from pgqueue.models import Limit as LimitRow
from pgqueue.models import Priority, QueueState, Task, TaskStatus

app = typer.Typer(
    help="pgqueue: a job queue that lives in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
dlq_app = typer.Typer(
    help="The dead-letter queue: tasks whose attempts are spent (status 'failed').",
    no_args_is_help=True,
)
app.add_typer(dlq_app, name="dlq")
queue_app = typer.Typer(
    help="Queues: pause and resume claiming, across every worker (settings live in the database).",
    no_args_is_help=True,
)
app.add_typer(queue_app, name="queue")
limit_app = typer.Typer(
    help="Limits on a task type or a queue, across every worker: how many run at once and how "
    "many start per period.",
    no_args_is_help=True,
)
app.add_typer(limit_app, name="limit")


class State:
    database_url: str | None = None
    json: bool = False
    debug: bool = False

    def url(self) -> str:
        return resolve_database_url(self.database_url)


state = State()


class UsageProblem(typer.BadParameter):
    """A usage error about how options combine rather than one value (exit code 2)."""

    def format_message(self) -> str:
        return self.message


@app.callback()
def main_options(
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="PGQUEUE_DATABASE_URL",
            help="PostgreSQL URL (default: $PGQUEUE_DATABASE_URL, else the embedded server).",
            show_envvar=True,
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    state.database_url = database_url
    state.json = json_output
    state.debug = debug


def emit(data: Any, human: str) -> None:
    typer.echo(json.dumps(data, default=str) if state.json else human)


@contextlib.contextmanager
def open_client() -> Iterator[Client]:
    """A client on one pooled connection; each ``client.connection()`` block commits."""
    with Client(state.url(), max_connections=1) as client:
        yield client


@contextlib.contextmanager
def connection() -> Iterator[Any]:
    """One connection in one transaction, committed when the block ends."""
    with open_client() as client, client.connection() as conn:
        yield conn


# --- arguments ---------------------------------------------------------------------------------

TypeFilter = Annotated[str | None, typer.Option("--type", help="Only tasks of this type.")]
QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only tasks of this queue.")]
Limit = Annotated[
    int, typer.Option("--limit", min=1, max=ops.MAX_BATCH, help="Show at most this many.")
]
TaskIdArg = Annotated[str, typer.Argument(metavar="TASK_ID", help="The task's id.")]


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _reject_constant(name: str) -> Any:
    raise typer.BadParameter(f"{name} is not valid JSON", param_hint="'--payload'")


def parse_payload(text: str) -> dict[str, Any]:
    """The --payload option: a JSON object, or a usage error naming what is wrong and where."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
            f"(character {exc.pos + 1})",
            param_hint="'--payload'",
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise typer.BadParameter(f"not usable JSON: {exc}", param_hint="'--payload'") from None
    except RecursionError:
        raise typer.BadParameter("nests too deeply", param_hint="'--payload'") from None
    if value is None:  # null: no payload, as None is in the library and the HTTP API
        return {}
    if not isinstance(value, dict):
        raise typer.BadParameter(
            f"must be a JSON object such as '{{\"order_id\": 42}}', not {_json_kind(value)}",
            param_hint="'--payload'",
        )
    return value


def parse_count(text: str | None, option: str) -> int | None:
    """A whole number written as one (``2``, not ``2.0``: the library and the HTTP API refuse
    a float too); its range is the library's to check."""
    if text is None:
        return None
    if not re.fullmatch(r"\s*[+-]?\d+\s*", text):
        raise typer.BadParameter(f"{text!r} is not a whole number", param_hint=f"'{option}'")
    return int(text)


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 time that says its timezone (``Z`` or an offset)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time such as 2030-01-31T09:00:00+00:00",
            param_hint=f"'{option}'",
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise typer.BadParameter(
            f"{text!r} has no timezone; add one, e.g. {value.isoformat()}Z (UTC) or "
            f"{value.isoformat()}+02:00",
            param_hint=f"'{option}'",
        )
    return value


# --- formatting --------------------------------------------------------------------------------


def _json_text(value: Any, limit: int | None = None) -> str:
    text = json.dumps(value, ensure_ascii=False)
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters; --json shows all)"
    return text


def describe(task: Task) -> str:
    status = task.status.value
    if task.status is TaskStatus.RUNNING and task.cancel_requested:
        status += " (cancellation requested)"
    pairs: list[tuple[str, object]] = [
        ("id", str(task.id)),
        ("type", task.type),
        ("queue", task.queue),
        ("priority", task.priority.label),
        ("status", status),
        ("attempts", f"{task.attempts}/{task.max_attempts}"),
    ]
    if task.idempotency_key is not None:
        pairs.append(("idempotency key", task.idempotency_key))
    pairs += [
        ("payload", _json_text(task.payload, 1000)),
        ("result", MISSING if task.result is None else _json_text(task.result, 1000)),
        ("last error", task.last_error or MISSING),
        ("created", timestamp(task.created_at)),
    ]
    if task.status is TaskStatus.QUEUED:
        pairs.append(("run at", timestamp(task.visible_after)))
    pairs += [("started", timestamp(task.started_at)), ("finished", timestamp(task.finished_at))]
    if task.status is TaskStatus.RUNNING:
        pairs.append(
            ("lease", f"{task.lease_owner or '?'} until {timestamp(task.lease_expires_at)}")
        )
    return key_values(pairs)


def task_table(tasks: Sequence[Task]) -> str:
    return table(
        ["ID", "TYPE", "QUEUE", "PRIORITY", "STATUS", "ATTEMPTS", "CREATED"],
        [
            [
                str(t.id),
                t.type,
                t.queue,
                t.priority.label,
                t.status.value,
                f"{t.attempts}/{t.max_attempts}",
                t.created_at,
            ]
            for t in tasks
        ],
    )


def _more_hint(shown: int, limit: int) -> str:
    return f"\n(the newest {limit} shown; raise --limit to see more)" if shown == limit else ""


# --- producing and inspecting ------------------------------------------------------------------


@app.command()
def enqueue(
    task_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="The task type (the name of its handler).")
    ],
    payload: Annotated[
        str,
        typer.Option("--payload", metavar="JSON", help="The task's arguments, a JSON object."),
    ] = "{}",
    priority: Annotated[
        str,
        typer.Option(
            "--priority",
            metavar="[high|normal|low]",
            help="Priority (any case, as in the library and the HTTP API).",
        ),
    ] = "normal",
    queue: Annotated[str, typer.Option("--queue", help="The queue to put it on.")] = DEFAULT_QUEUE,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Submit at most once per key: a repeat returns the existing task.",
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option("--delay", min=0.0, metavar="SECONDS", help="Run no sooner than this."),
    ] = None,
    run_at: Annotated[
        str | None,
        typer.Option(
            "--run-at",
            metavar="ISO8601",
            help="Run no sooner than this time, with a timezone: 2030-01-31T09:00:00Z.",
        ),
    ] = None,
    max_attempts: Annotated[
        str | None,
        typer.Option("--max-attempts", metavar="N", help="Attempts before dead-lettering (3)."),
    ] = None,
) -> None:
    """Submit a task."""
    if delay is not None and run_at is not None:
        raise UsageProblem("give --delay or --run-at, not both")
    data = parse_payload(payload)
    try:
        level = Priority.parse(priority)
    except ValidationError as exc:
        raise typer.BadParameter(exc.reason, param_hint="'--priority'") from None
    when = parse_time(run_at, "--run-at") if run_at is not None else None
    with connection() as conn:
        result = ops.enqueue(
            conn,
            task_type,
            data,
            priority=level,
            queue=queue,
            idempotency_key=idempotency_key,
            run_at=when,
            delay=delay,
            max_attempts=parse_count(max_attempts, "--max-attempts"),
        )
    task = result.task
    pairs: list[tuple[str, object]] = [
        ("id", str(task.id)),
        ("status", task.status.value),
        ("created", timestamp(task.created_at)),
    ]
    if task.status is TaskStatus.QUEUED and task.visible_after > task.created_at:
        pairs.append(("run at", timestamp(task.visible_after)))
    if not result.created:
        pairs.append(
            (
                "note",
                f"existing task returned: idempotency key {idempotency_key!r} was already used",
            )
        )
    emit({**task.to_dict(), "created": result.created}, key_values(pairs))


@app.command()
def status(task_id: TaskIdArg) -> None:
    """Show one task: status, attempts, result, last error and timestamps."""
    with connection() as conn:
        task = ops.get_task(conn, task_id)
    emit(task.to_dict(), describe(task))


@app.command("list")
def list_tasks(
    status: Annotated[
        TaskStatus | None,
        typer.Option("--status", case_sensitive=False, help="Only tasks in this status."),
    ] = None,
    task_type: TypeFilter = None,
    queue: QueueFilter = None,
    limit: Limit = 50,
) -> None:
    """List tasks, newest first."""
    with connection() as conn:
        tasks = ops.list_tasks(conn, status=status, type=task_type, queue=queue, limit=limit)
    human = task_table(tasks) + _more_hint(len(tasks), limit) if tasks else "no tasks"
    emit([t.to_dict() for t in tasks], human)


@app.command()
def cancel(task_id: TaskIdArg) -> None:
    """Cancel a task: a queued one at once, a running one by asking its handler to stop."""
    with connection() as conn:
        task = ops.cancel(conn, task_id)
    if task.status is TaskStatus.CANCELLED:
        human = f"cancelled task {task.id}"
    else:
        human = (
            f"cancellation requested for running task {task.id}: its handler is asked to stop "
            "(cooperative); if it finishes first, its outcome stands"
        )
    emit(task.to_dict(), human)


@app.command()
def stats(
    window: Annotated[
        float,
        typer.Option(
            "--window", min=1.0, metavar="SECONDS", help="Throughput over the last SECONDS."
        ),
    ] = 60.0,
) -> None:
    """Waiting, running and dead-lettered tasks by queue and priority, the oldest ready task's
    age, and tasks finished in the last minute (completed ones are counted there: counting all
    that are kept would read the whole table; SELECT * FROM pgqueue.queue_depth does)."""
    with connection() as conn:
        depth = ops.overview(conn)
        finished = ops.throughput(conn, window_seconds=window)
        paused = sorted(q.name for q in ops.list_queues(conn) if q.paused)
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
    if paused:  # a growing backlog there is expected: say why before anyone wonders
        parts += ["", "paused (no worker claims from them): " + ", ".join(paused)]
    emit(
        {
            "depth": [dataclasses.asdict(s) for s in depth],
            "throughput": [dataclasses.asdict(t) for t in finished],
            "window_seconds": window,
            "paused_queues": paused,
        },
        "\n".join(parts),
    )


# --- the dead-letter queue ---------------------------------------------------------------------


QueueNameArg = Annotated[str, typer.Argument(metavar="QUEUE", help="The queue's name.")]


def _queue_line(state: QueueState) -> str:
    if state.paused:
        return f"queue {state.name!r} is paused (since {timestamp(state.paused_at)})"
    return f"queue {state.name!r} is running"


@queue_app.command("pause")
def queue_pause(name: QueueNameArg) -> None:
    """Stop every worker from claiming this queue's tasks until it is resumed. Running tasks
    finish; submitting still works; it stays paused across restarts."""
    with connection() as conn:
        state = ops.pause_queue(conn, name)
    emit(_queue_dict(state), _queue_line(state) + ": workers claim none of its tasks")


@queue_app.command("resume")
def queue_resume(name: QueueNameArg) -> None:
    """Let workers claim this queue's tasks again (idle workers are woken at once)."""
    with connection() as conn:
        state = ops.resume_queue(conn, name)
    emit(_queue_dict(state), _queue_line(state))


SCHEDULE_COLUMNS = ("name", "cron", "timezone", "type", "queue", "last_tick", "next_tick")


@app.command()
def schedules() -> None:
    """Periodic tasks the workers declared: cron, time zone, last tick and next run."""
    with connection() as conn:
        rows = ops.list_schedules(conn)
    human = (
        table(
            ["NAME", "CRON", "TIME ZONE", "TYPE", "QUEUE", "LAST TICK", "NEXT RUN"],
            [[r[k] for k in SCHEDULE_COLUMNS] for r in rows],
        )
        if rows
        else "no schedules (workers record theirs when they start)"
    )
    emit(rows, human)


@queue_app.command("list")
def queue_list() -> None:
    """Queues with unfinished tasks or a setting: paused or running, and their retention."""
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


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float) -> float:
    """Seconds, or a number with a unit: 90s, 15m, 24h, 14d."""
    if isinstance(text, int | float):  # an option's default
        return float(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give seconds or e.g. 90s, 15m, 24h, 14d"
        )
    return float(match[1]) * DURATION_UNITS[match[2] or "s"]


def show_duration(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= DURATION_UNITS[unit] and seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds / DURATION_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def _duration_or_default(seconds: float | None) -> str:
    return "default" if seconds is None else show_duration(seconds)


@queue_app.command("retention")
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
) -> None:
    """Set how long this queue's finished tasks are kept, in place of the workers' defaults
    (--completed-retention, --dead-retention). Both are set at once: one left out goes back
    to the default. Pruning applies it from its next round on."""
    with connection() as conn:
        q = ops.set_queue_retention(conn, name, completed=completed, dead=dead)
    emit(
        _queue_dict(q),
        f"queue {q.name!r} keeps finished tasks {_duration_or_default(q.completed_retention)}"
        f" and dead letters {_duration_or_default(q.dead_retention)}",
    )


def _queue_dict(state: QueueState) -> dict[str, object]:
    return {
        "name": state.name,
        "paused": state.paused,
        "paused_at": state.paused_at.isoformat() if state.paused_at else None,
        "updated_at": state.updated_at.isoformat() if state.updated_at else None,
        "completed_retention": state.completed_retention,
        "dead_retention": state.dead_retention,
    }


# --- limits ------------------------------------------------------------------------------------

LimitType = Annotated[str | None, typer.Option("--type", help="Limit the tasks of this type.")]
LimitQueue = Annotated[str | None, typer.Option("--queue", help="Limit the tasks of this queue.")]


def _limit_dict(limit: LimitRow) -> dict[str, object]:
    return {
        "kind": limit.kind.value,
        "name": limit.name,
        "max_running": limit.max_running,
        "rate": limit.rate_limit,
        "per": limit.rate_period,
        "running": limit.running,
        "recent_starts": limit.recent_starts,
        "updated_at": limit.updated_at.isoformat() if limit.updated_at else None,
    }


def _rate_text(limit: LimitRow) -> str:
    if limit.rate_limit is None or limit.rate_period is None:
        return MISSING
    return f"{limit.rate_limit} per {show_duration(limit.rate_period)}"


@limit_app.command("set")
def limit_set(
    task_type: LimitType = None,
    queue: LimitQueue = None,
    max_running: Annotated[
        int | None,
        typer.Option(min=0, help="At most this many running at once, across every worker."),
    ] = None,
    rate: Annotated[
        int | None,
        typer.Option(min=0, max=ops.MAX_RATE, help="At most this many starts per --per."),
    ] = None,
    per: Annotated[
        float,
        typer.Option(
            parser=parse_duration, metavar="DURATION", help="The rate's window (e.g. 1s, 1m)."
        ),
    ] = 1.0,
) -> None:
    """Limit a task type (--type) or a queue (--queue) across the whole fleet, in the
    database. The limit is set as a whole: a part left out is no limit of that kind."""
    with connection() as conn:
        limit = ops.set_limit(
            conn, type=task_type, queue=queue, max_running=max_running, rate=rate, per=per
        )
    parts = []
    if limit.max_running is not None:
        parts.append(f"at most {limit.max_running} running at once")
    if limit.rate_limit is not None:
        parts.append(f"at most {_rate_text(limit)} started")
    emit(_limit_dict(limit), f"{limit.kind.value} {limit.name!r}: " + ", ".join(parts))


@limit_app.command("clear")
def limit_clear(task_type: LimitType = None, queue: LimitQueue = None) -> None:
    """Remove the limit on a task type or a queue."""
    with connection() as conn:
        removed = ops.clear_limit(conn, type=task_type, queue=queue)
    kind, name = ("type", task_type) if task_type is not None else ("queue", queue)
    emit(
        {"kind": kind, "name": name, "removed": removed},
        f"{kind} {name!r}: limit removed" if removed else f"{kind} {name!r} had no limit",
    )


@limit_app.command("list")
def limit_list() -> None:
    """Every limit, with the tasks running under it and its starts in the rate window."""
    with connection() as conn:
        limits = ops.list_limits(conn)
    human = (
        table(
            ["KIND", "NAME", "MAX RUNNING", "RUNNING", "RATE", "STARTS IN WINDOW"],
            [
                [
                    x.kind.value,
                    x.name,
                    MISSING if x.max_running is None else x.max_running,
                    x.running,
                    _rate_text(x),
                    MISSING if x.rate_limit is None else x.recent_starts,
                ]
                for x in limits
            ],
        )
        if limits
        else "no limits"
    )
    emit([_limit_dict(x) for x in limits], human)


@dlq_app.command("list")
def dlq_list(task_type: TypeFilter = None, queue: QueueFilter = None, limit: Limit = 50) -> None:
    """List dead letters, newest first."""
    with connection() as conn:
        tasks = ops.list_tasks(
            conn, status=TaskStatus.FAILED, type=task_type, queue=queue, limit=limit
        )
    human = (
        table(
            ["ID", "TYPE", "QUEUE", "ATTEMPTS", "FINISHED", "LAST ERROR"],
            [
                [
                    str(t.id),
                    t.type,
                    t.queue,
                    f"{t.attempts}/{t.max_attempts}",
                    t.finished_at,
                    headline(t.last_error, 60) if t.last_error else MISSING,
                ]
                for t in tasks
            ],
        )
        + _more_hint(len(tasks), limit)
        if tasks
        else "no dead letters"
    )
    emit([t.to_dict() for t in tasks], human)


@dlq_app.command("show")
def dlq_show(task_id: TaskIdArg) -> None:
    """Show a dead letter in full: payload, last error, attempts."""
    with connection() as conn:
        task = ops.get_task(conn, task_id)
    if task.status is not TaskStatus.FAILED:
        raise InvalidTaskState(
            task.id, task.status.value, f"not a dead letter; `pgqueue status {task.id}` shows it"
        )
    pairs: list[tuple[str, object]] = [
        ("id", str(task.id)),
        ("type", task.type),
        ("queue", task.queue),
        ("priority", task.priority.label),
        ("attempts", f"{task.attempts}/{task.max_attempts}"),
        ("created", timestamp(task.created_at)),
        ("failed", timestamp(task.finished_at)),
    ]
    if task.idempotency_key is not None:
        pairs.append(("idempotency key", task.idempotency_key))
    pairs += [
        ("payload", json.dumps(task.payload, indent=2, ensure_ascii=False)),
        ("last error", task.last_error or MISSING),
    ]
    emit(task.to_dict(), key_values(pairs))


IdsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="[ID]...", help="Dead letters by id.", show_default=False),
]
AllFlag = Annotated[bool, typer.Option("--all", help="Every dead letter.")]
BatchSize = Annotated[
    int,
    typer.Option("--batch-size", min=1, max=ops.MAX_BATCH, help="Tasks per transaction."),
]


def _check_selection(ids: Sequence[str], everything: bool, filtered: bool, verb: str) -> None:
    if ids and (everything or filtered):
        raise UsageProblem(f"give task ids or --all/--type/--queue to {verb}, not both")
    if everything and filtered:
        raise UsageProblem(f"--all {verb}s every dead letter; leave it out to filter")
    if not (ids or everything or filtered):
        raise UsageProblem(
            f"say which dead letters to {verb}: task ids, --all, or --type TYPE [--queue QUEUE]"
        )


def _is_terminal(stream: TextIO) -> bool:
    return stream.isatty()


@contextlib.contextmanager
def _progress(total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (and not --json); yields ``advance(n)``."""
    if state.json or not _is_terminal(sys.stderr):
        yield lambda n: None
        return
    if total is None:  # unknown length: a bar that moves, with the count so far
        bar = typer.progressbar(itertools.repeat(0), label=label, show_pos=True, file=sys.stderr)
    else:
        bar = typer.progressbar(length=total, label=label, show_pos=True, file=sys.stderr)
    with bar:
        yield bar.update


def _dead_letter_count(client: Client, queue: str | None) -> int:
    with client.connection() as conn:
        depth = ops.overview(conn)
    return sum(s.tasks for s in depth if s.status == TaskStatus.FAILED and queue in (None, s.queue))


def _in_batches(
    client: Client,
    action: Callable[..., list[uuid.UUID]],
    ids: Sequence[uuid.UUID] | None,
    task_type: str | None,
    queue: str | None,
    batch_size: int,
    advance: Callable[[int], None],
) -> list[uuid.UUID]:
    """Call ``action`` (ops.replay or ops.discard) one transaction per batch until done."""
    done: dict[uuid.UUID, None] = {}
    if ids is not None:
        for start in range(0, len(ids), ops.MAX_BATCH):
            chunk = ids[start : start + ops.MAX_BATCH]
            with client.connection() as conn:
                batch = action(conn, chunk, limit=len(chunk))
            done.update(dict.fromkeys(batch))
            advance(len(chunk))
        return list(done)
    while True:
        with client.connection() as conn:
            batch = action(conn, type=task_type, queue=queue, limit=batch_size)
        if not batch:
            break
        # A replayed task that fails for good again while we work comes back in a later batch;
        # stop there, or a fast-failing queue would keep this loop going forever.
        wrapped = any(task_id in done for task_id in batch)
        fresh = [task_id for task_id in batch if task_id not in done]
        done.update(dict.fromkeys(fresh))
        advance(len(fresh))
        if wrapped:
            break
    return list(done)


def _missing(client: Client, wanted: Sequence[uuid.UUID], done: Sequence[uuid.UUID]) -> list[str]:
    """Why each of ``wanted`` is not in ``done``: its status, or that it does not exist."""
    seen = set(done)
    out = []
    with client.connection() as conn:
        for task_id in wanted:
            if task_id in seen:
                continue
            try:
                out.append(f"{task_id} (status {ops.get_task(conn, task_id).status.value!r})")
            except TaskNotFound:
                out.append(f"{task_id} (no such task)")
    return out


def _dead_letter_action(
    verb: str,
    past: str,
    action: Callable[..., list[uuid.UUID]],
    client: Client,
    task_ids: Sequence[str],
    task_type: str | None,
    queue: str | None,
    batch_size: int,
    total: int | None,
) -> None:
    ids = list(dict.fromkeys(ops.parse_task_id(i) for i in task_ids)) if task_ids else None
    if ids is not None:
        total = len(ids)
    with _progress(total, f"{verb}ing dead letters") as advance:
        done = _in_batches(client, action, ids, task_type, queue, batch_size, advance)
    missing = _missing(client, ids, done) if ids is not None else []
    data: dict[str, Any] = {past: len(done), "ids": [str(i) for i in done]}
    if missing:
        data["not_" + past] = missing
    noun = "dead letter" if len(done) == 1 else "dead letters"
    emit(data, f"{past} {len(done)} {noun}")
    if missing:
        raise PgQueueError(
            f"{len(missing)} of {len(ids or [])} tasks were not {past} (not dead letters): "
            + ", ".join(missing)
        )


@dlq_app.command("replay")
def dlq_replay(
    task_ids: IdsArg = None,
    everything: AllFlag = False,
    task_type: TypeFilter = None,
    queue: QueueFilter = None,
    batch_size: BatchSize = 1000,
) -> None:
    """Move dead letters back to queued with fresh attempts: by id, --all, or --type/--queue."""
    filtered = task_type is not None or queue is not None
    _check_selection(task_ids or [], everything, filtered, "replay")
    with open_client() as client:
        total = None
        if not task_ids and task_type is None and not state.json and _is_terminal(sys.stderr):
            total = _dead_letter_count(client, queue)
        _dead_letter_action(
            "replay",
            "replayed",
            ops.replay,
            client,
            task_ids or [],
            task_type,
            queue,
            batch_size,
            total,
        )


def _confirm(question: str) -> bool:
    """Ask on stderr (stdout stays clean for --json); end the line when stdin is not a
    terminal, since the answer read from it is not echoed."""
    try:
        return typer.confirm(question, err=True)
    finally:
        if not _is_terminal(sys.stdin):
            typer.echo("", err=True)


@dlq_app.command("discard")
def dlq_discard(
    task_ids: IdsArg = None,
    everything: AllFlag = False,
    task_type: TypeFilter = None,
    queue: QueueFilter = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    batch_size: BatchSize = 1000,
) -> None:
    """Delete dead letters for good: by id, --all, or --type/--queue. Asks first unless --yes."""
    filtered = task_type is not None or queue is not None
    _check_selection(task_ids or [], everything, filtered, "discard")
    with open_client() as client:
        total = None
        if not task_ids and task_type is None:
            total = _dead_letter_count(client, queue)
        if not yes and total != 0:
            if task_ids:
                what = f"{len(set(task_ids))} dead letter(s)"
            elif total is not None:
                what = f"all {total} dead letter(s)" + (f" of queue {queue!r}" if queue else "")
            else:
                what = f"every dead letter of type {task_type!r}" + (
                    f" in queue {queue!r}" if queue else ""
                )
            if not _confirm(f"Permanently delete {what}?"):
                typer.echo("aborted: nothing was discarded", err=True)
                raise typer.Exit(1)
        _dead_letter_action(
            "discard",
            "discarded",
            ops.discard,
            client,
            task_ids or [],
            task_type,
            queue,
            batch_size,
            total,
        )


# --- schema ------------------------------------------------------------------------------------


@app.command()
def migrate(
    check: Annotated[
        bool, typer.Option("--check", help="Only report; exit 1 if the schema is behind.")
    ] = False,
) -> None:
    """Create or upgrade the pgqueue schema (idempotent)."""
    from pgqueue import migrate as migrate_mod  # alembic is slow to import: only here

    url = state.url()
    before = migrate_mod.current(url)
    head = migrate_mod.head()
    if check:
        ok = before == head
        emit(
            {"current": before, "head": head, "up_to_date": ok},
            f"schema at {before or 'nothing'}; head is {head}: "
            + ("up to date" if ok else "behind, run `pgqueue migrate`"),
        )
        raise typer.Exit(0 if ok else 1)
    if before is not None and not migrate_mod.known(before):
        raise migrate_mod.unknown_revision(before)  # alembic would fail with a traceback
    migrate_mod.upgrade(url)
    emit(
        {"previous": before, "current": head, "database": redact(url)},
        f"pgqueue schema at {head} (was {before or 'not installed'}) on {redact(url)}",
    )


@app.command()
def grant(
    role: Annotated[
        str,
        typer.Argument(
            metavar="ROLE", help="The role workers and the API log in as (it must exist)."
        ),
    ],
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="The schema owner's URL (default: the global --database-url, else "
            "$PGQUEUE_DATABASE_URL).",
        ),
    ] = None,
    print_only: Annotated[
        bool,
        typer.Option("--print", help="Print the SQL for ROLE instead of running it (offline)."),
    ] = False,
) -> None:
    """Grant ROLE what workers and the HTTP API need, and no DDL (run as the schema's owner)."""
    from pgqueue import roles

    if print_only:
        script = roles.grant_script(role)
        statements = [s.as_string(None) for s in roles.grant_statements(role)]
        emit({"role": role, "statements": statements}, script)
        return
    from pgqueue import db
    from pgqueue import migrate as migrate_mod

    roles.check_role_name(role)  # a usage error before any connection
    url = resolve_database_url(database_url) if database_url is not None else state.url()
    migrate_mod.check(url)
    with db.connect(url, autocommit=True) as conn:
        granted = roles.grant(conn, role)
    human = (
        f"granted role {role!r} what workers and the API need ({len(granted.statements)} "
        f"statements) on {redact(url)}"
    )
    if not granted.maintain:
        human += (
            f"\nnote: PostgreSQL {granted.server_version // 10000} has no MAINTAIN privilege, so "
            f"workers running as {role!r} cannot ANALYZE pgqueue.tasks: they say so once "
            "(maintenance.analyze_not_permitted) and autovacuum keeps its statistics"
        )
    emit(
        {
            "role": role,
            "database": redact(url),
            "statements": granted.statements,
            "server_version": granted.server_version,
            "maintain": granted.maintain,
        },
        human,
    )


# --- worker and demo ---------------------------------------------------------------------------


@app.command()
def worker(
    registry: Annotated[
        str,
        typer.Argument(
            help="Your handlers: MODULE:ATTRIBUTE naming a pgqueue.TaskRegistry "
            "(e.g. app.tasks:tasks)."
        ),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Queue to work on (repeatable; default: default)."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Tasks run at once per process.")
    ] = 10,
    processes: Annotated[
        int, typer.Option("--processes", "-p", min=1, help="Worker processes to run and supervise.")
    ] = 1,
    lease_seconds: Annotated[
        float, typer.Option(min=1, help="Visibility timeout; renewed by heartbeat while running.")
    ] = 30.0,
    grace_period: Annotated[
        float, typer.Option(min=0, help="On SIGTERM, seconds to let running tasks finish.")
    ] = 30.0,
    poll_interval: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="Seconds between polls when no NOTIFY arrives: a scheduled task starts "
            "within about this long of its time.",
        ),
    ] = 0.5,
    maintenance: Annotated[
        bool, typer.Option(help="Run the lease sweep and retention pruning in this worker.")
    ] = True,
    sweep_interval: Annotated[float, typer.Option(min=0.05, help="Seconds between sweeps.")] = 5.0,
    prune_interval: Annotated[
        float, typer.Option(min=0.05, help="Seconds between retention pruning rounds.")
    ] = 60.0,
    startup_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds a starting worker waits for a database that is down or starting up.",
        ),
    ] = 60.0,
    completed_retention: Annotated[
        float,
        typer.Option(
            min=1,
            help="Seconds to keep completed and cancelled tasks (a queue's own retention, "
            "`pgqueue queue retention`, wins).",
        ),
    ] = 24 * 3600.0,
    dead_retention: Annotated[
        float,
        typer.Option(min=1, help="Seconds to keep dead letters (a queue's own retention wins)."),
    ] = 14 * 24 * 3600.0,
    promote_after: Annotated[
        float,
        typer.Option(
            min=0,
            help="Starvation policy: a task waiting this long moves up one priority (0: never).",
        ),
    ] = 300.0,
    scheduler: Annotated[
        bool,
        typer.Option(help="Enqueue the registry's periodic tasks (once per tick, fleet-wide)."),
    ] = True,
    log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Serve Prometheus /metrics and a liveness /healthz on this port (needs "
            "prometheus-client: the api extra). With --processes N, process i gets PORT+i.",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            help="Address for --metrics-port. 0.0.0.0 (every IPv4 interface) lets Prometheus "
            "and the kubelet reach a pod on its IP; there is no authentication, so use "
            "127.0.0.1 where the port must stay local.",
        ),
    ] = "0.0.0.0",
) -> None:
    """Run handlers for queued tasks until SIGTERM/SIGINT (a second signal, a second or more
    later, stops at once)."""
    from pgqueue import log
    from pgqueue.maintenance import MaintenanceConfig
    from pgqueue.registry import load
    from pgqueue.supervisor import Supervisor
    from pgqueue.worker import Worker, WorkerConfig

    log.configure(log_format, log_level)
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        raise typer.BadParameter(
            f"{processes} processes need ports {metrics_port} to {metrics_port + processes - 1}, "
            "past 65535",
            param_hint="'--metrics-port'",
        )
    queues = queue or [DEFAULT_QUEUE]
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory's modules are importable
    url = state.url()
    tasks = load(registry)  # fail fast, in the parent too, on a bad MODULE:ATTRIBUTE
    if processes > 1:
        # The URL goes to the children in their environment, not their argv: any local user
        # can read a command line (ps), and the URL may hold a password.
        argv = [sys.executable, "-m", "pgqueue", "worker", registry, "--processes", "1"]
        for name, value in (
            ("--concurrency", concurrency),
            ("--lease-seconds", lease_seconds),
            ("--grace-period", grace_period),
            ("--poll-interval", poll_interval),
            ("--sweep-interval", sweep_interval),
            ("--prune-interval", prune_interval),
            ("--startup-timeout", startup_timeout),
            ("--completed-retention", completed_retention),
            ("--dead-retention", dead_retention),
            ("--promote-after", promote_after),
            ("--log-format", log_format),
            ("--log-level", log_level),
        ):
            argv += [name, str(value)]
        for q in queues:
            argv += ["--queue", q]
        if not maintenance:
            argv.append("--no-maintenance")
        if not scheduler:
            argv.append("--no-scheduler")
        env = {**os.environ, ENV_DATABASE_URL: url}
        if metrics_port is None:
            raise typer.Exit(Supervisor(argv, processes, env=env).run())
        argv += ["--metrics-host", metrics_host]
        first_port = metrics_port

        def port_of(slot: int) -> list[str]:  # child i on PORT+i, a replacement on the same
            return ["--metrics-port", str(first_port + slot)]

        raise typer.Exit(Supervisor(argv, processes, env=env, slot_args=port_of).run())
    config = WorkerConfig(
        queues=queues,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        poll_interval=poll_interval,
        grace_period=grace_period,
        startup_timeout=startup_timeout,
        scheduler=scheduler,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        maintenance=MaintenanceConfig(
            enabled=maintenance,
            sweep_interval=sweep_interval,
            prune_interval=prune_interval,
            completed_retention=completed_retention,
            dead_retention=dead_retention,
            promote_after=promote_after,
        ),
    )
    Worker(tasks, url, config).run()


@app.command()
def bench(
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to enqueue in bulk and drain.")] = 10_000,
    single: Annotated[
        int, typer.Option(min=1, help="Tasks to enqueue one per transaction.")
    ] = 1_000,
    latency_samples: Annotated[
        int, typer.Option(min=2, help="Tasks sent 20 ms apart to an idle worker.")
    ] = 200,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes for the drain.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks at once per process.")] = 100,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 300,
) -> None:
    """Measure enqueue, drain and pickup latency on this database (in a queue of its own)."""
    from pgqueue import bench as benchmark

    config = benchmark.BenchConfig(
        tasks=tasks,
        single=single,
        latency_samples=latency_samples,
        processes=processes,
        concurrency=concurrency,
        timeout=timeout,
    )
    result = benchmark.run(state.url(), config, progress=lambda line: typer.echo(line, err=True))
    rows = [
        ("bulk enqueue (enqueue_many, 1,000 a call)", f"{result.bulk_enqueue_per_s:,.0f} tasks/s"),
        ("single enqueue (one per transaction)", f"{result.single_enqueue_per_s:,.0f} tasks/s"),
        (
            f"drain ({processes} process(es) x {concurrency}, no-op handler)",
            f"{result.drain_per_s:,.0f} tasks/s",
        ),
        (
            "pickup latency p50 / p90 / p99 / max",
            (
                f"{result.latency_ms_p50:.1f} / {result.latency_ms_p90:.1f} / "
                f"{result.latency_ms_p99:.1f} / {result.latency_ms_max:.1f} ms"
            ),
        ),
        ("tasks that ran more than once", str(result.ran_more_than_once)),
    ]
    emit(dataclasses.asdict(result), table(["measurement", "result"], rows))


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 1,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Listen on a non-loopback address without API tokens (not recommended).",
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Serve the HTTP API (tokens: PGQUEUE_API_TOKENS or PGQUEUE_API_TOKENS_FILE)."""
    import os

    try:
        import uvicorn

        from pgqueue.api import ApiSettings
    except ImportError as exc:
        raise PgQueueError(
            f"the HTTP API needs its extra dependencies ({exc.name} is missing): "
            "pip install 'pgqueue[api]'"
        ) from None
    settings = ApiSettings.from_env()
    if not settings.tokens and not _is_loopback(host) and not allow_unauthenticated:
        raise UsageProblem(
            f"refusing to listen on {host} without authentication: set PGQUEUE_API_TOKENS "
            "(or PGQUEUE_API_TOKENS_FILE), listen on 127.0.0.1, or pass --allow-unauthenticated"
        )
    # Resolve once here (starting the embedded server if needed) and hand the URL to every
    # server process through the environment, where the app factory reads it.
    os.environ["PGQUEUE_DATABASE_URL"] = state.url()
    uvicorn.run(
        "pgqueue.api:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        proxy_headers=False,
    )


embedded_app = typer.Typer(
    help="The embedded PostgreSQL used when no database URL is configured.",
    no_args_is_help=True,
)
app.add_typer(embedded_app, name="embedded")


@embedded_app.command("url")
def embedded_url() -> None:
    """Start the embedded server if needed and print its URL (for psql and other tools)."""
    from pgqueue import embedded

    url = embedded.database_url()
    emit({"url": url, "data_dir": str(embedded.data_dir())}, url)


@embedded_app.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (its data stays; the next command starts it again)."""
    from pgqueue import embedded

    stopped = embedded.stop()
    emit({"stopped": stopped}, "stopped" if stopped else "the embedded server was not running")


@app.command()
def demo() -> None:
    """See pgqueue work: migrate, enqueue a mix of tasks, run a worker, summarise."""
    from pgqueue.demo import run_demo

    def say(line: str) -> None:
        if not state.json:
            typer.echo(line)

    summary = run_demo(state.database_url, say, as_json=state.json)
    if state.json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"\n{summary['tasks']} tasks in {summary['seconds']} s: "
        f"{summary['completed']} completed ({summary['completed_after_retry']} after a retry), "
        f"{summary['dead_lettered']} dead-lettered"
    )
    for error in summary["dead_letter_errors"]:
        typer.echo(f"  dead-letter error: {error}")
    typer.echo("\nLook for yourself (psql, or `pgqueue stats` / `pgqueue dlq list`):")
    for sql in summary["sql"]:
        typer.echo(f"  {sql}")


# --- entry point -------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(message: str, code: int) -> None:
    typer.secho(f"error: {_one_line(message)}", fg=typer.colors.RED, err=True)
    sys.exit(code)


def main() -> None:
    """Entry point: one readable line per error, a traceback only with --debug."""
    # psycopg's pool warns through logging ("discarding closed connection") before the error
    # reaches us; with no handler configured, logging would print it as a second line. The
    # worker configures real handlers, which still get these records.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    try:
        # Not standalone: usage errors come back here instead of typer's multi-line boxes.
        code = app(prog_name="pgqueue", standalone_mode=False)
    except typer.TyperException as exc:  # usage errors (exit code 2)
        exit_code = getattr(exc, "exit_code", 2)
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help has been printed
            sys.exit(exit_code)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        # typer validates some values with pydantic, whose messages start "Value error, ".
        message = exc.format_message().replace("Value error, ", "")
        _fail(message + hint, exit_code)
    except ValidationError as exc:  # a value the library refused is a usage error too
        if state.debug:
            raise
        _fail(str(exc), 2)
    except PgQueueError as exc:
        if state.debug:
            raise
        _fail(str(exc), 1)
    except typer.Abort:
        _fail("aborted", 1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if state.debug:
            raise
        _fail(f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", 1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
