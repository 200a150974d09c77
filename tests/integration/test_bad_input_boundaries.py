"""The bad-input catalogue, case by case, at the three boundaries: library, CLI and HTTP.

Each case is one bad (or borderline) input, written once and run at every boundary that can
express it:

- ``library``: ``pgqueue.enqueue(conn, ...)`` (and ``get_task``/``cancel``/``replay``...);
- ``cli``: the real entry point ``pgqueue.cli.main()``, in-process with ``sys.argv`` set and
  stdout/stderr captured (typer's CliRunner would bypass ``main()``, which is what turns an
  error into one line and an exit code; a subprocess per case would cost a second each). Every
  rejected command runs twice, plain and with ``--json``; real processes are used where the
  process is the point (argv bytes that are not UTF-8);
- ``http``: ``create_app(...)`` through httpx's ASGI transport on an event loop of its own, with
  its lifespan (the pool) running, so every request is the whole application.

What each boundary must do:

- reject: the library raises a ``pgqueue.ValidationError`` whose ``.field`` names the field;
  the CLI exits 2 with one line ``error: ...`` naming the field (stdout empty, no traceback);
  the API answers 4xx with the documented error body (400 ``malformed_json``, 413
  ``body_too_large``, 413 ``payload_too_large`` naming the payload, or 422
  ``invalid_request`` listing the field), never 5xx. Nothing is
  written: the whole table, seeded with tasks in every status, is compared before and after.
- accept: the task is stored verbatim (checked in the row) and reads back identically through
  ``pgqueue --json status ID`` and ``GET /api/v1/tasks/ID``; the seeded tasks are unchanged.

The same rule must hold at every boundary: ``test_same_rule_at_every_boundary`` compares the
verdicts the three boundaries reached for each case. Where pgqueue does not do what it should,
the cell is ``xfail(strict=True, reason="BUG: ...")``.

Set ``PGQUEUE_BAD_INPUT_REPORT=DIR`` to have this module write what it observed as a markdown
table, ``DIR/bad-input-boundaries.md`` (docs/bad-input.md is made from it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from boundaries import Api, CliResult, Snapshot, code, run_main, shorten, snapshot, write_tables
from jsonb_text import jsonb_size
from psycopg.rows import dict_row

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.formatting import clean

REPORT_ENV = "PGQUEUE_BAD_INPUT_REPORT"
API_BODY_LIMIT = 16 * 1024
PAYLOAD_LIMIT = 1024  # PGQUEUE_MAX_PAYLOAD_BYTES for the payload-size cases
BOUNDARIES = ("library", "cli", "http")
JSON_TYPE = {"Content-Type": "application/json"}


# --- the database: shared by the module, seeded with a task in every status ----------------------


@pytest.fixture(scope="module")
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    name = f"pgqueue_bib_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def seeded(db: psycopg.Connection[Any]) -> dict[str, uuid.UUID]:
    """Existing tasks that no case may change: one per status, one keyed, one scheduled."""
    ids = {
        "queued": pgqueue.enqueue(db, "existing", {"n": 1}, queue="seed-queued").id,
        "keyed": pgqueue.enqueue(
            db, "existing", {"n": 2}, queue="seed-queued", idempotency_key="existing-key"
        ).id,
        "scheduled": pgqueue.enqueue(db, "existing", {"n": 3}, queue="seed-later", delay=3600).id,
        "cancelled": pgqueue.enqueue(db, "existing", {"n": 4}, queue="seed-cancelled").id,
    }
    pgqueue.cancel(db, ids["cancelled"])
    for status in ("running", "completed", "failed"):
        queue = f"seed-{status}"
        ids[status] = pgqueue.enqueue(db, "existing", {"s": status}, queue=queue, max_attempts=1).id
        [claimed] = pgqueue.claim(db, [queue], limit=1, worker_id="seed")
        if status == "completed":
            pgqueue.complete(db, claimed.lease, {"ok": True})
        elif status == "failed":
            pgqueue.fail(db, claimed.lease, "boom")
    return ids


@pytest.fixture(scope="module")
def api(db_url: str, seeded: dict[str, uuid.UUID]) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=db_url, max_body_bytes=API_BODY_LIMIT))
    yield server
    server.close()


def remove_new_rows(conn: psycopg.Connection[Any], before: Snapshot) -> None:
    conn.execute("DELETE FROM pgqueue.tasks WHERE NOT (id = ANY(%s))", [list(before)])


@pytest.fixture
def ctx(
    db: psycopg.Connection[Any],
    db_url: str,
    api: Api,
    seeded: dict[str, uuid.UUID],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Context]:
    yield Context(db, db_url, api, seeded, monkeypatch)
    # Whatever a buggy boundary let through goes, so that the next case starts from the seed.
    db.execute("DELETE FROM pgqueue.tasks WHERE NOT (id = ANY(%s))", [list(seeded.values())])


@dataclasses.dataclass
class Context:
    db: psycopg.Connection[Any]
    url: str
    api: Api
    seeded: dict[str, uuid.UUID]
    monkeypatch: pytest.MonkeyPatch


# --- cases ---------------------------------------------------------------------------------------


class _NotApplicable:
    def __repr__(self) -> str:
        return "NA"


NA: Any = _NotApplicable()  # this boundary cannot express the input (None is a value)
ACCEPT = "accept"
REJECT = "reject"

STORED_COLUMNS = (
    "type", "queue", "idempotency_key", "payload", "priority", "max_attempts", "concurrency_key",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    group: str
    label: str  # the input, for the table in docs/bad-input.md
    expect: str  # ACCEPT or REJECT
    field: str | None = None  # the field a rejection must name (library spelling)
    lib: dict[str, Any] | None = None  # keyword arguments of pgqueue.enqueue
    cli: list[str] | None = None  # the command line after the global options
    http: dict[str, Any] | bytes | None = None  # a JSON body, or the raw bytes to send
    stored: dict[str, Any] = dataclasses.field(default_factory=dict)  # columns, if accepted
    http_status: tuple[int, ...] = (422,)  # the statuses a rejection may answer
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    bugs: dict[str, str] = dataclasses.field(default_factory=dict)  # boundary -> xfail reason
    rule_bug: str | None = None  # why the boundaries disagree (xfail of the consistency test)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # boundary -> n/a note

    def form(self, boundary: str) -> Any:
        return {"library": self.lib, "cli": self.cli, "http": self.http}[boundary]

    @property
    def boundaries(self) -> list[str]:
        return [b for b in BOUNDARIES if self.form(b) is not None]

    @property
    def http_field(self) -> str | None:
        return "delay_seconds" if self.field == "delay" else self.field


def names(value: str) -> dict[str, Any]:
    """The same value as type, queue and idempotency key, at every boundary."""
    return {
        "lib": {"type": value, "queue": value, "idempotency_key": value},
        "cli": ["enqueue", f"--queue={value}", f"--idempotency-key={value}", "--", value],
        "http": {"type": value, "queue": value, "idempotency_key": value},
    }


def one_field(field: str, value: str) -> dict[str, Any]:
    """``value`` in one field (type "t" otherwise), at every boundary."""
    flag = "--" + field.replace("_", "-")
    return {
        "lib": {"type": "t", field: value},
        "cli": ["enqueue", f"{flag}={value}", "--", "t"],
        "http": {"type": "t", field: value},
    }


def _body(http: Any, field: str) -> dict[str, Any] | bytes | None:
    if http is NA:
        return None
    return http if isinstance(http, bytes) else {"type": "t", field: http}


def option(field: str, lib: Any = NA, cli_text: Any = NA, http: Any = NA) -> dict[str, Any]:
    """An enqueue option as a Python value, as argv text, and as a JSON value (``bytes``: the
    whole raw body); NA where a boundary cannot express it."""
    flag = "--" + field.replace("_", "-")
    return {
        "lib": None if lib is NA else {"type": "t", field: lib},
        "cli": None if cli_text is NA else ["enqueue", f"{flag}={cli_text}", "--", "t"],
        "http": _body(http, "delay_seconds" if field == "delay" else field),
        "field": field,
    }


def payload(lib: Any = NA, cli_text: Any = NA, http: Any = NA) -> dict[str, Any]:
    """A payload as a Python value, as --payload text, and as the body's JSON value
    (``bytes``: the whole raw body); NA where a boundary cannot express it."""
    return {
        "lib": None if lib is NA else {"type": "t", "payload": lib},
        "cli": None if cli_text is NA else ["enqueue", f"--payload={cli_text}", "--", "t"],
        "http": _body(http, "payload"),
        "field": "payload",
    }


def nested(depth: int) -> dict[str, Any]:
    """``{"a": [[[...]]]}`` with ``depth`` nested arrays."""
    inner: list[Any] = []
    root = {"a": inner}
    for _ in range(depth - 1):
        deeper: list[Any] = []
        inner.append(deeper)
        inner = deeper
    return root


def nested_text(depth: int) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def raw_body(payload_text: str | bytes) -> bytes:
    text = payload_text if isinstance(payload_text, bytes) else payload_text.encode()
    return b'{"type": "t", "payload": ' + text + b"}"


def json_size(value: Any) -> int:
    return jsonb_size(value)  # the payload rule: the UTF-8 bytes of the text jsonb gives back


# Payload size: the jsonb text of {"s": "x" + "é" * 507} is 1024 bytes in UTF-8 but 517
# characters.
AT_LIMIT = {"s": "x" + "\u00e9" * 507}
OVER_LIMIT = {"s": "xx" + "\u00e9" * 507}
assert json_size(AT_LIMIT) == PAYLOAD_LIMIT and json_size(OVER_LIMIT) == PAYLOAD_LIMIT + 1
OVERSIZED_BODY = raw_body(b'{"s": "' + b"x" * (API_BODY_LIMIT - 34) + b'"}')
assert len(OVERSIZED_BODY) == API_BODY_LIMIT + 1
HUGE_INT = "1" * 5000  # past Python's 4300-digit limit for int <-> str


# fmt: off
CASES: list[Case] = [
    # --- payload: wrong types ---------------------------------------------------------------------
    Case(
        "payload-array", "payload", "payload is a JSON array `[1, 2]`", REJECT,
        **payload([1, 2], "[1, 2]", [1, 2]),
    ),
    Case(
        "payload-string", "payload", 'payload is a JSON string `"text"`', REJECT,
        **payload("text", '"text"', "text"),
    ),
    Case(
        "payload-number", "payload", "payload is a JSON number `42`", REJECT,
        **payload(42, "42", 42),
    ),
    Case("payload-bool", "payload", "payload is `true`", REJECT, **payload(True, "true", True)),
    Case(
        "payload-null", "payload", "payload is `null` (library: `None`)", ACCEPT,
        **payload(None, "null", None), stored={"payload": {}},
    ),
    Case(
        "payload-not-json", "payload", 'payload text that is not JSON `{"a": 1,}`', REJECT,
        **payload(NA, '{"a": 1,}', raw_body('{"a": 1,}')), http_status=(400,),
        notes={"library": "a dict is always well-formed"},
    ),
    # --- payload: not serialisable ----------------------------------------------------------------
    Case(
        "payload-nan", "payload", "payload holds NaN", REJECT,
        **payload({"x": float("nan")}, '{"x": NaN}', raw_body('{"x": NaN}')),
    ),
    Case(
        "payload-infinity", "payload", "payload holds Infinity (`1e400`)", REJECT,
        **payload({"x": float("inf")}, '{"x": 1e400}', raw_body('{"x": 1e400}')),
    ),
    Case(
        "payload-huge-int", "payload", "payload holds a 5000-digit integer", REJECT,
        **payload(
            {"n": int(HUGE_INT[:4000]) ** 2},
            '{"n": ' + HUGE_INT + "}",
            raw_body('{"n": ' + HUGE_INT + "}"),
        ),
        http_status=(400, 422),
    ),
    Case(
        "payload-deep-300", "payload", "payload nested 300 levels deep (the limit is 100)",
        REJECT, **payload(nested(300), nested_text(300), raw_body(nested_text(300))),
        http_status=(400, 422),
    ),
    Case(
        "payload-deep-5000", "payload", "payload nested 5000 levels deep", REJECT,
        **payload(nested(5000), nested_text(5000), raw_body(nested_text(5000))),
        http_status=(400, 422),
    ),
    # --- payload: size ----------------------------------------------------------------------------
    Case(
        "payload-at-limit", "payload size",
        f"payload of exactly {PAYLOAD_LIMIT} bytes as stored (517 characters; "
        f"PGQUEUE_MAX_PAYLOAD_BYTES={PAYLOAD_LIMIT})", ACCEPT,
        **payload(AT_LIMIT, json.dumps(AT_LIMIT, ensure_ascii=False), AT_LIMIT),
        stored={"payload": AT_LIMIT}, env={"PGQUEUE_MAX_PAYLOAD_BYTES": str(PAYLOAD_LIMIT)},
    ),
    Case(
        "payload-over-limit", "payload size",
        f"payload of {PAYLOAD_LIMIT + 1} bytes as stored (518 characters; "
        f"PGQUEUE_MAX_PAYLOAD_BYTES={PAYLOAD_LIMIT})", REJECT,
        **payload(OVER_LIMIT, json.dumps(OVER_LIMIT, ensure_ascii=False), OVER_LIMIT),
        env={"PGQUEUE_MAX_PAYLOAD_BYTES": str(PAYLOAD_LIMIT)}, http_status=(413,),
    ),
    Case(
        "body-over-api-limit", "payload size",
        f"request body of {API_BODY_LIMIT + 1} bytes "
        f"(PGQUEUE_API_MAX_BODY_BYTES={API_BODY_LIMIT})", REJECT, "body",
        http=OVERSIZED_BODY, http_status=(413,),
        notes={"library": "no request body", "cli": "no request body"},
    ),
    # --- NUL and invalid Unicode ------------------------------------------------------------------
    Case(
        "payload-nul-value", "NUL and invalid UTF-8", "NUL (`\\u0000`) in a payload string",
        REJECT, **payload({"s": "a\x00b"}, '{"s": "a\\u0000b"}', {"s": "a\x00b"}),
    ),
    Case(
        "payload-nul-key", "NUL and invalid UTF-8", "NUL (`\\u0000`) in a payload key", REJECT,
        **payload({"k\x00": 1}, '{"k\\u0000": 1}', {"k\x00": 1}),
    ),
    Case(
        "payload-surrogate-value", "NUL and invalid UTF-8",
        'lone surrogate escaped in JSON, `{"s": "\\ud800"}`', REJECT,
        **payload({"s": "\ud800"}, '{"s": "\\ud800"}', raw_body('{"s": "\\ud800"}')),
    ),
    Case(
        "payload-surrogate-key", "NUL and invalid UTF-8",
        'lone surrogate escaped in a payload key, `{"\\udc80": 1}`', REJECT,
        **payload({"\udc80": 1}, '{"\\udc80": 1}', raw_body('{"\\udc80": 1}')),
    ),
    Case(
        "payload-invalid-utf8", "NUL and invalid UTF-8",
        "byte 0xFF in a payload string (library: a `bytes` value; CLI: the argv bytes as "
        "Python decodes them, surrogateescape)", REJECT,
        **payload({"s": b"\xff"}, os.fsdecode(b'{"s": "\xff"}'), raw_body(b'{"s": "\xff"}')),
        http_status=(400, 422),
    ),
    Case(
        "type-invalid-utf8", "NUL and invalid UTF-8",
        "byte 0xFF in the type (library and CLI: U+DCFF, as surrogateescape decodes it)",
        REJECT, "type",
        lib={"type": os.fsdecode(b"send\xffmail")},
        cli=["enqueue", "--", os.fsdecode(b"send\xffmail")],
        http=b'{"type": "send\xffmail"}', http_status=(400, 422),
    ),
    # --- priority ---------------------------------------------------------------------------------
    Case(
        "priority-upper", "priority", 'priority `"HIGH"`', ACCEPT,
        **option("priority", "HIGH", "HIGH", "HIGH"), stored={"priority": 0},
    ),
    Case(
        "priority-spaces", "priority", 'priority `" high"`', ACCEPT,
        **option("priority", " high", " high", " high"), stored={"priority": 0},
    ),
    Case(
        "priority-number", "priority", "priority as the number `0`", ACCEPT,
        **option("priority", 0, NA, NA), stored={"priority": 0},
        notes={
            "cli": 'argv is text: see `"0"`',
            "http": "a priority is a name in JSON (the OpenAPI enum); only the library takes "
            "`pgqueue.Priority` members, an IntEnum, and so their numbers",
        },
    ),
    Case(
        "priority-digit", "priority", 'priority `"0"`', REJECT,
        **option("priority", "0", "0", "0"),
    ),
    Case(
        "priority-unknown", "priority", 'priority `"urgent"`', REJECT,
        **option("priority", "urgent", "urgent", "urgent"),
    ),
    Case("priority-empty", "priority", 'priority `""`', REJECT, **option("priority", "", "", "")),
    Case(
        "priority-null", "priority", "priority `null` (library: `None`)", ACCEPT,
        **option("priority", None, NA, None), stored={"priority": 1},
        notes={
            "cli": "argv is text",
            "library": "not given: the type's declared priority, else normal",
            "http": "not given: the type's declared priority, else normal",
        },
    ),
    # --- max_attempts -----------------------------------------------------------------------------
    Case(
        "max-attempts-string", "max_attempts", 'max_attempts as a string `"3"`', REJECT,
        **option("max_attempts", "3", NA, "3"),
        notes={"cli": "argv is text: `3` is the normal spelling"},
    ),
    Case(
        "max-attempts-word", "max_attempts", 'max_attempts `"three"`', REJECT,
        **option("max_attempts", "three", "three", "three"),
    ),
    Case(
        "max-attempts-float", "max_attempts", "max_attempts `2.0`", REJECT,
        **option("max_attempts", 2.0, "2.0", 2.0),
    ),
    Case(
        "max-attempts-fraction", "max_attempts", "max_attempts `2.5`", REJECT,
        **option("max_attempts", 2.5, "2.5", 2.5),
    ),
    Case(
        "max-attempts-bool", "max_attempts", "max_attempts `true`", REJECT,
        **option("max_attempts", True, NA, True), notes={"cli": "argv is text"},
    ),
    Case(
        "max-attempts-negative", "max_attempts", "max_attempts `-1`", REJECT,
        **option("max_attempts", -1, "-1", -1),
    ),
    Case(
        "max-attempts-zero", "max_attempts", "max_attempts `0`", REJECT,
        **option("max_attempts", 0, "0", 0),
    ),
    Case(
        "max-attempts-over", "max_attempts", "max_attempts `1000001` (the limit is 1,000,000)",
        REJECT, **option("max_attempts", 1_000_001, "1000001", 1_000_001),
    ),
    Case(
        "max-attempts-huge", "max_attempts", "max_attempts `10**30`", REJECT,
        **option("max_attempts", 10**30, str(10**30), 10**30),
    ),
    # --- delay ------------------------------------------------------------------------------------
    Case("delay-negative", "delay", "delay `-1`", REJECT, **option("delay", -1, "-1", -1)),
    Case(
        "delay-nan", "delay", "delay NaN", REJECT,
        **option("delay", float("nan"), "nan", b'{"type": "t", "delay_seconds": NaN}'),
    ),
    Case(
        "delay-infinity", "delay", "delay Infinity", REJECT,
        **option("delay", float("inf"), "inf", b'{"type": "t", "delay_seconds": Infinity}'),
    ),
    Case(
        "delay-huge", "delay", "delay `1e15` seconds (the limit is 10 years)", REJECT,
        **option("delay", 1e15, "1e15", 1e15),
    ),
    Case(
        "delay-string", "delay", 'delay as a string `"10"`', REJECT,
        **option("delay", "10", NA, "10"), notes={"cli": "argv is text"},
    ),
    Case("delay-word", "delay", 'delay `"ten"`', REJECT, **option("delay", "ten", "ten", "ten")),
    # --- run_at -----------------------------------------------------------------------------------
    Case(
        "run-at-naive", "run_at", "run_at without a time zone `2030-01-31T09:00:00`", REJECT,
        **option(
            "run_at", datetime(2030, 1, 31, 9), "2030-01-31T09:00:00", "2030-01-31T09:00:00"
        ),
    ),
    Case(
        "run-at-date", "run_at", "run_at a date only `2030-01-31`", REJECT,
        **option("run_at", date(2030, 1, 31), "2030-01-31", "2030-01-31"),
    ),
    Case(
        "run-at-words", "run_at", 'run_at `"next tuesday"`', REJECT,
        **option("run_at", "next tuesday", "next tuesday", "next tuesday"),
    ),
    Case(
        "run-at-impossible", "run_at", "run_at `2030-02-30T09:00:00Z`", REJECT,
        **option(
            "run_at", "2030-02-30T09:00:00Z", "2030-02-30T09:00:00Z", "2030-02-30T09:00:00Z"
        ),
    ),
    Case("run-at-empty", "run_at", 'run_at `""`', REJECT, **option("run_at", "", "", "")),
    Case(
        "run-at-epoch", "run_at", "run_at as a number `1893499200`", REJECT,
        **option("run_at", 1893499200, "1893499200", 1893499200),

    ),
]
# fmt: on

NAMES_GROUP = "hostile names (the value is the type, the queue and the idempotency key)"
ACCEPTED_NAMES = {
    "sql-drop": ("SQL `'; DROP TABLE pgqueue.tasks; --`", "'; DROP TABLE pgqueue.tasks; --"),
    "sql-dollar": ("SQL `$$; SELECT pg_sleep(30); $$`", "$$; SELECT pg_sleep(30); $$"),
    "format": ("format strings `%s %(type)s {0} \\N \\x00` (text)", "%s %(type)s {0} \\N \\x00"),
    "200-chars": ("200 characters (the limit)", "n" * 200),
    "200-emoji": ("200 emoji (200 characters, 800 bytes)", "\U0001f389" * 200),
    "200-combining": ("100 x (`e` + combining acute): 200 code points", "e\u0301" * 100),
    "ansi": ("terminal escapes `ESC[31m...ESC]0;title BEL`", "\x1b[31mred\x1b[0m\x1b]0;t\x07"),
    "c0-controls": ("tab, newline, CR, `\\x01`, DEL", "tab\tnew\nline\rcr\x01\x7f"),
    "c1-controls": ("C1 controls `\\x85\\x9b` then `x`", "\x85\x9bx"),
    "rtl-override": ("RTL override `\\u202egnp.exe`", "\u202egnp.exe"),
    "zero-width-only": ("only a zero-width space `\\u200b`", "\u200b"),
    "zwj-emoji": ("an emoji ZWJ sequence", "\U0001f469\u200d\U0001f469\u200d\U0001f467"),
    "bom": ("a leading BOM `\\ufeffname`", "\ufeffname"),
    "padded": ("surrounding spaces `' padded '`", " padded "),
    "dash": ("looks like an option: `--help`", "--help"),
    "path-unix": ("path traversal `../../etc/passwd`", "../../etc/passwd"),
    "path-windows": ("path traversal `..\\..\\windows\\system32`", "..\\..\\windows\\system32"),
    "path-encoded": ("encoded traversal `%2e%2e%2f`", "%2e%2e%2f"),
}
REJECTED_NAMES = {
    "empty": ('empty `""`', ""),
    "spaces": ("spaces only", "   "),
    "ideographic-space": ("ideographic space only `\\u3000`", "\u3000"),
    "file-separators": ("`\\x1c\\x1f` only (whitespace to Python)", "\x1c\x1f"),
    "201-chars": ("201 characters", "n" * 201),
    "201-emoji": ("201 emoji", "\U0001f389" * 201),
    "nul": ("NUL inside: `send\\x00mail`", "send\x00mail"),
    "surrogate": ("lone surrogate `t\\udcff` (HTTP: escaped in the JSON)", "t\udcff"),
}

CASES += [
    Case(
        f"name-{key}",
        NAMES_GROUP,
        label,
        ACCEPT,
        **names(value),
        stored={"type": value, "queue": value, "idempotency_key": value, "payload": {}},
    )
    for key, (label, value) in ACCEPTED_NAMES.items()
]
CASES += [
    Case(
        f"name-{key}",
        NAMES_GROUP,
        label,
        REJECT,
        "type",  # the first of the three checked, at every boundary
        **names(value),
        notes={"cli": "an OS argv cannot hold NUL"} if key == "nul" else {},
    )
    for key, (label, value) in REJECTED_NAMES.items()
]


def bad_names(field: str, limit: int) -> list[Case]:
    """A bad value of ``field`` alone, a name of 1 to ``limit`` characters: named as itself."""
    return [
        Case(f"{field}-{key}", f"{field} alone", f"{field}: {label}", REJECT, field,
             **one_field(field, value))
        for key, label, value in (
            ("spaces", "spaces only", "   "),
            ("over-limit", f"{limit + 1} characters", "k" * (limit + 1)),
            ("nul", "NUL", "a\x00b"),
            ("surrogate", "lone surrogate", "q\udcff"),
        )
    ]  # fmt: skip


CASES += bad_names("queue", 200) + bad_names("idempotency_key", 500)
CASES.append(
    Case(
        "idempotency_key-at-limit",
        "idempotency_key alone",
        "idempotency_key: 500 characters (the limit)",
        ACCEPT,
        **one_field("idempotency_key", "k" * 500),
        stored={"idempotency_key": "k" * 500},
    )
)
KEY_GROUP = "concurrency_key alone"
CASES += [
    *bad_names("concurrency_key", 200),
    Case(
        "concurrency_key-empty", KEY_GROUP, 'concurrency_key: empty `""`', REJECT,
        "concurrency_key", **one_field("concurrency_key", ""),
    ),
    Case(
        "concurrency_key-number", KEY_GROUP, "concurrency_key: the number `42`", REJECT,
        "concurrency_key", lib={"type": "t", "concurrency_key": 42},
        http={"type": "t", "concurrency_key": 42}, notes={"cli": "argv is text"},
    ),
    Case(
        "concurrency_key-at-limit", KEY_GROUP, "concurrency_key: 200 characters (the limit)",
        ACCEPT, **one_field("concurrency_key", "k" * 200), stored={"concurrency_key": "k" * 200},
    ),
    Case(
        "concurrency_key-hostile", KEY_GROUP,
        "concurrency_key: SQL, quotes, an emoji and surrounding spaces", ACCEPT,
        **one_field("concurrency_key", " '; DROP TABLE pgqueue.tasks; -- \"\U0001f389\" "),
        stored={"concurrency_key": " '; DROP TABLE pgqueue.tasks; -- \"\U0001f389\" "},
    ),
]  # fmt: skip
assert len({c.id for c in CASES}) == len(CASES)


# --- running a case at a boundary ----------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    boundary: str
    accepted: bool
    summary: str  # for the table
    field: str | None = None  # the field a rejection named ("body": the body as a whole)
    task_id: uuid.UUID | None = None
    problems: list[str] = dataclasses.field(default_factory=list)  # what is wrong with it
    stored: dict[str, Any] = dataclasses.field(default_factory=dict)  # the row, if accepted


OBSERVED: dict[tuple[str, str], Outcome] = {}
READ_BACK: set[tuple[str, str]] = set()  # (case, stored values) read back identically


def via_library(case: Case, ctx: Context) -> Outcome:
    assert case.lib is not None
    try:
        result = pgqueue.enqueue(ctx.db, **case.lib)
    except pgqueue.ValidationError as exc:
        summary = f"`{type(exc).__name__}` (`.field` = `{exc.field}`): {exc.reason}"
        return Outcome("library", False, summary, exc.field)
    except Exception as exc:
        problem = f"raised {type(exc).__name__}, not a pgqueue.ValidationError naming the field"
        return Outcome("library", False, f"`{type(exc).__name__}`: {exc}", problems=[problem])
    return Outcome("library", True, "accepted", task_id=result.id)


def cli_line(result: CliResult) -> str:
    """The error line; under ``--json`` the error's message, spelled as the plain line."""
    lines = result.stderr.splitlines()
    if not lines:
        return ""
    try:
        body = json.loads(lines[-1])
    except ValueError:
        return lines[-1]
    return f"error: {body['message']}" if isinstance(body, dict) and "message" in body else ""


