"""The named statements: one name, one text, whichever room file of pgqueue/sql/ holds it."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from pgqueue.queries.driver import parse_statements, statements


def test_a_name_given_twice_is_refused_naming_both_files() -> None:
    files = [("a.sql", "-- name: x\n-- why\nSELECT 1;\n"), ("b.sql", "-- name: x\nSELECT 2;\n")]
    with pytest.raises(RuntimeError, match=r"'x' is named twice: in a\.sql and b\.sql"):
        parse_statements(files)


def test_a_statement_is_sent_without_its_comment_lines() -> None:
    text = "-- header\n\n-- name: x\n-- why it exists\nSELECT 1\n  -- inside\nFROM t;\n"
    assert parse_statements([("a.sql", text)]) == {"x": "SELECT 1\nFROM t;"}


def test_every_room_file_is_read_and_each_statement_says_why() -> None:
    loaded = statements()
    named = 0
    for file in resources.files("pgqueue.sql").iterdir():
        if not file.name.endswith(".sql") or file.name == "grants.sql":
            continue
        text = file.read_text(encoding="utf-8")
        for name, why in re.findall(r"^-- name: (\S+)\n(.*)$", text, flags=re.M):
            named += 1
            assert name in loaded, (file.name, name)
            assert why.startswith("-- ") and len(why) > 10, (file.name, name, why)
    assert named == len(loaded) > 50
