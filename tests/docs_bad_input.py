"""The section "Observed: failure modes" of docs/bad-input.md, made from what
tests/integration/test_failure_modes.py observes on a real server::

    python tests/docs_bad_input.py           # rewrite the section
    python tests/docs_bad_input.py --check   # say how the doc differs (exit 1), change nothing

It runs that test module in a pytest of its own with ``PGQUEUE_BAD_INPUT_REPORT`` set, which
has the module write its tables (the schema at a revision pgqueue does not know and missing,
the worker refusing to start, connections killed mid-operation, malformed and unreachable
database URLs), and puts them under the section's heading. The server is the suite's:
``PGQUEUE_TEST_DATABASE_URL`` if set, else the embedded one. tests/integration/
test_docs_bad_input.py fails while the committed section differs.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bad-input.md"
MODULE = "tests/integration/test_failure_modes.py"
COMMAND = "python tests/docs_bad_input.py"
HEADING = "## Observed: failure modes"
NOTE = """\
Generated from what `tests/integration/test_failure_modes.py` observes, not edited by hand:
`python tests/docs_bad_input.py` rewrites it (on `PGQUEUE_TEST_DATABASE_URL`, else the
embedded server), and `tests/integration/test_docs_bad_input.py` fails, with the difference,
while it is out of date."""
assert MODULE in NOTE and COMMAND in NOTE


class NotObserved(Exception):
    """The test module failed, so its tables are not what pgqueue does."""


def observe(server_url: str | None = None) -> str:
    """The module's tables, from a run of it now (on ``server_url`` if given)."""
    with tempfile.TemporaryDirectory(prefix="pgqueue-bad-input-") as report:
        env = {**os.environ, "PGQUEUE_BAD_INPUT_REPORT": report}
        if server_url is not None:
            env["PGQUEUE_TEST_DATABASE_URL"] = server_url
        run = subprocess.run(
            [sys.executable, "-m", "pytest", MODULE, "-q", "-p", "no:cacheprovider"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        tables = Path(report) / "failure-modes.md"
        if run.returncode != 0 or not tables.exists():
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-40:])
            raise NotObserved(f"{MODULE} failed (exit {run.returncode}):\n{tail}")
        return tables.read_text(encoding="utf-8")


def section(tables: str) -> str:
    """The whole section: heading, the note on how it is made, the tables."""
    return f"{HEADING}\n\n{NOTE}\n\n{tables.strip()}\n"


def split(doc: str) -> tuple[str, str, str]:
    """``doc`` as (before the section, the section, after it)."""
    start = doc.index(f"\n{HEADING}\n") + 1
    end = doc.find("\n## ", start + len(HEADING))
    end = len(doc) if end == -1 else end + 1
    return doc[:start], doc[start:end], doc[end:]


def with_section(doc: str, new: str) -> str:
    before, _, after = split(doc)
    return before + new + ("\n" + after if after else "")


def difference(doc: str, new: str) -> str:
    """A unified diff from the doc's section to ``new``; empty when they are the same."""
    current = split(doc)[1].rstrip("\n") + "\n"
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            new.splitlines(keepends=True),
            "docs/bad-input.md (committed)",
            "docs/bad-input.md (observed now)",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("::")[0].strip())
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if it differs")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    try:
        new = section(observe())
    except NotObserved as exc:
        print(exc, file=sys.stderr)
        return 2
    diff = difference(doc, new)
    if not diff:
        print("docs/bad-input.md: the failure-modes section is up to date")
        return 0
    if args.check:
        print(diff, end="")
        print(f"docs/bad-input.md is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    DOC.write_text(with_section(doc, new), encoding="utf-8")
    print("docs/bad-input.md: the failure-modes section rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
