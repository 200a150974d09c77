"""Arguments and options that several commands share, declared once so that ``list`` and
``dlq list`` (and the rest) spell, limit and explain them alike."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from pgqueue.config import MAX_BATCH

TypeFilter = Annotated[str | None, typer.Option("--type", help="Only tasks of this type.")]
QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only tasks of this queue.")]
Limit = Annotated[
    int, typer.Option("--limit", min=1, max=MAX_BATCH, help="Show at most this many.")
]


def _id_text(value: str, what: str) -> str:
    try:
        uuid.UUID(value.strip())
    except ValueError:
        shown = repr(value) if len(value) <= 60 else f"{value[:40]!r}… ({len(value)} characters)"
        raise typer.BadParameter(f"{shown} is not {what} (a UUID)") from None
    return value


def task_id(value: str) -> str:
    """A malformed id is a usage error naming the argument (exit code 2), not "no task":
    nothing could ever have that id, so the command line itself is wrong."""
    return _id_text(value, "a task id")


def task_ids(values: list[str] | None) -> list[str] | None:
    """:func:`task_id` for each of several ids."""
    return [task_id(v) for v in values] if values else values


def workflow_id(value: str) -> str:
    """:func:`task_id`, for a workflow's id."""
    return _id_text(value, "a workflow id")


TaskIdArg = Annotated[
    str, typer.Argument(metavar="TASK_ID", help="The task's id.", callback=task_id)
]
