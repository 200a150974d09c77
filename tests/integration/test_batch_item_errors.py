"""A batch refused for one bad item says which item (its index in the list, from 0, and the
batch's size), with the error's own type and field, and writes nothing: pgqueue.enqueue_many
and a function task's enqueue_many alike."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.registry import TaskRegistry

TASKS = TaskRegistry()


@TASKS.task(name="resize")
def resize(image_id: int, width: int = 100) -> None:
    return None


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def batch_with(bad: dict[str, Any], at: int, size: int = 10) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "ok", "payload": {"n": i}} for i in range(size)]
    items[at] = bad
    return items


def test_a_bad_payload_names_its_item_and_keeps_its_type_and_field(conn):
    items = batch_with({"type": "ok", "payload": ["not", "an", "object"]}, at=3)

    with pytest.raises(pgqueue.InvalidPayload) as caught:
        pgqueue.enqueue_many(conn, items)

    assert str(caught.value).startswith("item 3 of 10: payload: must be a JSON object"), str(
        caught.value
    )
    assert caught.value.field == "payload"
    assert caught.value.index == 3  # type: ignore[attr-defined]
    assert count_tasks(conn) == 0


@pytest.mark.parametrize(
    ("bad", "error", "field", "message"),
    [
        # the plain dicts' fast path
        ({"type": "ok", "priority": "urgent"}, pgqueue.InvalidPriority, "priority", "priority:"),
        # the general path (an option the fast path does not take)
        ({"type": "ok", "delay": -1, "max_attempts": 0}, pgqueue.ValidationError, None, ""),
        ({"payload": {}}, pgqueue.ValidationError, "type", "type: is required"),
        ("ok", pgqueue.ValidationError, "tasks", "tasks: items must be dicts"),
    ],
)
def test_every_kind_of_bad_item_names_its_index(conn, bad, error, field, message):
    items = batch_with(bad, at=9)

    with pytest.raises(error) as caught:
        pgqueue.enqueue_many(conn, iter(items))  # any iterable, not only a list

    assert str(caught.value).startswith(f"item 9 of 10: {message}"), str(caught.value)
    if field is not None:
        assert caught.value.field == field
    assert count_tasks(conn) == 0


def test_a_function_tasks_batch_names_the_call_that_does_not_fit(conn):
    calls: list[Any] = [{"image_id": i} for i in range(5)]
    calls[2] = {"image_id": 1, "height": 3}

    with pytest.raises(pgqueue.InvalidArgument) as caught:
        resize.enqueue_many(conn, calls)

    assert str(caught.value) == "item 2 of 5: payload: unexpected argument 'height'"
    assert (caught.value.field, caught.value.argument) == ("payload", "height")
    assert count_tasks(conn) == 0

    calls[2] = resize.bind(7)
    calls[4] = {"width": 3}
    with pytest.raises(pgqueue.InvalidArgument) as caught:
        resize.enqueue_many(conn, tuple(calls))
    assert str(caught.value) == "item 4 of 5: payload: argument 'image_id' is missing"
    assert count_tasks(conn) == 0


def test_a_good_batch_is_written_whole(conn):
    results = pgqueue.enqueue_many(conn, batch_with({"type": "ok"}, at=0))
    handles = resize.enqueue_many(conn, [{"image_id": 1}, resize.bind(2, width=5)])

    assert len(results) == 10 and len(handles) == 2
    assert count_tasks(conn) == 12
