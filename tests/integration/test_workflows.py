"""Workflows: chain, group and chord built in Python, written by one enqueue_many in
the caller's transaction, run by a real worker against real PostgreSQL, results passed from
parents to children (function tasks through their unbound parameter, handler types through
ctx.parent_results)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import pgqueue
from pgqueue.models import TaskStatus
from pgqueue.registry import TaskRegistry


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def arithmetic() -> tuple[TaskRegistry, Any, Any, Any, dict[str, Any]]:
    tasks = TaskRegistry()
    seen: dict[str, Any] = {}

    @tasks.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @tasks.task(name="total")
    def total(values: list[int], scale: int = 1) -> int:
        return sum(values) * scale

    @tasks.task(name="boom", max_attempts=1)
    def boom(x: int) -> int:
        raise RuntimeError(f"boom {x}")

    @tasks.handler("report")
    def report(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        seen["report"] = ctx.parent_results
        seen["statuses"] = [p.status for p in ctx.parents]
        return {"sum": sum(r for r in ctx.parent_results if r is not None)}

    return tasks, add, total, boom, seen


def final(conn: psycopg.Connection[Any], handle: pgqueue.WorkflowHandle) -> bool:
    conn.rollback()
    finished = {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    return all(pgqueue.get_task(conn, t.id).status in finished for t in handle.tasks)


def test_a_chain_passes_each_result_to_the_next_step(database_url, conn, connect):
    tasks, add, _, _, _ = arithmetic()
    handle = pgqueue.chain(add.s(1, 2), add.s(10), add.options(priority="high").s(100)).enqueue(
        conn
    )
    conn.commit()

    assert len(handle.tasks) == 3 and handle.result_task is handle.tasks[-1]
    rows = [pgqueue.get_task(conn, t.id) for t in handle.tasks]
    assert [r.status for r in rows] == [TaskStatus.QUEUED, TaskStatus.WAITING, TaskStatus.WAITING]
    assert {r.workflow_id for r in rows} == {handle.id}
    # The receiving parameter holds a marker the worker replaces.
    assert rows[1].payload == {"x": 10, "y": {"$pgqueue": "parent_result"}}
    run_worker_until(database_url, tasks, lambda: final(conn, handle))

    assert [pgqueue.get_task(conn, t.id).result for t in handle.tasks] == [3, 13, 113]
    assert handle.wait(connect(), timeout=5) == 113


def test_a_chord_callback_gets_the_headers_results_in_order(database_url, conn, connect):
    tasks, add, total, _, _ = arithmetic()
    handle = pgqueue.chord([add.s(i, i) for i in range(6)], total.s(scale=10)).enqueue(conn)
    conn.commit()

    assert [t.type for t in handle.tasks] == ["add"] * 6 + ["total"]
    parents = pgqueue.parents(conn, handle.tasks[-1].id)
    assert [p.task_id for p in parents] == [t.id for t in handle.tasks[:6]]
    run_worker_until(database_url, tasks, lambda: final(conn, handle))

    assert handle.wait(connect(), timeout=5) == 10 * sum(2 * i for i in range(6))
    # The workflow as pgqueue.workflow reads it: the same tasks, in the same build order.
    info = pgqueue.workflow(conn, handle.id)
    assert [t.task.id for t in info.tasks] == [t.id for t in handle.tasks]
    assert info.status.value == "completed" and info.result == handle.wait(connect(), timeout=5)


def test_a_group_in_a_chain_gives_the_next_step_the_list(database_url, conn, connect):
    tasks, add, total, _, seen = arithmetic()
    flow = pgqueue.chain(
        add.s(1, 1),
        pgqueue.group(add.s(10), add.s(20), pgqueue.chain(add.s(30), add.s(1))),
        pgqueue.step("report"),
        pgqueue.chord([add.s(0, 5)], total.s()),  # a chord of one still gives a list
    )
    handle = flow.enqueue(conn)
    conn.commit()
    run_worker_until(database_url, tasks, lambda: final(conn, handle))

    results = [pgqueue.get_task(conn, t.id).result for t in handle.tasks]
    # 2; then 12, 22, (32 then 33); report gets [12, 22, 33].
    assert results[:6] == [2, 12, 22, 32, 33, {"sum": 67}]
    assert seen["report"] == [12, 22, 33]
    assert results[-1] == 5
    assert handle.wait(connect(), timeout=5) == 5


def test_group_alone_waits_for_every_member(database_url, conn, connect):
    tasks, add, _, _, _ = arithmetic()
    handle = pgqueue.group(add.s(i, 1) for i in range(3)).enqueue(conn)
    conn.commit()
    assert handle.result_task is None and len(handle.sinks) == 3
    run_worker_until(database_url, tasks, lambda: final(conn, handle))
    assert handle.wait(connect(), timeout=5) == [1, 2, 3]


def test_a_cleanup_step_runs_after_a_failure_and_sees_it(database_url, conn, connect):
    tasks, add, total, boom, seen = arithmetic()

    @tasks.task(name="tidy")
    def tidy(previous: Any, ctx: pgqueue.TaskContext) -> str:
        return f"tidied after {previous} ({ctx.parents[0].status})"

    flow = pgqueue.chord([add.s(1, 2), boom.s(7)], pgqueue.chain(total.s(), add.s(1)))
    handle = pgqueue.chain(flow, pgqueue.step("report", on_parent_failure="run")).enqueue(conn)
    fluent = pgqueue.chain(boom.s(1), tidy.s().run_anyway()).enqueue(conn)
    failing = pgqueue.chain(boom.s(2), add.s(1)).enqueue(conn)
    conn.commit()
    run_worker_until(
        database_url,
        tasks,
        lambda: final(conn, handle) and final(conn, fluent) and final(conn, failing),
    )

    rows = [pgqueue.get_task(conn, t.id) for t in handle.tasks]
    assert [r.status for r in rows] == [
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,  # the callback: a parent failed
        TaskStatus.CANCELLED,  # and the step after it
        TaskStatus.COMPLETED,  # the clean-up step ran anyway
    ]
    assert rows[2].cancelled_by == rows[1].id
    assert rows[3].cancelled_by == rows[2].id
    assert seen["report"] == [None] and seen["statuses"] == [TaskStatus.CANCELLED]
    assert pgqueue.get_task(conn, fluent.tasks[1].id).result == "tidied after None (failed)"
    # Waiting for a workflow with a dead-lettered task says so (pgqueue.wait_workflow).
    with pytest.raises(pgqueue.WorkflowFailed, match="boom 2"):
        failing.wait(connect(), timeout=5)


def test_rollback_of_the_callers_transaction_leaves_nothing(conn, connect):
    _, add, total, _, _ = arithmetic()
    tx = connect(autocommit=False)
    pgqueue.chord([add.s(1, 2), add.s(3, 4)], total.s()).enqueue(tx)
    tx.rollback()
    assert count_tasks(conn) == 0
    rows = conn.execute("SELECT count(*) FROM pgqueue.task_dependencies").fetchone()
    assert rows is not None and rows[0] == 0


def test_a_sqlalchemy_session_holds_the_workflow(database_url, conn):
    _, add, total, _, _ = arithmetic()
    engine = create_engine("postgresql+psycopg://" + database_url.split("://", 1)[1])
    try:
        with Session(engine) as session:
            pgqueue.chain(add.s(1, 2), add.s(3)).enqueue(session)
            session.rollback()
        with Session(engine) as session:
            kept = pgqueue.chord([add.s(1, 2)], total.s()).enqueue(session)
            session.commit()
    finally:
        engine.dispose()
    assert sorted(t.id for t in pgqueue.list_tasks(conn)) == sorted(t.id for t in kept.tasks)


def test_a_sqlalchemy_async_session_holds_the_workflow(database_url, conn):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    tasks, add, total, _, _ = arithmetic()

    async def scenario() -> tuple[pgqueue.WorkflowHandle, Any]:
        engine = create_async_engine("postgresql+psycopg://" + database_url.split("://", 1)[1])
        try:
            async with AsyncSession(engine) as session:
                await pgqueue.chain(add.s(1, 2), add.s(3)).aenqueue(session)
                await session.rollback()
            async with AsyncSession(engine) as session:
                kept = await pgqueue.chord([add.s(1, 2), add.s(3, 4)], total.s()).aenqueue(session)
                await session.commit()
            run_worker_until(database_url, tasks, lambda: final(conn, kept))
            async with AsyncSession(engine) as session:
                return kept, await kept.await_result(session, timeout=5)
        finally:
            await engine.dispose()

    kept, result = asyncio.run(scenario())
    assert sorted(t.id for t in pgqueue.list_tasks(conn)) == sorted(t.id for t in kept.tasks)
    assert result == 10


def test_aenqueue_and_await_result_on_an_async_connection(database_url, conn):
    tasks, add, _, _, _ = arithmetic()

    async def enqueue() -> pgqueue.WorkflowHandle:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            handle = await pgqueue.chain(add.s(1, 2), add.s(3)).aenqueue(aconn)
            await aconn.commit()
            return handle

    async def result(handle: pgqueue.WorkflowHandle) -> Any:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            return await handle.await_result(aconn, timeout=5)

    handle = asyncio.run(enqueue())
    assert [pgqueue.get_task(conn, t.id).status for t in handle.tasks] == [
        TaskStatus.QUEUED,
        TaskStatus.WAITING,
    ]
    run_worker_until(database_url, tasks, lambda: final(conn, handle))
    assert asyncio.run(result(handle)) == 6


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda add, total: pgqueue.chain(), "an empty chain"),
        (lambda add, total: pgqueue.group([]), "an empty group"),
        (lambda add, total: pgqueue.chain(add.s(1, 2), add), r"call \.s\(\.\.\.\) on it"),
        (lambda add, total: pgqueue.chord([add.s(1, 2)], "total"), "must be a step"),
        (lambda add, total: add.s(1, 2, 3), "takes 2 positional arguments"),
        (lambda add, total: add.s(z=1), "unexpected argument 'z'"),
        (lambda add, total: add.s("one"), "argument 'x' must be"),
        (lambda add, total: pgqueue.chain(add.s(1), add.s(2)).enqueue(None), "'y' is missing"),
        (lambda add, total: pgqueue.step("t", depends_on=[]), "a workflow sets it"),
        (lambda add, total: pgqueue.step("t", on_parent_failure="maybe"), "'cancel' or 'run'"),
        (lambda add, total: pgqueue.step("", {}), "must not be empty"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(conn, build, message):
    _, add, total, _, _ = arithmetic()
    with pytest.raises(pgqueue.ValidationError, match=message):
        flow = build(add, total)
        flow.enqueue(conn)
    conn.rollback()
    assert count_tasks(conn) == 0
