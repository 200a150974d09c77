"""A real failure, as every surface shows it: the exception first, the traceback on demand.

A real in-process worker runs a handler that raises ``ValueError("doomed always fails")``:
one task of it is dead-lettered (one attempt), another is waiting for its retry an hour away.
Then the HTTP API (a task, the failures list, the dead-letters list) and the CLI (``status``
and ``dlq show``, as a table and as JSON) must all give ``ValueError: doomed always fails`` as
the summary, before a traceback that starts with Python's header and names the handler.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from helpers import run_worker_until

import pgqueue
from pgqueue.api import ApiSettings

SUMMARY = "ValueError: doomed always fails"
HEADER = "Traceback (most recent call last):"


def doomed_charge(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    raise ValueError("doomed always fails")


@dataclasses.dataclass(frozen=True)
class Failed:
    dead: uuid.UUID  # dead-lettered after its one attempt
    retrying: uuid.UUID  # failed once, its retry an hour or so away


@pytest.fixture
def failed(conn: psycopg.Connection[Any], database_url: str) -> Failed:
    dead = pgqueue.enqueue(conn, "charge.dead", {"order": 1}, queue="payments").id
    retrying = pgqueue.enqueue(conn, "charge.retrying", {"order": 2}, queue="payments").id
    registry = pgqueue.TaskRegistry()
    registry.handler("charge.dead", max_attempts=1)(doomed_charge)
    later = pgqueue.RetryPolicy(max_attempts=5, base=3600.0, cap=7200.0)
    registry.handler("charge.retrying", retry=later)(doomed_charge)

    def both_failed() -> bool:
        first, second = pgqueue.get_task(conn, dead), pgqueue.get_task(conn, retrying)
        return first.status is pgqueue.TaskStatus.FAILED and (
            second.attempts == 1 and second.status is pgqueue.TaskStatus.QUEUED
        )

    run_worker_until(database_url, registry, both_failed, queues=["payments"])
    return Failed(dead=dead, retrying=retrying)


def check_split(item: dict[str, Any], handler: str = "doomed_charge") -> None:
    """The API's and the CLI's JSON: the summary, and the traceback where it failed."""
    assert item["last_error_summary"] == SUMMARY, item
    traceback = item["last_error_traceback"]
    assert traceback is not None and traceback.startswith(HEADER), traceback
    assert f"in {handler}" in traceback
    assert traceback.rstrip().endswith(SUMMARY)
    assert item["last_error"].startswith(SUMMARY + "\n" + HEADER)


@pytest.fixture
def api(database_url: str) -> Any:
    client = Api(ApiSettings(database_url=database_url))
    try:
        yield client
    finally:
        client.close()


# --- the HTTP API ----------------------------------------------------------------------------


def test_the_api_task_gives_the_exception_as_summary_and_the_traceback_apart(failed, api):
    for task_id in (failed.dead, failed.retrying):
        got = api.request("GET", f"/api/v1/tasks/{task_id}")
        assert got.status_code == 200, got.text
        check_split(got.json())


def test_the_api_failures_list_gives_the_exception_for_retrying_and_dead_tasks(failed, api):
    got = api.request("GET", "/api/v1/failures")
    assert got.status_code == 200, got.text
    body = got.json()
    (retrying,) = body["retrying"]
    (dead,) = body["dead"]
    assert (retrying["task_id"], dead["task_id"]) == (str(failed.retrying), str(failed.dead))
    check_split(retrying)
    check_split(dead)


def test_the_api_dead_letters_list_gives_the_exception_first(failed, api):
    got = api.request("GET", "/api/v1/dead-letters")
    assert got.status_code == 200, got.text
    items = got.json()["items"]
    assert [item["task_id"] for item in items] == [str(failed.dead)]
    check_split(items[0])


# --- the CLI ---------------------------------------------------------------------------------


def check_table(stdout: str) -> None:
    """The human form: the exception on the ``last error`` line, the traceback below it."""
    lines = stdout.splitlines()
    summary_at = next(i for i, line in enumerate(lines) if line.startswith("last error"))
    assert lines[summary_at].split(None, 2)[-1].strip() == SUMMARY, stdout
    header_at = next(i for i, line in enumerate(lines) if HEADER in line)
    assert summary_at < header_at, stdout
    assert "in doomed_charge" in stdout


@pytest.mark.parametrize("which", ["dead", "retrying"])
def test_cli_status_shows_the_exception_line_before_the_traceback(failed, database_url, which):
    task_id = getattr(failed, which)
    shown = run_main(database_url, "status", str(task_id))
    assert shown.code == 0, shown.stderr
    check_table(shown.stdout)
    as_json = run_main(database_url, "--json", "status", str(task_id))
    assert as_json.code == 0, as_json.stderr
    check_split(json.loads(as_json.stdout))


def test_cli_dlq_show_shows_the_exception_line_before_the_traceback(failed, database_url):
    shown = run_main(database_url, "dlq", "show", str(failed.dead))
    assert shown.code == 0, shown.stderr
    check_table(shown.stdout)
    as_json = run_main(database_url, "--json", "dlq", "show", str(failed.dead))
    assert as_json.code == 0, as_json.stderr
    check_split(json.loads(as_json.stdout))
