"""What a payload's (and a result's) numbers cost when read back, and how they come back.

PostgreSQL's jsonb keeps a number as ``numeric`` and prints it in full: ``5e-324`` is 326
characters when read, ``1e+308`` 309, and every item is followed by ", " and every key by ": ".
A payload is therefore measured by the text PostgreSQL gives back, not by Python's compact
JSON, so that whatever its numbers, no read of an accepted payload costs more than the limit.
The numbers' round trip, as docs/payloads.md states it, is pinned here against a real server.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from jsonb_text import jsonb_size, jsonb_text

import pgqueue
from pgqueue import TaskRegistry, config
from pgqueue.api import ApiSettings

TINY = 5e-324  # the smallest float: "5e-324", read back as "0." and 324 digits
HUGE = 1.7976931348623157e308  # the largest: read back as an integer of 309 digits

# Payloads that grow when jsonb prints them, each a family of the adversary's choice.
ADVERSARIAL: dict[str, dict[str, Any]] = {
    "many tiny floats": {"v": [TINY] * 300},
    "huge exponents": {"v": [HUGE, 1e308, 1e16, 1.5e17, -1e300] * 20},
    "small exponents": {"v": [1.5e-5, -2.5e-100, 1.2345678901234567e-300] * 30},
    "deep nesting of small arrays": {"v": [[[[[0], [0]], [[]]]] * 40]},
    "many keys": {f"k{i}": i for i in range(200)},
    "many zeros": {"v": [0] * 500},
    "negative zeros": {"v": [-0.0] * 100},
    "exponents in strings": {"e-mail": "re-run 1e-300 x", "v": ["5e-324"] * 50, "t": TINY},
    "escaped quotes around an exponent": {'k"': '\\"', "v": [TINY, "\\", '"1e+300"']},
}


def stored_octets(conn: psycopg.Connection[Any], task_id: uuid.UUID, column: str) -> int:
    row = conn.execute(
        f"SELECT octet_length({column}::text) FROM pgqueue.tasks WHERE id = %s", [task_id]
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_one(conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int) -> uuid.UUID:
    return pgqueue.enqueue(conn, "t", payload, max_payload_bytes=limit).task.id


def enqueue_many_one(
    conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int
) -> uuid.UUID:
    spec = pgqueue.prepare("t", payload, max_payload_bytes=limit)
    return pgqueue.enqueue_many(conn, [spec])[0].task.id


def enqueue_plain_many(
    conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int
) -> uuid.UUID:
    """enqueue_many's fast path for plain items, which reads the limit from the environment."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(limit))
        return pgqueue.enqueue_many(conn, [{"type": "t", "payload": payload}])[0].task.id


def enqueue_by_copy(
    conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int
) -> uuid.UUID:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(limit))
        (task_id,) = pgqueue.enqueue_columns(conn, "t", [payload])
        return task_id


def enqueue_function_task(
    conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int
) -> uuid.UUID:
    """A function task's arguments are its payload."""
    tasks = TaskRegistry()

    @tasks.task(name="t")
    def t(**values: Any) -> None:
        return None

    with pytest.MonkeyPatch.context() as env:
        env.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(limit))
        return t.enqueue(conn, **payload).id


def enqueue_workflow_step(
    conn: psycopg.Connection[Any], payload: dict[str, Any], limit: int
) -> uuid.UUID:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(limit))
        handle = pgqueue.chain(pgqueue.step("t", payload)).enqueue(conn)
    (task,) = handle.tasks
    return task.id


