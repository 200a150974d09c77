"""Every code block of README.md and docs/**/*.md runs, page by page, against real PostgreSQL.

Each page is one session (tests/docs/doc_session.py): a fresh migrated database whose URL is
``PGQUEUE_DATABASE_URL``, a fresh directory as the working directory and at the front of
``sys.path``, one Python namespace and one event loop. File blocks are written, Python blocks
executed, console commands run (workers and servers in the background). What a page may say
to the runner, and how, is in tests/docs/doc_blocks.py.

Writing a page: ``PGQUEUE_DOCS_KEEP_GOING=1 python -m pytest tests/docs -k PAGE`` reports
every failing block of the page, not only the first.

A block that cannot run says why (``<!-- docs-test: skip REASON -->``); those stay few:
``MAX_SKIPPED_PYTHON_BLOCKS`` is a ratchet, lowered as pages learn to run their blocks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import Page, commands, parse_page
from doc_session import REPOSITORY, RUN, PageSession, free_port, runnable, threads_left

from pgqueue import defaults

# How many Python blocks, across every page, may be marked skip. Lower it when you can;
# never raise it to let a block off running.
MAX_SKIPPED_PYTHON_BLOCKS = 4
PAGE_TIMEOUT = 180
# Set (to anything) to go on after a failing block and report every failure of a page, when
# writing one: the blocks after a failure may fail only because of it.
KEEP_GOING = "PGQUEUE_DOCS_KEEP_GOING"


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


@contextlib.contextmanager
def page_session(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PageSession]:
    """A session in ``tmp_path``: its environment, working directory and ``sys.path`` set
    with ``monkeypatch``; at the end its processes stopped, its modules forgotten, the logging
    set up as it was, and a thread it left running (which would hold up the test run's exit)
    a failure."""
    threads = set(threading.enumerate())
    loggers = {name: _logger_state(name) for name in (None, "pgqueue")}
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
            for logger_name, state in loggers.items():
                _restore_logger(logger_name, state)
            for name in set(sys.modules) - before:
                if str(getattr(sys.modules[name], "__file__", None) or "").startswith(
                    str(directory)
                ):
                    del sys.modules[name]
    died = session.died()
    if died:
        pytest.fail("a background process of the page failed:\n" + "\n".join(died))
    left = threads_left(threads)
    if left:
        pytest.fail(f"the page left threads running: {', '.join(sorted(left))}", pytrace=False)


def _logger_state(name: str | None) -> tuple[list[logging.Handler], int, bool]:
    logger = logging.getLogger(name)
    return list(logger.handlers), logger.level, logger.propagate


def _restore_logger(name: str | None, state: tuple[list[logging.Handler], int, bool]) -> None:
    logger = logging.getLogger(name)
    logger.handlers[:], logger.level, logger.propagate = state


@pytest.mark.timeout(PAGE_TIMEOUT)
@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(
    page: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = [block for current in session_order(page) for block in current.blocks]
    if not any(runnable(block) for block in blocks):
        return  # prose, SQL and output only: no database to make
    database_url = request.getfixturevalue("database_url")
    keep_going = bool(os.environ.get(KEEP_GOING))
    failures: list[str] = []
    with page_session(database_url, tmp_path, monkeypatch) as session:
        for block in blocks:
            try:
                session.run(block)
            except pytest.fail.Exception as exc:
                if not keep_going:
                    raise
                failures.append(str(exc))
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


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


def test_console_blocks_give_their_commands_a_prompt() -> None:
    """A console block with no "$ " line runs nothing, whatever it holds: a pgqueue, python
    or curl command in it without its prompt is never run, silently."""
    unprompted = [
        f"{block.page}:{block.line}: {line}"
        for page in PAGES
        for block in load(page).blocks
        if block.kind == "console" and not commands(block)
        for line in block.text.splitlines()
        if line.split(" ", 1)[0] in RUN
    ]
    assert unprompted == []


def test_the_pages_are_all_collected() -> None:
    assert "README.md" in PAGES
    assert "docs/architecture.md" in PAGES
    assert len(PAGES) == len(set(PAGES))


def test_after_pages_run_first_once_and_a_loop_or_a_missing_page_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pages = {
        "a.md": "# A\n",
        "b.md": "<!-- docs-test: after a.md -->\n",
        "c.md": "<!-- docs-test: after b.md -->\n<!-- docs-test: after a.md -->\n",
        "loop1.md": "<!-- docs-test: after loop2.md -->\n",
        "loop2.md": "<!-- docs-test: after loop1.md -->\n",
        "lost.md": "<!-- docs-test: after gone.md -->\n",
    }
    for name, text in pages.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "REPOSITORY", tmp_path)
    assert [p.path for p in session_order("c.md")] == ["a.md", "b.md", "c.md"]
    with pytest.raises(AssertionError, match=r"loop: loop1\.md -> loop2\.md -> loop1\.md"):
        session_order("loop1.md")
    with pytest.raises(AssertionError, match=r"lost\.md runs after gone\.md, which does not exist"):
        session_order("lost.md")
