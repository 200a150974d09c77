"""Plain-text output for people: aligned tables, key/value blocks, ages and timestamps.

No dependencies but the error layout (pgqueue.error_text). Every cell goes through
:func:`clean`, so text that came from outside (payloads, error messages) can neither break
the alignment nor send escape sequences to the terminal.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime

from pgqueue.error_text import split_error

MISSING = "-"


def clean(text: str, *, multiline: bool = False) -> str:
    """``text`` with control characters shown escaped (newlines kept when ``multiline``)."""
    out = []
    for char in text:
        if multiline and char == "\n":
            out.append(char)
        elif char == "\t":
            out.append("    " if multiline else " ")
        elif unicodedata.category(char)[0] == "C":
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out)


def width(text: str) -> int:
    """Columns ``text`` takes in a terminal (wide East Asian characters take two)."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
        for c in text
    )


def headline(error: str, limit: int) -> str:
    """The line of a stored error that says most: the first line of its summary (the
    exception itself, pgqueue.error_text.split_error); cut to ``limit`` characters."""
    line = split_error(error).headline.strip()
    return line if len(line) <= limit else line[: max(limit - 1, 0)].rstrip() + "…"


def timestamp(value: datetime | None) -> str:
    return MISSING if value is None else value.isoformat(sep=" ", timespec="seconds")


def age(seconds: float | None) -> str:
    """A duration for people: 45s, 3m12s, 2h05m, 3d04h."""
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def cell(value: object) -> str:
    if value is None:
        return MISSING
    if isinstance(value, datetime):
        return timestamp(value)
    return clean(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """An aligned table; columns whose values are all numbers are right-aligned."""
    raw = [list(row) for row in rows]
    numeric = [
        bool(raw)
        and all(
            isinstance(row[i], int | float) and not isinstance(row[i], bool)
            for row in raw
            if row[i] is not None
        )
        for i in range(len(headers))
    ]
    text = [[cell(v) for v in row] for row in raw]
    widths = [max([width(h), *(width(row[i]) for row in text)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = []
        for i, value in enumerate(values):
            pad = " " * (widths[i] - width(value))
            parts.append(pad + value if numeric[i] else value + pad)
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in text)])


def key_values(pairs: Iterable[tuple[str, object]]) -> str:
    """``key: value`` lines with the values aligned; multi-line values are indented."""
    items = list(pairs)
    if not items:
        return ""
    indent = max(width(key) for key, _ in items) + 2
    out = []
    for key, value in items:
        text = value if isinstance(value, str) else cell(value)
        lines = clean(text, multiline=True).splitlines() or [""]
        out.append(f"{key}:".ljust(indent) + lines[0])
        out.extend(" " * indent + extra for extra in lines[1:])
    return "\n".join(line.rstrip() for line in out)
