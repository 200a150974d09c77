"""Bad input is refused with a specific error and writes nothing.

Validation happens before any SQL is sent: on a connection with an open-able transaction the
transaction is still idle after the error, so the caller's own work is never poisoned.

Families of bad values share one database and report each value as a subtest.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import traceback
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from jsonb_text import jsonb_size
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import pgqueue
import pgqueue.aio
from pgqueue import config

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def count_tasks(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()[0]


def json_size(payload) -> int:
    """The payload's size by the payload rule: the UTF-8 bytes of the text jsonb gives back."""
    return jsonb_size(payload)


@pytest.fixture
def tx(connect):
    """A non-autocommit connection: a refused call must leave its transaction untouched."""
    return connect(autocommit=False)


def assert_refused_before_sql(tx, conn, error, call, **match):
    """``call(tx)`` raises ``error`` without sending SQL, and nothing is written."""
    with pytest.raises(error) as info:
        call(tx)
    assert tx.info.transaction_status is TransactionStatus.IDLE
    for attr, value in match.items():
        assert getattr(info.value, attr) == value
    assert count_tasks(conn) == 0
    return info.value


# --- priority --------------------------------------------------------------------------------


def test_priority_must_be_high_normal_or_low(tx, conn, subtests):
    for priority in ["urgent", 7, True, -1, 1.0, ""]:
        with subtests.test(priority=priority):
            exc = assert_refused_before_sql(
                tx,
                conn,
                pgqueue.InvalidPriority,
                lambda c, p=priority: pgqueue.enqueue(c, "t", {}, priority=p),
                field="priority",
            )
            assert "'high', 'normal', 'low'" in str(exc)

    # None is "not given": the type's declared priority, else normal.
    assert pgqueue.enqueue(conn, "t", {}, priority=None).task.priority is pgqueue.Priority.NORMAL

    # The accepted spellings, for contrast: names in any case, Priority members, 0 to 2.
    cases = [("high", 0), (" LOW ", 2), (pgqueue.Priority.NORMAL, 1), (0, 0), (2, 2)]
    for given, stored in cases:
        with subtests.test(accepted=given):
            result = pgqueue.enqueue(conn, "t", priority=given)
            assert int(pgqueue.get_task(conn, result.id).priority) == stored


# --- payload ---------------------------------------------------------------------------------


class Opaque:
    pass


def test_payload_must_be_a_json_object_without_nul(tx, conn, subtests):
    not_an_object = {
        "list": [1, 2],
        "str": "text",
        "int": 42,
        "set": {1, 2},
        "tuple": ("a", "b"),
        "bytes": b"{}",
    }
    not_serialisable = {
        "set-inside": {"tags": {1, 2}},
        "object": {"obj": Opaque()},
        "nan": {"x": float("nan")},
        "inf": {"x": [1.0, float("inf")]},
        "tuple-key": {("a", "b"): 1},
    }
    with_nul = {
        "value": {"s": "a\x00b"},
        "nested": {"nested": [{"deep": "\x00"}]},
        "key": {"key\x00": 1},
    }
    for cases, says in ((not_an_object, "dict"), (not_serialisable, "JSON"), (with_nul, "NUL")):
        for name, payload in cases.items():
            with subtests.test(case=name):
                exc = assert_refused_before_sql(
                    tx,
                    conn,
                    pgqueue.InvalidPayload,
                    lambda c, p=payload: pgqueue.enqueue(c, "t", p),
                    field="payload",
                )
                assert says in str(exc)

    # For contrast: None means {}, and the six characters \u0000 in text are not a NUL.
    empty = pgqueue.enqueue(conn, "t", None)
    assert pgqueue.get_task(conn, empty.id).payload == {}
    lookalike = {"s": "literally \\u0000 here"}
    stored = pgqueue.enqueue(conn, "t", lookalike)
    assert pgqueue.get_task(conn, stored.id).payload == lookalike


def test_lone_surrogate_in_a_payload_raises_invalid_payload(tx, conn):
    assert_refused_before_sql(
        tx,
        conn,
        pgqueue.InvalidPayload,
        lambda c: pgqueue.enqueue(c, "t", {"s": "half a pair: \ud800"}),
        field="payload",
    )


# --- payload size ----------------------------------------------------------------------------