def cli_problems(
    result: CliResult, exit_code: int, *, stdout_ok: bool = False, as_json: bool = False
) -> list[str]:
    """What keeps ``result`` from being a clean failure: ``exit_code`` and one line
    ``error: ...`` on stderr, or under ``--json`` one JSON document naming the kind, the
    message and the exit code (and nothing on stdout, unless ``stdout_ok``)."""
    problems = []
    if result.code != exit_code:
        problems.append(f"exit code {result.code}, not {exit_code}")
    if "Traceback" in result.stdout + result.stderr:
        problems.append("printed a traceback")
    lines = result.stderr.splitlines()
    if as_json:
        try:
            body = json.loads(result.stderr)
        except ValueError:
            body = None
        if (
            len(lines) != 1
            or not isinstance(body, dict)
            or not {"error", "message"} <= body.keys()
            or body.get("exit_code") != exit_code
        ):
            problems.append(f"stderr is not one JSON error document: {result.stderr!r}")
    elif len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"stderr is not one 'error: ...' line: {result.stderr!r}")
    if result.stdout and not stdout_ok:
        problems.append(f"wrote to stdout: {result.stdout!r:.200}")
    return problems


def cli_names(line: str, field: str) -> bool:
    """The CLI's line names ``field``: the library's ``field: ...`` or typer's ``'--option'``."""
    option = "--" + field.replace("_", "-")
    return line.startswith(f"error: {field}: ") or f"'{option}'" in line


