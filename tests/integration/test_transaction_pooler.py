"""pgqueue behind a transaction-mode pooler: a real PgBouncer (the ``pooled_database_url``
fixture, tests/pgbouncer.py) in front of real PostgreSQL.

Through such a pooler, each transaction of a client may run on another server connection:
a server-side prepared statement (psycopg prepares a statement it has run five times on a
connection) is then missing on one server connection and already there on another, and a
LISTEN hears nothing. In the pooler mode (``PGQUEUE_POOLER=transaction``, ``pooler=``) pgqueue
prepares nothing, listens only on ``PGQUEUE_LISTEN_URL`` (a direct URL) and otherwise polls.

Tasks are finished here by hand, on a direct connection (claim, complete), as a worker would:
the worker's side of the pooler is tested with the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from processes import wait_until
from test_api import Live, halt, launch
from typer.testing import CliRunner

import pgqueue
from pgqueue import db
from pgqueue.api import ApiSettings
from pgqueue.cli import app
from pgqueue.errors import ConfigurationError, UnsupportedConnection
from pgqueue.models import TaskStatus

# A wait behind the pooler polls; this is how late after the task's end it may return.
WAIT_LATENCY = 1.0


@pytest.fixture
def transaction_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """PGQUEUE_POOLER=transaction, and no LISTEN URL or NOTIFY switch from outside the test."""
    monkeypatch.setenv("PGQUEUE_POOLER", "transaction")
    monkeypatch.delenv("PGQUEUE_LISTEN_URL", raising=False)
    monkeypatch.delenv("PGQUEUE_NOTIFY", raising=False)


@pytest.fixture
def direct(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A direct connection (no pooler), for what a worker would do and for looking."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def finish(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> float:
    """Run the task to completion as a worker would (claim, complete) on ``conn``; the time it
    committed (time.monotonic)."""
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="test")
    assert claimed.id == task_id
    pgqueue.complete(conn, claimed.lease, {"done": str(task_id)})
    return time.monotonic()


def finish_later(conn: psycopg.Connection[Any], task_id: uuid.UUID, after: float) -> list[float]:
    """``finish`` in a thread after ``after`` seconds; the list gets its commit time."""
    done: list[float] = []

    def run() -> None:
        time.sleep(after)
        done.append(finish(conn, task_id))

    threading.Thread(target=run, daemon=True).start()
    return done


def enqueue_from_many_connections(connect: Callable[[], Any], per_connection: int) -> list[Any]:
    """Five connections, each enqueueing ``per_connection`` tasks at once with the others."""

    def producer(n: int) -> list[uuid.UUID]:
        with connect() as conn:
            return [
                pgqueue.enqueue(conn, "pooled", {"n": n, "i": i}).task.id
                for i in range(per_connection)
            ]

    with ThreadPoolExecutor(5) as pool:
        return [i for ids in pool.map(producer, range(5)) for i in ids]


def count(conn: psycopg.Connection[Any], sql: str = "SELECT count(*) FROM pgqueue.tasks") -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


# --- a caller's own connections ----------------------------------------------------------------


def test_enqueues_on_callers_connections_with_psycopgs_default_threshold_succeed_in_pooler_mode(
    pooled_database_url: str, direct: psycopg.Connection[Any], transaction_mode: None
) -> None:
    # The caller's connections prepare after five executions (psycopg's default); pgqueue's
    # statements on them must not.
    ids = enqueue_from_many_connections(
        lambda: psycopg.connect(pooled_database_url, autocommit=True), per_connection=10
    )
    assert len(set(ids)) == 50
    assert count(direct) == 50


def test_enqueues_on_connections_opened_by_pgqueue_connect_with_pooler_succeed(
    pooled_database_url: str, direct: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQUEUE_POOLER", raising=False)
    ids = enqueue_from_many_connections(
        lambda: db.connect(pooled_database_url, autocommit=True, pooler="transaction"),
        per_connection=10,
    )
    assert len(set(ids)) == 50
    assert count(direct) == 50


def test_enqueues_on_callers_connections_that_never_prepare_succeed(
    pooled_database_url: str, direct: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a caller's connection set up for a pooler looks like: no pooler mode needed.
    monkeypatch.delenv("PGQUEUE_POOLER", raising=False)
    ids = enqueue_from_many_connections(
        lambda: psycopg.connect(pooled_database_url, autocommit=True, prepare_threshold=None),
        per_connection=10,
    )
    assert len(set(ids)) == 50


def on_five_connections(url: str, work: Callable[[psycopg.Connection[Any], int], Any]) -> list[Any]:
    """``work(conn, n)`` on five connections at once (psycopg's default threshold, not in
    autocommit): concurrent clients are what makes the pooler mix server connections."""

    def one(n: int) -> Any:
        with psycopg.connect(url) as conn:
            return work(conn, n)

    with ThreadPoolExecutor(5) as pool:
        return list(pool.map(one, range(5)))


def test_enqueue_joins_the_callers_transaction_through_the_pooler(
    pooled_database_url: str, direct: psycopg.Connection[Any], transaction_mode: None
) -> None:
    def work(conn: psycopg.Connection[Any], n: int) -> None:
        for attempt in range(15):  # past psycopg's threshold, each in a transaction
            with conn.transaction():
                pgqueue.enqueue(conn, "kept", {"n": n, "i": attempt})
                # The caller's own statements are the caller's to keep unprepared
                # (prepare_threshold=None on the connection, or prepare=False).
                conn.execute("SELECT 1", prepare=False)
        with pytest.raises(RuntimeError), conn.transaction():
            pgqueue.enqueue(conn, "rolled_back")
            raise RuntimeError("the caller's transaction fails")

    on_five_connections(pooled_database_url, work)
    assert count(direct, "SELECT count(*) FROM pgqueue.tasks WHERE type = 'kept'") == 75
    assert count(direct, "SELECT count(*) FROM pgqueue.tasks WHERE type = 'rolled_back'") == 0


def test_workflows_and_limits_work_through_the_pooler(
    pooled_database_url: str, direct: psycopg.Connection[Any], transaction_mode: None
) -> None:
    def work(conn: psycopg.Connection[Any], n: int) -> list[Any]:
        conn.autocommit = True
        handles = [
            pgqueue.chain(pgqueue.step("a", {"i": i}), pgqueue.step("b")).enqueue(conn)
            for i in range(6)
        ]
        for i in range(6):
            pgqueue.set_limit(conn, type=f"limited{n}.{i}", max_running=1)
            assert len(pgqueue.list_limits(conn)) >= i + 1
        infos = [pgqueue.workflow(conn, h.id) for h in handles]
        assert all(len(info.tasks) == 2 for info in infos)
        return pgqueue.claim(conn, ["default"], limit=2, worker_id=f"test{n}")

    claimed = [c for batch in on_five_connections(pooled_database_url, work) for c in batch]
    assert len(claimed) == 10  # first steps only: each second step waits for its first
    assert {c.type for c in claimed} == {"a"}
    assert count(direct, "SELECT count(*) FROM pgqueue.tasks WHERE status = 'waiting'") == 30


def test_a_wait_on_a_callers_connection_polls_and_returns_soon_after_the_task_ends(
    pooled_database_url: str, direct: psycopg.Connection[Any], transaction_mode: None
) -> None:
    with psycopg.connect(pooled_database_url, autocommit=True) as conn:
        task_id = pgqueue.enqueue(conn, "waited").task.id
        # Not just before a multiple of the default poll_interval (2 s): that poll would end
        # the wait in time by luck.
        done = finish_later(direct, task_id, after=0.7)
        task = pgqueue.wait(conn, task_id, timeout=30)
        returned = time.monotonic()
    assert task.status is TaskStatus.COMPLETED
    assert returned - done[0] < WAIT_LATENCY


def test_an_async_wait_and_a_workflow_wait_poll_behind_the_pooler(
    pooled_database_url: str, direct: psycopg.Connection[Any], transaction_mode: None
) -> None:
    handle = pgqueue.chain(pgqueue.step("only")).enqueue(direct)
    (task_id,) = [t.id for t in handle.tasks]

    async def wait() -> tuple[TaskStatus, float]:
        async with await psycopg.AsyncConnection.connect(
            pooled_database_url, autocommit=True
        ) as conn:
            for _ in range(6):  # past psycopg's threshold on this connection
                await pgqueue.aio.get_task(conn, task_id)
            task = await pgqueue.aio.wait(conn, task_id, timeout=30)
            return task.status, time.monotonic()

    done = finish_later(direct, task_id, after=1.0)
    status, returned = asyncio.run(wait())
    assert status is TaskStatus.COMPLETED
    assert returned - done[0] < WAIT_LATENCY
    with psycopg.connect(pooled_database_url, autocommit=True) as conn:
        began = time.monotonic()
        assert pgqueue.wait_workflow(conn, handle.id, timeout=30) == {"done": str(task_id)}
        assert time.monotonic() - began < WAIT_LATENCY


LISTENING = (
    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"
    " AND datname = current_database() AND state = 'idle'"
)


def test_a_wait_listens_on_the_listen_url_when_one_is_given(
    pooled_database_url: str,
    database_url: str,
    direct: psycopg.Connection[Any],
    transaction_mode: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_LISTEN_URL", database_url)
    with psycopg.connect(pooled_database_url, autocommit=True) as conn:
        task_id = pgqueue.enqueue(conn, "waited").task.id
        listening: list[bool] = []

        def finish_when_listening() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not listening:
                if count(direct, LISTENING):
                    listening.append(True)
                else:
                    time.sleep(0.05)
            finish(direct, task_id)

        threading.Thread(target=finish_when_listening, daemon=True).start()
        # A poll this slow could not end the wait in time: the notification has to.
        began = time.monotonic()
        task = pgqueue.wait(conn, task_id, timeout=30, poll_interval=20)
    assert task.status is TaskStatus.COMPLETED
    assert listening == [True]
    assert time.monotonic() - began < 10
    # The LISTEN connection was the wait's own, and closed with it (its backend leaves
    # pg_stat_activity a moment after the client hangs up).
    wait_until(lambda: count(direct, LISTENING) == 0, 10, "the wait's LISTEN backend to exit")


def test_a_wait_on_a_closed_connection_says_the_connection_is_closed(
    database_url: str,
) -> None:
    conn = psycopg.connect(database_url, autocommit=True)
    task_id = pgqueue.enqueue(conn, "closed").task.id
    conn.close()
    with pytest.raises(UnsupportedConnection, match="closed"):
        pgqueue.wait(conn, task_id, timeout=1)
    with pytest.raises(UnsupportedConnection, match="closed"):
        pgqueue.enqueue(conn, "closed")


def test_an_async_wait_on_a_closed_connection_says_the_connection_is_closed(
    database_url: str,
) -> None:
    async def wait_on_closed() -> None:
        conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        await conn.close()
        await pgqueue.aio.wait(conn, uuid.uuid4(), timeout=1)

    with pytest.raises(UnsupportedConnection, match="closed"):
        asyncio.run(wait_on_closed())


# --- the Client ---------------------------------------------------------------------------------


def test_a_client_in_pooler_mode_enqueues_lists_waits_and_cancels(
    pooled_database_url: str, direct: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQUEUE_POOLER", raising=False)
    monkeypatch.delenv("PGQUEUE_LISTEN_URL", raising=False)
    with pgqueue.Client(pooled_database_url, pooler="transaction", max_connections=2) as client:
        ids = [client.enqueue("client", {"i": i}).task.id for i in range(12)]
        for _ in range(6):
            assert {t.id for t in client.list_tasks(type="client", limit=100)} == set(ids)
        done = finish_later(direct, ids[0], after=1.0)
        task = client.wait(ids[0], timeout=30)
        returned = time.monotonic()
        assert task.status is TaskStatus.COMPLETED
        assert returned - done[0] < WAIT_LATENCY
        cancelled = [client.cancel(i) for i in ids[1:]]
        assert {t.status for t in cancelled} == {TaskStatus.CANCELLED}


# --- the HTTP API and the dashboard's reads ------------------------------------------------------


@pytest.fixture
def pooled_api(pooled_database_url: str, transaction_mode: None) -> Iterator[Live]:
    live = launch(ApiSettings(database_url=pooled_database_url, wait_poll_seconds=3600))
    yield live
    halt([live])


def test_the_api_submits_gets_waits_and_deletes_through_the_pooler(
    pooled_api: Live, direct: psycopg.Connection[Any]
) -> None:
    client = pooled_api.client
    ids = []
    for i in range(10):
        response = client.post("/api/v1/tasks", json={"type": "api", "payload": {"i": i}})
        assert response.status_code == 202, response.text
        ids.append(uuid.UUID(response.json()["task_id"]))
    for task_id in ids:
        response = client.get(f"/api/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
    done = finish_later(direct, ids[0], after=1.0)
    response = client.get(f"/api/v1/tasks/{ids[0]}", params={"wait": 30})
    returned = time.monotonic()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    assert returned - done[0] < WAIT_LATENCY
    for task_id in ids[1:]:
        response = client.delete(f"/api/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"


def test_the_dashboards_reads_work_through_the_pooler(pooled_api: Live) -> None:
    paths = [
        "/api/v1/stats",
        "/api/v1/throughput/series",
        "/api/v1/failures",
        "/api/v1/queues",
        "/api/v1/limits",
        "/api/v1/schedules",
        "/api/v1/tasks",
        "/api/v1/dead-letters",
        "/api/v1/dead-letters/count",
        "/readyz",
        "/metrics",
        "/dashboard/",
    ]

    def read(path: str) -> None:
        with httpx.Client(base_url=pooled_api.base_url, timeout=30) as client:
            for _ in range(8):  # past psycopg's threshold on the API's pooled connections
                response = client.get(path)
                assert response.status_code == 200, (path, response.text)

    with ThreadPoolExecutor(5) as pool:
        list(pool.map(read, paths))


def test_many_waits_of_the_api_are_answered_soon_after_their_tasks_end(
    pooled_api: Live, direct: psycopg.Connection[Any]
) -> None:
    ids = [pgqueue.enqueue(direct, "api").task.id for _ in range(5)]
    answers: dict[uuid.UUID, float] = {}

    def get(task_id: uuid.UUID) -> None:
        response = pooled_api.client.get(f"/api/v1/tasks/{task_id}", params={"wait": 30})
        assert response.json()["status"] == "completed"
        answers[task_id] = time.monotonic()

    threads = [threading.Thread(target=get, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    finished = {i: finish(direct, i) for i in ids}
    for thread in threads:
        thread.join(30)
    assert set(answers) == set(ids)
    assert max(answers[i] - finished[i] for i in ids) < WAIT_LATENCY


# --- NOTIFY on enqueue -------------------------------------------------------------------------


@pytest.fixture
def listener(database_url: str) -> Iterator[Callable[[], list[str]]]:
    """A direct connection listening on ``pgqueue`` (what idle workers hear); calling it
    gives the payloads heard since the last call."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("LISTEN pgqueue")

        def heard() -> list[str]:
            return [n.payload for n in conn.notifies(timeout=0.3)]

        yield heard