def test_payload_over_max_payload_bytes_raises_payload_too_large(tx, conn):
    payload = {"blob": "x" * 100}
    size = json_size(payload)

    with pytest.raises(pgqueue.PayloadTooLarge) as info:
        pgqueue.prepare("t", payload, max_payload_bytes=size - 1)
    assert (info.value.size, info.value.limit) == (size, size - 1)
    assert isinstance(info.value, pgqueue.InvalidPayload)
    assert info.value.field == "payload"

    assert_refused_before_sql(
        tx,
        conn,
        pgqueue.PayloadTooLarge,
        lambda c: pgqueue.enqueue(c, "t", payload, max_payload_bytes=size - 1),
    )

    # Exactly at the limit is allowed.
    spec = pgqueue.prepare("t", payload, max_payload_bytes=size)
    assert pgqueue.enqueue_many(conn, [spec])[0].task.payload == payload


def test_payload_limit_counts_bytes_not_characters(tx, conn):
    payload = {"s": "é" * 100}  # 100 characters, 200 bytes in UTF-8
    characters = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False))
    limit = characters + 50  # enough for the characters, not for the bytes
    assert json_size(payload) > limit

    exc = assert_refused_before_sql(
        tx,
        conn,
        pgqueue.PayloadTooLarge,
        lambda c: pgqueue.enqueue(c, "t", payload, max_payload_bytes=limit),
    )
    assert exc.size >= json_size(payload)


def test_payload_limit_from_environment_applies_to_enqueue(tx, conn, monkeypatch, subtests):
    monkeypatch.setenv(config.ENV_MAX_PAYLOAD_BYTES, "64")
    too_big = {"blob": "x" * 64}
    assert json_size(too_big) > 64

    exc = assert_refused_before_sql(
        tx, conn, pgqueue.PayloadTooLarge, lambda c: pgqueue.enqueue(c, "t", too_big)
    )
    assert exc.limit == 64
    with pytest.raises(pgqueue.PayloadTooLarge):
        pgqueue.enqueue_many(conn, [{"type": "t", "payload": too_big}])
    assert count_tasks(conn) == 0

    fits = {"blob": "x" * 40}
    assert json_size(fits) <= 64
    assert pgqueue.enqueue(conn, "t", fits).created
    assert count_tasks(conn) == 1

    # A limit that is not a positive integer is a configuration error, also before any write.
    for raw in ["lots", "0", "-5", "1.5"]:
        with subtests.test(raw=raw):
            monkeypatch.setenv(config.ENV_MAX_PAYLOAD_BYTES, raw)
            with pytest.raises(pgqueue.ConfigurationError, match=config.ENV_MAX_PAYLOAD_BYTES):
                pgqueue.enqueue(tx, "t", {"a": 1})
            assert tx.info.transaction_status is TransactionStatus.IDLE
            assert count_tasks(conn) == 1


def test_payload_exactly_at_the_limit_in_utf8_bytes_is_accepted(conn):
    payload = {"s": "é" * 100, "emoji": "🎉"}
    size = json_size(payload)

    result = pgqueue.enqueue(conn, "t", payload, max_payload_bytes=size)

    assert pgqueue.get_task(conn, result.id).payload == payload
    with pytest.raises(pgqueue.PayloadTooLarge) as info:
        pgqueue.prepare("t", payload, max_payload_bytes=size - 1)
    assert info.value.size == size


# --- type, queue, idempotency key ------------------------------------------------------------

BAD_NAMES = {
    "empty": "",
    "spaces": "   ",
    "whitespace": "\t\n",
    "201-chars": "x" * 201,
    "nul": "send\x00mail",
    "none": None,
    "int": 7,
    "bytes": b"send_mail",
}


def test_type_and_queue_must_be_1_to_200_characters_without_nul(tx, conn, subtests):
    def as_type(c, value):
        return pgqueue.enqueue(c, value, {})

    def as_queue(c, value):
        return pgqueue.enqueue(c, "t", {}, queue=value)

    for field, call in (("type", as_type), ("queue", as_queue)):
        for name, value in BAD_NAMES.items():
            if field == "queue" and value is None:
                continue  # "not given": below
            with subtests.test(field=field, case=name):
                assert_refused_before_sql(
                    tx,
                    conn,
                    pgqueue.ValidationError,
                    lambda c, call=call, value=value: call(c, value),
                    field=field,
                )

    # queue=None is "not given": the type's declared queue, else 'default'.
    assert pgqueue.enqueue(conn, "t", {}, queue=None).task.queue == "default"

    # For contrast: 200 characters (not bytes) is within the limit.
    name = "é" * 200
    result = pgqueue.enqueue(conn, name, queue=name)
    task = pgqueue.get_task(conn, result.id)
    assert (task.type, task.queue) == (name, name)


