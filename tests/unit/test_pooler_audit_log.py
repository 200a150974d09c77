"""How the pooler pass's watch reads the server's log (tests/pooler_audit.py): what a record
of the pooler's role shows, and records that span lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from pooler_audit import ROLE, LogReader, findings_in_record


def kinds(message: str, user: str = ROLE, level: str = "LOG") -> list[str]:
    return sorted(f.kind for f in findings_in_record(user, "db", 1, level, message))


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("duration: 0.1 ms  parse <unnamed>: SELECT $1", []),
        ("duration: 0.1 ms  bind <unnamed>: SELECT $1", []),
        ("duration: 0.1 ms  execute <unnamed>: SELECT $1", []),
        ("duration: 0.1 ms  parse _pg3_0: SELECT $1", ["prepared statement"]),
        ("duration: 0.1 ms  bind _pg3_0: SELECT $1", ["prepared statement"]),
        ("duration: 0.1 ms  execute _pg3_0/portal: SELECT $1", ["prepared statement"]),
        ("duration: 0.1 ms  statement: PREPARE p AS SELECT 1", ["prepared statement"]),
        ("duration: 0.1 ms  statement: LISTEN pgqueue", ["LISTEN"]),
        ("duration: 0.1 ms  statement: -- wake-ups\nlisten pgqueue", ["LISTEN"]),
        ("duration: 0.1 ms  statement: SELECT 1; LISTEN pgqueue", ["LISTEN"]),
        ("duration: 0.1 ms  statement: NOTIFY pgqueue, 'LISTEN'", []),
        ("duration: 0.1 ms  statement: SELECT pg_advisory_lock(1)", ["session advisory lock"]),
        (
            "duration: 0.1 ms  execute <unnamed>: SELECT pg_try_advisory_lock($1)",
            ["session advisory lock"],
        ),
        (
            "duration: 0.1 ms  statement: SELECT pg_advisory_lock_shared(1)",
            ["session advisory lock"],
        ),
        ("duration: 0.1 ms  statement: SELECT pg_advisory_xact_lock(1)", []),
        ("duration: 0.1 ms  statement: SELECT pg_try_advisory_xact_lock(1)", []),
    ],
)
def test_what_a_record_of_the_pooled_role_shows(message: str, expected: list[str]) -> None:
    assert kinds(message) == expected


def test_a_prepared_statement_error_is_a_finding_and_other_users_records_are_not() -> None:
    assert kinds('prepared statement "_pg3_0" already exists', level="ERROR") == [
        "prepared statement"
    ]
    assert kinds('prepared statement "_pg3_4" does not exist', level="ERROR") == [
        "prepared statement"
    ]
    assert kinds("duration: 0.1 ms  statement: LISTEN pgqueue", user="postgres") == []


def test_a_record_over_several_lines_is_read_whole_and_the_last_held_until_it_ends(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    first = "2026-12-04 23:49:20.412 UTC [11] pgqueue_pooled@db LOG:  duration: 1 ms  statement: "
    second = "2026-12-04 23:49:20.413 UTC [12] postgres@db LOG:  duration: 1 ms  statement: "
    log.write_text(f"{first}SELECT 1\n\tFROM t\n{second}SELECT 2\n")
    reader = LogReader(log)
    assert list(reader.read()) == [
        ("pgqueue_pooled", "db", 11, "LOG", "duration: 1 ms  statement: SELECT 1\n\tFROM t")
    ]
    with log.open("a") as f:
        f.write("\tFROM u\n2026-12-04 23:49:20.414 UTC [13] pgqueue_pooled@db LOG:  dur")
    assert list(reader.read()) == []  # the next record's first line is not whole yet
    with log.open("a") as f:
        f.write("ation: 1 ms  statement: LISTEN x\n")
    assert [r[4] for r in reader.read()] == ["duration: 1 ms  statement: SELECT 2\n\tFROM u"]
    assert [r[2] for r in reader.flush()] == [13]
