"""Arguments and options that several commands share, declared once so that ``list`` and
``dlq list`` (and the rest) spell, limit and explain them alike."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue.config import MAX_BATCH

TypeFilter = Annotated[str | None, typer.Option("--type", help="Only tasks of this type.")]
QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only tasks of this queue.")]
Limit = Annotated[
    int, typer.Option("--limit", min=1, max=MAX_BATCH, help="Show at most this many.")
]
TaskIdArg = Annotated[str, typer.Argument(metavar="TASK_ID", help="The task's id.")]
