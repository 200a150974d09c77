"""Property: an enqueue either stores exactly what it was given, or refuses it with a
``pgqueue.ValidationError`` that names the offending argument, having written nothing.

Why: validation is the only thing between a caller's arguments and the hot table. A validator
that is too lax lets PostgreSQL raise instead (a psycopg error that aborts the caller's
transaction), one that is too strict refuses good tasks, and one that lets some other
exception escape breaks every caller that catches ``ValidationError``. Hand-picked cases
(tests/integration/test_bad_input.py) cover the values someone thought of; here Hypothesis
draws the arguments of ``enqueue``, ``prepare`` + ``enqueue_many`` and ``enqueue_many`` with
dicts: names with NUL, lone surrogates and lengths around the limits, priorities in every
spelling, payloads of nested JSON with non-JSON values, NaN and infinities, NUL characters,
sizes around the limit, idempotency keys, max_attempts, retry policies, run_at and delay.

The expected verdict comes from a small oracle written below from the documented rules (the
README, the docstrings, the limits named in error messages), never from pgqueue's own
validators. Accepted: the row holds type, queue, priority and idempotency key verbatim, the
payload equal to the input after a JSON round trip (numbers compared as JSON numbers), and
the documented schedule and attempts. Refused: a ``ValidationError`` whose ``.field`` is one
of the arguments the oracle found wrong (the specific subclass for priority and payload),
the caller's transaction still open and usable, its own earlier write still there, and not
one row more.

Every example runs in its own transaction on a non-autocommit connection and is rolled back,
so all examples share one database without seeing each other's rows.
"""

from __future__ import annotations

import json
import math
import struct
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from jsonb_text import jsonb_size
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

import pgqueue

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

# The documented limits (README, error messages), restated here rather than imported.
NAME_LIMIT = 200
KEY_LIMIT = 500
MAX_ATTEMPTS_LIMIT = 1_000_000
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600
DEFAULT_PAYLOAD_LIMIT = 1024 * 1024
MAX_JSON_DEPTH = 100  # levels of objects and arrays, the payload itself being the first
MAX_INT_DIGITS = 4300  # Python's limit for int <-> str, so for JSON
INT_BOUND: int = 10**MAX_INT_DIGITS  # the smallest integer with one digit too many
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BACKOFF = (1.0, 2.0, 300.0)
PRIORITY_NAMES = {"high": 0, "normal": 1, "low": 2}
MICROSECOND = timedelta(microseconds=1)

PROPERTY_SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None)

PATHS = ("enqueue", "prepare+enqueue_many", "dict+enqueue_many")


# --- the oracle ------------------------------------------------------------------------------


def text_is_storable(value: str) -> bool:
    """PostgreSQL text holds any Unicode string except one with NUL or a lone surrogate."""
    return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def name_is_bad(value: object, limit: int) -> bool:
    """type, queue and idempotency_key: a non-blank string of at most ``limit`` characters."""
    if not isinstance(value, str):
        return True
    return not value.strip() or len(value) > limit or not text_is_storable(value)