def enqueue_every_way(conn: Any, **notify: Any) -> None:
    """One enqueue by each path, one queue each: single (plain, keyed), many (COPY, keyed),
    columns, and a task with a parent (released at once: its parent is final)."""
    pgqueue.enqueue(conn, "t", queue="single", **notify)
    pgqueue.enqueue(conn, "t", queue="keyed", idempotency_key=str(uuid.uuid4()), **notify)
    pgqueue.enqueue_many(conn, [{"type": "t", "queue": "copy"}], **notify)
    pgqueue.enqueue_many(
        conn, [{"type": "t", "queue": "many_keyed", "idempotency_key": str(uuid.uuid4())}], **notify
    )
    pgqueue.enqueue_columns(conn, "t", [{}], queue="columns", **notify)
    parent = pgqueue.enqueue(conn, "t", queue="parent_q", **notify).task.id
    pgqueue.cancel(conn, parent)
    pgqueue.enqueue(
        conn, "t", queue="dependent", depends_on=[parent], on_parent_failure="run", **notify
    )


ALL_QUEUES = ["columns", "copy", "dependent", "keyed", "many_keyed", "parent_q", "single"]


def test_every_enqueue_notifies_once_per_queue_by_default(
    direct: psycopg.Connection[Any], listener: Callable[[], list[str]]
) -> None:
    enqueue_every_way(direct)
    assert sorted(listener()) == ALL_QUEUES


