"""``pgqueue dlq``: the dead-letter queue, tasks whose attempts are spent (status 'failed').

Replaying or discarding may touch any number of dead letters, so it works in batches, one
transaction each (a failure part-way keeps what was done), with a progress bar for a person
watching; a selection by id reports every id that was not a dead letter.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, TextIO

import typer

from pgqueue import cli
from pgqueue import operations as ops
from pgqueue.cli.arguments import Limit, QueueFilter, TaskIdArg, TypeFilter, task_ids
from pgqueue.cli.database import connection, open_client
from pgqueue.cli.errors import Declined, UsageProblem
from pgqueue.cli.output import emit, error_lines, more_hint
from pgqueue.cli.state import state
from pgqueue.client import Client
from pgqueue.errors import InvalidTaskState, PgQueueError, TaskNotFound
from pgqueue.formatting import MISSING, headline, key_values, table, timestamp
from pgqueue.models import TaskStatus

group = typer.Typer(
    help="The dead-letter queue: tasks whose attempts are spent (status 'failed').",
    no_args_is_help=True,
)

IdsArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[ID]...", help="Dead letters by id.", show_default=False, callback=task_ids
    ),
]
AllFlag = Annotated[bool, typer.Option("--all", help="Every dead letter.")]
BatchSize = Annotated[
    int,
    typer.Option("--batch-size", min=1, max=ops.MAX_BATCH, help="Tasks per transaction."),
]


@group.command("list")
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
        + more_hint(len(tasks), limit)
        if tasks
        else "no dead letters"
    )
    emit([t.to_dict() for t in tasks], human)


@group.command("show")
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
        *error_lines(task),
    ]
    emit(task.to_dict(), key_values(pairs))


def _check_selection(ids: Sequence[str], everything: bool, filtered: bool, verb: str) -> None:
    """Replay and discard act on nothing by default: a bare ``pgqueue dlq discard`` must not
    mean "all", and ids with filters would be ambiguous (both? either?)."""
    if ids and (everything or filtered):
        raise UsageProblem(f"give task ids or --all/--type/--queue to {verb}, not both")
    if everything and filtered:
        raise UsageProblem(f"--all {verb}s every dead letter; leave it out to filter")
    if not (ids or everything or filtered):
        raise UsageProblem(
            f"say which dead letters to {verb}: task ids, --all, or --type TYPE [--queue QUEUE]"
        )


def is_terminal(stream: TextIO) -> bool:
    """Whether stderr (for the bar) or stdin (for the confirmation) is a terminal: the
    package's ``_is_terminal``, read at each call, so that replacing it (as the tests do, to
    draw the bar) reaches every caller."""
    return cli._is_terminal(stream)


@contextlib.contextmanager
def _progress(total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (and not --json); yields ``advance(n)``."""
    if state.json or not is_terminal(sys.stderr):
        yield lambda n: None
        return
    if total is None:  # unknown length: a bar that moves, with the count so far
        bar = typer.progressbar(itertools.repeat(0), label=label, show_pos=True, file=sys.stderr)
    else:
        bar = typer.progressbar(length=total, label=label, show_pos=True, file=sys.stderr)
    with bar:
        yield bar.update


def _dead_letter_count(client: Client, queue: str | None) -> int:
    """The bar's length (and the confirmation's count) for --all or --queue, from the depth
    overview; a --type selection has no such count, so its bar runs without an end."""
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


def check_dead_letters(client: Client, ids: Sequence[uuid.UUID], past: str) -> None:
    """Refuse a selection by id that names anything but dead letters, before touching any:
    acting on the rest would leave the operator to work out what happened from a partial
    report, and a refused command writes nothing."""
    problems: list[tuple[uuid.UUID, str | None]] = []
    with client.connection() as conn:
        for task_id in ids:
            try:
                found = ops.get_task(conn, task_id).status
            except TaskNotFound:
                problems.append((task_id, None))
                continue
            if found is not TaskStatus.FAILED:
                problems.append((task_id, found.value))
    if not problems:
        return
    if len(problems) == 1 and len(ids) == 1:
        task_id, status = problems[0]
        if status is None:
            raise TaskNotFound(task_id)
        raise InvalidTaskState(
            task_id,
            status,
            f"not a dead letter, so nothing was {past}; `pgqueue status {task_id}` shows it",
        )
    listed = ", ".join(
        f"{task_id} (no such task)" if status is None else f"{task_id} (status {status!r})"
        for task_id, status in problems
    )
    raise PgQueueError(
        f"{len(problems)} of {len(ids)} tasks are not dead letters, so none was {past}: {listed}"
    )