def priority_number(value: object) -> int | None:
    """'high', 'normal', 'low' in any (ASCII) case, padding allowed, or 0, 1, 2; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int(value) if int(value) in (0, 1, 2) else None
    if isinstance(value, str):
        word = value.strip()
        if word.isascii():
            return PRIORITY_NAMES.get(word.lower())
    return None


def key_is_json(key: object) -> bool:
    """A dict key JSON can write: a string, or a scalar written as its text."""
    if isinstance(key, str):
        return text_is_storable(key)
    if isinstance(key, float):
        return math.isfinite(key)
    return key is None or isinstance(key, int)  # bool is an int


def value_is_json(value: object) -> bool:
    """A value jsonb can hold: JSON scalars (finite numbers, integers of at most 4,300
    digits), lists, tuples and dicts."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < INT_BOUND
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return text_is_storable(value)
    if isinstance(value, list | tuple):
        return all(value_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(key_is_json(k) and value_is_json(v) for k, v in value.items())
    return False


def nesting(value: object) -> int:
    """Levels of objects and arrays: 0 for a scalar, 1 for {} or []."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max(map(nesting, value), default=0)
    return 0


def json_size(payload: object) -> int | None:
    """Size by the payload rule (the UTF-8 text jsonb gives back, its floats in full), or None
    if it has no JSON encoding."""
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
        return jsonb_size(payload)
    except (TypeError, ValueError):
        return None


def payload_problem(payload: object, limit: int) -> str | None:
    """None for a storable payload, "too_large" when size is its only problem, else "invalid"."""
    if payload is None:
        return None
    if not isinstance(payload, Mapping):
        return "invalid"
    if not value_is_json(dict(payload)) or nesting(dict(payload)) > MAX_JSON_DEPTH:
        return "invalid"
    size = json_size(dict(payload))
    assert size is not None
    return "too_large" if size > limit else None


def utc_instant(value: datetime) -> datetime:
    """The instant an aware datetime names, in UTC; OverflowError outside years 1 to 9999."""
    offset = value.utcoffset()
    assert offset is not None
    return (value.replace(tzinfo=None) - offset).replace(tzinfo=UTC)


def run_at_is_bad(value: object) -> bool:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        return True
    try:
        utc_instant(value)
    except OverflowError:
        return True
    return False


def delay_is_bad(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return value < 0 or value > MAX_DELAY_SECONDS


def max_attempts_is_bad(value: object) -> bool:
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int):
        return True
    return not 1 <= value <= MAX_ATTEMPTS_LIMIT


def offending(args: Mapping[str, Any]) -> dict[str, str]:
    """The arguments that must be refused, each with a word on why: {} means accept."""
    bad: dict[str, str] = {}
    if name_is_bad(args["type"], NAME_LIMIT):
        bad["type"] = "name"
    # None is "not given" for queue and priority: the type's declaration applies.
    if "queue" in args and args["queue"] is not None and name_is_bad(args["queue"], NAME_LIMIT):
        bad["queue"] = "name"
    key = args.get("idempotency_key")
    if key is not None and name_is_bad(key, KEY_LIMIT):
        bad["idempotency_key"] = "name"
    if (
        "priority" in args
        and args["priority"] is not None
        and priority_number(args["priority"]) is None
    ):
        bad["priority"] = "priority"
    limit = args.get("max_payload_bytes", DEFAULT_PAYLOAD_LIMIT)
    problem = payload_problem(args.get("payload"), limit)
    if problem is not None:
        bad["payload"] = problem
    run_at, delay = args.get("run_at"), args.get("delay")
    if run_at is not None and delay is not None:
        bad["run_at"] = bad["delay"] = "both given"
    if run_at is not None and run_at_is_bad(run_at):
        bad["run_at"] = "run_at"
    if delay is not None and delay_is_bad(delay):
        bad["delay"] = "delay"
    if max_attempts_is_bad(args.get("max_attempts")):
        bad["max_attempts"] = "max_attempts"
    return bad


# --- what an accepted task must look like ----------------------------------------------------


def as_float4(value: float) -> float:
    """The value as PostgreSQL's real (float4) column holds it."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def json_value(text: str) -> Any:
    """Parsed JSON with every number as a Decimal, so 1e+23 and 100000000000000000000000 (the
    same JSON number, as Python and PostgreSQL print it) compare equal."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def same_json(a: Any, b: Any) -> bool:
    """Strict JSON equality: true is not 1, "1" is not 1, and numbers compare by value."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def expected_payload(args: Mapping[str, Any]) -> Any:
    payload = args.get("payload")
    payload = {} if payload is None else dict(payload)
    return json_value(json.dumps(payload, ensure_ascii=False))


def assert_stored_verbatim(row: Mapping[str, Any], args: Mapping[str, Any]) -> None:
    assert row["type"] == args["type"]
    given_queue, given_priority = args.get("queue"), args.get("priority")  # None: not given
    assert row["queue"] == ("default" if given_queue is None else given_queue)
    assert row["priority"] == priority_number(
        "normal" if given_priority is None else given_priority
    )
    assert row["idempotency_key"] == args.get("idempotency_key")
    assert row["status"] == "queued"
    assert row["attempts"] == 0
    stored = json_value(row["payload_text"])
    wanted = expected_payload(args)
    assert same_json(stored, wanted), f"stored payload {stored!r} != {wanted!r}"

    retry = args.get("retry")
    policy = (
        (retry.max_attempts, retry.base, retry.factor, retry.cap)
        if retry is not None
        else (DEFAULT_MAX_ATTEMPTS, *DEFAULT_BACKOFF)
    )
    max_attempts = args.get("max_attempts")
    assert row["max_attempts"] == (policy[0] if max_attempts is None else max_attempts)
    stored_backoff = (row["backoff_base"], row["backoff_factor"], row["backoff_cap"])
    assert tuple(map(as_float4, stored_backoff)) == tuple(as_float4(float(v)) for v in policy[1:])

    assert row["created_at"] == T0
    run_at, delay = args.get("run_at"), args.get("delay")
    if run_at is not None:
        assert row["visible_after"] == utc_instant(run_at)
    elif delay is not None:
        wanted_at = T0 + timedelta(seconds=float(delay))
        assert abs(row["visible_after"] - wanted_at) <= MICROSECOND, (row["visible_after"], delay)
    else:
        assert row["visible_after"] == T0


# --- running one example ---------------------------------------------------------------------


def tasks_in(tx: psycopg.Connection[Any]) -> dict[Any, dict[str, Any]]:
    with tx.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT id, type, queue, priority, idempotency_key, payload::text AS payload_text,"
            "       max_attempts, backoff_base, backoff_factor, backoff_cap, visible_after,"
            "       created_at, status, attempts"
            "  FROM pgqueue.tasks"
        )
        return {row["id"]: row for row in cur.fetchall()}


