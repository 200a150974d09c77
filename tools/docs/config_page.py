"""The configuration reference: every setting of ``pgqueue.settings_catalog.SETTINGS``, the
one table of the environment variables pgqueue reads."""

from __future__ import annotations

from collections.abc import Callable

from pgqueue.settings_catalog import SETTINGS

INTRO = """\
# Configuration

Every environment variable pgqueue reads, generated from the one table of them in the code
(`pgqueue/settings_catalog.py`). A command line flag, where there is one, takes the
variable's place for that command; an argument given in code takes precedence over both.

Invalid values are refused with an error that names the setting; passwords never appear in
messages or logs.

| variable | default | read by | |
|---|---|---|---|
"""


def render(exists: Callable[[str], bool] = lambda page: True) -> str:
    """The page's Markdown; ``exists(page)`` says whether a page (relative to docs/) is in the
    site, so that a link is written only to a page that is there."""
    rows = []
    for s in SETTINGS:
        text = s.description
        if s.flags:
            text += " Flag: " + ", ".join(f"`{f}`" for f in s.flags) + "."
        if s.docs and exists(s.docs):
            text += f" More in [{s.docs.removesuffix('.md')}](../{s.docs})."
        cells = [f"`{s.env}`{{: #{s.env.lower()} }}", s.default, s.reader, text]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return INTRO + "\n".join(rows) + "\n"
