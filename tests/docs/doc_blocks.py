"""The code blocks of a Markdown page, as tests/docs/test_doc_examples.py runs them.

The contract (pages are written to it):

- A fenced block (``` or ~~~, three or more) is found at any indentation: one inside a list
  item, an admonition or a content tab is dedented by its fence's indentation.
- Its language is the info string's first word (``python title="app.py"`` is ``python``).
  ``python``/``py``/``python3`` blocks run; ``console``/``bash``/``shell``/``sh`` blocks run
  their ``$ `` lines; every other language is shown, never run.
- A Python block whose first line is ``# relative/path.py`` (optionally followed by a comment
  in parentheses) is a file: written there under the page's directory, not executed.
- In a console block, a line starting with ``$ `` is a command (a trailing backslash
  continues it on the next line); other lines are output, not checked.
- ``<!-- docs-test: skip REASON -->`` on the line just before a fence: the block is not run.
  The reason is required.
- ``<!-- docs-test: after PATH -->`` anywhere in a page (usually its first line): PATH (a
  page, relative to the repository) runs first, in the same session.

Anything else that starts ``<!-- docs-test:`` is an error, and so is a skip marker that is
not followed by a fence: a marker that silently applies to nothing would hide a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

PYTHON = frozenset({"python", "py", "python3"})
CONSOLE = frozenset({"console", "bash", "shell", "sh", "shell-session", "zsh"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")
_MARKER = re.compile(r"^[ \t]*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
_MARKER_START = re.compile(r"^[ \t]*<!--\s*docs-test\b")
_FILE_LINE = re.compile(r"^#\s+(?P<path>[A-Za-z0-9_./-]+\.py)(?:\s+\(.*\))?\s*$")


class DocBlockError(ValueError):
    """A page breaks the contract (a marker without a reason, an unclosed fence, ...)."""


@dataclass(frozen=True)
class Block:
    """One fenced block. ``line`` is the 1-based line of its first content line in the page."""

    page: str
    line: int
    language: str
    text: str
    skip: str | None = None

    @property
    def kind(self) -> str:
        """``file``, ``python``, ``console`` or ``shown``."""
        if self.language in PYTHON:
            return "file" if self.file_path is not None else "python"
        if self.language in CONSOLE:
            return "console"
        return "shown"

    @property
    def file_path(self) -> str | None:
        """For a file block, its path relative to the page's directory; else None."""
        if self.language not in PYTHON:
            return None
        first = self.text.split("\n", 1)[0]
        match = _FILE_LINE.match(first)
        if match is None:
            return None
        path = PurePosixPath(match["path"])
        if path.is_absolute() or ".." in path.parts:
            raise DocBlockError(
                f"{self.page}:{self.line}: a file block's path must stay under the page's "
                f"directory: {match['path']!r}"
            )
        return str(path)


@dataclass
class Page:
    path: str
    blocks: list[Block] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Command:
    """One ``$ `` command of a console block (continuations joined), its page line, and the
    output the page shows for it (the lines up to the next command)."""

    line: int
    text: str
    output: str = ""


def _dedent(line: str, indent: str) -> str:
    """``line`` without up to ``len(indent)`` leading whitespace characters."""
    n = 0
    while n < len(indent) and n < len(line) and line[n] in " \t":
        n += 1
    return line[n:]


def _marker(page: str, lineno: int, body: str) -> tuple[str, str]:
    words = body.strip().split(None, 1)
    verb = words[0] if words else ""
    rest = words[1].strip() if len(words) > 1 else ""
    if verb == "skip":
        if not rest:
            raise DocBlockError(
                f"{page}:{lineno}: '<!-- docs-test: skip -->' needs a reason: "
                "'<!-- docs-test: skip REASON -->'"
            )
        return verb, rest
    if verb == "after":
        if not rest or len(rest.split()) != 1:
            raise DocBlockError(f"{page}:{lineno}: '<!-- docs-test: after PATH -->' needs a path")
        return verb, rest
    raise DocBlockError(
        f"{page}:{lineno}: unknown marker {body.strip()!r} (known: 'skip REASON', 'after PATH')"
    )


def parse_page(path: str, text: str) -> Page:
    """The blocks and ``after`` pages of the Markdown ``text`` of page ``path``."""
    page = Page(path)
    lines = text.splitlines()
    skip: tuple[int, str] | None = None  # a skip marker waiting for its fence (line, reason)
    i = 0
    while i < len(lines):
        line = lines[i]
        lineno = i + 1
        if skip is not None and skip[0] != i:  # the marker's next line was not a fence
            raise DocBlockError(
                f"{path}:{skip[0]}: a skip marker must be on the line just before a fence"
            )
        if _MARKER_START.match(line):
            match = _MARKER.match(line)
            if match is None:
                raise DocBlockError(f"{path}:{lineno}: a docs-test marker must be one line")
            verb, arg = _marker(path, lineno, match["body"])
            if verb == "after":
                page.after.append(arg)
            else:
                skip = (lineno, arg)
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            i += 1
            continue
        indent, mark = fence["indent"], fence["fence"]
        if mark[0] == "`" and "`" in fence["info"]:  # inline code, not a fence
            i += 1
            continue
        info = fence["info"].strip()
        language = info.split(None, 1)[0].strip("{}.").lower() if info else ""
        closing = re.compile(rf"^[ \t]*{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            body.append(_dedent(lines[j], indent))
            j += 1
        if j == len(lines):
            raise DocBlockError(f"{path}:{lineno}: the fence opened here is never closed")
        reason = skip[1] if skip is not None else None
        skip = None
        page.blocks.append(Block(path, lineno + 1, language, "\n".join(body) + "\n", reason))
        i = j + 1
    if skip is not None:
        raise DocBlockError(
            f"{path}:{skip[0]}: a skip marker must be on the line just before a fence"
        )
    return page


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, a trailing backslash joining the next line."""
    found: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("$ ") or line == "$"):
            i += 1
            continue
        start = i
        parts = [line[2:]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1]
            i += 1
            parts.append(lines[i])
        text = " ".join(p.strip() for p in parts).strip()
        output: list[str] = []
        while i + 1 < len(lines) and not lines[i + 1].startswith("$ "):
            i += 1
            output.append(lines[i])
        if text:
            found.append(Command(block.line + start, text, "\n".join(output)))
        i += 1
    return found


def python_source(block: Block) -> str:
    """The code of a Python block, padded with blank lines so that a traceback's line
    numbers are the page's."""
    return "\n" * (block.line - 1) + block.text