def submit(
    tx: psycopg.Connection[Any], path: str, items: list[dict[str, Any]]
) -> list[pgqueue.EnqueueResult]:
    """Submit the items through one of the three entry points."""
    if path == "enqueue":
        assert len(items) == 1
        return [pgqueue.enqueue(tx, **items[0], now=T0)]
    if path == "prepare+enqueue_many":
        specs = [pgqueue.prepare(**item) for item in items]
        results = pgqueue.enqueue_many(tx, specs, now=T0)
        # A prepared task keeps the id it was given (unless its key was taken).
        for spec, result in zip(specs, results, strict=True):
            assert result.id == spec.id or not result.created
        return results
    assert path == "dict+enqueue_many"
    return pgqueue.enqueue_many(tx, items, now=T0)


def check_refusal(exc: pgqueue.ValidationError, bad: Mapping[str, str], args: Any) -> None:
    assert exc.field in bad, f"refused {exc.field!r} ({exc}); the oracle objects to {bad}"
    if exc.field == "priority":
        assert isinstance(exc, pgqueue.InvalidPriority), repr(exc)
    elif exc.field == "payload":
        assert isinstance(exc, pgqueue.InvalidPayload), repr(exc)
        payload = dict(args["payload"]) if isinstance(args["payload"], Mapping) else None
        size = json_size(payload) if payload is not None else None
        if bad["payload"] == "too_large":
            assert isinstance(exc, pgqueue.PayloadTooLarge), repr(exc)
        if isinstance(exc, pgqueue.PayloadTooLarge):
            assert size is not None and exc.size == size > exc.limit, (exc, size)
    else:
        assert not isinstance(exc, pgqueue.InvalidPriority | pgqueue.InvalidPayload), repr(exc)


def printable(value: object) -> str:
    try:
        return repr(value)
    except ValueError:  # an integer past 4,300 digits has no repr either
        return f"<{type(value).__name__} too large to print>"


def attempt(tx: psycopg.Connection[Any], path: str, items: list[dict[str, Any]]) -> str:
    """Submit ``items`` in a fresh transaction (rolled back after) and check the outcome
    against the oracle; returns "accepted" or "refused"."""
    verdicts = [offending(item) for item in items]
    bad_items = [(item, bad) for item, bad in zip(items, verdicts, strict=True) if bad]
    note(f"path={path} items={printable(items)} oracle={verdicts}")
    try:
        marker = pgqueue.enqueue(tx, "caller's own work", {"mine": True}, now=T0).id
        before = tasks_in(tx)
        try:
            results = submit(tx, path, items)
        except pgqueue.ValidationError as exc:
            assert bad_items, f"refused valid arguments: {exc!r}"
            # Whichever bad item was validated first is the one named.
            assert any(exc.field in bad for _, bad in bad_items), (exc, verdicts)
            item, bad = next((i, b) for i, b in bad_items if exc.field in b)
            check_refusal(exc, bad, item)
            assert tx.info.transaction_status is TransactionStatus.INTRANS
            assert tasks_in(tx) == before  # nothing written ...
            assert marker in before  # ... and the caller's own work is intact
            return "refused"
        assert not bad_items, f"accepted arguments the oracle refuses: {verdicts}"
        after = tasks_in(tx)
        check_batch_outcome(items, results, before, after)
        return "accepted"
    finally:
        tx.rollback()


