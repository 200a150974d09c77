"""The command line and concurrency keys: ``pgqueue enqueue --concurrency-key KEY`` stores it,
``pgqueue status ID`` shows it (as a line, and in ``--json``), and a bad one exits 2 naming the
field, with nothing written. Through the real entry point, ``pgqueue.cli.main()``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from boundaries import run_main

import pgqueue


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def test_enqueue_stores_the_key_and_status_shows_it(database_url, conn):
    submitted = run_main(database_url, "--json", "enqueue", "report", "--concurrency-key=acct-42")

    assert submitted.code == 0, submitted.stderr
    task_id = uuid.UUID(json.loads(submitted.stdout)["task_id"])
    assert json.loads(submitted.stdout)["concurrency_key"] == "acct-42"
    assert pgqueue.get_task(conn, task_id).concurrency_key == "acct-42"
    shown = run_main(database_url, "status", str(task_id))
    assert shown.code == 0, shown.stderr
    assert [line.split() for line in shown.stdout.splitlines() if "concurrency" in line] == [
        ["concurrency", "key:", "acct-42"]
    ]
    as_json = run_main(database_url, "--json", "status", str(task_id))
    assert json.loads(as_json.stdout)["concurrency_key"] == "acct-42"


def test_status_of_a_task_without_a_key_shows_no_key_line_and_json_null(database_url, conn):
    task_id = pgqueue.enqueue(conn, "report").id

    shown = run_main(database_url, "status", str(task_id))
    as_json = run_main(database_url, "--json", "status", str(task_id))

    assert shown.code == 0 and "concurrency" not in shown.stdout
    assert json.loads(as_json.stdout)["concurrency_key"] is None


def test_enqueue_without_the_option_stores_no_key(database_url, conn):
    submitted = run_main(database_url, "--json", "enqueue", "report")

    task_id = json.loads(submitted.stdout)["task_id"]
    assert pgqueue.get_task(conn, task_id).concurrency_key is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "concurrency_key: must not be empty"),
        ("   ", "concurrency_key: must not be empty"),
        ("k" * 201, "concurrency_key: is 201 characters long; the limit is 200"),
        ("t\udcff", "concurrency_key: must be valid Unicode (it has a lone surrogate)"),
    ],
    ids=["empty", "blank", "201 characters", "byte 0xFF"],
)
def test_a_bad_key_exits_2_naming_the_field_and_writes_nothing(database_url, conn, value, message):
    plain = run_main(database_url, "enqueue", "t", f"--concurrency-key={value}")
    as_json = run_main(database_url, "--json", "enqueue", "t", f"--concurrency-key={value}")

    assert (plain.code, plain.stdout, plain.stderr) == (2, "", f"error: {message}\n")
    assert (as_json.code, as_json.stdout) == (2, "")
    error = json.loads(as_json.stderr)
    assert (error["error"], error["field"], error["exit_code"]) == (
        "invalid_request",
        "concurrency_key",
        2,
    )
    assert count_tasks(conn) == 0
