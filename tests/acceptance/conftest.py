"""Fixtures shared by the acceptance tests, which run pgqueue as real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_worker_processes import Workers


@pytest.fixture
def workers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    """Real ``pgqueue worker`` processes, all killed after the test; their logs are printed
    when the test failed."""
    pool = Workers(tmp_path)
    failed_before = request.session.testsfailed
    yield pool
    pool.kill_all()
    if request.session.testsfailed > failed_before and pool.started:
        print(f"\nworker logs of {request.node.nodeid}:\n{pool.describe()}")  # shown on failure
