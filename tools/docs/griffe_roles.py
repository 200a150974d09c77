"""A griffe extension (named in ``mkdocs.yml``): the docstrings' Sphinx roles as Markdown.

The package's docstrings are written for readers of the source and for Sphinx-style tools:
``:func:`~pgqueue.operations.enqueue``` and the like. mkdocstrings renders Markdown, where a
role would show as its raw text; here each becomes a code span of the name as Sphinx would
show it (the last part after ``~``, else the whole path). Not a link: most targets are
internal modules the site does not document, and a link that resolves nowhere fails the strict
build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def markdown_roles(text: str) -> str:
    """``text`` with each Sphinx role replaced by a code span of the name it shows."""

    def span(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return ROLE.sub(span, text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_roles(obj.docstring.value)
