"""``pgqueue worker`` takes a registry or ``--django``, exactly one; either mistake is a usage
error in one line (the Django side itself is tested in tests/django)."""

from __future__ import annotations

from processes import one_line_error, run_cli


def test_worker_refuses_neither_a_registry_nor_django(database_url: str) -> None:
    line = one_line_error(run_cli(database_url, "worker"), code=2)
    assert "give a registry (MODULE:ATTRIBUTE) or --django" in line


def test_worker_refuses_both_a_registry_and_django(database_url: str) -> None:
    line = one_line_error(run_cli(database_url, "worker", "app.tasks:tasks", "--django"), code=2)
    assert "one of the two" in line
