"""``rate_limit`` on ``@tasks.task`` and ``@tasks.handler``: Celery's forms are read, and a
bad one is refused where the task type is declared (at import), naming what to write."""

from __future__ import annotations

from typing import Any

import pytest

import pgqueue
from pgqueue.queries.task_types import RateDeclaration
from pgqueue.registry import TaskRegistry


@pytest.mark.parametrize(
    ("written", "rate", "period"),
    [
        ("10/s", 10, 1.0),
        ("10/m", 10, 60.0),
        ("100/h", 100, 3600.0),
        (" 3 / m ", 3, 60.0),
        ("7", 7, 1.0),
        (5, 5, 1.0),
        ("10000/s", 10_000, 1.0),
    ],
)
def test_a_rate_limit_is_read_as_celery_writes_it(written, rate, period):
    tasks = TaskRegistry()

    @tasks.task(name="sms", rate_limit=written)
    def sms() -> None:
        return None

    (decl,) = tasks.declarations()
    assert decl.rate_limit == RateDeclaration(rate, period, 1), "burst 1 unless given"


def test_a_handlers_rate_limit_and_burst_are_declared_with_its_type():
    tasks = TaskRegistry()

    @tasks.handler("sms", rate_limit="6/m", rate_burst=3)
    def sms(payload: dict[str, Any], ctx: Any) -> None:
        return None

    @tasks.handler("email")
    def email(payload: dict[str, Any], ctx: Any) -> None:
        return None

    by_type = {d.type: d.rate_limit for d in tasks.declarations()}
    assert by_type == {"email": None, "sms": RateDeclaration(6, 60.0, 3)}


@pytest.mark.parametrize(
    "written",
    [
        "10/x",
        "ten/m",
        "0/s",
        "10/m/s",
        "-1/s",
        "1.5/s",
        "",
        "/m",
        "10/min",
        "10001/s",
        0,
        2.5,
        True,
    ],
)
def test_a_bad_rate_limit_is_refused_at_declaration_naming_the_forms(written):
    tasks = TaskRegistry()
    with pytest.raises(pgqueue.ValidationError) as info:

        @tasks.task(name="sms", rate_limit=written)
        def sms() -> None:
            return None

    assert info.value.field == "rate_limit"
    assert "'10/m'" in str(info.value) and repr(written) in str(info.value)
    assert tasks.types == [], "nothing was registered"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate_limit": "10/s", "rate_burst": 0}, "rate_burst"),
        ({"rate_limit": "10/s", "rate_burst": 10_001}, "rate_burst"),
        ({"rate_limit": "10/s", "rate_burst": 2.0}, "rate_burst"),
        ({"rate_burst": 2}, "rate_burst"),
    ],
)
def test_a_bad_burst_is_refused_at_declaration(kwargs, field):
    tasks = TaskRegistry()
    with pytest.raises(pgqueue.ValidationError) as info:
        tasks.handler("sms", **kwargs)
    assert info.value.field == field
