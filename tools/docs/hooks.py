"""MkDocs hooks (named in ``mkdocs.yml``): the generated Reference pages, a navigation that
leaves out pages not written yet, and links to files outside ``docs/``.

- The Reference pages (:data:`GENERATED`) are made from the code at every build, by the
  ``*_page.py`` modules beside this one, and never written to ``docs/``.
- ``mkdocs.yml`` holds the whole navigation, the site's fixed layout. While
  ``extra.allow_missing_pages`` is true, an entry whose page does not exist (yet) is left out
  of the navigation, and a link to it is written as its text alone, each with a line at INFO
  level: so that a branch can build before every page has landed. Set it to false once every
  page exists: a missing page is then an error, in the navigation and wherever a page links
  to it. A link to a page outside the layout is an error either way.
- A link from a page to a file of the repository outside ``docs/`` (``../bench/RESULTS.md``)
  works on GitHub but not on the site: it is rewritten to the file on ``repo_url`` when one is
  configured, else to the path in words. A link to a file that does not exist is a warning
  (an error with ``--strict``).
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # MkDocs loads this file by path; the generators import by name
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("mkdocs.plugins.pgqueue")


def _python() -> str:
    from tools.docs import python_page

    return python_page.render()


def _cli() -> str:
    from tools.docs import cli_page

    return cli_page.render()


def _http() -> str:
    from tools.docs import http_page

    return http_page.render()


def _sql() -> str:
    from tools.docs import sql_page

    return sql_page.render()


_present: set[str] = set()
_pending: set[str] = set()  # pages of the layout not written yet, while they are allowed


def _configuration() -> str:
    from tools.docs import config_page

    return config_page.render(lambda page: page in _present)


GENERATED: dict[str, Callable[[], str]] = {
    "reference/python.md": _python,
    "reference/cli.md": _cli,
    "reference/http.md": _http,
    "reference/configuration.md": _configuration,
    "reference/sql.md": _sql,
}


def _pages_on_disk(docs_dir: Path) -> set[str]:
    return {p.relative_to(docs_dir).as_posix() for p in docs_dir.rglob("*.md")}


def _prune(nav: Any, present: set[str]) -> Any:
    """The navigation without the entries whose page is not in ``present``, and without the
    sections left empty."""
    if isinstance(nav, str):
        return nav if nav in present or "://" in nav else None
    if isinstance(nav, list):
        kept = [_prune(item, present) for item in nav]
        return [item for item in kept if item is not None] or None
    if isinstance(nav, dict):
        ((title, value),) = nav.items()
        kept = _prune(value, present)
        return None if kept is None else {title: kept}
    return nav


def _missing(nav: Any, present: set[str]) -> list[str]:
    if isinstance(nav, str):
        return [] if nav in present or "://" in nav else [nav]
    if isinstance(nav, list):
        return [m for item in nav for m in _missing(item, present)]
    if isinstance(nav, dict):
        return [m for value in nav.values() for m in _missing(value, present)]
    return []


def on_config(config: Any) -> Any:
    docs_dir = Path(config["docs_dir"])
    _present.clear()
    _present.update(_pages_on_disk(docs_dir) | set(GENERATED))
    missing = _missing(config["nav"], _present)
    _pending.clear()
    if missing and config["extra"].get("allow_missing_pages"):
        log.info("pages in mkdocs.yml's nav not written yet, left out: %s", ", ".join(missing))
        config["nav"] = _prune(config["nav"], _present)
        _pending.update(missing)
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, render in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise ValueError(f"docs/{path} is generated at build time: delete the file")
        files.append(File.generated(config, path, content=render()))
    return files


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Links to pages not written yet, and to files outside docs/, rewritten (outside fenced
    code blocks only)."""
    docs_dir = Path(config["docs_dir"]).resolve()
    here = docs_dir / Path(page.file.src_uri).parent  # generated pages have no file on disk

    def rewrite(match: re.Match[str]) -> str:
        pending = _pending_link(match, page.file.src_uri)
        if pending is not None:
            return pending
        return _outside_link(match, here, docs_dir, config, page.file.src_uri)

    parts = re.split(r"(^(?:```|~~~)[^\n]*\n.*?^(?:```|~~~)[ \t]*$)", markdown, flags=re.M | re.S)
    for i in range(0, len(parts), 2):  # the even parts are outside fenced blocks
        parts[i] = _LINK.sub(rewrite, parts[i])
    return "".join(parts)


def _pending_link(match: re.Match[str], page: str) -> str | None:
    """A link to a page of the layout not written yet, as its text alone; else None."""
    target = match.group(2).partition("#")[0]
    if not _pending or not target.endswith(".md") or "://" in target:
        return None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
    if resolved not in _pending:
        return None
    log.debug("%s: the link to %s, not written yet, is left as text", page, resolved)
    return match.group(1)


def _outside_link(match: re.Match[str], here: Path, docs_dir: Path, config: Any, page: str) -> str:
    text, target = match.group(1), match.group(2)
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return match.group(0)
    path, _, fragment = target.partition("#")
    resolved = (here / path).resolve()
    if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(ROOT):
        return match.group(0)
    if not resolved.exists():
        log.warning("%s links to %s, which is not in the repository", page, target)
        return match.group(0)
    relative = resolved.relative_to(ROOT).as_posix()
    repo_url = (config.get("repo_url") or "").rstrip("/")
    if repo_url:
        kind = "tree" if resolved.is_dir() else "blob"
        anchor = f"#{fragment}" if fragment else ""
        return f"[{text}]({repo_url}/{kind}/main/{relative}{anchor})"
    if text.strip("`") in (relative, relative.rstrip("/") + "/"):
        return f"`{relative}` (in the repository)"
    return f"{text} (`{relative}` in the repository)"
