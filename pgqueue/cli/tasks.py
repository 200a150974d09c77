"""One task at a time: submit it, look at it, list them, cancel it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import typer

from pgqueue.cli.arguments import Limit, QueueFilter, TaskIdArg, TypeFilter
from pgqueue.cli.database import connection, open_client
from pgqueue.cli.errors import UsageProblem
from pgqueue.cli.output import emit, error_lines, more_hint
from pgqueue.cli.parsing import parse_arguments, parse_count, parse_payload, parse_time
from pgqueue.config import DEFAULT_QUEUE
from pgqueue.errors import ValidationError, WaitTimeout
from pgqueue.formatting import MISSING, key_values, table, timestamp
from pgqueue.models import EnqueueResult, KeyReuse, Priority, Task, TaskStatus

commands = typer.Typer()

T = TypeVar("T")


def _json_text(value: Any, limit: int | None = None) -> str:
    """JSON cut at ``limit`` characters: a large payload would push the rest of a task's
    description off the screen."""
    text = json.dumps(value, ensure_ascii=False)
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters; --json shows all)"
    return text


def describe(task: Task) -> str:
    """A task for people: only the lines that mean something in its status (a run-at time
    while it waits, a lease while it runs)."""
    status = task.status.value
    if task.status is TaskStatus.RUNNING and task.cancel_requested:
        status += " (cancellation requested)"
    pairs: list[tuple[str, object]] = [
        ("id", str(task.id)),
        ("type", task.type),
        ("queue", task.queue),
        ("priority", priority_text(task)),
        ("status", status),
        ("attempts", f"{task.attempts}/{task.max_attempts}"),
    ]
    if task.idempotency_key is not None:
        pairs.append(("idempotency key", task.idempotency_key))
    if task.concurrency_key is not None:
        pairs.append(("concurrency key", task.concurrency_key))
    pairs += [
        ("payload", _json_text(task.payload, 1000)),
        ("result", MISSING if task.result is None else _json_text(task.result, 1000)),
        *([("progress", _json_text(task.progress, 1000))] if task.progress is not None else []),
        *error_lines(task),
        ("created", timestamp(task.created_at)),
    ]
    if task.status is TaskStatus.QUEUED:
        pairs.append(("run at", timestamp(task.visible_after)))
        if task.ready_since is not None and task.ready_since < task.visible_after:
            # Promoted or retried: its wait (the age stats report) began before its run time.
            pairs.append(("ready since", timestamp(task.ready_since)))
    if task.expires_at is not None:
        pairs.append(("expires", timestamp(task.expires_at)))
    if task.snoozes:
        pairs.append(("snoozes", str(task.snoozes)))
    pairs += [("started", timestamp(task.started_at)), ("finished", timestamp(task.finished_at))]
    if task.status is TaskStatus.RUNNING:
        pairs.append(
            ("lease", f"{task.lease_owner or '?'} until {timestamp(task.lease_expires_at)}")
        )
    return key_values(pairs)


def priority_text(task: Task) -> str:
    """The current priority, and the submitted one when the starvation policy promoted it:
    an operator must not mistake a promoted low task for one submitted high."""
    if task.submitted_priority is None or task.submitted_priority is task.priority:
        return task.priority.label
    return f"{task.priority.label} (submitted {task.submitted_priority.label})"


def task_table(tasks: Sequence[Task]) -> str:
    return table(
        ["ID", "TYPE", "QUEUE", "PRIORITY", "STATUS", "ATTEMPTS", "CREATED"],
        [
            [
                str(t.id),
                t.type,
                t.queue,
                priority_text(t),
                t.status.value,
                f"{t.attempts}/{t.max_attempts}",
                t.created_at,
            ]
            for t in tasks
        ],
    )


# The expiry options of enqueue.
ExpiresIn = Annotated[
    float | None,
    typer.Option(
        "--expires-in",
        metavar="SECONDS",
        help="Never run it if no attempt has started by then: it ends cancelled, reason 'expired'.",
    ),
]
ExpiresAt = Annotated[
    str | None,
    typer.Option(
        "--expires-at", metavar="ISO8601", help="As --expires-in, a time with a timezone."
    ),
]


ConcurrencyKey = Annotated[
    str | None,
    typer.Option(
        "--concurrency-key",
        metavar="KEY",
        help="The tenant (account, customer) it works for: workers take the keys of a queue "
        "in turns, and a limit's per-key maximum counts by it.",
    ),
]


KeyReuseOption = Annotated[
    str,
    typer.Option(
        "--key-reuse",
        metavar="[return|refuse]",
        help="When the key is already used: return the existing task whatever this "
        "submits (default), or refuse (exit 1, error idempotency_conflict) unless this "
        "has its type, queue and payload.",
    ),
]


@commands.command()
def enqueue(
    task_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="The task type (the name of its handler).")
    ],
    payload: Annotated[
        str | None,
        typer.Option("--payload", metavar="JSON", help="The task's arguments, a JSON object."),
    ] = None,
    args: Annotated[
        list[str] | None,
        typer.Option(
            "--arg",
            metavar="NAME=VALUE",
            help="One argument of a function task (repeatable): VALUE as JSON when it parses "
            'as JSON (42, true, null, [1,2], "42"), else as a string. Instead of --payload.',
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            metavar="[high|normal|low]",
            help="Priority (any case, as in the library and the HTTP API; default: the type's "
            "declaration, else normal).",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            help=f"The queue to put it on (default: the type's declaration, else {DEFAULT_QUEUE}).",
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Submit at most once per key: a repeat returns the existing task.",
        ),
    ] = None,
    key_reuse: KeyReuseOption = "return",
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
        typer.Option(
            "--max-attempts",
            metavar="N",
            help="Attempts before dead-lettering (default: the type's declaration, else 3).",
        ),
    ] = None,
    expires_in: ExpiresIn = None,
    expires_at: ExpiresAt = None,
    concurrency_key: ConcurrencyKey = None,
) -> None:
    """Submit a task: its payload as --payload JSON, or a function task's arguments as --arg."""
    if delay is not None and run_at is not None:
        raise UsageProblem("give --delay or --run-at, not both")
    if payload is not None and args:
        raise UsageProblem("give --payload or --arg, not both")
    data = parse_arguments(args) if args else parse_payload(payload or "{}")
    level = None if priority is None else _parsed(Priority.parse, priority, "--priority")
    reuse = _parsed(KeyReuse.parse, key_reuse, "--key-reuse")
    when = parse_time(run_at, "--run-at") if run_at is not None else None
    from pgqueue import operations as ops  # psycopg: not for `--help` and usage errors

    with connection() as conn:
        # A function task's arguments, checked against the parameters its workers recorded,
        # before anything is written (the library and the HTTP API give the same error).
        ops.check_arguments(conn, task_type, data)
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
            key_reuse=reuse,
            expires_in=expires_in,
            expires_at=parse_time(expires_at, "--expires-at") if expires_at is not None else None,
            concurrency_key=concurrency_key,
        )
    emit({**result.task.to_dict(), "created": result.created}, enqueued(result, idempotency_key))