def via_cli(case: Case, ctx: Context) -> Outcome:
    assert case.cli is not None
    as_json = run_main(ctx.url, "--json", *case.cli)
    if as_json.code == 0:
        task_id = uuid.UUID(json.loads(as_json.stdout)["task_id"])
        return Outcome("cli", True, "exit 0, accepted", task_id=task_id)
    plain = run_main(ctx.url, *case.cli)
    line = cli_line(plain)
    problems = cli_problems(plain, 2) + [
        f"--json: {p}" for p in cli_problems(as_json, 2, as_json=True)
    ]
    if (as_json.code, cli_line(as_json)) != (plain.code, line):
        problems.append(f"--json answers otherwise: {as_json.code} {as_json.stderr!r}")
    named = case.field if case.field and cli_names(line, case.field) else None
    return Outcome("cli", False, f"exit {plain.code}: {code(line)}", named, problems=problems)


def encode_body(body: dict[str, Any] | bytes) -> bytes:
    if isinstance(body, bytes):
        return body
    try:
        return json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape it, as JSON encoders do
        return json.dumps(body).encode("ascii")


HTTP_ERROR_CODES = {
    400: ("malformed_json",),
    413: ("body_too_large", "payload_too_large"),
    422: ("invalid_request",),
}


def http_rejection(
    response: httpx.Response, allowed: tuple[int, ...]
) -> tuple[str, list[str], list[str]]:
    """(summary, the fields the error body names, problems) of a refused request."""
    status = response.status_code
    problems = []
    try:
        body = response.json()
    except ValueError:
        body = {}
        problems.append(f"the body is not JSON: {response.text[:200]!r}")
    error = body.get("error")
    fields = [e.get("field") for e in body.get("errors") or []]
    summary = f"{status} `{error}`" + (f" (fields: {', '.join(fields)})" if fields else "")
    summary += f": {body.get('message', response.text[:200])}"
    if status >= 500:
        problems.append(f"answered {status}")
    elif status not in allowed:
        problems.append(f"answered {status}, expected one of {allowed}")
    if status in HTTP_ERROR_CODES and error not in HTTP_ERROR_CODES[status]:
        problems.append(f"error code {error!r}, documented: {HTTP_ERROR_CODES[status]!r}")
    if not body.get("message"):
        problems.append("no message")
    return summary, fields, problems