def test_lone_surrogate_in_type_raises_validation_error(tx, conn):
    assert_refused_before_sql(
        tx,
        conn,
        pgqueue.ValidationError,
        lambda c: pgqueue.enqueue(c, "send\udc80mail"),
        field="type",
    )


def test_bad_idempotency_key_raises_validation_error(tx, conn, subtests):
    for name, key in {
        "empty": "",
        "spaces": "   ",
        "501-chars": "k" * 501,
        "nul": "a\x00b",
    }.items():
        with subtests.test(case=name):
            assert_refused_before_sql(
                tx,
                conn,
                pgqueue.ValidationError,
                lambda c, k=key: pgqueue.enqueue(c, "t", idempotency_key=k),
                field="idempotency_key",
            )


# --- attempts and scheduling -----------------------------------------------------------------


def test_bad_max_attempts_raises_validation_error(tx, conn, subtests):
    for value in [0, -1, "x", 2.5, True]:
        with subtests.test(max_attempts=value):
            assert_refused_before_sql(
                tx,
                conn,
                pgqueue.ValidationError,
                lambda c, v=value: pgqueue.enqueue(c, "t", max_attempts=v),
                field="max_attempts",
            )


def test_max_attempts_beyond_the_column_range_raises_validation_error(tx, conn):
    assert_refused_before_sql(
        tx,
        conn,
        pgqueue.ValidationError,
        lambda c: pgqueue.enqueue(c, "t", max_attempts=2**31),
        field="max_attempts",
    )


def test_bad_delay_raises_validation_error(tx, conn, subtests):
    for delay in [-1, -0.001, float("nan"), float("inf"), float("-inf"), "10", True]:
        with subtests.test(delay=delay):
            assert_refused_before_sql(
                tx,
                conn,
                pgqueue.ValidationError,
                lambda c, d=delay: pgqueue.enqueue(c, "t", delay=d),
                field="delay",
            )


def test_delay_beyond_the_representable_range_raises_validation_error(tx, conn):
    assert_refused_before_sql(
        tx,
        conn,
        pgqueue.ValidationError,
        lambda c: pgqueue.enqueue(c, "t", delay=1e15),
        field="delay",
    )