def check_batch_outcome(
    items: list[dict[str, Any]],
    results: list[pgqueue.EnqueueResult],
    before: Mapping[Any, Any],
    after: Mapping[Any, dict[str, Any]],
) -> None:
    """In order, one result per item: the first item with a key creates its task, later
    items with that key get the same task back; nothing else is written."""
    assert len(results) == len(items)
    first_with_key: dict[str, pgqueue.EnqueueResult] = {}
    created = []
    for item, result in zip(items, results, strict=True):
        key = item.get("idempotency_key")
        if key is not None and key in first_with_key:
            assert not result.created
            assert result.id == first_with_key[key].id
            continue
        assert result.created
        if key is not None:
            first_with_key[key] = result
        created.append(result.id)
        row = after[result.id]
        assert_stored_verbatim(row, item)
        assert result.task.type == row["type"] and result.task.queue == row["queue"]
        assert int(result.task.priority) == row["priority"]
        assert result.task.visible_after == row["visible_after"]
        assert result.task.created_at == row["created_at"]
    assert len(set(created)) == len(created)
    assert set(after) == set(before) | set(created)
    assert not set(before) & set(created)


# --- strategies ------------------------------------------------------------------------------

ODD_CHARACTERS = [
    "\x00", "\ud800", "\udfff", "\udc80", " ", "\t", "\n", "\u2003", "\x1f", "\u200b",
    "é", "e\u0301", "🎉", "'", '"', "%", "%s", "\\", "{", "$1",
]  # fmt: skip
clean_character = st.characters(codec="utf-8", exclude_characters="\x00")


def odd_text(max_size: int) -> st.SearchStrategy[str]:
    """Text mixing any characters (NUL included) with the odd pieces above."""
    piece = st.one_of(st.characters(), st.sampled_from(ODD_CHARACTERS))
    return st.lists(piece, max_size=max_size).map("".join)


def good_names(limit: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(clean_character, min_size=1, max_size=24).filter(lambda s: bool(s.strip())),
        st.sampled_from(["send_email", "default", " padded ", "ключ ✓ 中文 🎉", "%(id)s {0} $1"]),
        st.sampled_from(["a", "é", "🎉", "中"]).map(lambda c: c * limit),
    )


def wild_names(limit: int) -> st.SearchStrategy[object]:
    return st.one_of(
        odd_text(12),
        st.builds(
            lambda c, extra: c * (limit + extra),
            st.sampled_from(["k", "é", "🎉", " "]),
            st.integers(-2, 2),
        ),
        st.builds(
            lambda s, c: s + c,
            st.text(clean_character, max_size=5),
            st.sampled_from(ODD_CHARACTERS),
        ),
        st.none(),
        st.integers(),
        st.binary(max_size=4),
        st.lists(st.text(max_size=2), max_size=2),
    )


def mangle_case(word: str, pattern: list[bool], pad: tuple[str, str]) -> str:
    ups = (pattern + [False] * len(word))[: len(word)]
    cased = "".join(c.upper() if up else c for c, up in zip(word, ups, strict=True))
    return pad[0] + cased + pad[1]


PADDING = st.sampled_from(["", " ", "\t", "\n ", "\u2003"])
spelled_priorities = st.builds(
    mangle_case,
    st.sampled_from(list(PRIORITY_NAMES)),
    st.lists(st.booleans(), max_size=6),
    st.tuples(PADDING, PADDING),
)
good_priorities = st.one_of(
    spelled_priorities, st.sampled_from(list(pgqueue.Priority)), st.integers(0, 2)
)
wild_priorities = st.one_of(
    good_priorities,
    st.integers(-3, 12),
    st.sampled_from([True, False, None, 1.0, 0.0, "", "urgent", "1", "high,low", "hi gh"]),
    odd_text(8),
    st.floats(),
)

# Text for payloads: mostly ordinary, sometimes with NUL or a lone surrogate.
payload_text = st.one_of(st.text(clean_character, max_size=12), odd_text(6))
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(clean_character, max_size=12),
)
good_json = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(clean_character, max_size=8), inner, max_size=3),
    ),
    max_leaves=12,
)
good_payloads = st.one_of(
    st.none(),
    st.dictionaries(st.text(clean_character, max_size=10), good_json, max_size=5),
)


class Opaque:
    """An object JSON knows nothing about."""

    def __repr__(self) -> str:
        return "Opaque()"


