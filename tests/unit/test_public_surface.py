"""The public surface is what it was before the package was reorganised.

The snapshots under ``surface/`` were generated from main before the reorganisation; these
tests fail on any change to a route, a schema, a CLI option or help line, or a signature of
``pgqueue`` and ``pgqueue.aio``.
"""

from __future__ import annotations

import difflib

import pytest

from tests.unit.surface import snapshot


def _same(expected: str, actual: str, what: str) -> None:
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                "before",
                "now",
                n=2,
            )
        )
        pytest.fail(f"{what} changed:\n{diff[:6000]}")


def test_openapi_document_is_unchanged() -> None:
    _same(snapshot.OPENAPI.read_text(encoding="utf-8"), snapshot.openapi_text(), "OpenAPI")


def test_every_cli_help_is_unchanged() -> None:
    _same(snapshot.CLI_HELP.read_text(encoding="utf-8"), snapshot.cli_help_text(), "CLI help")


def test_python_api_names_and_signatures_are_unchanged() -> None:
    _same(snapshot.PYTHON_API.read_text(encoding="utf-8"), snapshot.python_api_text(), "Python API")
