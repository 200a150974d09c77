"""Fixtures for the example apps' tests (examples/): real PostgreSQL, and real
``pgqueue worker`` processes that import the examples' task modules from the repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from acceptance.test_worker_processes import Workers

ROOT = Path(__file__).resolve().parents[2]  # where `import examples` works


@pytest.fixture
def workers(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workers]:
    """As tests/acceptance's fixture, with the repository on the workers' PYTHONPATH (they
    run in tmp_path), so that ``examples.fastapi_app.tasks:tasks`` imports as in the README."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pool = Workers(tmp_path)
    failed_before = request.session.testsfailed
    yield pool
    pool.kill_all()
    if request.session.testsfailed > failed_before and pool.started:
        print(f"\nworker logs of {request.node.nodeid}:\n{pool.describe()}")  # shown on failure
