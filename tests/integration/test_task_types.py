"""One source of truth for a task's attempts: the declared task types.

A handler's ``max_attempts``/``retry`` lived only in the worker's memory, so everything read
before the first failure (the enqueue's answer, status, list, the API, the started log)
showed the global default. Workers now record their registry in ``pgqueue.task_types`` at
start; enqueue applies it where the caller gave no policy (per call > declared > default,
field by field), and a claim applies it to a task enqueued before the declaration existed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import test_api

import pgqueue
from pgqueue import RetryPolicy
from pgqueue.api.settings import ApiSettings
from pgqueue.queries import driver, task_types
from pgqueue.registry import TaskRegistry

T0 = datetime(2030, 1, 1, tzinfo=UTC)

start_server = test_api.start_server  # its fixture: `pgqueue serve` processes, stopped after


def declare(conn, registry: TaskRegistry) -> None:
    driver.run(conn, task_types.task_types_declare("w1", registry.declarations()))


def registry() -> TaskRegistry:
    tasks = TaskRegistry()

    @tasks.handler("once", max_attempts=1)
    def once(payload, ctx):
        raise ValueError("doomed")

    @tasks.handler("patient", retry=RetryPolicy(max_attempts=5, base=2, factor=3, cap=60))
    def patient(payload, ctx):
        return None

    @tasks.handler("plain")
    def plain(payload, ctx):
        return None

    return tasks


def stored(conn, task_id) -> tuple[int, float, float, float, bool | None]:
    row = conn.execute(
        "SELECT max_attempts, backoff_base, backoff_factor, backoff_cap, policy_default"
        " FROM pgqueue.tasks WHERE id = %s",
        (task_id,),
    ).fetchone()
    return tuple(row)


def test_a_declared_max_attempts_is_what_every_reader_shows_before_the_first_run(conn):
    declare(conn, registry())

    result = pgqueue.enqueue(conn, "once", {})

    assert result.task.max_attempts == 1
    assert pgqueue.get_task(conn, result.id).max_attempts == 1
    assert [t.max_attempts for t in pgqueue.list_tasks(conn, type="once")] == [1]


def test_a_declared_retry_policy_is_stored_whole(conn):
    declare(conn, registry())

    task_id = pgqueue.enqueue(conn, "patient", {}).id

    assert stored(conn, task_id) == (5, 2.0, 3.0, 60.0, None)


@pytest.mark.parametrize("keyed", [False, True], ids=["copy", "keyed insert"])
def test_bulk_enqueue_applies_declarations_as_the_single_one_does(conn, keyed):
    declare(conn, registry())
    items = [
        {"type": "once", "payload": {}},
        {"type": "patient", "payload": {}},
        {"type": "plain", "payload": {}},
        {"type": "undeclared", "payload": {}},
        {"type": "once", "payload": {}, "max_attempts": 4},
    ]
    if keyed:
        for n, item in enumerate(items):
            item["idempotency_key"] = f"k{n}"

    results = pgqueue.enqueue_many(conn, items)

    assert [r.task.max_attempts for r in results] == [1, 5, 3, 3, 4]
    assert [stored(conn, r.id) for r in results] == [
        (1, 1.0, 2.0, 300.0, None),
        (5, 2.0, 3.0, 60.0, None),
        (3, 1.0, 2.0, 300.0, None),  # declared, with no policy: the default, not pending
        (3, 1.0, 2.0, 300.0, True),  # nobody declared it: the first claim after may apply one
        (4, 1.0, 2.0, 300.0, None),
    ]


def test_the_callers_policy_wins_over_the_declaration_field_by_field(conn):
    declare(conn, registry())

    attempts_only = pgqueue.enqueue(conn, "patient", {}, max_attempts=7).id
    whole = pgqueue.enqueue(
        conn, "patient", {}, retry=RetryPolicy(max_attempts=2, base=0, factor=1, cap=0)
    ).id

    assert stored(conn, attempts_only) == (7, 2.0, 3.0, 60.0, None)
    assert stored(conn, whole) == (2, 0.0, 1.0, 0.0, None)


def test_an_undeclared_type_gets_the_global_default(conn):
    task = pgqueue.enqueue(conn, "nobody_declared_it", {}).task

    assert task.max_attempts == 3


def test_a_task_enqueued_before_the_declaration_takes_it_at_its_first_claim(conn):
    early = pgqueue.enqueue(conn, "once", {}, now=T0).id
    explicit = pgqueue.enqueue(conn, "once", {}, max_attempts=3, now=T0).id
    assert pgqueue.get_task(conn, early).max_attempts == 3  # nothing declared yet

    declare(conn, registry())
    claimed = pgqueue.claim(conn, ["default"], limit=2, worker_id="w1", now=T0)

    by_id = {t.id: t for t in claimed}
    assert by_id[early].max_attempts == 1  # what the worker runs and logs with
    assert pgqueue.get_task(conn, early).max_attempts == 1  # and what every reader sees
    assert stored(conn, early)[4] is None  # applied once: the mark is gone
    assert by_id[explicit].max_attempts == 3  # the caller's own policy is left alone

    outcome = pgqueue.fail(conn, by_id[early].lease, "doomed", now=T0 + timedelta(seconds=1))
    assert outcome.outcome is pgqueue.FailOutcome.DEAD  # one attempt, as declared


def test_a_claim_before_any_declaration_keeps_the_mark_for_a_later_one(conn):
    task_id = pgqueue.enqueue(conn, "once", {}, now=T0).id
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w1", now=T0)
    pgqueue.fail(conn, claimed.lease, "boom", retry_after=0, now=T0 + timedelta(seconds=1))
    assert stored(conn, task_id)[4] is True

    declare(conn, registry())
    (again,) = pgqueue.claim(
        conn, ["default"], limit=1, worker_id="w1", now=T0 + timedelta(seconds=2)
    )

    assert again.max_attempts == 1
    assert stored(conn, task_id)[4] is None


def test_redeclaring_replaces_the_declaration_and_an_unchanged_one_writes_nothing(conn):
    declare(conn, registry())
    (before,) = [r for r in driver.run(conn, task_types.task_types_list()) if r["type"] == "once"]

    declare(conn, registry())
    (same,) = [r for r in driver.run(conn, task_types.task_types_list()) if r["type"] == "once"]
    assert same["updated_at"] == before["updated_at"]

    changed = TaskRegistry()
    changed.handler("once", max_attempts=2)(lambda payload, ctx: None)
    driver.run(conn, task_types.task_types_declare("w2", changed.declarations()))

    assert pgqueue.enqueue(conn, "once", {}).task.max_attempts == 2
    (now,) = [r for r in driver.run(conn, task_types.task_types_list()) if r["type"] == "once"]
    assert now["declared_by"] == "w2"


def test_a_task_submitted_over_http_without_max_attempts_gets_the_declared_one(
    database_url, start_server, conn
):
    declare(conn, registry())
    client = start_server(ApiSettings(database_url=database_url)).client

    response = client.post("/api/v1/tasks", json={"type": "once", "payload": {}})
    assert response.status_code == 202, response.text
    assert response.json()["max_attempts"] == 1
    task_id = response.json()["task_id"]
    assert client.get(f"/api/v1/tasks/{task_id}").json()["max_attempts"] == 1
    explicit = client.post("/api/v1/tasks", json={"type": "once", "max_attempts": 4}).json()
    assert explicit["max_attempts"] == 4
