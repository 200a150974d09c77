"""How a failed attempt's error is stored, and how readers split it again.

A task keeps one text column for its last error (``last_error``). Readers (the API, the CLI,
the dashboard) need the exception itself first, because that is what an operator scans a list
of failures for, and the traceback only when they dig in. So the worker writes the exception
line first (``ValueError: doomed always fails``) and the traceback after it, and every reader
splits the text with :func:`split_error`, the one rule for what the summary of a stored error
is. Rows written before this layout start with the traceback (``Traceback (most recent call
last):``); their summary is the exception line at its end.

This module imports nothing else from pgqueue: the models and the executor both build on it.
"""

from __future__ import annotations

import dataclasses
import re
import traceback as tb

MAX_ERROR_LENGTH = 8000  # what the column keeps (task_fail stores left(error, 8000))
MAX_SUMMARY_LENGTH = 2000  # a message longer than this is cut; the traceback gets the rest
TRACEBACK_HEADER = "Traceback (most recent call last):"
FRAMES_KEPT = 6  # the innermost frames: where it failed, not the worker's own call stack
_FRAME = re.compile(r'", line \d+, in ')  # a frame line, or what is left of one cut at its start
# Where a traceback starts: an exception group's (ExceptionGroup, TaskGroup) is drawn in a
# margin, "  + Exception Group Traceback (most recent call last):".
_HEADER = re.compile(r"^(?:  \+ Exception Group )?Traceback \(most recent call last\):")
_GROUP_LINE = re.compile(r"^\s*\| (\S.*)$")  # "  | ExceptionGroup: ..." (frames sit deeper)
_CUT = "  [... earlier lines cut to fit the 8000-character error]"


@dataclasses.dataclass(frozen=True)
class ErrorText:
    """A stored error, split for reading: ``summary`` is the exception's type and message
    (``ValueError: doomed always fails``), or the whole text of an error that has no
    traceback (a timeout, ``Retry: ...``); ``traceback`` is the rest, or None."""

    summary: str
    traceback: str | None

    @property
    def headline(self) -> str:
        """The summary's first line: what fits in a table cell or a log field."""
        return self.summary.split("\n", 1)[0]


def format_exception(exc: BaseException) -> str:
    """The text stored for a failed attempt that raised ``exc``: its type and message first,
    then the traceback's innermost frames, within MAX_ERROR_LENGTH.

    When the whole does not fit, the traceback loses its oldest lines (the exception line it
    ends with stays), and it still starts with the traceback header, so that the split finds
    it; the summary is never the part that gets cut unless it alone is too long.
    """
    summary = "".join(tb.format_exception_only(exc)).strip() or type(exc).__name__
    if len(summary) > MAX_SUMMARY_LENGTH:
        summary = summary[: MAX_SUMMARY_LENGTH - 1].rstrip() + "…"
    trace = "".join(tb.format_exception(exc, limit=-FRAMES_KEPT)).rstrip()
    room = MAX_ERROR_LENGTH - len(summary) - 1
    if len(trace) > room:
        head = f"{TRACEBACK_HEADER}\n{_CUT}\n"
        tail = trace[len(trace) - (room - len(head)) :]
        trace = head + tail.split("\n", 1)[-1]  # from a whole line on
    return f"{summary}\n{trace}"


def split_error(text: str) -> ErrorText:
    """A stored error's summary and traceback: the one rule every reader uses.

    - ``ValueError: x`` then a traceback (what the worker writes): the lines before the
      traceback header, and the traceback.
    - a traceback first (rows written before the summary came first, possibly cut at their
      start to 8000 characters): the exception at its end (from the first unindented line
      after the last frame, so a message of several lines stays whole), and the whole text.
    - an exception group's traceback is drawn in a margin (``  + Exception Group Traceback``);
      it is found, and read, as the plain one.
    - anything else (``timed out after 5 s``, an error passed to ``pgqueue.fail``): the text,
      and no traceback.
    """
    lines = text.rstrip().splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ErrorText("", None)
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    before = lines if start is None else lines[:start]
    if (
        start == 0
        or any(_FRAME.search(line) for line in before)
        or (start is not None and before[0][:1].isspace())
    ):  # a traceback first, or the tail of one cut at its start: the old layout
        return ErrorText(_old_summary(lines), "\n".join(lines))
    if start is None:
        return ErrorText("\n".join(lines).strip(), None)
    return ErrorText("\n".join(before).strip(), "\n".join(lines[start:]))


def _old_summary(lines: list[str]) -> str:
    """The exception an old-layout row (traceback first) ends with: everything from the first
    unindented line after its last frame, so that a message of several lines, and the notes
    after it, are kept whole, as the new layout keeps them."""
    if lines[0].lstrip().startswith("+ Exception Group"):  # its own line is in the margin
        found = next((m for m in map(_GROUP_LINE.match, lines) if m), None)
        if found:
            return found.group(1).strip()
    frames = [i for i, line in enumerate(lines) if line[:1].isspace() and _FRAME.search(line)]
    if frames:
        rest = lines[frames[-1] + 1 :]
        first = next((i for i, line in enumerate(rest) if line and not line[:1].isspace()), None)
        if first is not None:
            return "\n".join(rest[first:]).strip()
    return _last_exception_line(lines)


def _last_exception_line(lines: list[str]) -> str:
    """The exception a traceback ends with: its last line that is not indented (frames and
    source lines are)."""
    for line in reversed(lines):
        if line.strip() and not line[:1].isspace():
            return line.strip()
    return lines[-1].strip()
