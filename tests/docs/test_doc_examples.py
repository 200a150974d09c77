"""Every code block of README.md and docs/**/*.md runs, page by page, against real PostgreSQL.

Each page is one session (tests/docs/doc_session.py): a fresh migrated database whose URL is
``PGQUEUE_DATABASE_URL``, a fresh directory as the working directory and at the front of
``sys.path``, one Python namespace and one event loop. File blocks are written, Python blocks
executed, console commands run (workers and servers in the background). What a page may say
to the runner, and how, is in tests/docs/doc_blocks.py.

A block that cannot run says why (``<!-- docs-test: skip REASON -->``); those stay few:
``MAX_SKIPPED_PYTHON_BLOCKS`` is a ratchet, lowered as pages learn to run their blocks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import Page, parse_page
from doc_session import REPOSITORY, PageSession, free_port

from pgqueue import defaults

# How many Python blocks, across every page, may be marked skip. Lower it when you can;
# never raise it to let a block off running.
MAX_SKIPPED_PYTHON_BLOCKS = 12
PAGE_TIMEOUT = 180


def page_paths() -> list[str]:
    """README.md and every page under docs/, relative to the repository."""
    found = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").rglob("*.md"))]
    return [p.relative_to(REPOSITORY).as_posix() for p in found if p.is_file()]


PAGES = page_paths()


def load(path: str) -> Page:
    return parse_page(path, (REPOSITORY / path).read_text(encoding="utf-8"))


def session_order(path: str) -> list[Page]:
    """``path``'s page, preceded by the pages it runs ``after`` (theirs first, each once)."""
    order: list[Page] = []
    seen: set[str] = set()

    def visit(current: str, chain: tuple[str, ...]) -> None:
        if current in chain:
            raise AssertionError(f"'after' markers loop: {' -> '.join((*chain, current))}")
        if current in seen:
            return
        if not (REPOSITORY / current).is_file():
            raise AssertionError(f"{chain[-1]} runs after {current}, which does not exist")
        page = load(current)
        for earlier in page.after:
            visit(earlier, (*chain, current))
        seen.add(current)
        order.append(page)

    visit(path, ())
    return order


@pytest.fixture
def page_session(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PageSession]:
    directory = tmp_path / "page"
    directory.mkdir()
    session = PageSession(directory, database_url, free_port())
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    for name, value in session.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(sys.modules, session.module.__name__, session.module)
    defaults.reset()
    before = set(sys.modules)
    try:
        yield session
    finally:
        try:
            session.close()
        finally:
            defaults.reset()
            for name in set(sys.modules) - before:
                if str(getattr(sys.modules[name], "__file__", None) or "").startswith(
                    str(directory)
                ):
                    del sys.modules[name]
    died = session.died()
    if died:
        pytest.fail("a background process of the page failed:\n" + "\n".join(died))


@pytest.mark.timeout(PAGE_TIMEOUT)
@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page: str, page_session: PageSession) -> None:
    for current in session_order(page):
        for block in current.blocks:
            page_session.run(block)


def test_every_page_parses_and_its_after_pages_exist() -> None:
    problems = []
    for page in PAGES:
        try:
            session_order(page)
        except (ValueError, AssertionError) as exc:
            problems.append(str(exc))
    assert problems == []


def test_skipped_python_blocks_stay_few_and_each_says_why() -> None:
    skipped = [
        f"{block.page}:{block.line}: {block.skip}"
        for page in PAGES
        for block in load(page).blocks
        if block.skip is not None and block.kind in ("python", "file")
    ]
    assert all(line.split(": ", 1)[1].strip() for line in skipped)
    assert len(skipped) <= MAX_SKIPPED_PYTHON_BLOCKS, "\n".join(skipped)


def test_the_pages_are_all_collected() -> None:
    assert "README.md" in PAGES
    assert "docs/architecture.md" in PAGES
    assert len(PAGES) == len(set(PAGES))