non_json_values = st.one_of(
    st.sets(st.integers(), min_size=1, max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.binary(max_size=3),
    st.builds(Opaque),
    st.decimals(allow_nan=False, places=2),
    st.complex_numbers(max_magnitude=10),
    st.datetimes(),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308 * 10]),
)
payload_keys: st.SearchStrategy[object] = st.one_of(
    payload_text,
    st.integers(-5, 5),
    st.sampled_from([None, True, False, 1.5, float("nan"), ("a", "b"), frozenset()]),
)
wild_json = st.recursive(
    st.one_of(json_scalars, payload_text, st.floats(), non_json_values),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(payload_keys, inner, max_size=3),
    ),
    max_leaves=10,
)


def nest(levels: int, innermost: object, as_lists: bool) -> dict[str, Any]:
    """A payload ``levels`` deep: {"a": [[...[innermost]...]]} or {"a": {"a": ...}}."""
    value = innermost
    for _ in range(levels - 1):
        value = [value] if as_lists else {"a": value}
    return {"a": value}


deep_payloads = st.builds(
    nest,
    st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 2) | st.sampled_from([300]),
    st.sampled_from([1, "x", None, [], {}]),
    st.booleans(),
)
huge_numbers = st.sampled_from(
    [10 ** (MAX_INT_DIGITS - 1), -(10 ** (MAX_INT_DIGITS - 1)), 10**MAX_INT_DIGITS, 2**20000]
).map(lambda n: {"n": n})
wild_payloads = st.one_of(
    good_payloads,
    deep_payloads,
    huge_numbers,
    st.dictionaries(payload_keys, wild_json, max_size=4),
    st.lists(good_json, max_size=2),
    st.text(max_size=4),
    st.integers(),
    st.sets(st.integers(), max_size=2),
    st.tuples(st.text(max_size=2)),
    st.binary(max_size=4),
)
# A limit small enough for drawn payloads to land on both sides of it.
payload_limits = st.integers(min_value=1, max_value=300)

good_max_attempts = st.one_of(st.none(), st.integers(1, MAX_ATTEMPTS_LIMIT))
wild_max_attempts = st.one_of(
    st.integers(-3, 4),
    st.integers(MAX_ATTEMPTS_LIMIT - 2, MAX_ATTEMPTS_LIMIT + 2),
    st.integers(),
    st.sampled_from([2**31, 2**63, True, False, 2.0, 2.5, "3", Decimal(3), None]),
)
retry_policies = st.builds(
    pgqueue.RetryPolicy,
    max_attempts=st.integers(1, 10),
    base=st.one_of(st.just(0.0), st.floats(1e-3, 100)),
    factor=st.floats(1, 10),
    cap=st.one_of(st.just(0.0), st.floats(1e-3, 3600)),
)
# The numbers RetryPolicy's own ranges allow, down to the smallest positive float.
YEAR = 365 * 24 * 3600.0
retry_numbers = st.fixed_dictionaries(
    {
        "max_attempts": st.integers(1, MAX_ATTEMPTS_LIMIT),
        "base": st.one_of(st.floats(0, YEAR), st.floats(0, 1e-30)),
        "factor": st.floats(1, 100),
        "cap": st.one_of(st.floats(0, YEAR), st.floats(0, 1e-30)),
    }
)


