"""No tracked file refers to this project's tracker by number ("issue 16", "Issue 15.",
"(issue 18 item 9)"): a reader of the code, the docs or a test cannot look it up, so each
place says in words what it refers to.

A reference to another project's tracker stays allowed: a URL (``.../issues/123``), or a
number named with its repository (``psycopg/psycopg issue 123``). Recorded benchmark output
(``bench/results/``) is left as it was written: it quotes commit subjects verbatim."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What is checked: the package, its docs, tests, benchmarks, examples, deployment, CI and the
# migrations, and the README.
CHECKED_DIRS = (
    "pgqueue/",
    "docs/",
    "tests/",
    "bench/",
    "examples/",
    "deploy/",
    ".ci/",
    "migrations/",
)
CHECKED_FILES = ("README.md",)
NOT_CHECKED_DIRS = ("bench/results/",)

THIS_FILE = "tests/unit/test_no_issue_references.py"

# "issue 16", "Issue_15", "issue-20", "issue20", also across a line break inside a comment or
# docstring ("(issue\n    # 16)"); "test_issue15_..." too. Not after a letter, a digit, a
# "/" or a "." (a URL's path, a file name), nor after "owner/repo " (another project's issue).
REFERENCE = re.compile(
    r"(?<![A-Za-z0-9/.#-])issues?"
    r"(?:[ \t_-]*|[ \t]*\n[ \t#*/-]*)"
    r"\d+",
    re.IGNORECASE,
)
OTHER_PROJECT = re.compile(r"[\w.-]+/[\w.-]+[ \t]+$")


def references(text: str) -> list[tuple[int, str]]:
    """Each reference in ``text``: its line number and the line it starts on."""
    found = []
    lines = text.splitlines()
    for match in REFERENCE.finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if OTHER_PROJECT.search(text[line_start : match.start()]):
            continue
        number = text.count("\n", 0, match.start()) + 1
        found.append((number, lines[number - 1].strip()))
    return found


def checked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [
        path
        for path in listed.split("\0")
        if path
        and (path.startswith(CHECKED_DIRS) or path in CHECKED_FILES)
        and not path.startswith(NOT_CHECKED_DIRS)
        and path != THIS_FILE
    ]


def test_no_tracked_file_refers_to_an_issue_by_number() -> None:
    offending = []
    for path in checked_files():
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted in the working tree and not yet committed
        offending += [f"{path}:{line}: {content}" for line, content in references(text)]
    assert not offending, (
        "Say in words what these refer to (a reader cannot look up an internal issue "
        "number), or delete the reference where the sentence stands without it:\n"
        + "\n".join(offending)
    )


def test_the_pattern_finds_references_in_every_form_and_spares_other_projects() -> None:
    found = [
        "# Issue 15. The longest snooze",
        "declared by @tasks.task (issue 15)",
        "not echoed back (issue 18 item 9)",
        "def test_issue15_expiry():",
        "the expiry (issue\n    15) and key_reuse",
        "    # waiting (issue\n    # 16)",
        "issue-20 forked children",
        "issues 15 and 16",
    ]
    spared = [
        "https://github.com/psycopg/psycopg/issues/123",
        "see psycopg/psycopg issue 123",
        "bench/results/pinned-snapshot-issue20-20261203T143523Z.txt",
        "an issue with 2 workers",
        "tissue 5",
    ]
    assert [text for text in found if not references(text)] == []
    assert [text for text in spared if references(text)] == []
