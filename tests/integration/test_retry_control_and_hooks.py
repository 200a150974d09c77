"""Which exceptions retry (``retry_on``, ``no_retry_on``, ``Fail``), ``ctx.retries``, and the
hooks and middleware, run by real workers on a real database in each executor.

The handlers are declared once per executor (``thread``, ``async``, ``process``). The process
executor's children are spawned (this test process has connections open) and import this
module's registry by ``test_retry_control_and_hooks:tasks``: the middleware is registered at
import so that they have it too; the hooks run in the worker, so their calls are seen here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until

import pgqueue
from pgqueue.error_text import split_error
from pgqueue.executor import TaskContext

EXECUTORS = ("thread", "async", "process")
RETRY_AT_ONCE = pgqueue.RetryPolicy(5, base=0, cap=0)

RAISED: dict[str, type[Exception]] = {
    "KeyError": KeyError,
    "ValueError": ValueError,
    "ConnectionError": ConnectionError,
    "ConnectionRefusedError": ConnectionRefusedError,  # a ConnectionError
    "Fail": pgqueue.Fail,
}

# What the hooks were called with, in the worker (by task id): (hook, outcome, exception).
CALLS: dict[uuid.UUID, list[tuple[str, str, BaseException | None]]] = {}
_CALLS_LOCK = threading.Lock()


def recorder(name: str) -> Callable[[pgqueue.TaskFailure], None]:
    def record(failure: pgqueue.TaskFailure) -> None:
        with _CALLS_LOCK:
            CALLS.setdefault(failure.task_id, []).append((name, failure.outcome, failure.exception))
        if failure.type.startswith("hook_raises") and name == "registry.on_failure":
            raise RuntimeError("the hook's own bug")

    return record


tasks = pgqueue.TaskRegistry(
    on_failure=recorder("registry.on_failure"),
    on_retry=recorder("registry.on_retry"),
    on_dead=recorder("registry.on_dead"),
)


def _trail(ctx: TaskContext) -> list[str]:
    trail: list[str] | None = getattr(ctx, "trail", None)
    if trail is None:
        trail = []
        ctx.trail = trail  # type: ignore[attr-defined]
    return trail


def _marking(name: str) -> Any:
    def mw(ctx: TaskContext, call: Callable[[], Any]) -> Any:
        _trail(ctx).append(f"{name}>")
        value = call()
        return [*value, f"<{name}"] if isinstance(value, list) else value

    async def amw(ctx: TaskContext, call: Callable[[], Any]) -> Any:
        _trail(ctx).append(f"{name}>")
        value = await call()
        return [*value, f"<{name}"] if isinstance(value, list) else value

    return mw, amw


for _name in ("outer", "inner"):
    for _mw in _marking(_name):
        tasks.middleware(_mw)


def _outcome_of(payload: dict[str, Any], ctx: TaskContext) -> Any:
    """Raise the named exception while the attempt is below ``until`` (always, without it);
    then say which attempt it was, or give the middleware's trail."""
    until = payload.get("until")
    if "raise" in payload and (until is None or ctx.attempt < until):
        raise RAISED[payload["raise"]](payload.get("message", "boom"))
    if payload.get("trail"):
        return [*_trail(ctx), "handler"]
    return {"attempt": ctx.attempt, "retries": ctx.retries}


def _sync_handler(payload: dict[str, Any], ctx: TaskContext) -> Any:
    return _outcome_of(payload, ctx)


async def _async_handler(payload: dict[str, Any], ctx: TaskContext) -> Any:
    return _outcome_of(payload, ctx)


def _declare(kind: str, *, middleware: tuple[Any, Any] | None = None, **options: Any) -> None:
    """``KIND.EXECUTOR`` for each executor; ``middleware``: the type's own (plain, async)."""
    for executor in EXECUTORS:
        is_async = executor == "async"
        fn = _async_handler if is_async else _sync_handler
        if middleware is not None:
            options["middleware"] = [middleware[1] if is_async else middleware[0]]
        tasks.handler(f"{kind}.{executor}", executor=executor, **options)(fn)


