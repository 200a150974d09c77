"""The rules of periodic tasks: a cron expression or an interval, and its next tick after a
moment.

Parsing and matching are cronsim's (the parser Healthchecks runs, written to match Debian's
cron): five fields (minute hour day-of-month month day-of-week) or six with seconds first;
``*``, numbers, ``a-b``, ``/step``, lists, month and weekday names, 0 and 7 for Sunday; ``L``
(the last day of the month) and ``LW`` (its last weekday) in the day of month; ``5L`` (the last
Friday) and ``MON#2`` (the second Monday) in the day of week. When both day fields are
restricted, a day matches either; when one starts with ``*`` both must (Debian's rule).
pgqueue adds the ``@yearly`` ... ``@hourly`` aliases, the errors that name the expression and
the field, and its own rule for daylight-saving changes (below), which cronsim leaves to
Debian's habit of running a skipped job late.

Ticks are wall-clock times in the schedule's time zone: ``0 9 * * *`` in Europe/Paris fires at
09:00 Paris time in winter and in summer. A time that a daylight-saving change skips does not
fire that day. A schedule at set times of day (its minute and hour fields start with neither
``*`` nor ``*/``) fires a repeated time once, the first; one that runs through the hour
(``*/15 * * * *``, ``0 * * * *``) keeps its rhythm in real time, in both passes of the hour.

An :class:`Interval` ticks every so much real time, at ``anchor + n * every`` (the anchor is
the Unix epoch unless declared): every scheduler computes the same ticks from the clock alone,
so the schedule's fence (``last_tick``) serves it as it serves cron, and ticks never drift
from the grid however late a scheduler wakes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

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
# What each field of a six-field expression accepts, for the error that names a bad one.
FIELDS = (
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31, L (last day) or LW (last weekday)"),
    ("month", "1-12 or jan-dec"),
    ("day-of-week", "0-7 or sun-sat (0 and 7 are Sunday), 5L (last Friday), mon#2"),
)
NEAREST_WEEKDAY = re.compile(r"\d+W", re.IGNORECASE)
# Any expression that fires fires within cronsim's 50-year search from here; one that does not
# is refused when it is declared, not at its first tick.
PROBE = datetime(2000, 1, 1, tzinfo=UTC)


def _fields(text: str) -> list[str]:
    expanded = ALIASES.get(text.strip().lower(), text.strip())
    parts = expanded.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    if len(parts) != 6:
        raise ValidationError(
            "cron", f"{text!r} has {len(parts)} fields; give 5 (or 6, seconds first)"
        )
    return parts


def _check(text: str, parts: list[str]) -> None:
    """Turn cronsim's "Bad minute" into an error that names the expression, the field, its
    text and what the field accepts, and a combination that can never fire into just that."""
    day = parts[3]
    if NEAREST_WEEKDAY.fullmatch(day):
        raise ValidationError(
            "cron",
            f"{text!r}: the nearest weekday to a day ({day!r}) is not supported; "
            "LW (the last weekday of the month) is",
        )
    try:
        next(CronSim(" ".join(parts), PROBE))
        return
    except StopIteration:
        raise ValidationError("cron", f"{text!r} never fires") from None
    except CronSimError as exc:
        reason = str(exc)
    for index, (name, accepts) in enumerate(FIELDS):
        if reason == f"Bad {name}":
            alone = ["*"] * 6
            alone[index] = parts[index]
            try:
                next(CronSim(" ".join(alone), PROBE))
            except CronSimError:
                raise ValidationError(
                    "cron",
                    f"{text!r}: the {name} field {parts[index]!r} is not valid; "
                    f"it takes *, {accepts}, a-b ranges, /steps and comma lists",
                ) from None
            except StopIteration:
                pass
            raise ValidationError(
                "cron", f"{text!r} never fires: day {day} is in none of its months"
            ) from None
    raise ValidationError("cron", f"{text!r}: {reason}")  # pragma: no cover - a new message


@dataclasses.dataclass(frozen=True)
class Cron:
    """A checked expression: ``text`` as declared, ``fields`` as cronsim reads it (always six,
    seconds first, so that cronsim applies no DST habit of its own: see the module)."""

    text: str
    fields: str
    set_times: bool  # minute and hour are set values: a repeated wall-clock time fires once

    @classmethod
    def parse(cls, text: str) -> Cron:
        """The expression, or ValidationError (field ``cron``) saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise ValidationError("cron", "give a cron expression such as '*/5 * * * *'")
        parts = _fields(text)
        _check(text, parts)
        set_times = not parts[1].startswith("*") and not parts[2].startswith("*")
        return cls(text, " ".join(parts), set_times)

    def _fires(self, tick: datetime, tz: ZoneInfo) -> bool:
        """Whether a tick cronsim found keeps pgqueue's daylight-saving rule."""
        if tick.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != tick.replace(tzinfo=None):
            return False  # a wall-clock time the change skipped
        second_pass = tick.fold == 1 and tick.replace(fold=0).utcoffset() != tick.utcoffset()
        return not (second_pass and self.set_times)

    def next_after(self, moment: datetime, tz: ZoneInfo) -> datetime:
        """The first tick strictly after ``moment`` (aware), as an aware UTC datetime."""
        for tick in CronSim(self.fields, moment.astimezone(tz)):
            if tick > moment and self._fires(tick, tz):
                return tick.astimezone(UTC)
        raise ValidationError("cron", f"{self.text!r} never fires")


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``, or ValidationError (field ``timezone``)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError("timezone", f"{name!r} is not an IANA time zone") from None


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_INTERVAL = timedelta(seconds=1)


