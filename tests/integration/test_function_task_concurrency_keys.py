"""A function task's concurrency key: declared with ``@tasks.task(concurrency_key=...)`` as
the name of a parameter (the key is that argument's value, as ``str``) or a function of the
call's arguments, or given for a call with ``.options(concurrency_key=...)``; carried by every
way a call is submitted (``enqueue``, ``aenqueue``, ``bind``, ``enqueue_many``, ``s``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until

import pgqueue
from pgqueue.registry import TaskRegistry


def stored_key(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str | None:
    row = conn.execute(
        "SELECT concurrency_key FROM pgqueue.tasks WHERE id = %s", [task_id]
    ).fetchone()
    assert row is not None, "the task was not written"
    return row[0]  # type: ignore[no-any-return]


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def by_parameter() -> tuple[TaskRegistry, Any]:
    tasks = TaskRegistry()

    @tasks.task(name="bill", concurrency_key="account_id")
    def bill(account_id: int, amount: int = 0, *, note: str | None = None) -> None:
        return None

    return tasks, bill


# --- the key is a parameter's argument ---------------------------------------------------------


def test_a_parameter_name_makes_that_arguments_value_the_key(conn):
    _, bill = by_parameter()

    positional = bill.enqueue(conn, 42, 10)
    keyword = bill.enqueue(conn, amount=5, account_id=7)

    assert stored_key(conn, positional.id) == "42"  # str() of the argument
    assert stored_key(conn, keyword.id) == "7"
    assert positional.task.concurrency_key == "42"
    assert pgqueue.get_task(conn, keyword.id).concurrency_key == "7"


def test_a_parameter_left_at_its_default_gives_the_default_and_none_gives_no_key(conn):
    tasks = TaskRegistry()

    @tasks.task(name="sync", concurrency_key="region")
    def sync(item: int, region: str | None = "eu") -> None:
        return None

    defaulted = sync.enqueue(conn, 1)
    given = sync.enqueue(conn, 2, "us")
    none = sync.enqueue(conn, 3, None)

    assert [stored_key(conn, h.id) for h in (defaulted, given, none)] == ["eu", "us", None]


def test_a_parameter_whose_value_is_no_valid_key_is_refused_naming_the_field(conn):
    tasks = TaskRegistry()

    @tasks.task(name="label", concurrency_key="tenant")
    def label(tenant: str) -> None:
        return None

    for bad in ("", "t" * 201):
        with pytest.raises(pgqueue.ValidationError) as info:
            label.enqueue(conn, bad)
        assert info.value.field == "concurrency_key"
    assert count_tasks(conn) == 0


# --- the key is a function of the arguments ----------------------------------------------------


def test_a_key_function_is_called_with_the_calls_arguments_as_the_task_function_is(conn):
    tasks = TaskRegistry()
    calls: list[tuple[Any, ...]] = []

    def key(account: dict[str, Any], /, amount: int, *, region: str = "eu") -> str:
        calls.append((account, amount, region))
        return f"{region}:{account['id']}"

    @tasks.task(name="charge", concurrency_key=key)
    def charge(
        account: dict[str, Any], /, amount: int, *, region: str = "eu", ctx: pgqueue.TaskContext
    ) -> None:
        return None

    first = charge.enqueue(conn, {"id": 9}, 100)
    second = charge.enqueue(conn, {"id": 3}, amount=1, region="us")

    assert calls == [({"id": 9}, 100, "eu"), ({"id": 3}, 1, "us")]
    assert [stored_key(conn, h.id) for h in (first, second)] == ["eu:9", "us:3"]


def test_a_key_function_returning_none_gives_no_key(conn):
    tasks = TaskRegistry()

    @tasks.task(name="maybe", concurrency_key=lambda tenant=None: tenant)
    def maybe(tenant: str | None = None) -> None:
        return None

    assert stored_key(conn, maybe.enqueue(conn).id) is None
    assert stored_key(conn, maybe.enqueue(conn, "t1").id) == "t1"


def test_a_key_function_returning_something_else_is_refused_naming_the_field(conn):
    tasks = TaskRegistry()

    @tasks.task(name="numbered", concurrency_key=lambda n: n)
    def numbered(n: int) -> None:
        return None

    with pytest.raises(pgqueue.ValidationError) as info:
        numbered.enqueue(conn, 5)

    assert info.value.field == "concurrency_key"
    assert "returned int, not a str or None" in info.value.reason
    assert count_tasks(conn) == 0


# --- declared wrongly: refused at decoration time ------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ("acount_id", "'acount_id' is not a parameter of the function (its parameters: "),
        ("ctx", "'ctx' is the task's context, not an argument"),
        (42, "must be the name of a parameter of the function or a function of its arguments"),
    ],
)
def test_a_key_that_names_no_parameter_is_refused_when_the_function_is_declared(rule, reason):
    tasks = TaskRegistry()

    def bill(account_id: int, ctx: pgqueue.TaskContext) -> None:
        return None

    with pytest.raises(pgqueue.ValidationError) as info:
        tasks.task(name="bill", concurrency_key=rule)(bill)

    assert info.value.field == "concurrency_key"
    assert reason in info.value.reason
    assert tasks.types == []


# --- .options(concurrency_key=...) -------------------------------------------------------------


def test_options_override_the_declared_key_for_those_calls_only(conn):
    _, bill = by_parameter()

    overridden = bill.options(concurrency_key="vip").enqueue(conn, 42)
    declared = bill.enqueue(conn, 42)

    assert stored_key(conn, overridden.id) == "vip"
    assert stored_key(conn, declared.id) == "42"


def test_options_give_a_key_to_a_function_that_declares_none(conn):
    tasks = TaskRegistry()

    @tasks.task(name="plain")
    def plain(n: int) -> None:
        return None

    keyed = plain.options(concurrency_key="acct-1").enqueue(conn, 1)
    unkeyed = plain.enqueue(conn, 2)

    assert (stored_key(conn, keyed.id), stored_key(conn, unkeyed.id)) == ("acct-1", None)


def test_options_with_a_bad_key_are_refused_when_enqueued_naming_the_field(conn):
    _, bill = by_parameter()

    with pytest.raises(pgqueue.ValidationError) as info:
        bill.options(concurrency_key="x\x00y").enqueue(conn, 1)

    assert info.value.field == "concurrency_key"
    assert count_tasks(conn) == 0


# --- every way a call is submitted -------------------------------------------------------------


def test_bind_enqueue_many_and_aenqueue_carry_the_declared_key(database_url, conn):
    _, bill = by_parameter()

    bound = pgqueue.enqueue_many(conn, [bill.bind(1), bill.options(concurrency_key="o").bind(2)])
    many = bill.enqueue_many(conn, [{"account_id": 3}, bill.bind(4)])

    async def submit() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            handle = await bill.aenqueue(aconn, 5)
            [other] = await bill.aenqueue_many(aconn, [{"account_id": 6}])
            assert stored_key(conn, other.id) == "6"
            return handle.id

    later = asyncio.run(submit())

    assert [stored_key(conn, r.id) for r in bound] == ["1", "o"]
    assert [stored_key(conn, h.id) for h in many] == ["3", "4"]
    assert stored_key(conn, later) == "5"


def test_a_workflow_step_of_a_keyed_function_carries_its_key(conn):
    tasks = TaskRegistry()

    @tasks.task(name="fetch", concurrency_key="account_id")
    def fetch(account_id: int) -> int:
        return account_id

    # Called without the parameter that receives the parents' results, unknown until then.
    @tasks.task(name="store", concurrency_key=lambda account_id, **_: str(account_id))
    def store(rows: int, account_id: int) -> None:
        return None

    handle = pgqueue.chain(fetch.s(7), store.s(account_id=7)).enqueue(conn)

    assert [stored_key(conn, t.id) for t in handle.tasks] == ["7", "7"]


def test_a_step_whose_key_function_needs_the_parents_result_is_refused_naming_the_field(conn):
    tasks = TaskRegistry()

    @tasks.task(name="store", concurrency_key=lambda rows, account_id: str(rows))
    def store(rows: int, account_id: int) -> None:
        return None

    with pytest.raises(pgqueue.ValidationError) as info:
        store.s(account_id=7)

    assert info.value.field == "concurrency_key"
    assert "cannot take these arguments (missing a required argument: 'rows')" in str(info.value)
    assert count_tasks(conn) == 0


def test_a_step_whose_key_parameter_receives_the_parents_result_needs_its_key_given(conn):
    tasks = TaskRegistry()

    @tasks.task(name="total", concurrency_key="account_id")
    def total(account_id: int) -> None:
        return None

    with pytest.raises(pgqueue.ValidationError) as info:
        total.s()

    handle = pgqueue.chain(
        pgqueue.step("source"), total.options(concurrency_key="acct-1").s()
    ).enqueue(conn)

    assert info.value.field == "concurrency_key"
    assert "receives the parents' results" in info.value.reason
    assert stored_key(conn, handle.tasks[1].id) == "acct-1"


def test_a_keyed_function_task_runs_with_its_arguments_and_sees_its_key(database_url, conn):
    tasks = TaskRegistry()
    seen: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    @tasks.task(name="bill", concurrency_key="account_id")
    def bill(account_id: int, ctx: pgqueue.TaskContext) -> None:
        with lock:
            seen.append((account_id, ctx.concurrency_key))

    bill.enqueue(conn, 42)

    run_worker_until(database_url, tasks, lambda: len(seen) == 1)

    assert seen == [(42, "42")]
