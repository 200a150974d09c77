"""docs/testing.md's examples run: each ```python block, in order, in one namespace with the
test's database URL, as a reader would paste them."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def test_every_example_of_the_testing_page_runs(database_url):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"database_url": database_url, "__name__": "docs_testing"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/testing.md, block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/testing.md's block {i + 1} failed: {exc!r}") from exc