def _duration(every: timedelta) -> str:
    """``every`` as people write it: 30s, 5m, 1h30m, 1d, 1.5s."""
    rest = every // timedelta(microseconds=1)
    parts = []
    for size, unit in ((86_400_000_000, "d"), (3_600_000_000, "h"), (60_000_000, "m")):
        value, rest = divmod(rest, size)
        if value:
            parts.append(f"{value}{unit}")
    if rest:
        whole, micro = divmod(rest, 1_000_000)
        parts.append(f"{whole}.{micro:06d}".rstrip("0").rstrip(".") + "s")
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class Interval:
    """Ticks every ``every`` of real time at ``anchor + n * every``, none before the anchor
    (an aware UTC datetime; the Unix epoch unless declared, so that ``every=timedelta(
    minutes=5)`` ticks at :00, :05, ...). Real time, not wall-clock: a daylight-saving change
    neither skips nor repeats a tick (use cron for "at 09:00 local")."""

    every: timedelta
    anchor: datetime = EPOCH

    @classmethod
    def parse(
        cls, every: timedelta | float, anchor: datetime | None = None, tz: ZoneInfo | None = None
    ) -> Interval:
        """The interval, or ValidationError (field ``every`` or ``anchor``) saying what is
        wrong. ``every`` is a timedelta or seconds, at least one second; a naive ``anchor``
        is read in ``tz`` (the schedule's time zone)."""
        if isinstance(every, bool) or not isinstance(every, timedelta | int | float):
            raise ValidationError(
                "every", f"give a timedelta or seconds (e.g. timedelta(seconds=30)), not {every!r}"
            )
        if not isinstance(every, timedelta):
            if every != every or every in (float("inf"), float("-inf")):
                raise ValidationError("every", f"must be a number of seconds, not {every!r}")
            every = timedelta(seconds=every)
        if every < MIN_INTERVAL:
            raise ValidationError(
                "every", f"must be at least 1 second, not {every.total_seconds():g} s"
            )
        if anchor is not None and not isinstance(anchor, datetime):
            raise ValidationError("anchor", f"must be a datetime, not {type(anchor).__name__}")
        if anchor is not None and anchor.tzinfo is None:
            anchor = anchor.replace(tzinfo=tz or UTC)
        interval = cls(every) if anchor is None else cls(every, anchor.astimezone(UTC))
        try:
            interval.next_after(datetime.now(UTC) + every)
        except OverflowError:
            raise ValidationError("every", f"{interval.text} ticks past the year 9999") from None
        return interval

    @property
    def text(self) -> str:
        """How ``pgqueue schedules`` and the API show it: ``every 30s`` (``from ANCHOR`` when
        the anchor is not the epoch)."""
        text = f"every {_duration(self.every)}"
        return text if self.anchor == EPOCH else f"{text} from {self.anchor.isoformat()}"

    def next_after(self, moment: datetime, tz: ZoneInfo | None = None) -> datetime:
        """The first tick strictly after ``moment`` (aware), as an aware UTC datetime. Exact:
        timedelta arithmetic in whole microseconds, no float."""
        if moment < self.anchor:
            return self.anchor
        return self.anchor + ((moment - self.anchor) // self.every + 1) * self.every

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The newest tick not after ``moment`` (None: before the anchor)."""
        if moment < self.anchor:
            return None
        return self.anchor + ((moment - self.anchor) // self.every) * self.every


# Without catch_up, the newest missed tick is looked for in these windows before now, widening
# until one holds a tick: bounded work for a per-second schedule after a long outage, and a
# yearly one is still found.
LOOKBACK_SECONDS = (60.0, 3600.0, 86400.0, 32 * 86400.0, 400 * 86400.0)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A periodic task: ``type`` with ``payload`` is enqueued at every tick of ``cron`` in
    ``timezone``, or of the interval ``every`` (one of the two). Ticks missed while no
    scheduler ran are not replayed, except the newest; with ``catch_up`` every missed tick is
    enqueued, oldest first, up to ``max_catch_up`` a round."""

    name: str
    cron: Cron | None
    timezone: str
    type: str
    payload: Mapping[str, Any]
    queue: str
    priority: str
    catch_up: bool = False
    max_catch_up: int = 1000
    every: Interval | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValidationError(
                "every",
                f"schedule {self.name!r}: give a cron expression or an interval (every=...), "
                + ("not both" if self.cron is not None else "one of them"),
            )

    @property
    def rule(self) -> Cron | Interval:
        """What sets the ticks: the cron expression or the interval."""
        rule = self.cron or self.every
        assert rule is not None  # __post_init__
        return rule

    @property
    def text(self) -> str:
        """The rule as declared and listed: ``*/5 * * * *`` or ``every 30s``."""
        return self.rule.text

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def next_after(self, moment: datetime) -> datetime:
        return self.rule.next_after(moment, self.zone)

    def due(self, last_tick: datetime | None, now: datetime) -> list[datetime]:
        """The ticks to enqueue now: after ``last_tick`` and not after ``now``. A schedule
        seen for the first time (no last tick) starts from now: nothing from the past."""
        if last_tick is None or last_tick >= now:
            return []
        if self.every is not None and not self.catch_up:
            newest = self.every.latest_at_or_before(now)
            return [newest] if newest is not None and newest > last_tick else []
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
