"""The bulk enqueue's fast paths give what the general ones give: the same specs, the same
errors (type, message, field), the same Tasks, the same kind of ids. No database."""

import dataclasses
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

import pgqueue
from pgqueue.enqueue import MAX_JSON_DEPTH, new_task_id, new_task_ids, prepare, prepare_plain
from pgqueue.models import EnqueueResult, Priority, Task, TaskStatus, built
from pgqueue.queries.specs import _inserted

LIMIT = 200


def _deep(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    return out


GOOD: list[dict[str, Any]] = [
    {"type": "t"},
    {"type": "t", "payload": None},
    {"type": "t", "payload": {"n": 1, "s": "ключ ✓", "l": [1, {"x": None}]}},
    {"type": "t", "payload": OrderedDict(a=1)},  # a dict subclass is kept as it is
    {"type": "t", "payload": MappingProxyType({"a": 1})},  # any Mapping, stored as a dict
    {"type": "t", "queue": "q", "priority": "high"},
    {"type": "t", "queue": None, "priority": None},
    {"type": "t", "priority": 2},
    {"type": "t", "priority": Priority.LOW},
    {"type": "t", "payload": {"x": "[" * 150}},  # brackets in strings do not nest
]

BAD: dict[str, dict[str, Any]] = {
    "empty type": {"type": ""},
    "blank type": {"type": "  "},
    "int type": {"type": 5},
    "unhashable type": {"type": ["t"]},
    "NUL in type": {"type": "a\x00b"},
    "long type": {"type": "t" * 1000},
    "surrogate type": {"type": "\ud800"},
    "bad queue": {"type": "t", "queue": ""},
    "unhashable queue": {"type": "t", "queue": {}},
    "unknown priority": {"type": "t", "priority": "urgent"},
    "bool priority": {"type": "t", "priority": True},
    "out-of-range priority": {"type": "t", "priority": 7},
    "list payload": {"type": "t", "payload": [1]},
    "str payload": {"type": "t", "payload": "x"},
    "NaN": {"type": "t", "payload": {"x": float("nan")}},
    "set": {"type": "t", "payload": {"x": {1}}},
    "tuple key": {"type": "t", "payload": {(1, 2): 3}},
    "too large": {"type": "t", "payload": {"x": "y" * LIMIT}},
    "too deep": {"type": "t", "payload": _deep(MAX_JSON_DEPTH + 1)},
    "far too deep": {"type": "t", "payload": _deep(5000)},
    "lone surrogate": {"type": "t", "payload": {"x": "\ud800"}},
    "NUL": {"type": "t", "payload": {"x": "a\x00"}},
    "bad type before bad payload": {"type": "", "payload": [1]},
    "bad priority before bad payload": {"type": "t", "priority": "x", "payload": [1]},
}


@pytest.mark.parametrize("item", GOOD, ids=repr)
def test_prepare_plain_builds_what_prepare_builds(item):
    task_id = new_task_id()
    expected = prepare(**item, max_payload_bytes=LIMIT)._replace(id=task_id)
    got = prepare_plain(task_id, item, LIMIT, set())
    assert got == expected
    assert type(got.payload) is type(expected.payload)


def _raised(call: Any) -> tuple[type, str, object]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value), getattr(info.value, "field", None)


@pytest.mark.parametrize("name", list(BAD))
def test_prepare_plain_refuses_what_prepare_refuses_with_the_same_error(name):
    item = BAD[name]
    expected = _raised(lambda: prepare(**item, max_payload_bytes=LIMIT))
    assert _raised(lambda: prepare_plain(new_task_id(), item, LIMIT, set())) == expected
    # Names remembered from good items of the batch change nothing.
    names: set[str] = set()
    for good in GOOD:
        prepare_plain(new_task_id(), good, LIMIT, names)
    assert _raised(lambda: prepare_plain(new_task_id(), item, LIMIT, names)) == expected