def via_http(case: Case, ctx: Context) -> Outcome:
    assert case.http is not None
    response = ctx.api.request(
        "POST", "/api/v1/tasks", content=encode_body(case.http), headers=JSON_TYPE
    )
    if response.status_code in (200, 202):
        task_id = uuid.UUID(response.json()["task_id"])
        return Outcome("http", True, f"{response.status_code}, accepted", task_id=task_id)
    summary, fields, problems = http_rejection(response, case.http_status)
    if response.status_code == 400 or (response.status_code == 413 and not fields):
        named: str | None = "body"  # the error code says what is wrong with the body
    else:
        named = case.http_field if case.http_field in fields else None
    return Outcome("http", False, summary, named, problems=problems)


RUNNERS: dict[str, Callable[[Case, Context], Outcome]] = {
    "library": via_library,
    "cli": via_cli,
    "http": via_http,
}


def row(ctx: Context, task_id: uuid.UUID) -> dict[str, Any]:
    with ctx.db.cursor(row_factory=dict_row) as cur:
        found = cur.execute("SELECT * FROM pgqueue.tasks WHERE id = %s", [task_id]).fetchone()
    assert found is not None, f"task {task_id} was reported created but is not in the table"
    return found


def readback_problems(ctx: Context, task_id: uuid.UUID, stored: dict[str, Any]) -> list[str]:
    """``pgqueue --json status ID`` and ``GET /api/v1/tasks/ID`` return the stored row."""
    want = {c: stored[c] for c in STORED_COLUMNS}
    want["priority"] = pgqueue.Priority(stored["priority"]).label
    problems = []
    status = run_main(ctx.url, "--json", "status", str(task_id))
    if status.code != 0:
        problems.append(f"`pgqueue --json status` failed: {status.code} {status.stderr!r}")
    elif {k: json.loads(status.stdout)[k] for k in want} != want:
        problems.append("`pgqueue --json status` does not return the stored values")
    response = ctx.api.request("GET", f"/api/v1/tasks/{task_id}")
    if response.status_code != 200:
        problems.append(f"GET /api/v1/tasks/ID answered {response.status_code}")
    elif {k: response.json()[k] for k in want} != want:
        problems.append("GET /api/v1/tasks/ID does not return the stored values")
    return problems


