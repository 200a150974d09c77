"""Task lists without payloads: ``GET /api/v1/tasks?fields=summary`` and
``GET /api/v1/dead-letters?fields=summary`` answer every field of a task but its payload and
result, which the server does not read (task_list_summary), with the sizes those take as
stored. A payload or a result may be a MiB each, and a list that shows neither (the
dashboard's, refreshed every few seconds) should not cost that. The whole form stays the
default.

Real PostgreSQL and the real application (``boundaries.Api``). That the payloads stay in the
database is measured where it happens: the TOAST blocks of pgqueue.tasks read while the named
statement runs (``pg_statio_user_tables``), since EXPLAIN ANALYZE never fetches the values it
would return and so cannot tell the two forms apart.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from boundaries import Api
from helpers import make_dead_letters

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.operations import list_args
from pgqueue.queries import driver, tasks

MIB = 1024 * 1024
BLOB_OVERHEAD = len('{"blob": ""}')  # the JSON around {"blob": text}, as jsonb prints it
SIZES = {"payload_stored_bytes", "result_stored_bytes"}
ERROR = 'ValueError: boom\nTraceback (most recent call last):\n  File "job.py", line 1, in run\n'


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    server = Api(ApiSettings(database_url=database_url))
    yield server
    server.close()


def get(api: Api, path: str) -> Any:
    response = api.request("GET", path)
    assert response.status_code == 200, response.text
    return response.json()


def blob(size: int) -> dict[str, str]:
    """A payload of ``size`` bytes of JSON text as stored, random hex so that PostgreSQL's
    compression cannot shrink it: it is kept out of line, in TOAST, at its full size."""
    text = os.urandom((size - BLOB_OVERHEAD) // 2).hex()
    value = {"blob": text}
    assert len(json.dumps(value)) == size
    return value


def stored_sizes(conn: psycopg.Connection[Any]) -> dict[uuid.UUID, tuple[int, int | None]]:
    rows = conn.execute(
        "SELECT id, pg_column_size(payload), pg_column_size(result) FROM pgqueue.tasks"
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def complete_one(conn: psycopg.Connection[Any], queue: str, result: Any) -> uuid.UUID:
    with conn.transaction():
        (claimed,) = pgqueue.claim(conn, [queue], limit=1, worker_id="test")
        pgqueue.complete(conn, claimed.lease, result)
    return claimed.id


# --- the answer's shape --------------------------------------------------------------------


def test_a_summary_list_has_every_field_of_the_whole_list_but_payload_and_result(
    conn: psycopg.Connection[Any], api: Api
) -> None:
    (dead,) = make_dead_letters(conn, 1, error=ERROR)
    pgqueue.enqueue(conn, "job", {"n": 1}, queue="done")
    done = complete_one(conn, "done", {"ok": [1, 2, 3]})
    queued = pgqueue.enqueue(conn, "job", {"n": 2, "text": "x" * 5000}).id

    whole = get(api, "/api/v1/tasks?limit=10")["items"]
    summary = get(api, "/api/v1/tasks?limit=10&fields=summary")["items"]

    assert [t["task_id"] for t in summary] == [t["task_id"] for t in whole]
    sizes = stored_sizes(conn)
    for full, short in zip(whole, summary, strict=True):
        assert set(short) == (set(full) - {"payload", "result"}) | SIZES
        assert {k: v for k, v in short.items() if k not in SIZES} == {
            k: v for k, v in full.items() if k not in ("payload", "result")
        }
        payload_bytes, result_bytes = sizes[uuid.UUID(short["task_id"])]
        assert short["payload_stored_bytes"] == payload_bytes > 0
        assert short["result_stored_bytes"] == result_bytes
    by_id = {uuid.UUID(t["task_id"]): t for t in summary}
    assert by_id[done]["result_stored_bytes"] > 0
    assert by_id[queued]["result_stored_bytes"] is None
    assert by_id[dead]["last_error"] == ERROR
    assert by_id[dead]["last_error_summary"] == "ValueError: boom"
    assert by_id[dead]["last_error_traceback"].startswith("Traceback (most recent call last):")


def test_the_whole_form_is_the_default_and_unchanged(
    conn: psycopg.Connection[Any], api: Api
) -> None:
    make_dead_letters(conn, 2)
    pgqueue.enqueue(conn, "job", {"n": 1})
    for path in ("/api/v1/tasks?limit=5", "/api/v1/dead-letters?limit=5"):
        default = get(api, path)
        assert get(api, path + "&fields=full") == default
        assert all("payload" in t and "result" in t for t in default["items"])
        assert not any(SIZES & set(t) for t in default["items"])


def test_a_summary_of_the_dead_letters_lists_only_dead_letters_with_their_errors(
    conn: psycopg.Connection[Any], api: Api
) -> None:
    dead = make_dead_letters(conn, 3, error="KeyError: 'user'")
    pgqueue.enqueue(conn, "job", {"n": 1})
    body = get(api, "/api/v1/dead-letters?fields=summary")
    assert {uuid.UUID(t["task_id"]) for t in body["items"]} == set(dead)
    for item in body["items"]:
        assert item["status"] == "failed"
        assert item["last_error_summary"] == "KeyError: 'user'"
        assert "payload" not in item and "result" not in item


@pytest.mark.parametrize("path", ["/api/v1/tasks", "/api/v1/dead-letters"])
def test_an_unknown_fields_value_is_refused_naming_the_values_allowed(api: Api, path: str) -> None:
    response = api.request("GET", path + "?fields=payloadless")
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid_request"
    assert [e["field"] for e in body["errors"]] == ["fields"]
    assert "'full'" in body["message"] and "'summary'" in body["message"], body["message"]


# --- pages and filters ---------------------------------------------------------------------


def pages(api: Api, path: str) -> list[list[str]]:
    """Every page of a list, following next_cursor; the ids of each. A summary's pages carry
    no payload or result."""
    out: list[list[str]] = []
    url = path
    while True:
        body = get(api, url)
        out.append([t["task_id"] for t in body["items"]])
        if "fields=summary" in path:
            assert not any({"payload", "result"} & set(t) for t in body["items"]), url
        if body["next_cursor"] is None:
            return out
        url = f"{path}&cursor={body['next_cursor']}"


def test_summary_pages_follow_the_cursor_as_whole_pages_do(
    conn: psycopg.Connection[Any], api: Api
) -> None:
    ids = [pgqueue.enqueue(conn, "job", {"n": i}, queue="waiting").id for i in range(8)]
    whole = pages(api, "/api/v1/tasks?limit=3")
    summary = pages(api, "/api/v1/tasks?limit=3&fields=summary")
    assert summary == whole
    assert [len(p) for p in summary] == [3, 3, 2]
    assert sorted(i for p in summary for i in p) == sorted(str(i) for i in ids)

    make_dead_letters(conn, 5)
    assert pages(api, "/api/v1/dead-letters?limit=2&fields=summary") == pages(
        api, "/api/v1/dead-letters?limit=2"
    )


def test_summary_lists_filter_by_status_type_and_queue(
    conn: psycopg.Connection[Any], api: Api
) -> None:
    make_dead_letters(conn, 2, type="boom", queue="emails")
    make_dead_letters(conn, 1, type="boom", queue="reports")
    pgqueue.enqueue(conn, "mail", {}, queue="emails")
    pgqueue.enqueue(conn, "report", {}, queue="reports")
    pgqueue.enqueue(conn, "report", {}, queue="emails")
    for query in (
        "status=queued",
        "status=failed",
        "type=report",
        "queue=emails",
        "type=report&queue=emails",
        "status=failed&queue=reports",
    ):
        summary = get(api, f"/api/v1/tasks?{query}&fields=summary")["items"]
        whole = get(api, f"/api/v1/tasks?{query}")["items"]
        assert summary, query
        assert all(set(t) >= SIZES and "payload" not in t for t in summary), query
        assert [t["task_id"] for t in summary] == [t["task_id"] for t in whole], query
    for query in ("queue=emails", "type=boom&queue=reports"):
        summary = get(api, f"/api/v1/dead-letters?{query}&fields=summary")["items"]
        whole = get(api, f"/api/v1/dead-letters?{query}")["items"]
        assert summary and [t["task_id"] for t in summary] == [t["task_id"] for t in whole]
        assert all(set(t) >= SIZES and "payload" not in t for t in summary), query


# --- what a page reads ---------------------------------------------------------------------

LARGE = 50  # tasks with a payload of about a MiB each


def toast_blocks(conn: psycopg.Connection[Any]) -> int:
    """Blocks of pgqueue.tasks' TOAST table read or found in the buffer cache, by every
    session, as the server's statistics have them now."""
    conn.execute("SELECT pg_stat_clear_snapshot()")  # a fresh read, not this session's cache
    row = conn.execute(
        "SELECT coalesce(toast_blks_read, 0) + coalesce(toast_blks_hit, 0)"
        "  FROM pg_statio_user_tables WHERE schemaname = 'pgqueue' AND relname = 'tasks'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def toast_blocks_of(conn: psycopg.Connection[Any], run: Callable[[], Any]) -> int:
    """The TOAST blocks ``run`` reads on ``conn`` (autocommit): its statistics are sent when
    it is idle again, at once since pg_stat_force_next_flush asks so."""
    before = toast_blocks(conn)
    run()
    conn.execute("SELECT pg_stat_force_next_flush()")
    return toast_blocks(conn) - before


@pytest.fixture
def large(connect: Callable[..., psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """An autocommit connection to a database holding LARGE tasks with a payload just under
    PGQUEUE_MAX_PAYLOAD_BYTES (1 MiB) each. Nothing else reads the table meanwhile:
    autovacuum is off for it, so that the TOAST statistics are the test's alone."""
    conn = connect(autocommit=True)
    conn.execute(
        "ALTER TABLE pgqueue.tasks SET (autovacuum_enabled = off, toast.autovacuum_enabled = off)"
    )
    pgqueue.enqueue_many(conn, [{"type": "bulky", "payload": blob(MIB - 64)} for _ in range(LARGE)])
    return conn


def test_the_summary_statement_reads_no_payload_where_the_whole_list_reads_them_all(
    large: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    args = list_args(None, None, None, LARGE, None)
    summary: list[Any] = []
    whole: list[Any] = []
    summary_blocks = toast_blocks_of(
        large, lambda: summary.extend(driver.run(large, tasks.task_list_summary(**args)))
    )
    whole_blocks = toast_blocks_of(
        large, lambda: whole.extend(driver.run(large, tasks.task_list(**args)))
    )
    assert [t.id for t in summary] == [t.id for t in whole] and len(summary) == LARGE
    # A MiB is 128 blocks of 8 KiB: the whole list fetches every payload, the summary none.
    assert whole_blocks >= LARGE * 100, whole_blocks
    assert summary_blocks == 0, summary_blocks
    assert all(t.payload_stored_bytes > MIB - 100 for t in summary)
    with capsys.disabled():
        print(
            f"\n[list summary] {LARGE} tasks of ~1 MiB: TOAST blocks read by the whole list "
            f"{whole_blocks:,}, by the summary {summary_blocks:,}"
        )


def test_a_summary_page_of_large_tasks_is_small_and_quick(
    large: psycopg.Connection[Any], database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = Api(ApiSettings(database_url=database_url))
    try:
        started = time.monotonic()
        summary = server.request("GET", f"/api/v1/tasks?limit={LARGE}&fields=summary")
        summary_seconds = time.monotonic() - started
        started = time.monotonic()
        whole = server.request("GET", f"/api/v1/tasks?limit={LARGE}")
        whole_seconds = time.monotonic() - started
    finally:
        server.close()
    assert summary.status_code == whole.status_code == 200
    assert len(summary.json()["items"]) == LARGE
    assert len(summary.content) < 100_000, len(summary.content)
    assert len(whole.content) > LARGE * (MIB - 100)
    with capsys.disabled():
        print(
            f"\n[list summary] GET /api/v1/tasks?limit={LARGE}: whole {len(whole.content):,} "
            f"bytes in {whole_seconds:.2f} s, summary {len(summary.content):,} bytes in "
            f"{summary_seconds:.2f} s"
        )


# --- the plans -----------------------------------------------------------------------------


def scans(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The plan's nodes that read pgqueue.tasks: how, and through which index."""
    out = []
    if plan.get("Relation Name") == "tasks":
        out.append((str(plan["Node Type"]), plan.get("Index Name")))
    for child in plan.get("Plans", []):
        out.extend(scans(child))
    return out


def explain(conn: psycopg.Connection[Any], query: driver.Query, *, generic: bool) -> Any:
    """The plan of the statement as the driver sends it: a custom plan for these values, or
    the generic plan a long-lived connection may settle on once psycopg has prepared it."""
    sql = driver.statements()[query.name]
    if not generic:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", query.params).fetchone()
        assert row is not None
        return row[0][0]["Plan"]
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, sql).replace("%%", "%")
    conn.execute(f"PREPARE list_probe AS {text}")
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        cur = psycopg.ClientCursor(conn)
        args = ", ".join(["%s"] * len(names))
        cur.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE list_probe({args})", [query.params[n] for n in names]
        )
        row = cur.fetchone()
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE list_probe")
    assert row is not None
    return row[0][0]["Plan"]


def test_the_summary_list_reads_the_same_indexes_as_the_whole_list(
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    conn = connect(autocommit=True)
    conn.execute(
        """
        INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, created_at,
                                   finished_at, last_error)
        SELECT (ARRAY['default', 'email', 'reports'])[1 + i % 3], 'job' || i % 7, '{"n": 1}',
               (ARRAY['queued', 'completed', 'completed', 'completed', 'failed',
                      'cancelled'])[1 + i % 6],
               1, now() - i * interval '1 second',
               CASE WHEN i % 6 <> 0 THEN now() END,
               CASE WHEN i % 6 = 4 THEN 'ValueError: boom' END
          FROM generate_series(1, 30000) AS i
        """
    )
    conn.execute("ANALYZE pgqueue.tasks")
    middle = conn.execute(
        "SELECT created_at, id FROM pgqueue.tasks WHERE status = 'failed'"
        " ORDER BY created_at DESC, id DESC OFFSET 1000 LIMIT 1"
    ).fetchone()
    assert middle is not None
    cursor: tuple[datetime, uuid.UUID] = (middle[0], middle[1])
    cases: list[tuple[str | None, str | None, str | None, tuple[datetime, uuid.UUID] | None]] = [
        (None, None, None, None),
        (None, None, None, cursor),
        ("failed", None, None, None),
        ("failed", None, "email", cursor),
        ("queued", "job3", None, None),
        (None, None, "reports", None),
    ]
    for status, type, queue, before in cases:
        args = list_args(status, type, queue, 100, before)
        whole = next(tasks.task_list(**args))
        summary = next(tasks.task_list_summary(**args))
        assert isinstance(whole, driver.Query) and isinstance(summary, driver.Query)
        for generic in (False, True):
            whole_scans = scans(explain(conn, whole, generic=generic))
            label = f"{status=} {type=} {queue=} cursor={before is not None} {generic=}"
            assert whole_scans, label
            assert scans(explain(conn, summary, generic=generic)) == whole_scans, label