def _dead_letter_action(
    verb: str,
    past: str,
    action: Callable[..., list[uuid.UUID]],
    client: Client,
    ids: Sequence[uuid.UUID] | None,
    task_type: str | None,
    queue: str | None,
    batch_size: int,
    total: int | None,
) -> None:
    """What replay and discard share, so that both select, batch, report and fail alike.
    ``ids`` have passed :func:`check_dead_letters`; one can still have changed since (a
    replayed task a worker has just taken), which the report then names."""
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
            f"{len(missing)} of {len(ids or [])} tasks were not {past} (not dead letters "
            "any more): " + ", ".join(missing)
        )


def _selected_ids(task_ids: Sequence[str]) -> list[uuid.UUID] | None:
    """The ids given, parsed (each was checked to be a UUID) and without repeats."""
    return list(dict.fromkeys(ops.parse_task_id(i) for i in task_ids)) if task_ids else None


@group.command("replay")
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
    ops.check_filters(type=task_type, queue=queue)
    ids = _selected_ids(task_ids or [])
    with open_client() as client:
        total = None
        if ids is not None:
            check_dead_letters(client, ids, "replayed")
        elif task_type is None and not state.json and is_terminal(sys.stderr):
            total = _dead_letter_count(client, queue)
        _dead_letter_action(
            "replay", "replayed", ops.replay, client, ids, task_type, queue, batch_size, total
        )


def confirm(question: str, refused: str) -> None:
    """Ask ``question`` (y/N) on stderr and read the answer from stdin; return only on yes.

    Without a terminal on stdin there is no one to ask, and an answer read from a pipe is
    not a person's: that is a usage error telling to pass ``--yes``. The answer is read with
    ``readline``, not ``input``, which would write its prompt's space to stdout, where a
    program may be reading the command's answer."""
    if not is_terminal(sys.stdin):
        raise UsageProblem(
            f"{question} stdin is not a terminal, so no one can be asked: pass --yes to go "
            f"ahead (nothing was {refused})"
        )
    typer.echo(f"{question} [y/N]: ", nl=False, err=True)
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):  # end of input: end the prompt's line
        typer.echo("", err=True)
    if answer.strip().lower() not in ("y", "yes"):
        raise Declined(f"aborted: nothing was {refused}")


@group.command("discard")
def dlq_discard(
    task_ids: IdsArg = None,
    everything: AllFlag = False,
    task_type: TypeFilter = None,
    queue: QueueFilter = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Do not ask for confirmation (needed when stdin is not a terminal)."
        ),
    ] = False,
    batch_size: BatchSize = 1000,
) -> None:
    """Delete dead letters for good: by id, --all, or --type/--queue. Asks first unless --yes."""
    filtered = task_type is not None or queue is not None
    _check_selection(task_ids or [], everything, filtered, "discard")
    ops.check_filters(type=task_type, queue=queue)
    ids = _selected_ids(task_ids or [])
    with open_client() as client:
        total = None
        if ids is not None:
            check_dead_letters(client, ids, "discarded")
        elif task_type is None:
            total = _dead_letter_count(client, queue)
        if not yes and total != 0:
            if ids is not None:
                what = f"{len(ids)} dead letter(s)"
            elif total is not None:
                what = f"all {total} dead letter(s)" + (f" of queue {queue!r}" if queue else "")
            else:
                what = f"every dead letter of type {task_type!r}" + (
                    f" in queue {queue!r}" if queue else ""
                )
            confirm(f"Permanently delete {what}?", "discarded")
        _dead_letter_action(
            "discard", "discarded", ops.discard, client, ids, task_type, queue, batch_size, total
        )