def observe(case: Case, boundary: str, ctx: Context) -> Outcome:
    """Run ``case`` at ``boundary`` and check the table; then remove what it wrote."""
    for name, value in case.env.items():
        ctx.monkeypatch.setenv(name, value)
    before = snapshot(ctx.db)
    try:
        outcome = RUNNERS[boundary](case, ctx)
        after = snapshot(ctx.db)
        added = set(after) - set(before)
        changed = [str(i) for i in before if after.get(i) != before[i]]
        if changed:
            outcome.problems.append(f"existing tasks changed or went missing: {changed}")
        if outcome.accepted:
            assert outcome.task_id is not None
            if added != {outcome.task_id}:
                outcome.problems.append(f"wrote {len(added)} tasks, not the one reported")
            stored = row(ctx, outcome.task_id)
            outcome.stored = {c: stored[c] for c in STORED_COLUMNS}
            wrong = {c: stored[c] for c in case.stored if stored[c] != case.stored[c]}
            if wrong:
                outcome.problems.append(f"not stored verbatim: {wrong!r:.300}")
            # Reading back depends only on the row: once per case and stored values is enough.
            key = (case.id, json.dumps(outcome.stored, sort_keys=True, default=str))
            if key not in READ_BACK:
                problems = readback_problems(ctx, outcome.task_id, stored)
                outcome.problems += problems
                if not problems:
                    READ_BACK.add(key)
            if not outcome.problems:
                outcome.summary += "; stored verbatim, the same through `status --json` and GET"
        elif added:
            outcome.problems.append(f"refused, yet {len(added)} task(s) were written")
    finally:
        remove_new_rows(ctx.db, before)
        for name in case.env:
            ctx.monkeypatch.delenv(name)
    OBSERVED[(case.id, boundary)] = outcome
    return outcome


