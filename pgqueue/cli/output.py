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


def error_attempt(task: Task) -> str | None:
    """Which attempt the stored error is the error of, where that is not plain. Only a dead
    letter's error is why it stands where it is; any other task keeps it from an earlier
    attempt, and a completed task showing it unlabelled reads as a task that failed."""
    if task.status is TaskStatus.FAILED:
        return None
    if task.status is TaskStatus.QUEUED:
        if task.attempts == 0:
            return "an attempt before the replay"
        return f"attempt {task.attempts}: to be retried"
    if task.status is TaskStatus.COMPLETED:
        return "an earlier attempt: retried, then completed"
    if task.status is TaskStatus.RUNNING:
        return f"an earlier attempt: attempt {task.attempts} is running"
    return "an earlier attempt"


def error_lines(task: Task) -> list[tuple[str, object]]:
    """The last error for people: the exception first, which attempt it is of (unless the
    task is a dead letter), its traceback (if any) below."""
    error = task.error
    if error is None:
        return [("last error", MISSING)]
    lines: list[tuple[str, object]] = [("last error", error.summary)]
    attempt = error_attempt(task)
    if attempt is not None:
        lines.append(("error of", attempt))
    if error.traceback is not None:
        lines.append(("traceback", error.traceback))
    return lines
