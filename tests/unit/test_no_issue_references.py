"""No tracked file refers to this project's tracker by number (the word for a tracker entry
followed by its number, in any spelling): a reader of the code, the docs or a test cannot
look it up, so each place says in words what it refers to.

A reference to another project's tracker stays allowed: a URL (``.../issues/123``), or a
number named with its repository (``owner/repo`` before the word). Recorded benchmark output
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

# The word and its number apart or joined by "_", "-" or nothing, in any case, also across a
# line break inside a comment or docstring, and inside a test's name. Not after a letter, a digit, a
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
    # Spelt from parts, so that this file does not hold what it forbids.
    word = "iss" + "ue"
    found = [
        f"# {word.title()} 15. The longest snooze",
        f"declared by @tasks.task ({word} 15)",
        f"not echoed back ({word} 18 item 9)",
        f"def test_{word}15_expiry():",
        f"the expiry ({word}\n    15) and key_reuse",
        f"    # waiting ({word}\n    # 16)",
        f"{word}-20 forked children",
        f"{word}s 15 and 16",
    ]
    spared = [
        f"https://github.com/psycopg/psycopg/{word}s/123",
        f"see psycopg/psycopg {word} 123",
        f"bench/results/pinned-snapshot-{word}20-20261203T143523Z.txt",
        f"an {word} with 2 workers",
        f"t{word} 5",
    ]
    assert [text for text in found if not references(text)] == []
    assert [text for text in spared if references(text)] == []
