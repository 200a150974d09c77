"""Submitting tasks: validate at the boundary, then insert in the caller's transaction.

Nothing here commits. When the caller's transaction commits, the tasks exist and idle workers
are woken (``pg_notify`` is delivered at commit); when it rolls back, the tasks never existed.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pgqueue import config, dependencies
from pgqueue.errors import InvalidPayload, PayloadTooLarge, ValidationError
from pgqueue.models import Priority, RetryPolicy
from pgqueue.queries.specs import DEFAULT_RETRY as DEFAULT_RETRY
from pgqueue.queries.specs import TaskSpec

MAX_IDEMPOTENCY_KEY_LENGTH = 500
# The column's CHECK (migration 0015), so that a key too long is refused here, naming the
# field, rather than by the server.
MAX_CONCURRENCY_KEY_LENGTH = 200
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600


_id_lock = threading.Lock()
_id_state = [0, 0]  # last millisecond, sequence within it
_random = bytearray()  # entropy drawn 4 KiB at a time: one syscall per 512 ids, not per id
# A forked child must not reuse the parent's unread entropy (same bits, same millisecond and
# sequence: the same id in two processes).
os.register_at_fork(after_in_child=_random.clear)


def new_task_id() -> uuid.UUID:
    """A time-ordered UUID (version 7, RFC 9562).

    Ids made together sit together in the primary-key index, which keeps inserts cheap at
    millions of tasks a day, and the 62 random bits keep them unguessable. Within a process
    they strictly increase (a 12-bit sequence within each millisecond), so the claim's
    ``ORDER BY priority, created_at, id`` keeps the order of tasks enqueued in one batch.
    """
    return new_task_ids(1)[0]


def new_task_ids(count: int) -> list[uuid.UUID]:
    """``count`` ids as new_task_id makes them, under one acquisition of the lock and with one
    read of the entropy pool (a bulk enqueue takes its batch's ids at once)."""
    out: list[uuid.UUID] = []
    if count <= 0:
        return out  # (_random[-0:] would be all of it)
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        last, seq = _id_state
        if ms <= last:
            ms = last
        else:
            seq = -1
        need = 8 * count
        if len(_random) < need:
            _random.extend(os.urandom(max(4096, need)))
        rands = struct.unpack(f">{count}Q", _random[-need:])
        del _random[-need:]
        high = (ms & _MS_MASK) << 80 | _VERSION_7
        for rand in rands:
            seq += 1
            if seq > 0xFFF:  # more than 4096 ids in one millisecond: borrow the next one
                ms, seq = ms + 1, 0
                high = (ms & _MS_MASK) << 80 | _VERSION_7
            # unix_ts_ms and version, rand_a used as a sequence, variant, rand_b
            out.append(_uuid(high | seq << 64 | _VARIANT | rand & _RAND_B_MASK))
        _id_state[0], _id_state[1] = ms, seq
    return out


_MS_MASK = (1 << 48) - 1
_VERSION_7 = 0x7 << 76
_VARIANT = 0b10 << 62
_RAND_B_MASK = (1 << 62) - 1
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def _uuid(value: int) -> uuid.UUID:
    """uuid.UUID(int=value) for a value known to be in range, without the keyword parsing
    and range checks of UUID.__init__ (a third of an id's cost); what __init__ itself ends
    with, setting the two slots."""
    u = object.__new__(uuid.UUID)
    object.__setattr__(u, "int", value)
    object.__setattr__(u, "is_safe", _SAFE_UNKNOWN)
    return u


def check_name(field: str, value: object, *, max_length: int = config.MAX_NAME_LENGTH) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, not {type(value).__name__}")
    if not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > max_length:
        raise ValidationError(field, f"is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "must be valid Unicode (it has a lone surrogate)") from None
    return value


def check_concurrency_key(value: object) -> str:
    """A concurrency key (the tenant a task works for) by a name's rule, at most 200
    characters: the one check of every surface that submits one."""
    return check_name("concurrency_key", value, max_length=MAX_CONCURRENCY_KEY_LENGTH)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


# UTF-8 JSON spaced as PostgreSQL prints jsonb (", " and ": "), so that the text measured is
# the text a read gets back; strict about NaN; one encoder for all calls (json.dumps with
# options builds a new one each time).
_ENCODER = json.JSONEncoder(separators=(", ", ": "), allow_nan=False, ensure_ascii=False)


def _encode(payload: dict[str, Any]) -> str:
    """``_ENCODER.encode(payload)`` for a dict, straight to the C encoder that encode() builds
    on each call (fresh circular-reference markers each time, as encode's): the same text and
    the same errors without two Python frames, a quarter of a small payload's encoding."""
    if _make_encoder is None:  # no C accelerator: the pure-Python encoder
        return _ENCODER.encode(payload)
    chunks = _make_encoder(
        {}, _ENCODER.default, _encode_string, None, ": ", ", ", False, False, False
    )(payload, 0)
    return "".join(chunks)


_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_encode_string = json.encoder.encode_basestring  # what encode() picks with ensure_ascii=False


# Deeper JSON than this is refused: PostgreSQL stores it, but the HTTP API's serialiser (255
# levels) and Python's recursion limit (~1000) cannot give it back. No real payload nests so.
MAX_JSON_DEPTH = 100


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests objects and arrays deeper than ``limit``; brackets
    inside strings do not count.

    Free for a payload with fewer brackets than the limit (most). Otherwise, in C-speed string
    operations: drop the strings (split on quotes; a regular expression if a quote is
    escaped), keep the brackets, and strip innermost ``()`` pairs once per level."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    outside = _outside_strings(raw)
    nesting = outside.translate(_PARENS, _NOT_BRACKETS)
    for _ in range(limit):
        if not nesting:
            return False
        nesting = nesting.replace(b"()", b"")
    return bool(nesting)


# A float Python writes with an exponent (its repr: one digit, maybe a fraction, ``e``, a sign
# and the exponent); jsonb keeps numbers as numeric and prints them without one.
_EXPONENT = re.compile(rb"[0-9](?:\.([0-9]+))?e([-+][0-9]+)")
_NEGATIVE_ZERO = re.compile(rb"-0\.0(?![0-9])")  # numeric has no -0: printed "0.0"
# What an exponent starts with, in a number or a string ("re-1"); a quick search (a literal
# first), run only on text with "e-" or "e+" in it, which hyphenated words often have.
_EXPONENT_HINT = re.compile(rb"e[-+][0-9]")


def _may_have_exponent(raw: bytes) -> bool:
    return (b"e-" in raw or b"e+" in raw) and _EXPONENT_HINT.search(raw) is not None


def stored_size(raw: bytes) -> int:
    """How many bytes PostgreSQL's text of the jsonb made from ``raw`` is at most: what any read
    of it costs (``payload::text``, the API, the dashboard). ``raw`` is _ENCODER's UTF-8 text,
    spaced as jsonb prints, so it is that text but for the floats written with an exponent,
    which jsonb prints in full: ``5e-324`` as ``0.`` and 324 digits, ``1e+308`` as 309.
    ``-0.0`` is printed ``0.0``. (A duplicated key, ``{1: .., "1": ..}``, is kept once: the
    text only gets shorter.)

    Free for text without ``e+``, ``e-`` or ``-0.0`` (most payloads), cheap for text whose
    ``e-`` are hyphens; otherwise the strings are dropped (a ``1e-5`` in a string is not a
    number) and each number that changes is counted, in C-speed string and regular-expression
    operations."""
    size = len(raw)
    exponents = _may_have_exponent(raw)
    if not exponents and b"-0.0" not in raw:
        return size
    outside = _outside_strings(raw)
    if b"-0.0" in outside:
        size -= len(_NEGATIVE_ZERO.findall(outside))
    if not exponents or not _may_have_exponent(outside):  # only in strings: not numbers
        return size
    # (each distinct number once: an adversary's payload repeats one)
    for (fraction, exponent), count in Counter(_EXPONENT.findall(outside)).items():
        digits, shift = len(fraction), int(exponent)
        written = 1 + (digits and digits + 1) + 1 + len(exponent)  # d[.ddd]e±XX
        if shift < 0:  # 0.000ddd: "0." then the fraction's digits, shifted right
            printed = 2 + digits - shift
        else:  # an integer of 1 + shift digits, and what of the fraction is left past it
            printed = 1 + shift + (digits > shift and digits - shift + 1)
        size += count * (printed - written)
    return size


def _outside_strings(raw: bytes) -> bytes:
    """JSON text ``raw`` without its strings (keys and values): numbers, literals, punctuation."""
    if b'\\"' in raw:
        text = raw.decode("utf-8", "surrogatepass")
        return _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    return b"".join(raw.split(b'"')[0::2])


def encode_payload(payload: object, limit: int | None = None) -> str:
    """The payload as JSON text, or a specific InvalidPayload saying why it cannot be stored.

    Its size is the text's that PostgreSQL gives back (stored_size), in UTF-8 bytes, at most
    ``limit`` (``PGQUEUE_MAX_PAYLOAD_BYTES`` when not given): what a read of it costs is
    bounded, whatever its numbers."""
    if type(payload) is not dict:  # (a dict skips the Mapping check, an ABC's and slow)
        if not isinstance(payload, Mapping):
            raise InvalidPayload(f"must be a JSON object (a dict), not {type(payload).__name__}")
        if not isinstance(payload, dict):  # any Mapping will do; the encoder only knows dict
            payload = dict(payload)
    try:
        text = _encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, which PostgreSQL would reject
        raise InvalidPayload(
            f"is not JSON-serialisable: contains a string that is not valid Unicode ({exc.reason})"
        ) from None
    # (json_depth_exceeds's own first test, inline: a call saved on every payload)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth_exceeds(raw):
        raise InvalidPayload(f"nests deeper than {MAX_JSON_DEPTH} levels")
    limit = config.max_payload_bytes() if limit is None else limit
    # (stored_size's own first test, inline, as above; a -0.0 only makes the text shorter)
    if len(raw) > limit or _may_have_exponent(raw):
        size = stored_size(raw)
        if size > limit:
            raise PayloadTooLarge(size, limit)
    # PostgreSQL's jsonb cannot hold \u0000; check precisely only when the text hints at it.
    if "\\u0000" in text and _has_nul(payload):
        raise InvalidPayload("strings in the payload must not contain NUL (\\u0000) characters")
    return text


def prepare(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    priority: Priority | str | int | None = None,
    queue: str | None = None,
    idempotency_key: str | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    max_payload_bytes: int | None = None,
    expires_in: float | None = None,
    expires_at: datetime | None = None,
    depends_on: Iterable[Any] | None = None,
    on_parent_failure: str = "cancel",
    workflow_id: uuid.UUID | str | None = None,
    concurrency_key: str | None = None,
) -> TaskSpec:
    """Validate one task's arguments and build the row to insert; raises before any write.

    ``queue`` and ``priority`` left out (None) stay "not given" up to the insert, which takes
    the type's declared ones (pgqueue.task_types), else 'default' and normal.

    ``depends_on``: the task waits until these tasks (ids, handles, or prepared
    tasks of the same batch) are final; ``on_parent_failure`` "cancel" (it is cancelled when
    one fails or is cancelled) or "run" (a clean-up step: it runs once all are final).
    ``workflow_id``: the workflow it belongs to.

    ``concurrency_key``: the tenant (account, customer) the task works for; workers claim the
    keys of a queue in turns, and a limit's ``per_key_max_running`` caps how many of a key run
    at once. None: no key (claimed in plain order). 1 to 200 characters, a name's rule."""
    check_name("type", type)
    if queue is not None:
        check_name("queue", queue)
    if idempotency_key is not None:
        check_name("idempotency_key", idempotency_key, max_length=MAX_IDEMPOTENCY_KEY_LENGTH)
    if concurrency_key is not None:
        check_concurrency_key(concurrency_key)
    prio = None if priority is None else Priority.parse(priority)
    payload = {} if payload is None else payload
    payload_json = encode_payload(payload, max_payload_bytes)
    if run_at is not None and delay is not None:
        raise ValidationError("run_at", "give either run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ValidationError("run_at", f"must be a datetime, not {run_at.__class__.__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ValidationError("run_at", "must be timezone-aware (e.g. datetime.now(UTC))")
        try:
            # In UTC from here on: an offset with seconds and microseconds is valid Python
            # but not a time zone PostgreSQL's text input accepts.
            run_at = run_at.astimezone(UTC)
        except OverflowError:
            raise ValidationError("run_at", "is outside the years 1 to 9999 in UTC") from None
    delay_seconds = 0.0
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise ValidationError("delay", f"must be a number of seconds, not {delay!r}")
        # A float that is not finite; an int beyond any float (math.isfinite would overflow).
        if (isinstance(delay, float) and not math.isfinite(delay)) or delay < 0:
            raise ValidationError("delay", f"must be a finite number of seconds >= 0, not {delay}")
        if delay > MAX_DELAY_SECONDS:
            raise ValidationError("delay", f"must be at most {MAX_DELAY_SECONDS} s (10 years)")
        delay_seconds = float(delay)
    expiry = _expiry(expires_in, expires_at, run_at, delay_seconds)
    # Only what the caller gave: the insert fills the rest from the type's declaration, else
    # the default (per call > declared > default, field by field; see task_insert).
    attempts: int | None = retry.max_attempts if retry else None
    if max_attempts is not None:
        attempts = RetryPolicy(max_attempts).max_attempts  # validated as a policy would be
    task_id = new_task_id()
    parents: tuple[uuid.UUID, ...] = ()
    run_anyway, workflow = False, None
    if depends_on is not None or on_parent_failure != "cancel" or workflow_id is not None:
        parents = dependencies.parse_depends_on(depends_on, task_id)  # a plain task skips these
        run_anyway = dependencies.parse_on_parent_failure(on_parent_failure)
        workflow = None if workflow_id is None else _workflow_id(workflow_id)
    if parents and idempotency_key is not None:
        raise ValidationError(
            "idempotency_key", "is not supported with depends_on (give it to a root task)"
        )
    return TaskSpec(
        id=task_id,
        type=type,
        payload=payload if isinstance(payload, dict) else dict(payload),
        payload_json=payload_json,
        priority=prio,
        queue=queue,
        max_attempts=attempts,
        backoff_base=float(retry.base) if retry else None,
        backoff_factor=float(retry.factor) if retry else None,
        backoff_cap=float(retry.cap) if retry else None,
        idempotency_key=idempotency_key,
        run_at=run_at,
        delay_seconds=delay_seconds,
        expires_at=expiry[0],
        expires_in=expiry[1],
        depends_on=parents,
        run_anyway=run_anyway,
        workflow_id=workflow,
        concurrency_key=concurrency_key,
    )


# The keys of a batch item that prepare_plain handles (enqueue_many's common case), without
# and with a concurrency key; an item with any other option goes through prepare.
PLAIN_KEYS = frozenset({"type", "payload", "queue", "priority"})
PLAIN_KEYED_KEYS = PLAIN_KEYS | {"concurrency_key"}


def prepare_plain(
    task_id: uuid.UUID,
    item: Mapping[str, Any],
    limit: int,
    names: set[str],
    concurrency_key: Any = None,
) -> TaskSpec:
    """What ``prepare(**item)`` returns, with ``task_id``, for a batch item of PLAIN_KEYS only
    (and "type"): the same checks in the same order with the same errors, without the
    options' checks it does not need. ``names``: the batch's names already checked (a name
    is valid or not whatever field it is in), so a batch of one type checks it once.
    ``concurrency_key``: the item's, for an item of PLAIN_KEYED_KEYS (passed by the caller,
    which looked at the item's keys anyway: an item without one costs no lookup more)."""
    type = item["type"]
    # Only a str is remembered (a subclass could compare equal to what it is not; anything
    # else is refused, if unhashable before the set sees it).
    if type.__class__ is not str or type not in names:
        check_name("type", type)
        if type.__class__ is str:
            names.add(type)
    queue = item.get("queue")
    if queue is not None and (queue.__class__ is not str or queue not in names):
        check_name("queue", queue)
        if queue.__class__ is str:
            names.add(queue)
    if concurrency_key is not None:
        check_concurrency_key(concurrency_key)
    priority = item.get("priority")
    prio = None if priority is None else Priority.parse(priority)
    payload = item.get("payload")
    if payload is None:
        payload = {}
    payload_json = encode_payload(payload, limit)
    if not isinstance(payload, dict):
        payload = dict(payload)
    # TaskSpec's fields in order (the retry policy, idempotency key, run_at: not given)
    spec: TaskSpec = _new_spec(
        TaskSpec,
        (task_id, type, payload, payload_json, prio, queue, None, None, None, None, None, None,
         0.0, None, None, (), False, None, concurrency_key),
    )  # fmt: skip
    return spec


_new_spec: Any = tuple.__new__  # what TaskSpec._make calls, without _make's frame


def _workflow_id(value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value).strip())
    except ValueError:
        raise ValidationError("workflow_id", f"is not a UUID: {value!r}") from None


def _aware(field: str, value: object) -> datetime:
    """An aware datetime, in UTC, as run_at is checked above (for expires_at)."""
    if not isinstance(value, datetime):
        raise ValidationError(field, f"must be a datetime, not {value.__class__.__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "must be timezone-aware (e.g. datetime.now(UTC))")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValidationError(field, "is outside the years 1 to 9999 in UTC") from None


def _expiry(
    expires_in: float | None,
    expires_at: datetime | None,
    run_at: datetime | None,
    delay: float,
) -> tuple[datetime | None, float | None]:
    """The expiry as (expires_at, expires_in), checked: one of the two at most, in
    the future, and after the task's run time (it would expire before it could start). The
    times compare with this machine's clock; expires_in counts from the server's at the
    insert, as delay does."""
    if expires_in is None and expires_at is None:
        return None, None
    if expires_in is not None and expires_at is not None:
        raise ValidationError("expires_at", "give either expires_in or expires_at, not both")
    now = datetime.now(UTC)
    if expires_in is not None:
        if (
            isinstance(expires_in, bool)
            or not isinstance(expires_in, int | float)
            or (isinstance(expires_in, float) and not math.isfinite(expires_in))
            or not 0 < expires_in <= MAX_DELAY_SECONDS
        ):
            raise ValidationError(
                "expires_in",
                f"must be seconds from more than 0 to {MAX_DELAY_SECONDS} (10 years), "
                f"not {expires_in!r}",
            )
        if run_at is not None and run_at >= now + timedelta(seconds=expires_in):
            raise ValidationError("expires_in", "expires before run_at: the task could never run")
        if delay and delay >= expires_in:
            raise ValidationError("expires_in", "expires before its delay has passed")
        return None, float(expires_in)
    assert expires_at is not None
    expires_at = _aware("expires_at", expires_at)
    if expires_at <= now:
        raise ValidationError("expires_at", f"is in the past ({expires_at.isoformat()})")
    if expires_at > now + timedelta(seconds=MAX_DELAY_SECONDS):
        raise ValidationError("expires_at", "is more than 10 years away")
    if run_at is not None and run_at >= expires_at:
        raise ValidationError("expires_at", "expires before run_at: the task could never run")
    if delay and now + timedelta(seconds=delay) >= expires_at:
        raise ValidationError("expires_at", "expires before its delay has passed")
    return expires_at, None
