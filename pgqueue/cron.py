"""Cron expressions for periodic tasks: parse one, and find its next tick after a moment.

Five fields (minute hour day-of-month month day-of-week) as in crontab(5), or six with seconds
first. Each field takes ``*``, numbers, ``a-b`` ranges, ``/step`` and comma lists; months and
weekdays also take their English three-letter names, and 0 and 7 are both Sunday. When both
day fields are restricted, a day matches either (crontab's rule). ``@yearly``, ``@monthly``,
``@weekly``, ``@daily`` (``@midnight``) and ``@hourly`` stand for the usual expressions.

Ticks are wall-clock times in the schedule's time zone: ``0 9 * * *`` in Europe/Paris fires at
09:00 Paris time in winter and in summer. A time that a daylight-saving change skips does not
fire that day; a time it repeats fires once (the first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgqueue.errors import ValidationError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# (name, low, high, names whose index + offset is the value)
FIELDS = (
    ("second", 0, 59, None, 0),
    ("minute", 0, 59, None, 0),
    ("hour", 0, 23, None, 0),
    ("day of month", 1, 31, None, 0),
    ("month", 1, 12, MONTHS, 1),
    ("day of week", 0, 7, WEEKDAYS, 0),
)
# The search gives up after this many years without a tick (``0 0 30 2 *`` never fires).
HORIZON_YEARS = 8


def _value(text: str, field: str, low: int, high: int, names: list[str] | None, offset: int) -> int:
    if names is not None and text.lower() in names:
        return names.index(text.lower()) + offset
    if not text.isdigit():
        raise ValueError(f"{field}: {text!r} is not a number")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{field}: {value} is outside {low}-{high}")
    return value


def _field(text: str, spec: tuple[str, int, int, list[str] | None, int]) -> frozenset[int]:
    field, low, high, names, offset = spec
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{field}: step {step_text!r} is not a positive number")
            step = int(step_text)
        if body == "*":
            start, end = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            start = _value(a, field, low, high, names, offset)
            end = _value(b, field, low, high, names, offset)
            if start > end:
                raise ValueError(f"{field}: range {body!r} runs backwards")
        else:
            start = _value(body, field, low, high, names, offset)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclasses.dataclass(frozen=True)
class Cron:
    """A parsed expression: the allowed values of each field."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *

    @classmethod
    def parse(cls, text: str) -> Cron:
        """The expression, or ValidationError (field ``cron``) saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise ValidationError("cron", "give a cron expression such as '*/5 * * * *'")
        expanded = ALIASES.get(text.strip().lower(), text.strip())
        parts = expanded.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        if len(parts) != 6:
            raise ValidationError(
                "cron", f"{text!r} has {len(parts)} fields; give 5 (or 6, seconds first)"
            )
        try:
            sets = [_field(part, spec) for part, spec in zip(parts, FIELDS, strict=True)]
        except ValueError as exc:
            raise ValidationError("cron", f"{text!r}: {exc}") from None
        weekdays = frozenset(d % 7 for d in sets[5])
        seconds, minutes, hours, days, months = sets[:5]
        return cls(
            text,
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            any_day=parts[3] == "*",
            any_weekday=parts[5] == "*",
        )

    def _day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week  # both restricted: either will do

    def next_after(self, moment: datetime, tz: ZoneInfo) -> datetime:
        """The first tick strictly after ``moment`` (aware), as an aware UTC datetime."""
        local = moment.astimezone(tz).replace(tzinfo=None, microsecond=0) + timedelta(seconds=1)
        limit = local.replace(year=min(local.year + HORIZON_YEARS, 9999))
        while local < limit:
            if local.month not in self.months:
                year, month = (
                    (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
                )
                local = datetime(year, month, 1)
                continue
            if not self._day_matches(local):
                local = datetime(local.year, local.month, local.day) + timedelta(days=1)
                continue
            if local.hour not in self.hours:
                local = local.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if local.minute not in self.minutes:
                local = local.replace(second=0) + timedelta(minutes=1)
                continue
            if local.second not in self.seconds:
                local += timedelta(seconds=1)
                continue
            aware = local.replace(tzinfo=tz, fold=0)
            # A time skipped by a daylight-saving change does not exist: it does not fire.
            if aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == local:
                tick = aware.astimezone(UTC)
                if tick > moment:
                    return tick
            local += timedelta(seconds=1)
        raise ValidationError("cron", f"{self.text!r} never fires")


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``, or ValidationError (field ``timezone``)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError("timezone", f"{name!r} is not an IANA time zone") from None


# Without catch_up, the newest missed tick is looked for in these windows before now, widening
# until one holds a tick: bounded work for a per-second schedule after a long outage, and a
# yearly one is still found.
LOOKBACK_SECONDS = (60.0, 3600.0, 86400.0, 32 * 86400.0, 400 * 86400.0)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A periodic task: ``type`` with ``payload`` is enqueued at every tick of ``cron`` in
    ``timezone``. Ticks missed while no scheduler ran are not replayed, except the newest;
    with ``catch_up`` every missed tick is enqueued, oldest first, up to ``max_catch_up`` a
    round."""

    name: str
    cron: Cron
    timezone: str
    type: str
    payload: Mapping[str, Any]
    queue: str
    priority: str
    catch_up: bool = False
    max_catch_up: int = 1000

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def next_after(self, moment: datetime) -> datetime:
        return self.cron.next_after(moment, self.zone)

    def due(self, last_tick: datetime | None, now: datetime) -> list[datetime]:
        """The ticks to enqueue now: after ``last_tick`` and not after ``now``. A schedule
        seen for the first time (no last tick) starts from now: nothing from the past."""
        if last_tick is None or last_tick >= now:
            return []
        if self.catch_up:
            ticks: list[datetime] = []
            tick = self.next_after(last_tick)
            while tick <= now and len(ticks) < self.max_catch_up:
                ticks.append(tick)
                tick = self.next_after(tick)
            return ticks
        for window in (*LOOKBACK_SECONDS, None):
            start = last_tick if window is None else max(last_tick, now - timedelta(seconds=window))
            newest = None
            tick = self.next_after(start)
            while tick <= now:
                newest = tick
                tick = self.next_after(tick)
            if newest is not None or window is None or start == last_tick:
                return [] if newest is None else [newest]
        return []
