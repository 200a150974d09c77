"""Where the progress column is read and written, from the statements themselves (no
database): only the statements that read a whole task read it, never a claim, a completion
or a heartbeat, which run for every task; and only the lease holder's fenced write sets it."""

from __future__ import annotations

import re

from pgqueue.queries import driver

HOT = [
    "task_claim",
    "task_claim_limited",
    "task_claim_keyed",
    "task_complete",
    "task_fail",
    "task_heartbeat",
    "task_release",
    "task_snooze",
    "task_cancel_requested",
]


def test_the_hot_statements_neither_name_nor_return_every_column() -> None:
    statements = driver.statements()
    for name in HOT:
        sql = re.sub(r"--[^\n]*", "", statements[name])  # comments may mention anything
        assert "progress" not in sql, name
        assert not re.search(r"RETURNING\s+(\w+\.)?\*", sql), name
        assert not re.search(r"SELECT\s+(\w+\.)?\*\s+FROM\s+pgqueue\.tasks", sql), name


def test_only_the_fenced_write_sets_the_progress() -> None:
    statements = driver.statements()
    writers = [
        name
        for name, sql in statements.items()
        if re.search(r"\bprogress\s*=", re.sub(r"--[^\n]*", "", sql))
    ]
    assert writers == ["task_progress"]
    assert "lease_token = %(token)s" in statements["task_progress"]
