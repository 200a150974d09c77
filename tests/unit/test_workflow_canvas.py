"""Building the canvas's finer steps without a database: immutable steps (``si``), the
parent's result first (``parent_result="first"``), and error handlers (``link_error``)."""

from __future__ import annotations

from typing import Any

import pytest

import pgqueue
from pgqueue.registry import TaskRegistry

ONE = {"$pgqueue": "parent_result"}
FAILED = {"$pgqueue": "parent_failure"}

tasks = TaskRegistry()


@tasks.task(name="sub")
def sub(x: int, y: int) -> int:
    return x - y


@tasks.task(name="label")
def label(prefix: str, value: int = 0) -> str:
    return f"{prefix}{value}"


@tasks.task(name="alert")
def alert(failed: dict[str, Any], channel: str) -> str:
    return channel


@tasks.task(name="count_only")
def count_only(failed: int, channel: str) -> str:
    return channel


@tasks.task(name="takes_parent_result")
def takes_parent_result(x: int, parent_result: str = "unbound") -> str:
    return parent_result


def test_an_immutable_step_receives_nothing_and_needs_every_argument():
    a, b = pgqueue.chain(sub.s(5, 1), sub.si(10, 3)).build()[1]
    assert b.depends_on == (a.id,) and b.payload == {"x": 10, "y": 3}
    with pytest.raises(pgqueue.ValidationError, match="'y'"):
        sub.si(10)


def test_the_parent_result_first_binds_the_arguments_after_it_as_celery_does():
    _, b = pgqueue.chain(sub.s(5, 1), sub.s(10, parent_result="first")).build()[1]
    assert b.payload == {"x": ONE, "y": 10}  # sub(result, 10); sub.s(10) is sub(10, result)
    # With nothing else to bind, the first parameter receives even where a default follows.
    _, c = pgqueue.chain(sub.s(1, 1), label.s(parent_result="first")).build()[1]
    assert c.payload == {"prefix": ONE}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sub.s(1, 2, parent_result="first"), "takes 1 positional argument after"),
        (lambda: sub.s(x=1, parent_result="first"), "argument 'x' receives the parent's result"),
        (lambda: sub.s(1, parent_result="last"), "parent_result: must be 'first'"),
        (lambda: pgqueue.chain(sub.s(y=2, parent_result="first")).build(), "has no parent"),
    ],
)
def test_a_parent_result_first_step_that_does_not_fit_is_refused(call, message):
    with pytest.raises(pgqueue.ValidationError, match=message):
        call()


def test_a_function_with_a_parameter_named_parent_result_gets_it_as_its_argument():
    step = takes_parent_result.s(1, parent_result="first")
    assert step.payload == {"x": 1, "parent_result": "first"} and step.receives is None


def test_an_error_handler_depends_on_its_step_outside_the_workflow_and_after_the_sinks():
    flow = pgqueue.chain(
        sub.s(5, 1).link_error(alert.s(channel="ops")),
        sub.s(y=1).link_error(alert.s(channel="oncall"), alert.s(channel="log")),
    )
    workflow_id, specs, sinks = flow.build()
    a, b, on_a, on_b, on_b_too = specs
    assert sinks == 1 and b.depends_on == (a.id,)
    assert [h.depends_on for h in (on_a, on_b, on_b_too)] == [(a.id,), (b.id,), (b.id,)]
    assert {h.workflow_id for h in (on_a, on_b, on_b_too)} == {None}
    assert {a.workflow_id, b.workflow_id} == {workflow_id}
    assert on_a.payload == {"failed": FAILED, "channel": "ops"} and on_a.run_anyway


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (lambda: alert.si({}, channel="ops"), "an error handler receives the failed task"),
        (lambda: pgqueue.step("alert", {"failed": {}, "channel": "x"}), "has none"),
        (lambda: alert, "must be a step \\(fn.s\\(...\\)\\), not TaskFunction \\(call .s"),
        (lambda: count_only.s(channel="x"), "receives the failed task as a dict"),
    ],
)
def test_an_error_handler_that_cannot_receive_the_failed_task_is_refused(handler, message):
    with pytest.raises(pgqueue.ValidationError, match=message):
        sub.s(1, 2).link_error(handler())
