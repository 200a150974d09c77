"""Turning help texts and docstrings into Markdown that renders as written."""

from __future__ import annotations

import re

_DOUBLE_BACKTICKS = re.compile(r"``(.+?)``", re.DOTALL)
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def rst_literals(text: str) -> str:
    """``code`` (reStructuredText, as the docstrings write it) as Markdown's `code`."""
    return _DOUBLE_BACKTICKS.sub(lambda m: f"`{m.group(1)}`", text)


def prose(text: str) -> str:
    """Plain text (a help text, a description) as Markdown: what Markdown would take for
    markup outside code spans (``<str>``, ``*``, ``[default: 1]``) is escaped."""
    parts = _CODE_SPAN.split(rst_literals(text))
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        part = parts[i].replace("\\", "\\\\")
        part = part.replace("<", "&lt;").replace(">", "&gt;")
        for char in "*[]_":
            part = part.replace(char, "\\" + char)
        parts[i] = part
    return "".join(parts)


def cell(text: str) -> str:
    """``text`` for one cell of a Markdown table: one line, its pipes escaped."""
    return " ".join(prose(text).split()).replace("|", "\\|")


def code(text: str) -> str:
    """``text`` as a code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def paragraphs(text: str) -> str:
    """A help text's paragraphs, each rewrapped as Markdown prose (click wraps them anew)."""
    blocks = [" ".join(block.split()) for block in text.strip().split("\n\n")]
    return "\n\n".join(prose(block) for block in blocks if block)
