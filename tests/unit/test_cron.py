"""Cron expressions (cronsim behind pgqueue's interface): the next tick, in a time zone,
across daylight-saving changes; L, LW, 5L and #; and the error that names a bad expression."""

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
        # The same rule with seconds: cronsim would fire a six-field 02:30 in both passes.
        pytest.param("0 30 2 * * *", utc(2030, 3, 30, 12), PARIS, utc(2030, 4, 1, 0, 30)),
        pytest.param("0 30 2 * * *", utc(2030, 10, 27, 0, 30), PARIS, utc(2030, 10, 28, 1, 30)),
    ],
)
def test_next_tick_is_the_first_wall_clock_match_strictly_after(expression, after, tz, expected):
    assert Cron.parse(expression).next_after(after, tz) == expected


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # 27 October 2030, Paris: 02:00-03:00 happens twice (00:00-01:00 UTC, then 01:00-02:00).
        pytest.param("*/30 * * * *", utc(2030, 10, 27, 0, 30), utc(2030, 10, 27, 1, 0)),
        pytest.param("*/30 * * * *", utc(2030, 10, 27, 1, 0), utc(2030, 10, 27, 1, 30)),
        pytest.param("0 * * * *", utc(2030, 10, 27, 0, 0), utc(2030, 10, 27, 1, 0)),
        # 31 March 2030: the hour after 01:00 local is 03:00, an hour of real time later.
        pytest.param("*/30 * * * *", utc(2030, 3, 31, 0, 30), utc(2030, 3, 31, 1, 0)),
    ],
)
def test_a_schedule_through_the_hour_keeps_its_rhythm_across_a_repeated_hour(
    expression, after, expected
):
    assert Cron.parse(expression).next_after(after, PARIS) == expected


@pytest.mark.parametrize(
    ("expression", "after", "tz", "expected"),
    [
        pytest.param("0 0 L * *", utc(2030, 2, 1), zone("UTC"), utc(2030, 2, 28), id="L"),
        pytest.param("0 0 L 2 *", utc(2031, 3, 1), zone("UTC"), utc(2032, 2, 29), id="L-leap"),
        # 30 June 2030 is a Sunday: the last weekday is Friday the 28th.
        pytest.param("0 0 LW * *", utc(2030, 6, 1), zone("UTC"), utc(2030, 6, 28), id="LW"),
        # The last day of January at 23:00 in Paris is 22:00 UTC.
        pytest.param("0 23 L * *", utc(2030, 1, 1), PARIS, utc(2030, 1, 31, 22), id="L-zone"),
        pytest.param("0 0 * * 5L", utc(2030, 1, 1), zone("UTC"), utc(2030, 1, 25), id="5L"),
        pytest.param("0 0 * * fri#3", utc(2030, 1, 1), zone("UTC"), utc(2030, 1, 18), id="#"),
        # No fifth Friday in January or February 2030: the first is 29 March.
        pytest.param("0 0 * * 5#5", utc(2030, 1, 1), zone("UTC"), utc(2030, 3, 29), id="#5"),
        pytest.param("0 9 * * mon#1,mon#3", utc(2030, 1, 8), PARIS, utc(2030, 1, 21, 8)),
    ],
)
def test_last_day_last_weekday_and_nth_weekday_fire_on_the_day_they_name(
    expression, after, tz, expected
):
    assert Cron.parse(expression).next_after(after, tz) == expected


@pytest.mark.parametrize(
    "expression",
    ["", "* * *", "61 * * * *", "*/0 * * * *", "5-1 * * * *", "* * * foo *", "0 0 30 2 *"],
)
def test_a_bad_or_impossible_expression_is_a_validation_error_naming_cron(expression):
    with pytest.raises(pgqueue.ValidationError) as info:
        Cron.parse(expression).next_after(utc(2030, 1, 1), zone("UTC"))
    assert info.value.field == "cron"


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * *", "'* * *' has 3 fields; give 5 (or 6, seconds first)"),
        ("61 * * * *", "'61 * * * *': the minute field '61' is not valid; it takes *, 0-59"),
        ("* 24 * * *", "'* 24 * * *': the hour field '24' is not valid; it takes *, 0-23"),
        ("5-1 * * * *", "'5-1 * * * *': the minute field '5-1' is not valid"),
        ("*/0 * * * *", "'*/0 * * * *': the minute field '*/0' is not valid"),
        ("0 0 L-2 * *", "'0 0 L-2 * *': the day-of-month field 'L-2' is not valid"),
        ("0 0 * * mon#6", "'0 0 * * mon#6': the day-of-week field 'mon#6' is not valid"),
        ("0 0 * * 8", "'0 0 * * 8': the day-of-week field '8' is not valid; it takes *, 0-7"),
        ("0 0 * foo *", "'0 0 * foo *': the month field 'foo' is not valid"),
        ("0 0 15W * *", "'0 0 15W * *': the nearest weekday to a day ('15W') is not supported"),
        ("0 0 30 2 *", "'0 0 30 2 *' never fires: day 30 is in none of its months"),
        # The 1st or the 21st, when that day is also the month's last Monday: never.
        ("* * */20 * 1L", "'* * */20 * 1L' never fires"),
    ],
)
def test_a_bad_expression_is_refused_when_parsed_naming_it_and_what_is_wrong(expression, says):
    with pytest.raises(pgqueue.ValidationError) as info:
        Cron.parse(expression)
    assert info.value.field == "cron"
    assert str(info.value).startswith(f"cron: {says}")


def test_a_bad_expression_is_refused_by_periodic_naming_it():
    tasks = pgqueue.TaskRegistry()
    with pytest.raises(pgqueue.ValidationError) as info:
        tasks.periodic("month-end", "0 0 LW-1 * *")
    assert str(info.value).startswith(
        "cron: '0 0 LW-1 * *': the day-of-month field 'LW-1' is not valid"
    )
    assert tasks.schedules == []


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
