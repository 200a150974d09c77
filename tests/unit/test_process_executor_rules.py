"""The process executor's rules that need no process: what a task type may declare, what a
worker may be configured with, where a handler runs, and what crosses the pipe."""

from __future__ import annotations

import signal
import sys
import types
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

import pgqueue
from pgqueue.executor import Cancelled, Completed, Failed, Lost, Recorded, Snoozed
from pgqueue.models import ClaimedTask, Parent, Priority, TaskStatus
from pgqueue.worker import WorkerConfig
from pgqueue.worker.process_wire import outcome_from, outcome_message, task_from, task_message
from pgqueue.worker.processes import describe_exit, registry_spec


def sync_fn(payload: Any, ctx: Any) -> None:
    pass


async def async_fn(payload: Any, ctx: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "options", "message"),
    [
        (sync_fn, {"executor": "fork"}, "unknown executor 'fork' for sync_fn"),
        (sync_fn, {"executor": "async"}, "sync_fn is a plain function"),
        (async_fn, {"executor": "thread"}, "async_fn is async def"),
        (sync_fn, {"executor": "thread", "hard_timeout": 3}, "applies to the 'process'"),
        (sync_fn, {"hard_timeout": 0}, "must be positive seconds, not 0"),
        (sync_fn, {"hard_timeout": float("inf")}, "must be positive seconds"),
    ],
)
def test_a_task_type_is_refused_an_executor_that_cannot_run_it(
    fn: Any, options: dict[str, Any], message: str
) -> None:
    tasks = pgqueue.TaskRegistry()
    for decorate in (tasks.handler("t", **options), tasks.task(name="f", **options)):
        with pytest.raises(pgqueue.ValidationError) as caught:
            decorate(fn)
        assert message in str(caught.value)
    assert tasks.types == []


def test_where_a_handler_runs_under_each_worker_default() -> None:
    tasks = pgqueue.TaskRegistry()
    tasks.handler("plain")(sync_fn)
    tasks.handler("coroutine")(async_fn)
    tasks.handler("pinned", executor="thread")(sync_fn)
    tasks.handler("child", executor="process", hard_timeout=2)(async_fn)
    where = {
        default: {t: h.executor_under(default) for t in tasks.types if (h := tasks.get(t))}
        for default in ("thread", "process")
    }
    assert where["thread"] == {
        "plain": "thread",
        "coroutine": "async",
        "pinned": "thread",
        "child": "process",
    }
    assert where["process"] == {
        "plain": "process",
        "coroutine": "process",
        "pinned": "thread",
        "child": "process",
    }
    child = tasks.get("child")
    assert child is not None and child.hard_timeout == 2


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"executor": "async"}, "executor", "'async' is for async def handlers only"),
        ({"executor": "forks"}, "executor", "must be 'thread' or 'process', not 'forks'"),
        ({"process_pool_size": 0}, "process_pool_size", "must be 1 to the concurrency (10)"),
        ({"process_pool_size": 11}, "process_pool_size", "not 11"),
        ({"hard_timeout": 0}, "hard_timeout", "must be positive seconds"),
        ({"max_tasks_per_child": 0}, "max_tasks_per_child", "must be at least 1"),
        ({"memory_limit": -1}, "memory_limit", "must be positive megabytes"),
        (
            {"max_memory_per_child": 500, "memory_limit": 400},
            "max_memory_per_child",
            "must be below memory_limit (400 MB)",
        ),
    ],
)
def test_a_worker_config_refuses_process_settings_that_cannot_work(
    options: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(pgqueue.ValidationError) as caught:
        WorkerConfig(**options)
    assert caught.value.field == field and message in caught.value.reason


def test_the_pool_is_the_cpus_at_most_the_concurrency() -> None:
    assert WorkerConfig(concurrency=1).process_children == 1
    assert WorkerConfig(concurrency=64, process_pool_size=3).process_children == 3
    assert 1 <= WorkerConfig().process_children <= 10


def test_a_claimed_task_and_each_outcome_cross_the_pipe_unchanged() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    parent = Parent(uuid.uuid4(), "a", TaskStatus.COMPLETED, 0, False, {"x": [1, 2]}, None)
    task = ClaimedTask(
        id=uuid.uuid4(),
        queue="q",
        type="t",
        payload={"n": 1, "s": "é", "nested": {"l": [None, True, 1.5]}},
        priority=Priority.HIGH,
        attempts=2,
        max_attempts=5,
        lease_token=uuid.uuid4(),
        lease_expires_at=now,
        created_at=now,
        trace_context={"traceparent": "00-abc-def-01"},
        has_parents=True,
        workflow_id=uuid.uuid4(),
        parents=(parent,),
        concurrency_key="tenant-7",
    )
    assert task_from(task_message(task)) == task
    for outcome in (
        Completed('{"a": 1}'),
        Completed(None),
        Recorded("2"),
        Failed("ValueError: no", retry_after=3.0),
        Failed("too large", dead=True),
        Cancelled("why"),
        Snoozed(4.0, "later"),
        Lost(),
    ):
        message = outcome_message(task.id, outcome, timed_out=False)
        assert outcome_from(message) == outcome


def test_how_a_child_s_end_is_described() -> None:
    assert describe_exit(-signal.SIGSEGV) == "worker child died: SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "worker child died: SIGKILL"
    assert describe_exit(3) == "worker child exited with code 3"
    assert describe_exit(None) == "worker child died: its fork server exited"


def test_a_spawned_process_finds_the_registry_by_its_module_attribute() -> None:
    loaded = pgqueue.TaskRegistry()
    loaded.origin = "app.tasks:tasks"
    assert registry_spec(loaded) == "app.tasks:tasks"

    module = types.ModuleType("pgqueue_test_registry_home")
    module.jobs = pgqueue.TaskRegistry()  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert registry_spec(module.jobs) == "pgqueue_test_registry_home:jobs"  # type: ignore[attr-defined]
    finally:
        del sys.modules[module.__name__]
    # Held by no importable module (a script's __main__ cannot be imported again): None,
    # and the pool refuses to spawn with a message that says why.
    assert registry_spec(pgqueue.TaskRegistry()) is None


def test_the_worker_command_refuses_a_bad_executor_before_it_starts() -> None:
    from processes import one_line_error, run_cli

    closed = "postgresql://postgres@127.0.0.1:9/none"  # never dialled
    line = one_line_error(run_cli(closed, "worker", "app:tasks", "--executor", "async"), code=2)
    assert "executor: 'async' is for async def handlers only" in line
    line = one_line_error(
        run_cli(
            closed, "worker", "app:tasks", "--max-memory-per-child", "900", "--memory-limit", "500"
        ),
        code=2,
    )
    assert "max_memory_per_child: must be below memory_limit (500 MB)" in line