_declare("retry_on", retry=RETRY_AT_ONCE, retry_on=ConnectionError)
_declare("no_retry_on", retry=RETRY_AT_ONCE, no_retry_on=(KeyError, ValueError))
_declare("plain", retry=RETRY_AT_ONCE)
_declare(
    "hooked",
    retry=pgqueue.RetryPolicy(2, base=0, cap=0),
    on_failure=recorder("task.on_failure"),
    on_retry=recorder("task.on_retry"),
    on_dead=recorder("task.on_dead"),
)
_declare("hook_raises", retry=pgqueue.RetryPolicy(2, base=0, cap=0))
_declare("with_middleware", middleware=_marking("task"))


def _overrun(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Runs past its timeout (a thread is told to stop; a child is interrupted)."""
    deadline = time.monotonic() + 10
    while not ctx.should_stop() and time.monotonic() < deadline:
        time.sleep(0.01)


for _executor in ("thread", "process"):
    tasks.handler(
        f"overrun.{_executor}",
        executor=_executor,
        timeout=0.3,
        max_attempts=1,
        retry_on=ConnectionError,
    )(_overrun)


def _run(
    database_url: str,
    conn: psycopg.Connection[Any],
    specs: list[tuple[str, dict[str, Any]]],
    *,
    hook_calls: int = 0,
) -> list[pgqueue.Task]:
    """Enqueue each (type, payload), run a real worker until every task is finished and its
    hooks have run (``hook_calls`` each at least), and return the tasks."""
    ids = [pgqueue.enqueue(conn, type, payload).id for type, payload in specs]
    finished = {pgqueue.TaskStatus.COMPLETED, pgqueue.TaskStatus.FAILED}

    def done() -> bool:
        if any(pgqueue.get_task(conn, i).status not in finished for i in ids):
            return False
        with _CALLS_LOCK:
            return all(len(CALLS.get(i, [])) >= hook_calls for i in ids)

    run_worker_until(database_url, tasks, done)
    return [pgqueue.get_task(conn, i) for i in ids]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_exception_outside_retry_on_is_dead_lettered_at_once_saying_why(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    other, subclass = _run(
        database_url,
        conn,
        [
            (f"retry_on.{executor}", {"raise": "KeyError", "message": "no such order"}),
            (f"retry_on.{executor}", {"raise": "ConnectionRefusedError", "until": 3}),
        ],
    )
    assert (other.status, other.attempts) == (pgqueue.TaskStatus.FAILED, 1)
    assert other.last_error is not None
    assert split_error(other.last_error).headline == "KeyError: 'no such order'"
    assert "not retried: KeyError is not in retry_on (ConnectionError)" in other.last_error
    # A subclass of a type in retry_on is retried, as isinstance says.
    assert (subclass.status, subclass.attempts) == (pgqueue.TaskStatus.COMPLETED, 3)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_exception_in_no_retry_on_is_dead_lettered_at_once_and_others_retry(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    listed, other = _run(
        database_url,
        conn,
        [
            (f"no_retry_on.{executor}", {"raise": "ValueError", "message": "bad input"}),
            (f"no_retry_on.{executor}", {"raise": "ConnectionError", "until": 2}),
        ],
    )
    assert (listed.status, listed.attempts) == (pgqueue.TaskStatus.FAILED, 1)
    assert listed.last_error is not None
    error = split_error(listed.last_error)
    assert error.headline == "ValueError: bad input"
    assert "not retried: ValueError is in no_retry_on" in error.summary
    assert error.traceback is not None and "_outcome_of" in error.traceback
    assert (other.status, other.attempts) == (pgqueue.TaskStatus.COMPLETED, 2)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fail_dead_letters_at_once_with_its_reason_as_a_failure(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    (task,) = _run(
        database_url,
        conn,
        [(f"plain.{executor}", {"raise": "Fail", "message": "card declined"})],
        hook_calls=2,
    )
    assert (task.status, task.attempts, task.max_attempts) == (pgqueue.TaskStatus.FAILED, 1, 5)
    assert task.last_error == "Fail: card declined"
    assert pgqueue.count_dead_letters(conn) == 1
    [(_, _, _), (hook, outcome, exception)] = CALLS[task.id]
    assert (hook, outcome) == ("registry.on_dead", "dead")
    if executor == "process":
        assert isinstance(exception, pgqueue.ChildException)
        assert (exception.type_name, exception.message) == ("pgqueue.errors.Fail", "card declined")
    else:
        assert isinstance(exception, pgqueue.Fail) and exception.reason == "card declined"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_ctx_retries_counts_the_attempts_before_this_one(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    (task,) = _run(database_url, conn, [(f"plain.{executor}", {"raise": "ValueError", "until": 3})])
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.result == {"attempt": 3, "retries": 2}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_hooks_see_each_failed_attempt_then_the_retry_or_the_dead_letter(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    (task,) = _run(
        database_url,
        conn,
        [(f"hooked.{executor}", {"raise": "ValueError", "message": "boom"})],
        hook_calls=8,
    )
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 2)
    calls = CALLS[task.id]
    assert [(hook, outcome) for hook, outcome, _ in calls] == [
        ("registry.on_failure", "retrying"),
        ("task.on_failure", "retrying"),
        ("registry.on_retry", "retrying"),
        ("task.on_retry", "retrying"),
        ("registry.on_failure", "dead"),
        ("task.on_failure", "dead"),
        ("registry.on_dead", "dead"),
        ("task.on_dead", "dead"),
    ]
    for _, _, exception in calls:
        if executor == "process":
            assert isinstance(exception, pgqueue.ChildException)
            assert (exception.type_name, exception.message) == ("ValueError", "boom")
        else:
            assert isinstance(exception, ValueError) and str(exception) == "boom"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_hook_that_raises_is_logged_and_changes_nothing(
    database_url: str,
    conn: psycopg.Connection[Any],
    executor: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue")
    (task,) = _run(
        database_url,
        conn,
        [(f"hook_raises.{executor}", {"raise": "ValueError", "until": 2})],
        hook_calls=2,
    )
    # Retried as if the hook had not raised, and the next hook still ran.
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.COMPLETED, 2)
    assert [hook for hook, _, _ in CALLS[task.id]] == ["registry.on_failure", "registry.on_retry"]
    [failed] = [r for r in caplog.records if getattr(r, "pgqueue_event", "") == "task.hook_failed"]
    fields = failed.pgqueue_fields  # type: ignore[attr-defined]
    assert failed.levelno == logging.ERROR
    assert (fields["task_id"], fields["type"], fields["attempt"]) == (task.id, task.type, 1)
    assert fields["hook"] == "on_failure"
    assert fields["error"] == "RuntimeError: the hook's own bug"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_middleware_wraps_the_call_registry_first_then_the_type(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    (task,) = _run(database_url, conn, [(f"with_middleware.{executor}", {"trail": True})])
    assert task.status is pgqueue.TaskStatus.COMPLETED
    assert task.result == [
        "outer>",
        "inner>",
        "task>",
        "handler",
        "<task",
        "<inner",
        "<outer",
    ]


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_timeout_runs_the_hooks_without_an_exception_and_is_not_subject_to_retry_on(
    database_url: str, conn: psycopg.Connection[Any], executor: str
) -> None:
    (task,) = _run(database_url, conn, [(f"overrun.{executor}", {})], hook_calls=2)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.FAILED, 1)
    assert task.last_error == "timed out after 0.3 s"
    assert CALLS[task.id] == [
        ("registry.on_failure", "dead", None),
        ("registry.on_dead", "dead", None),
    ]