class NoOffset(tzinfo):
    """A time zone that declines to say its offset: such a datetime is effectively naive."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


ZONES: list[tzinfo] = [
    UTC,
    timezone(timedelta(hours=14)),
    timezone(-timedelta(hours=12)),
    timezone(timedelta(hours=5, minutes=30)),
    ZoneInfo("Europe/Paris"),
    ZoneInfo("America/New_York"),
    ZoneInfo("Australia/Lord_Howe"),
    ZoneInfo("Europe/Amsterdam"),  # +00:19:32 before 1937: an offset with seconds
]
# Offsets Python allows and no tz database uses: seconds and microseconds, nearly a day.
ODD_ZONES: list[tzinfo] = [
    timezone(timedelta(seconds=1, microseconds=5)),
    timezone(timedelta(hours=1, microseconds=1)),
    timezone(-timedelta(hours=23, minutes=59, seconds=59, microseconds=999999)),
]
good_run_at = st.one_of(
    st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.sampled_from(ZONES),
    ),
    st.sampled_from(
        [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)]
    ),
)
wild_run_at = st.one_of(
    good_run_at,
    st.datetimes(timezones=st.sampled_from(ZONES)),  # years 1 to 9999 in local time
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(NoOffset())),
    st.dates(),
    st.sampled_from(["2030-01-01T12:00:00Z", 1893499200, 1893499200.5, T0.timestamp()]),
    st.just(T0.date()),
)
good_delays = st.one_of(
    st.integers(0, MAX_DELAY_SECONDS),
    st.floats(0, MAX_DELAY_SECONDS),
    st.sampled_from([0, 0.0, -0.0, 1e-7, 0.5, MAX_DELAY_SECONDS]),
)
wild_delays = st.one_of(
    good_delays,
    st.floats(),
    st.integers(),
    st.sampled_from([MAX_DELAY_SECONDS + 1, MAX_DELAY_SECONDS + 1e-3, -1e-9, True, False, "5"]),
    st.decimals(allow_nan=False, places=1),
    st.builds(timedelta, seconds=st.integers(0, 100)),
)


def schedules(
    run_at: st.SearchStrategy[object], delay: st.SearchStrategy[object], *, both: bool
) -> st.SearchStrategy[dict[str, Any]]:
    options = [st.just({}), run_at.map(lambda v: {"run_at": v}), delay.map(lambda v: {"delay": v})]
    if both:
        options.append(st.fixed_dictionaries({"run_at": run_at, "delay": delay}))
        options.append(st.just({"run_at": None, "delay": None}))
    return st.one_of(options)


FIELDS = ("type", "queue", "idempotency_key", "priority", "payload", "schedule", "max_attempts")


@st.composite
def enqueue_arguments(
    draw: st.DrawFn, keys: st.SearchStrategy[object] | None = None
) -> dict[str, Any]:
    """One task's arguments: a few fields (possibly none) drawn wild, the others good."""
    wild = draw(st.sets(st.sampled_from(FIELDS), max_size=3))
    args: dict[str, Any] = {
        "type": draw(wild_names(NAME_LIMIT) if "type" in wild else good_names(NAME_LIMIT))
    }
    if "queue" in wild or draw(st.booleans()):
        args["queue"] = draw(wild_names(NAME_LIMIT) if "queue" in wild else good_names(NAME_LIMIT))
    if keys is not None:
        args["idempotency_key"] = draw(keys)
    elif "idempotency_key" in wild:
        args["idempotency_key"] = draw(wild_names(KEY_LIMIT))
    elif draw(st.booleans()):
        args["idempotency_key"] = draw(st.one_of(st.none(), good_names(KEY_LIMIT)))
    if "priority" in wild or draw(st.booleans()):
        args["priority"] = draw(wild_priorities if "priority" in wild else good_priorities)
    if "payload" in wild:
        args["payload"] = draw(wild_payloads)
        if draw(st.booleans()):
            args["max_payload_bytes"] = draw(payload_limits)
    elif draw(st.booleans()):
        args["payload"] = draw(good_payloads)
    if "schedule" in wild:
        args.update(draw(schedules(wild_run_at, wild_delays, both=True)))
    else:
        args.update(draw(schedules(good_run_at, good_delays, both=False)))
    if "max_attempts" in wild:
        args["max_attempts"] = draw(wild_max_attempts)
    elif draw(st.booleans()):
        args["max_attempts"] = draw(good_max_attempts)
    if draw(st.booleans()):
        args["retry"] = draw(st.one_of(st.none(), retry_policies))
    return args


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def tx(connect: Callable[..., psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """A connection with transactions of its own: each example is rolled back."""
    return connect(autocommit=False)


@pytest.fixture(autouse=True)
def default_payload_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The oracle assumes the documented default limit: no PGQUEUE_MAX_PAYLOAD_BYTES."""
    monkeypatch.delenv("PGQUEUE_MAX_PAYLOAD_BYTES", raising=False)
    yield


def assert_both_verdicts_seen(seen: Counter[str], minimum: int) -> None:
    """Guard against a vacuous property: the strategies must reach both outcomes."""
    assert seen["accepted"] >= minimum and seen["refused"] >= minimum, seen


# --- the properties --------------------------------------------------------------------------


def test_enqueue_stores_the_task_verbatim_or_refuses_the_named_argument_writing_nothing(
    tx: psycopg.Connection[Any],
) -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(args=enqueue_arguments(), path=st.sampled_from(PATHS))
    def check(args: dict[str, Any], path: str) -> None:
        seen[attempt(tx, path, [args])] += 1

    check()
    assert_both_verdicts_seen(seen, 30)


def test_enqueue_many_stores_the_whole_batch_in_order_or_nothing(
    tx: psycopg.Connection[Any],
) -> None:
    """One bad item refuses the batch before anything is written; a good batch is stored
    item by item, in order, a repeated idempotency key returning the first item's task."""
    seen: Counter[str] = Counter()
    batch_keys = st.sampled_from([None, "k1", "k2", "k3"])
    items = st.lists(enqueue_arguments(keys=batch_keys), min_size=0, max_size=6)

    @settings(PROPERTY_SETTINGS, max_examples=80)
    @given(items=items, path=st.sampled_from(PATHS[1:]))
    def check(items: list[dict[str, Any]], path: str) -> None:
        seen[attempt(tx, path, items)] += 1

    check()
    assert_both_verdicts_seen(seen, 15)


def test_the_same_prepared_task_twice_refuses_the_batch_as_tasks(
    tx: psycopg.Connection[Any],
) -> None:
    @settings(PROPERTY_SETTINGS, max_examples=20)
    @given(others=st.lists(enqueue_arguments().filter(lambda a: not offending(a)), max_size=3))
    def check(others: list[dict[str, Any]]) -> None:
        try:
            before = tasks_in(tx)
            spec = pgqueue.prepare("twice", {"n": 1})
            batch: list[Any] = [*others, spec, spec]
            with pytest.raises(pgqueue.ValidationError) as info:
                pgqueue.enqueue_many(tx, batch, now=T0)
            assert info.value.field == "tasks"
            assert tx.info.transaction_status is TransactionStatus.INTRANS
            assert tasks_in(tx) == before
        finally:
            tx.rollback()

    check()


def test_priority_is_a_name_in_any_ascii_case_or_its_number_and_nothing_else(
    tx: psycopg.Connection[Any],
) -> None:
    """Names match in ASCII case only: Unicode case mapping must not turn a different word
    into a priority (``"h\\u0131gh".upper() == "HIGH"``: U+0131 is the dotless i)."""
    lookalikes = st.sampled_from(
        [
            "h\u0131gh",  # dotless i: upper() is "HIGH"
            "H\u0131GH",
            "H\u0130GH",  # dotted capital I: lower() is "i\u0307"
            "\uff48\uff49\uff47\uff48",  # fullwidth
            "l\u03bfw",  # Greek omicron
            "n\u03bfrmal",
            "norma1",
            "hig\u0127",
            "LOW\x00",
        ]
    )
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=60)
    @given(priority=st.one_of(lookalikes, wild_priorities), path=st.sampled_from(PATHS))
    def check(priority: object, path: str) -> None:
        seen[attempt(tx, path, [{"type": "t", "priority": priority}])] += 1

    check()
    assert_both_verdicts_seen(seen, 12)


def test_delay_of_any_type_and_magnitude_schedules_the_task_or_is_refused_as_delay(
    tx: psycopg.Connection[Any],
) -> None:
    """A delay beyond any float (``10**400``) is just too long: a ValidationError on
    ``delay``, like every other out-of-range delay, not an OverflowError."""
    huge = st.one_of(
        st.integers(min_value=2**1023, max_value=10**400),
        st.sampled_from([2**1024, 10**400, -(10**400)]),
    )
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=50)
    @given(delay=st.one_of(wild_delays, huge), path=st.sampled_from(PATHS))
    def check(delay: object, path: str) -> None:
        seen[attempt(tx, path, [{"type": "t", "delay": delay}])] += 1

    check()
    assert_both_verdicts_seen(seen, 10)


