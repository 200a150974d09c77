"""docs/bad-input.md's section "Observed: failure modes" is what pgqueue does now: the section
is made again (tests/docs_bad_input.py runs tests/integration/test_failure_modes.py on this
session's server) and compared with the committed one."""

from __future__ import annotations

import docs_bad_input
import pytest

# A run of the whole failure-modes module, processes and killed connections included.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_failure_modes_section_of_bad_input_md_is_what_the_tests_observe(
    server_url: str,
) -> None:
    doc = docs_bad_input.DOC.read_text(encoding="utf-8")
    try:
        observed = docs_bad_input.observe(server_url)
    except docs_bad_input.NotObserved as exc:
        pytest.fail(f"the section cannot be made while its tests fail: {exc}")
    diff = docs_bad_input.difference(doc, docs_bad_input.section(observed))
    assert not diff, (
        "docs/bad-input.md's failure-modes section is not what the tests observe now; "
        f"run `{docs_bad_input.COMMAND}` to rewrite it:\n{diff}"
    )
