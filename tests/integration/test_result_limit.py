"""A task's result is bounded like its payload: ``PGQUEUE_MAX_RESULT_BYTES``,
1 MiB by default, counted in bytes of compact UTF-8 JSON. A handler that returns more fails its
attempt and is dead-lettered at once (it would only return as much again), with an error that
names the task, the size and the limit, and nothing stored as its result; ``pgqueue.complete``
refuses such a result before writing anything. Real workers, real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from helpers import run_worker_until

import pgqueue
from pgqueue import config
from pgqueue.api import ApiSettings
from pgqueue.log import logger

ENV = "PGQUEUE_MAX_RESULT_BYTES"  # the documented name, spelled out
MIB = 1024 * 1024
BLOB_OVERHEAD = len('{"blob": ""}')  # the JSON around {"blob": "x" * n}


def blob(size: int) -> dict[str, str]:
    """A result of exactly ``size`` bytes as stored (the text jsonb gives back)."""
    value = {"blob": "x" * (size - BLOB_OVERHEAD)}
    assert len(json.dumps(value).encode()) == size
    return value


def sized_registry() -> pgqueue.TaskRegistry:
    """``sized`` returns a result of ``payload["size"]`` bytes; three attempts allowed, so a
    task dead after one shows that no retry was spent on it."""
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("sized", max_attempts=3)
    def sized(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return blob(payload["size"])

    @tasks.handler("sized_async", max_attempts=3)
    async def sized_async(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return blob(payload["size"])

    return tasks


def finished(conn: psycopg.Connection[Any], *ids: uuid.UUID) -> bool:
    return all(pgqueue.get_task(conn, i).status.value in ("completed", "failed") for i in ids)


def too_large_error(task_id: uuid.UUID, type: str, size: int, limit: int) -> str:
    return (
        f"ResultTooLarge: result of task {task_id} ({type}, attempt 1) is {size:,} bytes "
        "as stored (the JSON text PostgreSQL gives back), "
        f"over the {limit:,}-byte limit PGQUEUE_MAX_RESULT_BYTES"
    )


# --- the worker ----------------------------------------------------------------------------------


@pytest.fixture
def events() -> Iterator[list[logging.LogRecord]]:
    """The pgqueue logger's records, kept on the logger itself: a CLI run earlier in the same
    process (``log.configure``) stops it propagating to pytest's caplog."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, level = Keep(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_worker_stores_a_result_at_the_default_limit_and_dead_letters_one_byte_over(
    database_url, conn, events, monkeypatch
):
    monkeypatch.delenv(ENV, raising=False)
    ids = {
        (type, size): pgqueue.enqueue(conn, type, {"size": size}).task.id
        for type in ("sized", "sized_async")
        for size in (MIB, MIB + 1)
    }

    run_worker_until(database_url, sized_registry(), lambda: finished(conn, *ids.values()))

    for (type, size), task_id in ids.items():
        task = pgqueue.get_task(conn, task_id)
        if size == MIB:  # at the limit: stored whole
            assert task.status is pgqueue.TaskStatus.COMPLETED, (type, task.last_error)
            assert task.result == blob(MIB)
            continue
        # One byte over: dead after its first attempt, though two were left; no result.
        assert task.status is pgqueue.TaskStatus.FAILED, type
        assert (task.attempts, task.max_attempts) == (1, 3)
        assert task.result is None
        assert task.last_error == too_large_error(task_id, type, MIB + 1, MIB)
        dead = conn.execute("SELECT 1 FROM pgqueue.dead_letters WHERE id = %s", (task_id,))
        assert dead.fetchone() is not None

    # The worker logged it as the task's death, naming task, type, attempt and the limit.
    for type in ("sized", "sized_async"):
        task_id = ids[(type, MIB + 1)]
        (record,) = [
            r
            for r in events
            if getattr(r, "pgqueue_event", None) == "task.dead"
            and r.pgqueue_fields["task_id"] == task_id  # type: ignore[attr-defined]
        ]
        fields = record.pgqueue_fields  # type: ignore[attr-defined]
        assert (fields["type"], fields["attempt"]) == (type, 1)
        assert fields["error"] == too_large_error(task_id, type, MIB + 1, MIB)
    events = {getattr(r, "pgqueue_event", None) for r in events}
    assert "worker.internal_error" not in events