def test_no_enqueue_notifies_when_notify_is_off(
    direct: psycopg.Connection[Any], listener: Callable[[], list[str]]
) -> None:
    enqueue_every_way(direct, notify=False)
    assert listener() == []
    pgqueue.enqueue(direct, "t", queue="single", notify=True)
    assert listener() == ["single"]


def test_no_enqueue_notifies_when_pgqueue_notify_is_off(
    direct: psycopg.Connection[Any],
    listener: Callable[[], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_NOTIFY", "off")
    enqueue_every_way(direct)
    workflow = pgqueue.group(pgqueue.step("a"), pgqueue.step("b"))
    workflow.enqueue(direct)
    assert listener() == []
    enqueue_every_way(direct, notify=True)  # the argument wins
    assert sorted(listener()) == ALL_QUEUES


def test_a_client_with_notify_off_enqueues_without_notifying(
    database_url: str, listener: Callable[[], list[str]]
) -> None:
    with pgqueue.Client(database_url, notify=False) as client:
        client.enqueue("t")
        client.enqueue_many([{"type": "t"}, {"type": "t", "idempotency_key": "k"}])
        client.enqueue_columns("t", [{}, {}])
        assert client.list_tasks(type="t")
    assert listener() == []


def test_a_bad_pooler_value_is_a_configuration_error(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_POOLER", "transactional")
    with pytest.raises(ConfigurationError, match="PGQUEUE_POOLER"):
        pgqueue.Client(database_url)
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        pytest.raises(ConfigurationError, match="PGQUEUE_POOLER"),
    ):
        pgqueue.enqueue(conn, "t")


# --- the command line ---------------------------------------------------------------------------


def test_the_cli_with_pooler_transaction_waits_and_cancels_through_the_pooler(
    pooled_database_url: str, direct: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQUEUE_POOLER", raising=False)
    monkeypatch.delenv("PGQUEUE_LISTEN_URL", raising=False)
    ids = [pgqueue.enqueue(direct, "cli").task.id for _ in range(2)]
    options = ["--database-url", pooled_database_url, "--pooler", "transaction", "--json"]
    done = finish_later(direct, ids[0], after=1.0)
    result = CliRunner().invoke(app, [*options, "status", str(ids[0]), "--wait", "30"])
    returned = time.monotonic()
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "completed"
    assert returned - done[0] < WAIT_LATENCY
    result = CliRunner().invoke(app, [*options, "cancel", str(ids[1])])
    assert result.exit_code == 0, result.output
    assert pgqueue.get_task(direct, ids[1]).status is TaskStatus.CANCELLED


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_bad_pooler_is_a_configuration_error_of_the_cli(how: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    args = [sys.executable, "-m", "pgqueue", "--database-url", "postgresql://127.0.0.1:1/x"]
    if how == "option":
        args += ["--pooler", "transactional"]
    else:
        env["PGQUEUE_POOLER"] = "transactional"
    proc = subprocess.run(
        [*args, "--json", "stats"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    error = json.loads(proc.stderr)
    assert error["error"] == "configuration"
    assert "--pooler (PGQUEUE_POOLER) must be one of none, session, transaction" in error["message"]
