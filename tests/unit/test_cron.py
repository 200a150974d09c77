"""Cron expressions: the next tick, in a time zone, across daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import pgqueue
from pgqueue.cron import Cron, Schedule, zone

PARIS = zone("Europe/Paris")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "tz", "expected"),
    [
        pytest.param("0 9 * * *", utc(2030, 1, 1, 10), PARIS, utc(2030, 1, 2, 8), id="winter"),
        pytest.param("0 9 * * *", utc(2030, 7, 1, 10), PARIS, utc(2030, 7, 2, 7), id="summer"),
        pytest.param("*/15 * * * *", utc(2030, 1, 1, 0, 7), zone("UTC"), utc(2030, 1, 1, 0, 15)),
        pytest.param(
            "* * * * * *", utc(2030, 1, 1, 0, 0, 0), zone("UTC"), utc(2030, 1, 1, 0, 0, 1)
        ),
        pytest.param("0 0 29 2 *", utc(2030, 3, 1), zone("UTC"), utc(2032, 2, 29), id="leap-day"),
        pytest.param("@weekly", utc(2030, 1, 1), zone("UTC"), utc(2030, 1, 6), id="sunday"),
        pytest.param("0 0 * * mon-fri", utc(2030, 1, 4, 12), zone("UTC"), utc(2030, 1, 7)),
        pytest.param("0 0 13 * fri", utc(2030, 1, 1), zone("UTC"), utc(2030, 1, 4), id="either"),
        pytest.param("0 12 1 jan,jul *", utc(2030, 2, 1), zone("UTC"), utc(2030, 7, 1, 12)),
        # 31 March 2030, Paris: 02:00 to 03:00 does not exist, so 02:30 does not fire that day.
        pytest.param("30 2 * * *", utc(2030, 3, 30, 12), PARIS, utc(2030, 4, 1, 0, 30), id="gap"),
        # 27 October 2030, Paris: 02:30 happens twice and fires once (the first, 00:30 UTC).
        pytest.param("30 2 * * *", utc(2030, 10, 26, 12), PARIS, utc(2030, 10, 27, 0, 30)),
        pytest.param("30 2 * * *", utc(2030, 10, 27, 0, 30), PARIS, utc(2030, 10, 28, 1, 30)),
    ],
)
def test_next_tick_is_the_first_wall_clock_match_strictly_after(expression, after, tz, expected):
    assert Cron.parse(expression).next_after(after, tz) == expected


@pytest.mark.parametrize(
    "expression",
    ["", "* * *", "61 * * * *", "*/0 * * * *", "5-1 * * * *", "* * * foo *", "0 0 30 2 *"],
)
def test_a_bad_or_impossible_expression_is_a_validation_error_naming_cron(expression):
    with pytest.raises(pgqueue.ValidationError) as info:
        Cron.parse(expression).next_after(utc(2030, 1, 1), zone("UTC"))
    assert info.value.field == "cron"


def test_an_unknown_time_zone_is_a_validation_error():
    with pytest.raises(pgqueue.ValidationError) as info:
        zone("Mars/Olympus_Mons")
    assert info.value.field == "timezone"


def every_minute(catch_up: bool = False) -> Schedule:
    return Schedule("m", Cron.parse("* * * * *"), "UTC", "t", {}, "default", "normal", catch_up)


def test_missed_ticks_are_not_replayed_except_the_newest_unless_asked():
    last, now = utc(2030, 1, 1, 0, 0), utc(2030, 1, 1, 3, 30, 30)  # 210 ticks missed
    assert every_minute().due(last, now) == [utc(2030, 1, 1, 3, 30)]
    ticks = every_minute(catch_up=True).due(last, now)
    assert (
        len(ticks) == 210
        and ticks[0] == utc(2030, 1, 1, 0, 1)
        and ticks[-1] == now.replace(second=0)
    )


def test_a_schedule_seen_for_the_first_time_starts_from_now():
    assert every_minute().due(None, utc(2030, 1, 1, 12)) == []


def test_the_registry_checks_a_schedule_when_it_is_declared():
    tasks = pgqueue.TaskRegistry()
    tasks.periodic("nightly", "0 3 * * *", timezone="Europe/Paris", queue="reports")
    assert [s.name for s in tasks.schedules] == ["nightly"]
    for bad in (
        lambda: tasks.periodic("nightly", "0 3 * * *"),
        lambda: tasks.periodic("x", "0 3 * *"),
        lambda: tasks.periodic("y", "* * * * *", timezone="Nowhere/City"),
        lambda: tasks.periodic("z", "* * * * *", priority="urgent"),
    ):
        with pytest.raises((pgqueue.ValidationError, ValueError)):
            bad()
