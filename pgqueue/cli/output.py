"""How every command answers: one JSON document with ``--json``, text for people otherwise.

One function decides between the two so that no command can print a table into a ``--json``
run (stdout is then a machine's input).
"""

from __future__ import annotations

import json
from typing import Any

import typer

from pgqueue.cli.state import state
from pgqueue.formatting import MISSING
from pgqueue.models import Task, TaskStatus


def emit(data: Any, human: str) -> None:
    typer.echo(json.dumps(data, default=str) if state.json else human)


def more_hint(shown: int, limit: int) -> str:
    """A full page may not be everything: say so, or a list cut at --limit reads as complete."""
    return f"\n(the newest {limit} shown; raise --limit to see more)" if shown == limit else ""


def error_label(task: Task) -> str:
    """What the stored error is the error of. Only a dead letter's error is why it stands
    where it is; any other task that has one keeps it from an earlier attempt, and a
    completed task showing it unlabelled reads as a task that failed."""
    if task.status is TaskStatus.FAILED:
        return "last error"
    if task.status is TaskStatus.QUEUED:
        if task.attempts == 0:
            return "last error (of an attempt before the replay)"
        return f"last error (attempt {task.attempts}, to be retried)"
    if task.status is TaskStatus.COMPLETED:
        return "last error (of an earlier attempt, before the retry that completed)"
    if task.status is TaskStatus.RUNNING:
        return f"last error (of an earlier attempt; attempt {task.attempts} is running)"
    return "last error (of an earlier attempt)"


def error_lines(task: Task) -> list[tuple[str, object]]:
    """The last error for people, labelled with the attempt it belongs to: the exception
    first, its traceback (if any) below it."""
    error = task.error
    if error is None:
        return [("last error", MISSING)]
    lines: list[tuple[str, object]] = [(error_label(task), error.summary)]
    if error.traceback is not None:
        lines.append(("traceback", error.traceback))
    return lines