def test_run_at_in_any_time_zone_schedules_the_task_at_that_instant_or_is_refused(
    tx: psycopg.Connection[Any],
) -> None:
    """Any aware datetime whose instant lies in years 1 to 9999 is a valid run_at, whatever
    offset its time zone has (Python allows seconds and microseconds), through every path,
    with or without an idempotency key."""
    seen: Counter[str] = Counter()
    run_at = st.one_of(wild_run_at, st.datetimes(timezones=st.sampled_from(ODD_ZONES)))

    @settings(PROPERTY_SETTINGS, max_examples=60)
    @given(
        run_at=run_at,
        key=st.sampled_from([None, "scheduled"]),
        path=st.sampled_from(PATHS),
    )
    def check(run_at: object, key: str | None, path: str) -> None:
        args = {"type": "t", "run_at": run_at, "idempotency_key": key}
        seen[attempt(tx, path, [args])] += 1

    check()
    assert_both_verdicts_seen(seen, 10)


def test_every_retry_policy_that_retrypolicy_accepts_is_stored(
    tx: psycopg.Connection[Any],
) -> None:
    """RetryPolicy validates its numbers; a policy it accepted must then be stored (the
    backoff columns are ``real``), not refused by PostgreSQL in the caller's transaction.
    (Refusing a number RetryPolicy cannot store is fine: then there is no policy.)"""
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=40)
    @given(numbers=retry_numbers, path=st.sampled_from(PATHS))
    def check(numbers: dict[str, Any], path: str) -> None:
        try:
            retry = pgqueue.RetryPolicy(**numbers)
        except pgqueue.ValidationError:
            seen["no policy"] += 1
            return
        outcome = attempt(tx, path, [{"type": "t", "retry": retry}])
        assert outcome == "accepted"
        seen[outcome] += 1

    check()
    assert seen["accepted"] >= 5, seen


