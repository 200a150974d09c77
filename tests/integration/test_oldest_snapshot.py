"""pgqueue.oldest_snapshot names what holds back the cleanup of finished tasks: a session
idle in a transaction, a REPEATABLE READ reader (the operator must see it coming).
Prepared transactions are read too, but neither test server allows any
(max_prepared_transactions = 0), so no test here can hold one."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgqueue
import pgqueue.aio


def test_nothing_holds_cleanup_back_in_a_quiet_database(conn: psycopg.Connection[Any]) -> None:
    assert pgqueue.oldest_snapshot(conn) is None


def test_a_session_idle_in_a_transaction_with_an_xid_is_named(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    idle = connect(autocommit=False)
    idle.execute("SET application_name = 'nightly-report'")
    pid = idle.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    idle.execute("SELECT txid_current()")
    time.sleep(0.05)  # the transaction's age is what is measured: let it have one
    pgqueue.enqueue(conn, "job", {})  # newer transactions than the holder's
    held = pgqueue.oldest_snapshot(conn)
    assert held is not None
    assert (held.kind, held.pid, held.state) == ("session", pid, "idle in transaction")
    assert "nightly-report" in held.holder
    assert held.seconds is not None and held.seconds >= 0.05
    assert held.xid_age >= 1
    idle.rollback()
    assert pgqueue.oldest_snapshot(conn) is None


def test_a_repeatable_read_reader_counts_and_async_agrees(
    database_url: str, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    reader = connect(autocommit=False)
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT count(*) FROM pgqueue.tasks")  # takes the snapshot, no xid
    pid = reader.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

    async def look() -> pgqueue.OldestSnapshot | None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            return await pgqueue.aio.oldest_snapshot(c)

    held = asyncio.run(look())
    assert held is not None and held.pid == pid and held.kind == "session"


def test_stats_names_the_holder_and_warns_past_the_threshold(
    database_url: str,
    connect: Callable[..., psycopg.Connection[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from pgqueue.cli import app

    idle = connect(autocommit=False)
    idle.execute("SET application_name = 'left-open'")
    idle.execute("SELECT txid_current()")
    time.sleep(1.1)  # stats leaves out the sub-second transactions of a busy fleet
    runner = CliRunner()
    args = ["--database-url", database_url, "stats"]

    monkeypatch.setenv("PGQUEUE_SNAPSHOT_WARN_SECONDS", "3600")
    calm = runner.invoke(app, args)
    assert calm.exit_code == 0, calm.output
    # 1 s or more: a busy machine may take seconds between the sleep and the stats
    assert re.search(r"oldest snapshot holding back cleanup: \d+s,", calm.output), calm.output
    assert "left-open" in calm.output and "WARNING" not in calm.output

    monkeypatch.setenv("PGQUEUE_SNAPSHOT_WARN_SECONDS", "1")
    warned = runner.invoke(app, args)
    assert "WARNING: over 1s: vacuum cannot clean pgqueue.tasks" in warned.output
    data = json.loads(runner.invoke(app, ["--json", *args]).output)
    assert data["oldest_snapshot"]["kind"] == "session"
    assert data["oldest_snapshot"]["state"] == "idle in transaction"
    assert data["oldest_snapshot_warning"] is True

    idle.rollback()
    quiet = json.loads(runner.invoke(app, ["--json", *args]).output)
    assert quiet["oldest_snapshot"] is None and quiet["oldest_snapshot_warning"] is False


def test_the_api_stats_metrics_and_threshold_show_the_holder(
    database_url: str,
    connect: Callable[..., psycopg.Connection[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi.testclient import TestClient

    from pgqueue.api import ApiSettings, create_app

    monkeypatch.setenv("PGQUEUE_SNAPSHOT_WARN_SECONDS", "1")
    with TestClient(
        create_app(ApiSettings(database_url=database_url)),
        base_url="http://localhost",
        client=("127.0.0.1", 50000),
    ) as client:
        quiet = client.get("/api/v1/stats").json()
        assert quiet["oldest_snapshot"] is None and quiet["oldest_snapshot_warning"] is False

        idle = connect(autocommit=False)
        idle.execute("SELECT txid_current()")
        time.sleep(1.1)
        body = client.get("/api/v1/stats").json()
        metrics = client.get("/metrics").text

    assert body["oldest_snapshot"]["state"] == "idle in transaction"
    assert body["oldest_snapshot_warning"] is True
    assert body["oldest_snapshot_warn_seconds"] == 1.0
    gauges = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("pgqueue_oldest_snapshot")
    }
    assert gauges["pgqueue_oldest_snapshot_seconds"] >= 1.0
    assert gauges["pgqueue_oldest_snapshot_xid_age"] >= 1
    assert gauges["pgqueue_oldest_snapshot_warn_seconds"] == 1.0
