"""Interval schedules (``every=``): ticks on a grid every scheduler computes alike, the
declaration's checks, and how the rule reads in listings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import pgqueue
from pgqueue.cron import Cron, Interval, Schedule


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_interval_ticks_fall_on_multiples_of_the_interval_from_the_epoch():
    every = Interval.parse(timedelta(minutes=5))
    assert every.next_after(utc(2030, 1, 1, 0, 7, 13)) == utc(2030, 1, 1, 0, 10)
    assert every.next_after(utc(2030, 1, 1, 0, 10)) == utc(2030, 1, 1, 0, 15)  # strictly after
    assert every.latest_at_or_before(utc(2030, 1, 1, 0, 10)) == utc(2030, 1, 1, 0, 10)
    # 2030-01-01 is 1893456000 s after the epoch, 7 x 270493714 + 2
    assert Interval.parse(7).next_after(utc(2030, 1, 1)) == utc(2030, 1, 1, 0, 0, 5)


def test_interval_ticks_keep_the_grid_over_many_ticks_without_drift():
    every = Interval.parse(1.1)  # not a whole number of seconds, nor a binary fraction
    tick = every.next_after(utc(2030, 1, 1))
    for _ in range(10_000):
        tick = every.next_after(tick)
    assert (tick - every.anchor) % timedelta(microseconds=1_100_000) == timedelta(0)
    assert tick == every.next_after(tick - timedelta(microseconds=1))


def test_an_anchored_interval_starts_at_its_anchor_and_a_naive_anchor_is_read_in_the_zone():
    tasks = pgqueue.TaskRegistry()
    schedule = tasks.periodic(
        "half-past",
        every=timedelta(hours=1),
        anchor=datetime(2030, 1, 1, 9, 30),  # Paris, winter: UTC+1
        timezone="Europe/Paris",
    )
    assert schedule.every is not None and schedule.every.anchor == utc(2030, 1, 1, 8, 30)
    assert schedule.next_after(utc(2029, 6, 1)) == utc(2030, 1, 1, 8, 30)  # none before it
    assert schedule.next_after(utc(2030, 7, 1, 12, 0)) == utc(2030, 7, 1, 12, 30)  # real time
    assert schedule.text == "every 1h from 2030-01-01T08:30:00+00:00"


@pytest.mark.parametrize(
    ("every", "text"),
    [
        (30, "every 30s"),
        (1.5, "every 1.5s"),
        (timedelta(minutes=90), "every 1h30m"),
        (timedelta(days=1), "every 1d"),
        (timedelta(days=1, seconds=61), "every 1d1m1s"),
    ],
)
def test_an_interval_reads_as_people_write_it(every, text):
    assert pgqueue.TaskRegistry().periodic("s", every=every).text == text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0.5}, "every: must be at least 1 second, not 0.5 s"),
        ({"every": timedelta(seconds=-5)}, "every: must be at least 1 second, not -5 s"),
        ({"every": 0}, "every: must be at least 1 second, not 0 s"),
        ({"every": "30s"}, "every: give a timedelta or seconds (e.g. timedelta(seconds=30))"),
        ({"every": True}, "every: give a timedelta or seconds"),
        ({"every": float("nan")}, "every: must be a number of seconds, not nan"),
        ({"every": timedelta.max}, "ticks past the year 9999"),
        ({"cron": "* * * * *", "every": 5}, "every: schedule 's': give a cron expression or"),
        ({}, "cron: schedule 's': give a cron expression (e.g. '*/5 * * * *') or an interval"),
        ({"cron": "* * * * *", "anchor": utc(2030, 1, 1)}, "anchor: schedule 's': an anchor is"),
        ({"every": 5, "anchor": "2030-01-01"}, "anchor: must be a datetime, not str"),
    ],
)
def test_a_bad_interval_declaration_is_refused_saying_what_to_give(kwargs, message):
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.TaskRegistry().periodic("s", **kwargs)
    assert message in str(caught.value)


def test_a_schedule_built_by_hand_needs_exactly_one_rule():
    cron, every = Cron.parse("* * * * *"), Interval.parse(5)
    with pytest.raises(pgqueue.ValidationError, match="not both"):
        Schedule("s", cron, "UTC", "t", {}, "default", "normal", every=every)
    with pytest.raises(pgqueue.ValidationError, match="one of them"):
        Schedule("s", None, "UTC", "t", {}, "default", "normal")


def test_without_catch_up_an_interval_enqueues_only_the_newest_missed_tick():
    schedule = pgqueue.TaskRegistry().periodic("s", every=10)
    last = utc(2030, 1, 1)
    assert schedule.due(last, utc(2030, 1, 2, 0, 0, 5)) == [utc(2030, 1, 2)]
    assert schedule.due(last, utc(2030, 1, 1, 0, 0, 9)) == []
    caught_up = pgqueue.TaskRegistry().periodic("s", every=10, catch_up=True)
    assert caught_up.due(last, utc(2030, 1, 1, 0, 0, 35)) == [
        utc(2030, 1, 1, 0, 0, s) for s in (10, 20, 30)
    ]
