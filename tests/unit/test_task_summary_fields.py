"""The summary form of a task list: the same page as the whole form, less the payload and
the result. Read from the code and the statements, without a database (the behaviour against
PostgreSQL is tests/integration/test_task_list_summary.py)."""

from __future__ import annotations

import dataclasses
import re

from pgqueue.api.schemas import TaskOut, TaskSummaryOut
from pgqueue.models import Task
from pgqueue.queries import driver
from pgqueue.queries.tasks import TaskSummary

SIZES = {"payload_stored_bytes", "result_stored_bytes"}


def test_a_task_summary_has_every_field_of_a_task_but_its_payload_and_result() -> None:
    task = {f.name for f in dataclasses.fields(Task)}
    summary = {f.name for f in dataclasses.fields(TaskSummary)}
    assert summary == (task - {"payload", "result"}) | SIZES


def test_the_summary_answer_has_every_field_of_the_whole_answer_but_payload_and_result() -> None:
    whole = TaskOut.model_fields
    summary = TaskSummaryOut.model_fields
    assert set(summary) == (set(whole) - {"payload", "result"}) | SIZES
    # What both forms carry means the same in both (the edges say why they are empty).
    for name in set(summary) - SIZES - {"parents", "children", "last_error", "timeout_seconds"}:
        assert summary[name].description == whole[name].description, name


def _after_select_list(sql: str) -> str:
    """A statement from its FROM on, whitespace folded: its filters, cursor and order."""
    tail = sql[sql.index("FROM pgqueue.tasks") :]
    return re.sub(r"\s+", " ", tail).strip()


def test_the_summary_statement_filters_pages_and_orders_as_the_whole_list() -> None:
    statements = driver.statements()
    assert _after_select_list(statements["task_list_summary"]) == _after_select_list(
        statements["task_list"]
    )


def test_the_summary_statement_selects_neither_the_payload_nor_the_result() -> None:
    sql = driver.statements()["task_list_summary"]
    select_list = sql[: sql.index("FROM pgqueue.tasks")]
    assert "*" not in select_list
    # Both are named only inside pg_column_size, which reads no value.
    named = re.findall(r"\b(payload|result)\b", select_list)
    inside = re.findall(r"pg_column_size\((payload|result)\)", select_list)
    assert sorted(named) == sorted(inside) == ["payload", "result"]