PATHS: dict[str, Callable[[psycopg.Connection[Any], dict[str, Any], int], uuid.UUID]] = {
    "enqueue": enqueue_one,
    "enqueue_many (prepared)": enqueue_many_one,
    "enqueue_many (plain)": enqueue_plain_many,
    "enqueue_columns (COPY)": enqueue_by_copy,
    "function task": enqueue_function_task,
    "workflow step": enqueue_workflow_step,
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
@pytest.mark.parametrize("path", list(PATHS))
def test_an_accepted_payload_reads_back_within_the_limit_and_one_byte_less_refuses_it(
    conn: psycopg.Connection[Any], name: str, path: str
) -> None:
    payload = ADVERSARIAL[name]
    size = jsonb_size(payload)
    submit = PATHS[path]

    with pytest.raises(pgqueue.PayloadTooLarge) as info:
        submit(conn, payload, size - 1)
    assert (info.value.field, info.value.size, info.value.limit) == ("payload", size, size - 1)
    assert info.value.reason == (
        f"payload is {size} bytes as stored (the JSON text PostgreSQL gives back); "
        f"the limit is {size - 1} bytes"
    )

    task_id = submit(conn, payload, size)
    read_back = stored_octets(conn, task_id, "payload")
    assert read_back == size


def test_a_mebibyte_of_tiny_floats_is_refused_for_the_megabytes_it_would_read_back(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(config.ENV_MAX_PAYLOAD_BYTES, raising=False)
    compact = 1024 * 1024 // len("5e-324,") - 10
    payload = {"v": [TINY] * compact}
    assert len(json.dumps(payload, separators=(",", ":"))) < config.DEFAULT_MAX_PAYLOAD_BYTES

    with pytest.raises(pgqueue.PayloadTooLarge) as info:
        pgqueue.enqueue(conn, "t", payload)
    assert info.value.size == jsonb_size(payload) > 45 * config.DEFAULT_MAX_PAYLOAD_BYTES
    assert conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone() == (0,)


def test_payload_size_is_the_text_jsonb_gives_back_spaces_included(
    conn: psycopg.Connection[Any],
) -> None:
    payload = {"a": 1, "b": [1, 2], "c": {}}
    text = '{"a": 1, "b": [1, 2], "c": {}}'
    assert conn.execute("SELECT %s::jsonb::text", [json.dumps(payload)]).fetchone() == (text,)

    task_id = enqueue_one(conn, payload, len(text))
    assert stored_octets(conn, task_id, "payload") == len(text)
    with pytest.raises(pgqueue.PayloadTooLarge):
        enqueue_one(conn, payload, len(text) - 1)  # its compact JSON is 27 bytes: not the rule


# --- results --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_a_recorded_result_reads_back_within_the_limit_and_one_byte_more_is_refused(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result = ADVERSARIAL[name]
    size = jsonb_size(result)
    task_id = pgqueue.enqueue(conn, "t", {}).task.id
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")

    monkeypatch.setenv(config.ENV_MAX_RESULT_BYTES, str(size - 1))
    with pytest.raises(pgqueue.ResultTooLarge) as info:
        pgqueue.complete(conn, claimed.lease, result)
    assert (info.value.size, info.value.limit) == (size, size - 1)

    monkeypatch.setenv(config.ENV_MAX_RESULT_BYTES, str(size))
    pgqueue.complete(conn, claimed.lease, result)
    assert stored_octets(conn, task_id, "result") == size


# --- the CLI and the HTTP API: the library's rule, the same error ---------------------------


OVERSIZED = {"v": [TINY] * 20}  # 143 bytes of compact JSON, 6,701 as stored
CLI_LIMIT = 1024


def test_the_cli_refuses_a_payload_over_the_limit_as_stored_with_exit_2(
    database_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(CLI_LIMIT))
    text = json.dumps(OVERSIZED, separators=(",", ":"))
    assert len(text) < CLI_LIMIT < jsonb_size(OVERSIZED)

    result = run_main(database_url, "enqueue", f"--payload={text}", "--", "t")

    assert result.code == 2
    assert result.line == (
        f"error: payload: payload is {jsonb_size(OVERSIZED)} bytes as stored "
        f"(the JSON text PostgreSQL gives back); the limit is {CLI_LIMIT} bytes"
    )
    assert conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone() == (0,)


@pytest.fixture
def api(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv(config.ENV_MAX_PAYLOAD_BYTES, str(CLI_LIMIT))
    server = Api(ApiSettings(database_url=database_url))
    try:
        yield server
    finally:
        server.close()


def test_the_api_refuses_a_payload_over_the_limit_as_stored_with_413(
    api: Api, conn: psycopg.Connection[Any]
) -> None:
    response = api.request("POST", "/api/v1/tasks", json={"type": "t", "payload": OVERSIZED})

    assert response.status_code == 413
    body = response.json()
    assert body["error"] == "payload_too_large"
    assert [e["field"] for e in body["errors"]] == ["payload"]
    assert f"payload is {jsonb_size(OVERSIZED)} bytes as stored" in body["message"]
    assert conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone() == (0,)


# --- which numbers come back as they went in (docs/payloads.md) ------------------------------


def read_back(conn: psycopg.Connection[Any], payload: dict[str, Any]) -> dict[str, Any]:
    task_id = pgqueue.enqueue(conn, "t", payload).task.id
    return pgqueue.get_task(conn, task_id).payload


def test_integers_of_any_size_come_back_exactly(conn: psycopg.Connection[Any]) -> None:
    values = [0, -1, 2**53 + 1, -(10**40) - 7, int("9" * 4000)]
    back = read_back(conn, {"v": values})["v"]
    assert back == values and all(type(v) is int for v in back)


def test_floats_come_back_as_floats_of_the_same_value(conn: psycopg.Connection[Any]) -> None:
    values = [0.1, 1.5, -2.25, 3.0, 1e15, 9007199254740993.0, 1.5e-5, TINY, -1e-300, 1e-7]
    back = read_back(conn, {"v": values})["v"]
    assert back == values and all(type(v) is float for v in back)


def test_negative_zero_comes_back_as_zero(conn: psycopg.Connection[Any]) -> None:
    (back,) = read_back(conn, {"v": [-0.0]})["v"]
    assert (type(back), back, math.copysign(1, back)) == (float, 0.0, 1.0)


def test_an_integral_float_python_writes_with_an_exponent_comes_back_as_an_int(
    conn: psycopg.Connection[Any],
) -> None:
    values = [1e16, -1.5e17, 1e23, HUGE]
    assert [repr(v) for v in values] == ["1e+16", "-1.5e+17", "1e+23", "1.7976931348623157e+308"]
    back = read_back(conn, {"v": values, "below": 9999999999999998.0})
    # The int its repr spells, not the float's binary value (int(1e23) is 99999999999999991611392)
    assert back["v"] == [10**16, -15 * 10**16, 10**23, 17976931348623157 * 10**292]
    assert all(type(v) is int for v in back["v"])
    assert [float(v) for v in back["v"]] == values  # the same float again
    assert type(back["below"]) is float  # written "9999999999999998.0": no exponent, a float


def test_nan_and_infinity_are_refused(conn: psycopg.Connection[Any]) -> None:
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(pgqueue.InvalidPayload, match="Out of range float values"):
            pgqueue.enqueue(conn, "t", {"v": value})


def test_a_decimal_is_refused_and_other_clients_read_numbers_in_full(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(pgqueue.InvalidPayload, match="Decimal is not JSON serializable"):
        pgqueue.enqueue(conn, "t", {"v": Decimal("1.10")})

    payload = {"tiny": TINY, "big": 1e16, "half": 0.5, "zero": -0.0}
    task_id = pgqueue.enqueue(conn, "t", payload).task.id
    (text,) = conn.execute(
        "SELECT payload::text FROM pgqueue.tasks WHERE id = %s", [task_id]
    ).fetchone()  # what psql, or any client reading the column, is given
    assert json.loads(text, parse_float=Decimal) == {
        "tiny": Decimal("0." + "0" * 323 + "5"),
        "big": 10000000000000000,
        "half": Decimal("0.5"),
        "zero": Decimal("0.0"),
    }
    assert len(text) == len(jsonb_text(payload))