def cells() -> Iterator[Any]:
    for case in CASES:
        for boundary in case.boundaries:
            reason = case.bugs.get(boundary)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(case, boundary, id=f"{case.id}-{boundary}", marks=marks)


@pytest.mark.parametrize(("case", "boundary"), list(cells()))
def test_bad_input_at_each_boundary(case: Case, boundary: str, ctx: Context) -> None:
    outcome = observe(case, boundary, ctx)

    assert outcome.problems == [], outcome.summary
    assert case.expect in (ACCEPT, REJECT), f"{case.id}: say which the input must get"
    if case.expect == ACCEPT:
        assert outcome.accepted, outcome.summary
    else:
        assert not outcome.accepted, "accepted an input that must be refused"
    if not outcome.accepted:  # it names the field (the API: or says what is wrong with the body)
        field = case.http_field if boundary == "http" else case.field
        assert outcome.field in (field, "body" if boundary == "http" else field), outcome.summary


def verdict(outcome: Outcome) -> str:
    if outcome.accepted:
        stored = json.dumps(outcome.stored, sort_keys=True, default=str)
        return (
            f"accepted as {stored[:100]}... (sha256 {hashlib.sha256(stored.encode()).hexdigest()})"
        )
    if any(p.startswith("answered 5") for p in outcome.problems):
        return "server error"
    return "refused"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=c.id,
            marks=[pytest.mark.xfail(strict=True, reason=c.rule_bug)] if c.rule_bug else [],
        )
        for c in CASES
        if len(c.boundaries) > 1
    ],
)
def test_same_rule_at_every_boundary(case: Case, ctx: Context) -> None:
    """Every boundary that can express the input reaches the same verdict: refused, or
    accepted with the same stored values."""
    verdicts = {
        boundary: verdict(OBSERVED.get((case.id, boundary)) or observe(case, boundary, ctx))
        for boundary in case.boundaries
    }
    assert len(set(verdicts.values())) == 1, verdicts