# Items with a concurrency key: prepare_plain is given the item's key by as_specs.
GOOD_KEYED: list[dict[str, Any]] = [
    {"type": "t", "concurrency_key": "acct-1"},
    {"type": "t", "queue": "q", "priority": "low", "concurrency_key": "\U0001f389" * 200},
    {"type": "t", "concurrency_key": None},
]
BAD_KEYED: dict[str, dict[str, Any]] = {
    "empty key": {"type": "t", "concurrency_key": ""},
    "int key": {"type": "t", "concurrency_key": 7},
    "long key": {"type": "t", "concurrency_key": "k" * 201},
    "NUL in key": {"type": "t", "concurrency_key": "a\x00"},
    "bad queue before bad key": {"type": "t", "queue": "", "concurrency_key": ""},
    "bad key before bad priority": {"type": "t", "concurrency_key": "", "priority": "x"},
    "bad key before bad payload": {"type": "t", "concurrency_key": "", "payload": [1]},
}


@pytest.mark.parametrize("item", GOOD_KEYED, ids=repr)
def test_prepare_plain_with_a_key_builds_what_prepare_builds(item):
    task_id = new_task_id()
    expected = prepare(**item, max_payload_bytes=LIMIT)._replace(id=task_id)
    got = prepare_plain(task_id, item, LIMIT, set(), item["concurrency_key"])
    assert got == expected and got.concurrency_key == item["concurrency_key"]


@pytest.mark.parametrize("name", list(BAD_KEYED))
def test_prepare_plain_with_a_key_refuses_what_prepare_refuses_with_the_same_error(name):
    item = BAD_KEYED[name]
    expected = _raised(lambda: prepare(**item, max_payload_bytes=LIMIT))
    got = _raised(lambda: prepare_plain(new_task_id(), item, LIMIT, set(), item["concurrency_key"]))
    assert got == expected


def test_a_batch_of_dicts_with_and_without_keys_takes_each_ones_key():
    from pgqueue.operations import as_specs

    specs = as_specs([{"type": "t", "concurrency_key": "a"}, {"type": "t"}, GOOD_KEYED[1]])
    assert [s.concurrency_key for s in specs] == ["a", None, GOOD_KEYED[1]["concurrency_key"]]


def test_a_batch_of_dicts_gets_increasing_ids_in_its_order_with_options_or_not():
    prepared = pgqueue.prepare("t")
    items: list[Any] = [{"type": "t"}, {"type": "t", "delay": 5}, prepared, {"type": "t"}]
    from pgqueue.operations import as_specs

    specs = as_specs(items)
    fresh = [s.id for s in specs if s is not prepared]
    assert fresh == sorted(fresh) and len(set(fresh)) == 3
    assert specs[2] is prepared and specs[1].delay_seconds == 5.0


def test_new_task_ids_are_uuid7_and_continue_the_single_ids_order():
    ids = [new_task_id(), *new_task_ids(10_000), new_task_id(), *new_task_ids(3)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids, key=lambda i: i.int) and len(set(ids)) == len(ids)
    assert all(uuid.UUID(str(i)) == i and hash(uuid.UUID(int=i.int)) == hash(i) for i in ids)
    assert new_task_ids(0) == []


def test_a_built_task_is_the_task_its_init_makes():
    spec = prepare("t", {"n": 1}, idempotency_key="k")
    now = datetime.now(UTC)
    task = _inserted(spec._replace(concurrency_key="acct-1"), now, now, 3, "q", 1, now)
    made = Task(
        id=spec.id,
        queue="q",
        type="t",
        payload={"n": 1},
        priority=Priority.NORMAL,
        status=TaskStatus.QUEUED,
        attempts=0,
        max_attempts=3,
        visible_after=now,
        idempotency_key="k",
        result=None,
        last_error=None,
        cancel_requested=False,
        lease_owner=None,
        lease_expires_at=None,
        created_at=now,
        started_at=None,
        finished_at=None,
        ready_since=now,
        expires_at=now,
        concurrency_key="acct-1",
    )
    assert task == made and repr(task) == repr(made) and hash(task.id) == hash(made.id)
    assert list(vars(task)) == [f.name for f in dataclasses.fields(Task)]  # every field
    assert type(task.priority) is Priority
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.queue = "other"  # type: ignore[misc]
    result = built(EnqueueResult, {"task": task, "created": True})
    assert result == EnqueueResult(task, True) and result.id == spec.id