def test_any_mapping_payload_is_stored_like_the_equal_dict(tx: psycopg.Connection[Any]) -> None:
    """``payload: Mapping[str, Any]``: a read-only mapping (``types.MappingProxyType``) is a
    JSON object as much as a dict is, and must be stored as one."""
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=20)
    @given(
        payload=st.dictionaries(st.text(clean_character, max_size=6), good_json, max_size=4),
        path=st.sampled_from(PATHS),
    )
    def check(payload: dict[str, Any], path: str) -> None:
        mapping = types.MappingProxyType(payload)
        seen[attempt(tx, path, [{"type": "t", "payload": mapping}])] += 1

    check()
    assert seen["accepted"] == sum(seen.values())


def test_payload_nested_up_to_the_depth_limit_is_stored_and_deeper_is_refused(
    tx: psycopg.Connection[Any],
) -> None:
    """Objects and arrays nest at most 100 levels (the payload itself is the first);
    integers have at most 4,300 digits. Both limits hold on either side of the boundary."""
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=30)
    @given(payload=st.one_of(deep_payloads, huge_numbers), path=st.sampled_from(PATHS))
    def check(payload: dict[str, Any], path: str) -> None:
        seen[attempt(tx, path, [{"type": "t", "payload": payload}])] += 1

    check()
    assert_both_verdicts_seen(seen, 8)


def test_payload_of_exactly_the_default_limit_is_accepted_and_one_byte_more_is_refused(
    tx: psycopg.Connection[Any],
) -> None:
    """The limit is the payload's size as stored (the UTF-8 text jsonb gives back): multi-byte
    characters count for their bytes, and the boundary is exact (1 MiB accepted, 1 MiB + 1
    refused)."""
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, max_examples=14)
    @given(
        character=st.sampled_from(["a", "é", "€", "🎉", "\u2028"]),
        over_by=st.integers(-3, 3),
        key=st.sampled_from(["s", "ключ"]),
        path=st.sampled_from(PATHS),
    )
    def check(character: str, over_by: int, key: str, path: str) -> None:
        target = DEFAULT_PAYLOAD_LIMIT + over_by
        overhead = json_size({key: ""})
        assert overhead is not None
        width = len(character.encode("utf-8"))
        body = character * ((target - overhead) // width)
        body += "x" * (target - overhead - len(body.encode("utf-8")))
        payload = {key: body}
        assert json_size(payload) == target
        outcome = attempt(tx, path, [{"type": "big", "payload": payload}])
        assert outcome == ("accepted" if over_by <= 0 else "refused")
        seen[outcome] += 1

    check()
    assert_both_verdicts_seen(seen, 3)


def test_oracle_sanity_on_documented_examples() -> None:
    """The oracle itself agrees with the README and test_bad_input's hand-picked cases."""
    assert offending({"type": "send_receipt", "payload": {"order_id": 1}, "priority": "high"}) == {}
    assert offending({"type": "t", "priority": " LOW "}) == {}
    assert offending({"type": "t", "priority": "urgent"}) == {"priority": "priority"}
    assert offending({"type": "t", "payload": [1]}) == {"payload": "invalid"}
    assert offending({"type": "t", "payload": {"x": "y" * 50}, "max_payload_bytes": 10}) == {
        "payload": "too_large"
    }
    assert offending({"type": "", "delay": -1}) == {"type": "name", "delay": "delay"}
    assert offending({"type": "t", "run_at": T0, "delay": 0}) == {
        "run_at": "both given",
        "delay": "both given",
    }
    assert offending({"type": "t", "max_attempts": 2**31}) == {"max_attempts": "max_attempts"}
    assert offending({"type": "t", "idempotency_key": "k" * 501}) == {"idempotency_key": "name"}
    assert offending({"type": "t", "payload": {"s": "literally \\u0000 here"}}) == {}
    assert offending({"type": "t", "run_at": date(2030, 1, 1)}) == {"run_at": "run_at"}