def _parsed(parse: Callable[[str], T], value: str, option: str) -> T:
    """``parse(value)``, the library's refusal reported as a usage error of ``option``."""
    try:
        return parse(value)
    except ValidationError as exc:
        raise typer.BadParameter(exc.reason, param_hint=f"'{option}'") from None


def enqueued(result: EnqueueResult, idempotency_key: str | None) -> str:
    """What `pgqueue enqueue` tells people: the task's id, status and times."""
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
    return key_values(pairs)


@commands.command()
def status(
    task_id: TaskIdArg,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            help="Wait up to this long for the task to finish (completed, failed or cancelled) "
            "and show it then; if it has not, show it as it is and exit with code 3.",
        ),
    ] = None,
) -> None:
    """Show one task: status, attempts, result, last error and timestamps."""
    from pgqueue import operations as ops

    if wait is None:
        with connection() as conn:
            task = ops.get_task(conn, task_id)
        emit(task.to_dict(), describe(task))
        return
    try:
        seconds = ops.check_seconds("wait", wait)
    except ValidationError as exc:
        raise typer.BadParameter(exc.reason, param_hint="'--wait'") from None
    with open_client() as client:
        try:
            task = client.wait(task_id, timeout=seconds)
        except WaitTimeout as exc:
            # The task as it is on stdout; the timeout on stderr, with exit code 3 (cli/errors).
            emit(exc.task.to_dict(), describe(exc.task))
            raise
    emit(task.to_dict(), describe(task))


@commands.command("list")
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
    from pgqueue import operations as ops

    with connection() as conn:
        tasks = ops.list_tasks(conn, status=status, type=task_type, queue=queue, limit=limit)
    human = task_table(tasks) + more_hint(len(tasks), limit) if tasks else "no tasks"
    emit([t.to_dict() for t in tasks], human)


@commands.command()
def cancel(task_id: TaskIdArg) -> None:
    """Cancel a task: a queued one at once, a running one by asking its handler to stop."""
    from pgqueue import operations as ops

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
