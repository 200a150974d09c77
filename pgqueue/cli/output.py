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
from pgqueue.models import Task


def emit(data: Any, human: str) -> None:
    typer.echo(json.dumps(data, default=str) if state.json else human)


def more_hint(shown: int, limit: int) -> str:
    """A full page may not be everything: say so, or a list cut at --limit reads as complete."""
    return f"\n(the newest {limit} shown; raise --limit to see more)" if shown == limit else ""


def error_lines(task: Task) -> list[tuple[str, object]]:
    """The last error for people: the exception first, its traceback (if any) below it."""
    error = task.error
    if error is None:
        return [("last error", MISSING)]
    lines: list[tuple[str, object]] = [("last error", error.summary)]
    if error.traceback is not None:
        lines.append(("traceback", error.traceback))
    return lines
