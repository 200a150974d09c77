"""A real ``pgqueue worker`` behind a real PgBouncer in transaction mode (tests/pgbouncer.py).

Such a pooler hands each transaction to whichever server connection is free: a statement
psycopg prepared on one (it prepares what it ran five times) is missing on the next, or
already there, and a LISTEN hears nothing. In pooler mode (``--pooler transaction``,
``PGQUEUE_POOLER=transaction``) the worker and its children prepare nothing, hold no session
state on pooled connections, and, with no direct URL to LISTEN on (``PGQUEUE_LISTEN_URL``),
poll: adaptively for new tasks, and for the cancel flags of the tasks they run.

Producers and the test's own reads go through the pooler too, with preparing off. The
bounds on time are generous (a loaded machine must not fail them); bench/pooler_latency.py
measures the latencies.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgbouncer import PgBouncer
from pooler_handlers import SIDE_TABLE, pooled_add
from psycopg import ClientCursor
from test_worker_processes import WorkerProcess, Workers, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(180)]

POOLER = ("--pooler", "transaction")
# A worker whose idle polls alone would have run its claim statement far more than five
# times: one that prepared would have died by then.
LONG_ENOUGH = 8.0


@pytest.fixture
def pooled(
    pooled_database_url: str, pooler: PgBouncer, conn: psycopg.Connection[Any]
) -> Iterator[Any]:
    """An autocommit connection through the pooler (preparing off), the side table made."""
    conn.execute(SIDE_TABLE)
    try:
        c = psycopg.connect(
            pooled_database_url, autocommit=True, prepare_threshold=None, connect_timeout=20
        )
    except psycopg.OperationalError as exc:
        tail = "\n".join(pooler.log().splitlines()[-40:])
        pytest.fail(f"no connection through the pooler ({exc}); its log ends:\n{tail}")
    with c:
        yield c


def starts(conn: psycopg.Connection[Any], type_: str | None = None) -> dict[uuid.UUID, float]:
    """When each task's handler started (wall clock), by task id."""
    rows = conn.execute(
        "SELECT task_id, started FROM pooled_starts"
        " WHERE %(type)s::text IS NULL OR type = %(type)s",
        {"type": type_},
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def completed(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE id = ANY(%s) AND status = 'completed'", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)


def retried(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    """The tasks among ``ids`` that took more than one attempt, with their last error: behind
    the pooler, a statement prepared on one server connection fails on the next."""
    rows = conn.execute(
        "SELECT id, attempts, last_error FROM pgqueue.tasks WHERE id = ANY(%s) AND attempts > 1",
        (ids,),
    ).fetchall()
    return [tuple(r) for r in rows]


def listening(conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
    """(client port, query) of the backends of this database sitting in a LISTEN."""
    rows = conn.execute(
        "SELECT client_port, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def pooler_ports(pooler: PgBouncer) -> set[int]:
    """The local ports of the pooler's server connections (its admin console's SHOW SERVERS),
    which are the client ports of the backends it holds."""
    admin = f"postgresql://postgres@{pooler.host}:{pooler.port}/pgbouncer"
    # The admin console speaks the simple query protocol only: a client-side cursor.
    with psycopg.connect(admin, autocommit=True, cursor_factory=ClientCursor) as c:
        cur = c.execute("SHOW SERVERS")
        names = [d.name for d in cur.description or []]
        return {int(row[names.index("local_port")]) for row in cur.fetchall()}


@contextlib.contextmanager
def churn(pooled_database_url: str, clients: int = 3) -> Iterator[None]:
    """Other clients' short transactions through the pooler meanwhile, so that one client's
    consecutive transactions land on different server connections (alone, a client keeps
    getting the one it last used, and a prepared statement would work by luck)."""
    stop = threading.Event()

    def run() -> None:
        with psycopg.connect(pooled_database_url, autocommit=True, prepare_threshold=None) as c:
            while not stop.is_set():
                c.execute("SELECT pg_sleep(0.01)")

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


def stay_up(worker: WorkerProcess, since: float) -> None:
    """Until the worker has run LONG_ENOUGH (not an assertion), then: still running."""
    time.sleep(max(0.0, since + LONG_ENOUGH - time.monotonic()))
    assert worker.alive(), worker.describe()


def run_tasks(pooled: psycopg.Connection[Any], count: int, type_: str = "pooled") -> list[Any]:
    return [r.task.id for r in pgqueue.enqueue_many(pooled, [{"type": type_}] * count)]


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_worker_behind_a_transaction_pooler_runs_200_tasks_from_several_producers_and_stays_up(
    pooled_database_url: str,
    pooled: psycopg.Connection[Any],
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
    given: str,
):
    if given == "environment":
        monkeypatch.setenv("PGQUEUE_POOLER", "transaction")
    began = time.monotonic()
    worker = workers.start(
        pooled_database_url,
        *(POOLER if given == "option" else ()),
        "--log-format", "json", "--concurrency", "4",
        registry="pooler_handlers:tasks",
    )  # fmt: skip
    ids: list[uuid.UUID] = []
    lock = threading.Lock()

    def produce() -> None:
        with psycopg.connect(pooled_database_url, autocommit=True, prepare_threshold=None) as c:
            for _ in range(50):
                task_id = pgqueue.enqueue(c, "pooled", {}).id
                with lock:
                    ids.append(task_id)
                time.sleep(0.01)

    producers = [threading.Thread(target=produce) for _ in range(4)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    wait_until(lambda: completed(pooled, ids), timeout=120, what="200 tasks", alive=[worker])
    assert len(starts(pooled)) == 200  # each ran once, its write committed with its completion
    assert retried(pooled, ids) == []
    stay_up(worker, began)
    assert listening(pooled) == []  # no LISTEN reached a server connection
    assert "DuplicatePreparedStatement" not in worker.stderr()


def test_without_listen_a_worker_behind_the_pooler_picks_up_tasks_arriving_at_20_a_second_fast(
    pooled_database_url: str, pooled: psycopg.Connection[Any], workers: Workers
):
    worker = workers.start(
        pooled_database_url, *POOLER, "--log-format", "json", registry="pooler_handlers:tasks"
    )
    first = run_tasks(pooled, 1)
    wait_until(lambda: completed(pooled, first), timeout=60, what="the first task", alive=[worker])
    time.sleep(1.0)  # not an assertion: the worker's polls back off while it is idle
    enqueued: dict[uuid.UUID, float] = {}
    next_at = time.monotonic()
    for _ in range(40):
        at = time.time()
        enqueued[pgqueue.enqueue(pooled, "pooled", {}).id] = at
        next_at += 0.05
        time.sleep(max(0.0, next_at - time.monotonic()))
    ids = list(enqueued)
    wait_until(lambda: completed(pooled, ids), timeout=60, what="40 tasks", alive=[worker])
    started = starts(pooled)
    pickups = sorted(started[t] - enqueued[t] for t in ids)
    median = statistics.median(pickups)
    assert median < 0.1, f"median pickup {median * 1000:.0f} ms: {pickups}"
    assert listening(pooled) == []


def _held_task_running(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> bool:
    return pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING


def test_a_cancel_through_the_pooler_reaches_the_running_handler_within_about_a_second(
    pooled_database_url: str, pooled: psycopg.Connection[Any], workers: Workers
):
    """The lease is 60 s, so the heartbeat beats every 20 s: the stop can only come from the
    worker's poll of its running tasks' cancel flags (the log says so: via=poll)."""
    worker = workers.start(
        pooled_database_url, *POOLER, "--lease-seconds", "60", "--log-format", "json",
        registry="pooler_handlers:tasks",
    )  # fmt: skip
    task_id = pgqueue.enqueue(pooled, "held", {}).id
    wait_until(
        lambda: _held_task_running(pooled, task_id), timeout=60, what="the task to run",
        alive=[worker],
    )  # fmt: skip
    time.sleep(0.3)  # not an assertion: the handler reaches its loop
    asked = time.time()
    assert pgqueue.cancel(pooled, task_id).cancel_requested

    def seen() -> float | None:
        task = pgqueue.get_task(pooled, task_id)
        if task.status is not pgqueue.TaskStatus.CANCELLED:
            return None
        assert task.last_error is not None and task.last_error.startswith("saw stop at ")
        return float(task.last_error.removeprefix("saw stop at "))

    at = wait_until(seen, timeout=60, what="the handler to see the stop", alive=[worker])
    assert at - asked < 3.0, f"the handler saw the stop {at - asked:.2f} s later"
    told = [e for e in worker.events() if e["event"] == "task.cancel_requested"]
    assert [e["via"] for e in told] == ["poll"], told


def test_with_a_listen_url_the_worker_listens_on_the_direct_connection_and_never_through_the_pooler(
    pooled_database_url: str,
    database_url: str,
    pooler: PgBouncer,
    pooled: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("PGQUEUE_LISTEN_URL", database_url)
    began = time.monotonic()
    worker = workers.start(
        pooled_database_url, *POOLER, "--log-format", "json", registry="pooler_handlers:tasks"
    )
    wait_until(
        lambda: ("LISTEN pgqueue" in [q for _, q in listening(conn)]),
        timeout=60, what="the worker to LISTEN", alive=[worker],
    )  # fmt: skip
    ids = run_tasks(pooled, 30)
    wait_until(lambda: completed(pooled, ids), timeout=60, what="30 tasks", alive=[worker])
    stay_up(worker, began)
    through_pooler = pooler_ports(pooler)
    listeners = listening(conn)
    assert [q for _, q in listeners] == ["LISTEN pgqueue"], listeners
    assert not {port for port, _ in listeners} & through_pooler, (listeners, through_pooler)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_supervised_children_inherit_the_pooler_mode(
    pooled_database_url: str,
    pooled: psycopg.Connection[Any],
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
    start: str,
):
    monkeypatch.setenv("PGQUEUE_WORKER_START_METHOD", start)
    began = time.monotonic()
    supervisor = workers.start(
        pooled_database_url, *POOLER, "--processes", "2", "--log-format", "json",
        registry="pooler_handlers:tasks",
    )  # fmt: skip
    ids = run_tasks(pooled, 100)
    wait_until(lambda: completed(pooled, ids), timeout=120, what="100 tasks", alive=[supervisor])
    assert retried(pooled, ids) == []
    stay_up(supervisor, began)
    exits = [e for e in supervisor.events() if e["event"] == "worker.process_exited"]
    assert exits == [], exits
    assert listening(pooled) == []


def test_process_executor_children_inherit_the_pooler_mode(
    pooled_database_url: str, pooled: psycopg.Connection[Any], workers: Workers
):
    """One child runs every task, and writes each through its own ctx.connection, with the
    completion: the same statements many times on one connection."""
    began = time.monotonic()
    worker = workers.start(
        pooled_database_url, *POOLER, "--process-pool-size", "1", "--log-format", "json",
        registry="pooler_handlers:process_tasks",
    )  # fmt: skip
    with churn(pooled_database_url):
        ids = run_tasks(pooled, 40, "pooled_process")
        wait_until(lambda: completed(pooled, ids), timeout=120, what="40 tasks", alive=[worker])
        assert len(starts(pooled)) == 40
        assert retried(pooled, ids) == []
        stay_up(worker, began)
    died = [e for e in worker.events() if e["event"] == "worker.child_died"]
    assert died == [], died


def test_limits_periodic_tasks_and_workflows_run_through_the_pooler(
    pooled_database_url: str, pooled: psycopg.Connection[Any], workers: Workers
):
    pgqueue.set_limit(pooled, type="pooled", max_running=2)
    began = time.monotonic()
    worker = workers.start(
        pooled_database_url, *POOLER, "--queue", "default", "--queue", "periodic",
        "--log-format", "json", registry="pooler_handlers:everything",
    )  # fmt: skip
    with churn(pooled_database_url):
        limited = run_tasks(pooled, 30)
        chain = pgqueue.chain(pooled_add.s(1, 2), pooled_add.s(10), pooled_add.s(100))
        workflow = chain.enqueue(pooled)
        wait_until(
            lambda: completed(pooled, [*limited, *(t.id for t in workflow.tasks)]),
            timeout=120, what="the limited tasks and the chain", alive=[worker],
        )  # fmt: skip
        assert [pgqueue.get_task(pooled, t.id).result for t in workflow.tasks] == [3, 13, 113]
        assert retried(pooled, [*limited, *(t.id for t in workflow.tasks)]) == []
        wait_until(
            lambda: len(starts(pooled, "pooled_beat")) >= 2,
            timeout=30, what="two ticks of the schedule to run", alive=[worker],
        )  # fmt: skip
        stay_up(worker, began)
    assert listening(pooled) == []
