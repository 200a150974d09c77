"""What a task type's retry rules, hooks and middleware refuse at declaration, and how a
failure's exception crosses from a child process (the worker's runs are in
tests/integration/test_retry_control_and_hooks.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import pgqueue
from pgqueue.executor import Failed, _from_exception
from pgqueue.hooks import not_retried_because
from pgqueue.worker.process_wire import outcome_from, outcome_message


def test_max_retries_is_max_attempts_less_the_first_run() -> None:
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("h", max_retries=3)
    def h(payload: Any, ctx: Any) -> None: ...

    @tasks.task(name="t", max_retries=0)
    def t() -> None: ...

    declared = {d.type: d for d in tasks.declarations()}
    assert declared["h"].retry is not None and declared["h"].retry.max_attempts == 4
    assert declared["t"].retry is not None and declared["t"].retry.max_attempts == 1


@pytest.mark.parametrize("decorator", ["handler", "task"])
def test_max_retries_and_max_attempts_together_are_refused(decorator: str) -> None:
    tasks = pgqueue.TaskRegistry()
    args = ("x",) if decorator == "handler" else ()
    with pytest.raises(pgqueue.ValidationError, match="max_attempts = max_retries \\+ 1"):
        getattr(tasks, decorator)(*args, max_attempts=3, max_retries=2)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_max_retries_must_be_a_count(value: Any) -> None:
    with pytest.raises(pgqueue.ValidationError, match="max_retries"):
        pgqueue.TaskRegistry().handler("x", max_retries=value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ((), "at least one exception class"),
        ("ValueError", "must be exception classes"),
        ((ValueError, 3), "must be exception classes"),
        (KeyboardInterrupt, "must be exception classes"),
        (pgqueue.Retry, "Retry is an outcome"),
        ((ValueError, pgqueue.Fail), "Fail is an outcome"),
    ],
)
@pytest.mark.parametrize("option", ["retry_on", "no_retry_on"])
def test_retry_rules_name_exception_classes_of_the_handlers_work(
    option: str, value: Any, message: str
) -> None:
    with pytest.raises(pgqueue.ValidationError, match=message) as raised:
        pgqueue.TaskRegistry().handler("x", **{option: value})
    assert raised.value.field == option


def test_why_an_exception_is_not_retried() -> None:
    assert not_retried_because(KeyError("k"), (ConnectionError,), None) == (
        "not retried: KeyError is not in retry_on (ConnectionError)"
    )
    assert not_retried_because(ConnectionRefusedError(), (ConnectionError,), None) is None
    assert not_retried_because(ConnectionRefusedError(), None, (ConnectionError,)) == (
        "not retried: ConnectionRefusedError (a ConnectionError) is in no_retry_on"
    )
    # Both: retried when in retry_on and not in no_retry_on.
    assert not_retried_because(ConnectionResetError(), (OSError,), (ConnectionError,)) == (
        "not retried: ConnectionResetError (a ConnectionError) is in no_retry_on"
    )
    assert not_retried_because(FileNotFoundError(), (OSError,), (ConnectionError,)) is None


def test_a_middleware_of_the_other_kind_than_its_handler_is_refused() -> None:
    tasks = pgqueue.TaskRegistry()

    async def amw(ctx: Any, call: Any) -> Any:
        return await call()

    with pytest.raises(pgqueue.ValidationError, match="a middleware wraps handlers of its own"):

        @tasks.handler("x", middleware=[amw])
        def x(payload: Any, ctx: Any) -> None: ...


@pytest.mark.parametrize("hook", ["on_failure", "on_retry", "on_dead"])
def test_a_hook_must_be_callable(hook: str) -> None:
    with pytest.raises(pgqueue.ValidationError, match="TaskFailure"):
        pgqueue.TaskRegistry(**{hook: "alert"})
    with pytest.raises(pgqueue.ValidationError, match="TaskFailure"):
        pgqueue.TaskRegistry().task(**{hook: 42})


def test_fail_is_a_failed_attempt_that_dead_letters() -> None:
    outcome = _from_exception(pgqueue.Fail("card declined"))
    assert outcome == Failed("Fail: card declined", dead=True)


def test_a_childs_failure_carries_its_exceptions_type_and_message() -> None:
    class CardDeclined(Exception):
        pass

    outcome = _from_exception(CardDeclined("declined by the bank"))
    message = outcome_message(uuid.uuid4(), outcome, timed_out=False)
    back = outcome_from(message)
    assert isinstance(back, Failed) and back == outcome
    assert isinstance(back.exception, pgqueue.ChildException)
    assert back.exception.type_name == f"{__name__}.{CardDeclined.__qualname__}"
    assert back.exception.message == "declined by the bank"
    # Builtins by their bare name, as a traceback shows them.
    builtin = outcome_from(
        outcome_message(uuid.uuid4(), _from_exception(KeyError("k")), timed_out=False)
    )
    assert isinstance(builtin, Failed) and isinstance(builtin.exception, pgqueue.ChildException)
    assert builtin.exception.type_name == "KeyError"
