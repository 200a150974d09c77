"""Typed arguments without a database: each converted type's JSON form and its way back,
what is refused and how it is said, and what a signature that does not fully resolve keeps."""

from __future__ import annotations

import dataclasses
import enum
import json
import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any

import pytest

import pgqueue
from pgqueue.arguments import UndecodableArgument, check_arguments, describe_parameters


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


def roundtrip(fn: Any, **arguments: Any) -> dict[str, Any]:
    parameters = describe_parameters(fn, "t")
    payload = json.loads(json.dumps(parameters.encode(arguments)))
    check_arguments(parameters.description, payload)
    return dict(parameters.decode(payload))


def test_each_type_comes_back_as_it_went_in():
    def fn(
        a: datetime,
        b: date,
        c: time,
        d: timedelta,
        e: Decimal,
        f: uuid.UUID,
        g: Size,
        h: list[date] | None,
        i: dict[str, Decimal],
        j: Annotated[date, "a note"],
    ) -> None: ...

    values = {
        "a": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
        "b": date(2026, 1, 2),
        "c": time(23, 59, 59, 999999),
        "d": timedelta(days=2, microseconds=5),
        "e": Decimal("-0.000000000000000000001"),
        "f": uuid.UUID(int=7),
        "g": Size.LARGE,
        "h": [date(2026, 1, 1), date(2026, 12, 31)],
        "i": {"x": Decimal("1E+30")},
        "j": date(2000, 2, 29),
    }
    back = roundtrip(fn, **values)
    assert back == values
    assert back["a"].utcoffset() == timedelta(hours=-5)  # the offset kept, not made UTC
    assert type(back["g"]) is Size
    assert roundtrip(fn, **{**values, "h": None})["h"] is None


def test_the_json_form_is_accepted_where_the_value_is():
    def fn(when: datetime, amount: Decimal, id: uuid.UUID, size: Size) -> None: ...

    back = roundtrip(fn, when="2026-01-02T03:04:05Z", amount=12.5, id=str(uuid.UUID(int=1)), size=1)
    assert back == {
        "when": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "amount": Decimal("12.5"),
        "id": uuid.UUID(int=1),
        "size": Size.SMALL,
    }


@pytest.mark.parametrize(
    ("annotation", "value", "message"),
    [
        (datetime, datetime(2026, 1, 2), "argument 'x' has no UTC offset (2026-01-02T00:00:00)"),
        (datetime, 17, "argument 'x' must be a date-time with a UTC offset (ISO 8601, such as"),
        (
            date,
            "2026-02-30",
            "argument 'x' must be a date (ISO 8601, such as 2026-01-02), not '2026-02-30'",
        ),
        (time, "25:00", "argument 'x' must be a time of day (ISO 8601, such as 03:04:05)"),
        (timedelta, "1 day", "argument 'x' must be a duration in seconds (a number), not string"),
        (Decimal, Decimal("NaN"), "argument 'x' must be a finite decimal number, not NaN"),
        (Decimal, True, "argument 'x' must be a decimal number"),
        (Decimal, 1 / 3, "argument 'x' is a float of more than 15 digits (0.3333333333333333)"),
        (uuid.UUID, "x", "argument 'x' must be a UUID"),
        (Size, True, "argument 'x' must be one of Size's values (1, 2), not True"),
        (list[date], ["2026-01-01", "nope"], "argument 'x'[1] must be a date"),
        (dict[str, date], {"k": 1}, "argument 'x'['k'] must be a date"),
    ],
)
def test_a_value_that_does_not_fit_is_refused_naming_where(annotation, value, message):
    def fn(x): ...  # type: ignore[no-untyped-def]

    fn.__annotations__ = {"x": annotation}
    parameters = describe_parameters(fn, "t")
    with pytest.raises(pgqueue.InvalidArgument, match="^payload: " + re_escape(message)):
        parameters.encode({"x": value})
    if _json(value):  # a JSON value is refused the same way from the recorded description
        with pytest.raises(pgqueue.InvalidArgument, match="^payload: " + re_escape(message)):
            check_arguments(parameters.description, {"x": value})
        with pytest.raises(UndecodableArgument, match="^payload: " + re_escape(message)):
            parameters.decode({"x": value})


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def _json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def test_a_decimal_sent_as_a_json_number_is_taken_when_no_digit_can_have_been_lost():
    def fn(x: Decimal) -> None: ...

    parameters = describe_parameters(fn, "t")
    assert parameters.encode({"x": 12.5}) == {"x": "12.5"}
    assert parameters.encode({"x": 12345678901234.5}) == {"x": "12345678901234.5"}
    assert parameters.encode({"x": 10**30}) == {"x": str(10**30)}  # an int is exact
    assert parameters.decode({"x": 0.1}) == {"x": Decimal("0.1")}
    with pytest.raises(pgqueue.InvalidArgument, match="send the decimal as a string"):
        check_arguments(parameters.description, {"x": 1234567890.123456789})


def test_a_converted_parameter_whose_default_is_none_takes_none():
    def fn(when: datetime = None) -> None: ...  # type: ignore[assignment]  # noqa: RUF013

    parameters = describe_parameters(fn, "t")
    assert parameters.encode({"when": None}) == {"when": None}
    check_arguments(parameters.description, {"when": None})
    assert parameters.decode({"when": None}) == {"when": None}


def test_a_dataclass_is_its_fields_and_its_own_checks_apply():
    @dataclasses.dataclass
    class Window:
        start: datetime
        end: datetime
        label: str = ""

        def __post_init__(self) -> None:
            if self.end <= self.start:
                raise ValueError("end must follow start")

    def fn(w: Window) -> None: ...

    start = datetime(2026, 1, 1, tzinfo=UTC)
    fn.__annotations__ = {"w": Window}
    parameters = describe_parameters(fn, "t")
    stored = parameters.encode({"w": Window(start, start + timedelta(hours=1))})
    assert stored == {
        "w": {"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-01T01:00:00+00:00", "label": ""}
    }
    with pytest.raises(pgqueue.InvalidArgument, match="is not a valid Window: end must follow"):
        parameters.encode({"w": {"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}})
    with pytest.raises(pgqueue.InvalidArgument, match="has a field Window does not have: 'x'"):
        check_arguments(parameters.description, {"w": {**stored["w"], "x": 1}})


def test_a_parameter_that_does_not_resolve_leaves_the_others_converted():
    def fn(when: datetime, thing: NotDefinedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    parameters = describe_parameters(fn, "t")
    assert set(parameters.codecs) == {"when"}
    assert parameters.encode({"when": datetime(2026, 1, 1, tzinfo=UTC), "thing": 1}) == {
        "when": "2026-01-01T00:00:00+00:00",
        "thing": 1,
    }


def test_an_enum_whose_values_are_not_json_is_refused_when_declared():
    class Odd(enum.Enum):
        A = (1, 2j)

    tasks = pgqueue.TaskRegistry()

    def fn(o: Odd) -> None: ...

    fn.__annotations__ = {"o": Odd}
    with pytest.raises(pgqueue.ValidationError, match="parameter 'o': Odd's values are not JSON"):
        tasks.task(name="odd")(fn)


def test_pydantic_is_not_imported_unless_an_annotation_is_a_model():
    code = (
        "import sys, datetime, pgqueue\n"
        "tasks = pgqueue.TaskRegistry()\n"
        "@tasks.task\n"
        "def f(d: datetime.date, n: int) -> None: ...\n"
        "f.arguments(datetime.date(2026, 1, 1), 1)\n"
        "assert 'pydantic' not in sys.modules, 'pydantic was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