def test_run_at_must_be_an_aware_datetime_and_not_combined_with_delay(tx, conn, subtests):
    cases = {
        "with-delay": {"run_at": T0, "delay": 5},
        "with-zero-delay": {"run_at": T0, "delay": 0},
        "naive": {"run_at": datetime(2030, 1, 1, 12, 0)},
        "str": {"run_at": "2030-01-01T12:00:00Z"},
        "epoch": {"run_at": 1893499200},
    }
    for name, options in cases.items():
        with subtests.test(case=name):
            assert_refused_before_sql(
                tx,
                conn,
                pgqueue.ValidationError,
                lambda c, o=options: pgqueue.enqueue(c, "t", **o),
                field="run_at",
            )

    # For contrast: any aware datetime is accepted, as the instant it names.
    tokyo = datetime(2030, 1, 2, 6, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    result = pgqueue.enqueue(conn, "t", run_at=tokyo, now=T0 - timedelta(hours=1))
    stored = pgqueue.get_task(conn, result.id).visible_after
    assert stored == datetime(2030, 1, 1, 21, 0, tzinfo=UTC)


# --- unknown tasks and wrong states ----------------------------------------------------------


def test_unknown_or_malformed_task_id_raises_task_not_found(conn, subtests):
    existing = pgqueue.enqueue(conn, "t")
    cases = {
        "unknown-uuid": uuid.uuid4(),
        "unknown-text": str(uuid.uuid4()),
        "malformed": "not-a-uuid",
        "empty": "",
        "int": 12345,
    }
    for name, task_id in cases.items():
        for operation in (pgqueue.get_task, pgqueue.cancel):
            with subtests.test(case=name, operation=operation.__name__):
                with pytest.raises(pgqueue.TaskNotFound) as info:
                    operation(conn, task_id)
                assert isinstance(info.value, LookupError)

    task = pgqueue.get_task(conn, existing.id)
    assert task.status is pgqueue.TaskStatus.QUEUED
    assert task.cancel_requested is False
    assert count_tasks(conn) == 1


def finish(conn, how):
    result = pgqueue.enqueue(conn, f"t-{how}", max_attempts=1)
    if how == "cancelled":
        pgqueue.cancel(conn, result.id)
        return result.id
    [claimed] = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")
    assert claimed.id == result.id
    if how == "completed":
        pgqueue.complete(conn, claimed.lease, {"done": True})
    else:
        pgqueue.fail(conn, claimed.lease, "boom")
    return result.id


def test_cancelling_a_finished_task_raises_invalid_task_state(conn, subtests):
    for status in ["completed", "failed", "cancelled"]:
        with subtests.test(status=status):
            task_id = finish(conn, status)
            before = pgqueue.get_task(conn, task_id)
            assert before.status == status

            with pytest.raises(pgqueue.InvalidTaskState) as info:
                pgqueue.cancel(conn, task_id)

            assert info.value.status == status
            assert info.value.task_id == task_id
            assert pgqueue.get_task(conn, task_id) == before


# --- database URLs (no database needed) ------------------------------------------------------

MALFORMED_URLS = ["", "   ", "localhost:5432", "mysql://x/y", "postgresql://h:notaport/db"]


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_malformed_database_url_is_rejected_by_validation(url):
    with pytest.raises(pgqueue.InvalidDatabaseURL):
        config.validate_database_url(url)


@pytest.mark.parametrize("url", [u for u in MALFORMED_URLS if u])
def test_malformed_database_url_is_rejected_by_client(url, monkeypatch):
    monkeypatch.delenv(config.ENV_DATABASE_URL, raising=False)
    with pytest.raises(pgqueue.InvalidDatabaseURL):
        pgqueue.Client(url)


def test_empty_database_url_is_rejected_by_client(monkeypatch):
    # A valid fallback in the environment, so the bug cannot start an embedded server
    # (the Client connects lazily; nothing listens on port 1).
    monkeypatch.setenv(config.ENV_DATABASE_URL, "postgresql://postgres@127.0.0.1:1/fallback")
    with pytest.raises(pgqueue.InvalidDatabaseURL):
        pgqueue.Client("")


def test_invalid_database_url_message_hides_the_password():
    with pytest.raises(pgqueue.InvalidDatabaseURL) as info:
        config.validate_database_url("postgresql://app:s3cr3t-pw@db:notaport/app")
    assert "s3cr3t-pw" not in str(info.value)
    assert "notaport" in str(info.value)


def test_unreachable_database_raises_database_unavailable_without_the_password():
    url = "postgresql://postgres:secret@127.0.0.1:1/x"
    client = pgqueue.Client(url)
    try:
        with pytest.raises(pgqueue.DatabaseUnavailable) as info:
            client.enqueue("t", {"a": 1})
    finally:
        client.close()

    assert "secret" not in str(info.value)
    assert "127.0.0.1" in str(info.value)
    rendered = "".join(traceback.format_exception(info.value))
    assert "secret" not in rendered


# --- connection objects ----------------------------------------------------------------------


def test_unsupported_connection_objects_raise_unsupported_connection(
    database_url, tx, conn, subtests
):
    lite = sqlite3.connect(":memory:")
    engine = create_engine("sqlite://")
    session = Session(engine)
    try:
        cases = {"sqlite3": lite, "object": object(), "sqlalchemy-sqlite": session}
        for name, obj in cases.items():
            with subtests.test(case=name):
                with pytest.raises(pgqueue.UnsupportedConnection) as info:
                    pgqueue.enqueue(obj, "t")
                assert isinstance(info.value, TypeError)
                with pytest.raises(pgqueue.UnsupportedConnection):
                    pgqueue.enqueue_many(obj, [{"type": "t"}])
                with pytest.raises(pgqueue.UnsupportedConnection):
                    pgqueue.get_task(obj, uuid.uuid4())
    finally:
        session.close()
        engine.dispose()
        lite.close()

    async def wrong_api():
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            with (
                subtests.test(case="async-connection-to-sync-api"),
                pytest.raises(pgqueue.UnsupportedConnection, match=r"pgqueue\.aio"),
            ):
                pgqueue.enqueue(aconn, "t")
        with (
            subtests.test(case="sync-connection-to-async-api"),
            pytest.raises(pgqueue.UnsupportedConnection),
        ):
            await pgqueue.aio.enqueue(tx, "t")

    asyncio.run(wrong_api())
    assert tx.info.transaction_status is TransactionStatus.IDLE
    assert count_tasks(conn) == 0


# --- enqueue_many: one bad item rejects the batch --------------------------------------------


def test_one_bad_item_rejects_the_whole_batch(tx, conn, subtests):
    cases = {
        "priority": ({"type": "t", "priority": "urgent"}, pgqueue.InvalidPriority, "priority"),
        "payload": ({"type": "t", "payload": [1]}, pgqueue.InvalidPayload, "payload"),
        "too-large": (
            {"type": "t", "payload": {"x": "y" * 50}, "max_payload_bytes": 10},
            pgqueue.PayloadTooLarge,
            "payload",
        ),
        "empty-type": ({"type": ""}, pgqueue.ValidationError, "type"),
        "missing-type": ({"payload": {"no": "type"}}, pgqueue.ValidationError, "type"),
        "delay": ({"type": "t", "delay": -1}, pgqueue.ValidationError, "delay"),
        "unknown-option": ({"type": "t", "colour": "red"}, TypeError, None),
        "str-item": ("not a dict", pgqueue.ValidationError, "tasks"),
    }
    for name, (bad_item, error, field) in cases.items():
        with subtests.test(case=name):
            batch = [
                {"type": "good", "payload": {"n": 1}},
                pgqueue.prepare("good", {"n": 2}),
                bad_item,
                {"type": "good", "payload": {"n": 3}},
            ]
            with pytest.raises(error) as info:
                pgqueue.enqueue_many(tx, batch)
            if field is not None:
                assert info.value.field == field
            assert tx.info.transaction_status is TransactionStatus.IDLE
            assert count_tasks(conn) == 0


def test_the_same_prepared_task_twice_in_a_batch_raises_validation_error(tx, conn):
    spec = pgqueue.prepare("t", {"n": 1})
    assert_refused_before_sql(
        tx, conn, pgqueue.ValidationError, lambda c: pgqueue.enqueue_many(c, [spec, spec])
    )


# --- hostile strings are data, never SQL -----------------------------------------------------

HOSTILE = [
    "'; DROP TABLE pgqueue.tasks; --",
    "Robert'); DROP TABLE pgqueue.tasks; --",
    '" OR 1=1; --',
    "%(id)s %s {0} $1 \\x00 \\",
    "ключ ✓ 中文 🎉 e\u0301",
    "tab\tnew\nline",
]


def test_hostile_strings_are_stored_verbatim_and_never_run_as_sql(conn, subtests):
    for hostile in HOSTILE:
        with subtests.test(value=hostile):
            payload = {hostile: hostile, "list": [hostile]}
            result = pgqueue.enqueue(conn, hostile, payload, queue=hostile, idempotency_key=hostile)
            again = pgqueue.enqueue(conn, hostile, {}, queue=hostile, idempotency_key=hostile)

            assert conn.execute("SELECT to_regclass('pgqueue.tasks')").fetchone()[0] is not None
            assert again.created is False
            assert again.id == result.id
            row = conn.execute(
                "SELECT type, queue, idempotency_key, payload FROM pgqueue.tasks WHERE id = %s",
                [result.id],
            ).fetchone()
            assert row == (hostile, hostile, hostile, payload)
            listed = pgqueue.list_tasks(conn, type=hostile, queue=hostile)
            assert [t.id for t in listed] == [result.id]
            [claimed] = pgqueue.claim(conn, [hostile], limit=5, worker_id=hostile)
            assert claimed.id == result.id
    assert count_tasks(conn) == len(HOSTILE)

    # The same strings through the batch path (new keys, so new tasks).
    batch = pgqueue.enqueue_many(
        conn,
        [
            {"type": h, "queue": h, "idempotency_key": h + "#2", "payload": {"v": h}}
            for h in HOSTILE
        ],
    )
    assert conn.execute("SELECT to_regclass('pgqueue.tasks')").fetchone()[0] is not None
    assert all(r.created for r in batch)
    stored = {
        row[0]: row[1:]
        for row in conn.execute(
            "SELECT id, type, queue, idempotency_key, payload FROM pgqueue.tasks"
        )
    }
    assert [stored[r.id] for r in batch] == [(h, h, h + "#2", {"v": h}) for h in HOSTILE]