# --- argv bytes that are not UTF-8, in real processes --------------------------------------------


ARGV_BYTES = {
    "type": [b"enqueue", b"--", b"send\xffmail"],
    "payload": [b"enqueue", b'--payload={"s": "\xff"}', b"--", b"t"],
}


def test_argv_bytes_that_are_not_utf8_exit_2_naming_the_field(ctx: Context) -> None:
    """What an operator's shell can pass: bytes that are not UTF-8 (Python decodes them with
    surrogateescape). Real processes, concurrently."""
    before = snapshot(ctx.db)
    command = [sys.executable.encode(), b"-m", b"pgqueue", b"--database-url", ctx.url.encode()]
    procs = {
        field: subprocess.Popen([*command, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for field, argv in ARGV_BYTES.items()
    }
    for field, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        result = CliResult(proc.returncode, stdout.decode(), stderr.decode("utf-8", "replace"))
        line = cli_line(result)
        problems = cli_problems(result, 2)
        OBSERVED[(f"argv-bytes-{field}", "cli")] = Outcome(
            "cli", False, f"exit {result.code}: {code(line)}", field, problems=problems
        )
        assert problems == [], (field, result)
        assert cli_names(line, field), line
    assert snapshot(ctx.db) == before


# --- task ids and filters: status, cancel, dead letters ------------------------------------------


BAD_IDS = {
    "not-a-uuid": "not-a-uuid",
    "empty": "",
    "sql": "'; DROP TABLE pgqueue.tasks; --",
    "traversal": "../../etc/passwd",
    "nul": "\x00",
    "invalid-utf8": os.fsdecode(b"\xff"),
    "10k-chars": "x" * 10_000,
    "unknown-uuid": str(uuid.UUID(int=42)),
}


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("key", BAD_IDS)
def test_bad_task_ids_are_not_found_and_change_nothing(
    key: str, boundary: str, ctx: Context
) -> None:
    """Show, cancel, replay and discard by an id that is malformed or unknown: not found
    (library TaskNotFound, HTTP 404 ``not_found``; the CLI: exit 1 for an unknown id, a usage
    error naming the argument, exit 2, for a malformed one), and no task changes."""
    task_id = BAD_IDS[key]
    before = snapshot(ctx.db)
    if boundary == "library":
        for op in (pgqueue.get_task, pgqueue.cancel):
            with pytest.raises(pgqueue.TaskNotFound):
                op(ctx.db, task_id)
        for bulk in (pgqueue.replay, pgqueue.discard):
            if key == "unknown-uuid":  # well-formed: simply not a dead letter
                assert bulk(ctx.db, [task_id]) == []
            else:
                with pytest.raises(pgqueue.TaskNotFound):
                    bulk(ctx.db, [task_id])
        summary = "`TaskNotFound` (get_task, cancel; replay/discard of a malformed id)"
    elif boundary == "cli":
        # A malformed id is a usage error naming the argument; a well-formed unknown one is
        # not found.
        malformed = key != "unknown-uuid"
        for command in (["status"], ["--json", "status"], ["cancel"], ["dlq", "replay"]):
            result = run_main(ctx.url, *command, task_id)
            as_json = command[0] == "--json"
            assert cli_problems(result, 2 if malformed else 1, as_json=as_json) == [], result
            if malformed:
                assert "'TASK_ID'" in result.stderr or "'[ID]...'" in result.stderr, result
                assert "is not a task id (a UUID)" in result.stderr, result
            else:
                assert "no task with id" in result.stderr or "(no such task)" in result.stderr
        summary = f"exit {result.code}: {code(cli_line(result)[:120])}"
    else:
        if key == "empty":
            pytest.skip("an empty path segment is another URL (the collection)")
        segment = quote(task_id, safe="", errors="surrogateescape")
        for method, path in (
            ("GET", f"/api/v1/tasks/{segment}"),
            ("DELETE", f"/api/v1/tasks/{segment}"),
            ("POST", f"/api/v1/dead-letters/{segment}/replay"),
            ("DELETE", f"/api/v1/dead-letters/{segment}"),
        ):
            response = ctx.api.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"] == "not_found"
        summary = "404 `not_found` (GET, DELETE, dead-letter replay and discard)"
    OBSERVED[(f"id-{key}", boundary)] = Outcome(boundary, False, summary)
    assert snapshot(ctx.db) == before


BAD_FILTERS = {"nul": "boom\x00", "spaces": "   ", "201-chars": "f" * 201, "empty": ""}


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("key", BAD_FILTERS)
def test_bad_filters_name_the_field_and_change_nothing(
    key: str, boundary: str, ctx: Context
) -> None:
    """A type or queue filter no task can have is refused like the name at enqueue, naming the
    filter, and nothing changes: library list_tasks/replay/discard, CLI `list` and `dlq replay`
    (plain and --json), API GET /tasks and POST /dead-letters/replay and /discard."""
    value = BAD_FILTERS[key]
    before = snapshot(ctx.db)
    for field in ("type", "queue"):
        if boundary == "library":
            ops: list[Callable[..., Any]] = [pgqueue.list_tasks, pgqueue.replay, pgqueue.discard]
            for op in ops:
                with pytest.raises(pgqueue.ValidationError) as info:
                    op(ctx.db, **{field: value})
                assert info.value.field == field
            summary = f"`ValidationError` (`.field` = `{field}`): {info.value.reason}"
        elif boundary == "cli":
            for command in (["list"], ["--json", "dlq", "replay"]):
                result = run_main(ctx.url, *command, f"--{field}={value}")
                as_json = command[0] == "--json"
                assert cli_problems(result, 2, as_json=as_json) == [], (command, result)
                assert cli_names(cli_line(result), field), cli_line(result)
            summary = f"exit 2: {code(cli_line(result))}"
        else:
            requests = [("GET", "/api/v1/tasks", {"params": {field: value}})] + [
                ("POST", f"/api/v1/dead-letters/{action}", {"json": {field: value}})
                for action in ("replay", "discard")
            ]
            for method, path, options in requests:
                response = ctx.api.request(method, path, **options)
                summary, fields, problems = http_rejection(response, (422,))
                assert (problems, fields) == ([], [field]), response.text
    OBSERVED[(f"filter-{key}", boundary)] = Outcome(boundary, False, summary, "queue")
    assert snapshot(ctx.db) == before


def test_the_seeded_tasks_are_intact_at_the_end(
    db: psycopg.Connection[Any], seeded: dict[str, uuid.UUID]
) -> None:
    """After every case at every boundary, the tasks seeded first are there, as they were."""
    statuses = dict(db.execute("SELECT id, status FROM pgqueue.tasks").fetchall())
    assert statuses == {
        seeded["queued"]: "queued",
        seeded["keyed"]: "queued",
        seeded["scheduled"]: "queued",
        seeded["cancelled"]: "cancelled",
        seeded["running"]: "running",
        seeded["completed"]: "completed",
        seeded["failed"]: "failed",
    }


# --- the table for docs/bad-input.md -------------------------------------------------------------


def _cell(text: str) -> str:
    text = clean(text).replace("|", "\\|")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return shorten(text)


EXTRA_ROWS = [
    ("argv bytes (real processes)", "argv-bytes-type", "`pgqueue enqueue -- $'send\\xffmail'`"),
    ("argv bytes (real processes)", "argv-bytes-payload", "`--payload` with byte 0xFF in a string"),
    *[
        ("task ids (show, cancel, dead-letter replay/discard)", f"id-{key}", f"task id: {key}")
        for key in BAD_IDS
    ],
    *[
        ("filters (--type/--queue of list, dead-letter replay/discard)", f"filter-{k}", k)
        for k in BAD_FILTERS
    ],
]


def report_rows() -> Iterator[tuple[str, list[str]]]:
    rows: list[tuple[str, str, str, Case | None]] = [(c.group, c.id, c.label, c) for c in CASES]
    rows += [(group, key, label, None) for group, key, label in EXTRA_ROWS]
    for group, key, label, case in rows:
        if not any((key, b) in OBSERVED for b in BOUNDARIES):
            continue
        texts = []
        for boundary in BOUNDARIES:
            outcome = OBSERVED.get((key, boundary))
            if outcome is None:
                note = case.notes.get(boundary) if case else None
                texts.append(f"n/a ({note})" if note else "n/a")
            elif outcome.problems:
                texts.append(_cell(f"**BUG** {outcome.summary} ({'; '.join(outcome.problems)})"))
            elif case and boundary in case.bugs:
                texts.append(_cell(f"**BUG** {outcome.summary}"))
            else:
                texts.append(_cell(outcome.summary))
        if case and case.rule_bug:
            label += " **(boundaries disagree)**"
        yield group, [_cell(label), *texts]


def write_report(path: Path) -> None:
    write_tables(path, ["input", "library", "CLI", "HTTP"], report_rows())


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        write_report(Path(target) / "bad-input-boundaries.md")