def test_the_limit_comes_from_the_environment_and_counts_utf8_bytes(
    database_url, conn, monkeypatch
):
    monkeypatch.setenv(ENV, "100")
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("accents", max_attempts=3)
    def accents(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return {"s": "x" + "é" * payload["n"]}  # 2 bytes each, 10 bytes around them

    fits = pgqueue.enqueue(conn, "accents", {"n": 45}).task.id  # 10 + 90 = 100 bytes as stored
    over = pgqueue.enqueue(conn, "accents", {"n": 46}).task.id  # 102 bytes, 56 characters

    run_worker_until(database_url, tasks, lambda: finished(conn, fits, over))

    assert pgqueue.get_task(conn, fits).result == {"s": "x" + "é" * 45}
    task = pgqueue.get_task(conn, over)
    assert (task.status, task.attempts, task.result) == (pgqueue.TaskStatus.FAILED, 1, None)
    assert task.last_error == too_large_error(over, "accents", 102, 100)


def test_an_oversized_result_rolls_back_the_handlers_own_transaction(
    database_url, conn, monkeypatch
):
    """A handler writing through ctx.connection commits with its completion: a result too
    large to complete with must take the handler's writes back with it."""
    monkeypatch.setenv(ENV, "64")
    conn.execute("CREATE TABLE side_effects (task_id uuid, size int)")
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("writes", max_attempts=3)
    def writes(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        ctx.connection.execute(
            "INSERT INTO side_effects VALUES (%s, %s)", (ctx.task_id, payload["size"])
        )
        return blob(payload["size"])

    @tasks.handler("writes_async", max_attempts=3)
    async def writes_async(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        aconn = await ctx.aconnection()
        await aconn.execute(
            "INSERT INTO side_effects VALUES (%s, %s)", (ctx.task_id, payload["size"])
        )
        return blob(payload["size"])

    ids = {
        (type, size): pgqueue.enqueue(conn, type, {"size": size}).task.id
        for type in ("writes", "writes_async")
        for size in (64, 65)
    }

    run_worker_until(database_url, tasks, lambda: finished(conn, *ids.values()))

    written = {r[0] for r in conn.execute("SELECT task_id FROM side_effects").fetchall()}
    assert written == {ids[("writes", 64)], ids[("writes_async", 64)]}
    for (type, size), task_id in ids.items():
        task = pgqueue.get_task(conn, task_id)
        if size == 64:
            assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, blob(64))
        else:
            assert (task.status, task.attempts, task.result) == (
                pgqueue.TaskStatus.FAILED,
                1,
                None,
            )
            assert task.last_error == too_large_error(task_id, type, 65, 64)


def test_a_result_that_cannot_be_stored_at_all_dead_letters_naming_why(database_url, conn):
    """Not JSON, or a NUL that jsonb refuses: the same rule, the same at-once dead letter; a
    NUL result no longer fails the batched completion statement of the tasks beside it."""
    tasks = pgqueue.TaskRegistry()

    @tasks.handler("returns", max_attempts=3)
    def returns(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> Any:
        return {"set": {1, 2}, "nul": "a\x00b", "ok": "fine"}[payload["kind"]]

    ids = {k: pgqueue.enqueue(conn, "returns", {"kind": k}).task.id for k in ("set", "nul")}
    ok = [pgqueue.enqueue(conn, "returns", {"kind": "ok"}).task.id for _ in range(5)]

    run_worker_until(database_url, tasks, lambda: finished(conn, *ids.values(), *ok))

    assert all(pgqueue.get_task(conn, i).result == "fine" for i in ok)
    expected = {
        "set": "is not JSON-serialisable: Object of type set is not JSON serializable",
        "nul": "contains a NUL (\\u0000) character, which PostgreSQL cannot store",
    }
    for kind, task_id in ids.items():
        task = pgqueue.get_task(conn, task_id)
        assert (task.status, task.attempts, task.result) == (pgqueue.TaskStatus.FAILED, 1, None)
        assert task.last_error == (
            f"InvalidResult: result of task {task_id} (returns, attempt 1) {expected[kind]}"
        )


def test_the_error_is_shown_by_status_the_api_and_the_dashboards_failures(
    database_url, conn, monkeypatch
):
    monkeypatch.setenv(ENV, "64")
    task_id = pgqueue.enqueue(conn, "sized", {"size": 65}).task.id
    run_worker_until(database_url, sized_registry(), lambda: finished(conn, task_id))
    error = too_large_error(task_id, "sized", 65, 64)

    shown = run_main(database_url, "status", str(task_id))
    assert shown.code == 0, shown
    assert error in shown.stdout

    api = Api(ApiSettings(database_url=database_url))
    try:
        body = api.request("GET", f"/api/v1/tasks/{task_id}").json()
        assert (body["status"], body["result"], body["last_error"]) == ("failed", None, error)
        failures = api.request("GET", "/api/v1/failures").json()
        (dead,) = failures["dead"]
        assert (dead["task_id"], dead["last_error_summary"]) == (str(task_id), error)
    finally:
        api.close()


# --- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["lots", "0", "-5", "1.5", "1MiB"])
def test_a_bad_limit_is_refused_naming_the_variable(database_url, conn, monkeypatch, raw):
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(pgqueue.ConfigurationError, match=ENV):
        config.max_result_bytes()
    # The worker refuses to be built: it must not start and fail at its first result.
    with pytest.raises(pgqueue.ConfigurationError, match=ENV):
        pgqueue.Worker(sized_registry(), database_url)
    # The library's completion refuses too, before writing anything.
    task_id = pgqueue.enqueue(conn, "sized", {}).task.id
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    with pytest.raises(pgqueue.ConfigurationError, match=ENV):
        pgqueue.complete(conn, claimed.lease, {"ok": True})
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING


@pytest.mark.timeout(60)  # without the check, a supervisor would restart its children forever
@pytest.mark.parametrize("processes", ["1", "2"])
def test_pgqueue_worker_refuses_a_bad_limit_before_connecting(monkeypatch, processes):
    monkeypatch.setenv(ENV, "lots")
    # The URL points nowhere: the refusal must come before any connection is tried.
    result = run_main(
        "postgresql://u@127.0.0.1:1/x",
        "worker",
        "pgqueue.demo:tasks",
        "--processes",
        processes,
        "--startup-timeout",
        "0",
    )
    assert result.code == 1, result
    assert result.line == "error: PGQUEUE_MAX_RESULT_BYTES must be an integer, not 'lots'"
    assert result.stdout == ""


def test_an_unset_or_blank_limit_is_one_mib(monkeypatch):
    for raw in (None, "", "  "):
        if raw is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, raw)
        assert config.max_result_bytes() == MIB
    monkeypatch.setenv(ENV, " 4096 ")
    assert config.max_result_bytes() == 4096


# --- the library ---------------------------------------------------------------------------------


def claim_one(conn: psycopg.Connection[Any]) -> pgqueue.ClaimedTask:
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    return claimed


def test_complete_refuses_an_oversized_result_and_writes_nothing(conn, monkeypatch):
    monkeypatch.setenv(ENV, "64")
    task_id = pgqueue.enqueue(conn, "t", {}).task.id
    claimed = claim_one(conn)

    with pytest.raises(pgqueue.ResultTooLarge) as info:
        pgqueue.complete(conn, claimed.lease, blob(65))
    exc = info.value
    assert isinstance(exc, pgqueue.InvalidResult) and isinstance(exc, pgqueue.ValidationError)
    assert (exc.field, exc.task_id, exc.size, exc.limit) == ("result", task_id, 65, 64)
    assert exc.reason == (
        f"result of task {task_id} is 65 bytes as stored (the JSON text PostgreSQL gives back), "
        "over the 64-byte limit PGQUEUE_MAX_RESULT_BYTES"
    )
    task = pgqueue.get_task(conn, task_id)
    assert (task.status, task.result) == (pgqueue.TaskStatus.RUNNING, None)

    # The lease is still the caller's: a result at the limit completes.
    pgqueue.complete(conn, claimed.lease, blob(64))
    assert pgqueue.get_task(conn, task_id).result == blob(64)


def test_complete_many_refuses_the_whole_batch_when_one_result_is_too_large(conn, monkeypatch):
    monkeypatch.setenv(ENV, "64")
    for _ in range(3):
        pgqueue.enqueue(conn, "t", {})
    claimed = pgqueue.claim(conn, ["default"], limit=3, worker_id="test")
    items = [(c.lease, blob(64)) for c in claimed[:2]] + [(claimed[2].lease, blob(65))]

    with pytest.raises(pgqueue.ResultTooLarge) as info:
        pgqueue.complete_many(conn, items)
    assert info.value.task_id == claimed[2].id
    assert {pgqueue.get_task(conn, c.id).status for c in claimed} == {pgqueue.TaskStatus.RUNNING}


def test_complete_refuses_a_result_that_is_not_json_with_a_specific_error(conn):
    task_id = pgqueue.enqueue(conn, "t", {}).task.id
    claimed = claim_one(conn)
    with pytest.raises(pgqueue.InvalidResult, match="is not JSON-serialisable") as info:
        pgqueue.complete(conn, claimed.lease, {"when": {1, 2}})
    assert info.value.task_id == task_id
    with pytest.raises(pgqueue.InvalidResult, match="NUL"):
        pgqueue.complete(conn, claimed.lease, {"s": "a\x00b"})
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING


def test_the_async_complete_applies_the_same_limit(database_url, monkeypatch):
    monkeypatch.setenv(ENV, "64")

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            await pgqueue.aio.enqueue(aconn, "t", {})
            (claimed,) = await pgqueue.aio.claim(aconn, ["default"], limit=1, worker_id="test")
            with pytest.raises(pgqueue.ResultTooLarge):
                await pgqueue.aio.complete(aconn, claimed.lease, blob(65))
            await pgqueue.aio.complete(aconn, claimed.lease, blob(64))

    asyncio.run(scenario())


# --- the encoder ---------------------------------------------------------------------------------


def test_the_encoder_names_the_issue_s_five_mib_result_and_the_default_limit(monkeypatch):
    from pgqueue.result_encoding import encode_result

    monkeypatch.delenv(ENV, raising=False)
    task_id = uuid.uuid4()
    with pytest.raises(pgqueue.ResultTooLarge) as info:
        encode_result(blob(5 * MIB), task_id, subject=f"task {task_id} (report, attempt 2)")
    assert info.value.reason == (
        f"result of task {task_id} (report, attempt 2) is 5,242,880 bytes as stored "
        "(the JSON text PostgreSQL gives back), "
        "over the 1,048,576-byte limit PGQUEUE_MAX_RESULT_BYTES"
    )
    assert encode_result(None, task_id, limit=1) is None  # no result: nothing to bound
    assert encode_result([1, 2], task_id, limit=6) == "[1, 2]"  # as jsonb prints it
