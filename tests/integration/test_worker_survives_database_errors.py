"""No service loop of the worker dies on an unexpected database error.

Each test runs a real worker in this process (its own event loop in a thread, as
test_worker_metrics.py does) against real PostgreSQL, and makes the first call of one
service's database step fail on the server: the step is wrapped so that its first call runs,
on the connection it was given, a statement the server refuses (a division by zero, a
prepared statement that already exists or does not, as behind a pooler in transaction mode,
a statement timeout, a row lock it may not wait for) or reads a row that does not decode.
Then it checks that (a) the service is still running and the worker with it, (b) the
service's work happens afterwards, (c) the error was logged with the service, the error's
class, SQLSTATE and first line, and (d) ``/metrics`` counts it. Every wait polls with a
deadline.

database_errors.py's rules on their own (the backoff, the log's summaries, a forced stop, a
cancellation, a bug of the worker's own) are in the last tests, on a Database of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import aio
from pgqueue.log import logger
from pgqueue.models import TaskStatus
from pgqueue.registry import TaskRegistry
from pgqueue.worker import Worker, WorkerConfig
from pgqueue.worker import completer as completer_module
from pgqueue.worker import database as database_module
from pgqueue.worker import runner as runner_module
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.database import Database
from pgqueue.worker.listener import Listener
from pgqueue.worker.maintenance import Maintenance, MaintenanceConfig
from pgqueue.worker.metrics import PrometheusWorkerMetrics
from pgqueue.worker.state import StopRequest

T = TypeVar("T")
Failing = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]

# --- statements the server refuses ---------------------------------------------------------


async def division_by_zero(conn: psycopg.AsyncConnection[Any]) -> None:
    """A broken trigger's error: 22012."""
    await conn.execute("SELECT 1/0")


async def duplicate_prepared_statement(conn: psycopg.AsyncConnection[Any]) -> None:
    """What a transaction-mode pooler gives a session that prepares: 42P05."""
    await conn.execute("PREPARE pgqueue_test_fault AS SELECT 1")
    try:
        await conn.execute("PREPARE pgqueue_test_fault AS SELECT 1")
    finally:
        await conn.execute("DEALLOCATE pgqueue_test_fault")


async def missing_prepared_statement(conn: psycopg.AsyncConnection[Any]) -> None:
    """What a transaction-mode pooler gives a statement prepared on another server: 26000."""
    await conn.execute("EXECUTE pgqueue_test_fault")


async def statement_timeout(conn: psycopg.AsyncConnection[Any]) -> None:
    """A statement cancelled by statement_timeout: 57014."""
    await conn.execute("SET statement_timeout = '50ms'")
    try:
        await conn.execute("SELECT pg_sleep(10)")
    finally:
        await conn.execute("RESET statement_timeout")


async def undecodable_row(conn: psycopg.AsyncConnection[Any]) -> None:
    """Not psycopg's error: a row fetched from the server that does not decode."""
    cur = await conn.execute("SELECT '{\"tick\": '::text")
    row = await cur.fetchone()
    assert row is not None
    json.loads(row[0])


async def row_locked(conn: psycopg.AsyncConnection[Any]) -> None:
    """A row another session holds, taken NOWAIT: 55P03 (see the maintenance test)."""
    await conn.execute("SELECT * FROM fault_lock FOR UPDATE NOWAIT")


class Fault:
    """Makes the first call of a database step run ``fail`` on the connection it was given
    (the first ``AsyncConnection`` among its arguments) instead; later calls run the step."""

    def __init__(self, fail: Failing) -> None:
        self.fail = fail
        self.hits = 0

    def wrap(self, step: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def faulty(*args: Any, **kwargs: Any) -> T:
            if not self.hits:
                self.hits += 1
                conn = next(a for a in args if isinstance(a, psycopg.AsyncConnection))
                await self.fail(conn)
                raise RuntimeError(f"{self.fail.__name__} did not fail")
            return await step(*args, **kwargs)

        return faulty


# --- a worker in this process --------------------------------------------------------------


class Events(logging.Handler):
    """pgqueue's events, with their fields."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "pgqueue_fields", None)
        if isinstance(fields, dict):
            self.seen.append({"event": getattr(record, "pgqueue_event", ""), **fields})

    def named(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in list(self.seen)
            if e["event"] == name and all(e.get(k) == v for k, v in match.items())
        ]


@pytest.fixture
def events() -> Iterator[Events]:
    """pgqueue's events, kept on its logger (a CLI run earlier in this process may have
    stopped it propagating to pytest's caplog)."""
    handler, level = Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def wait_until(predicate: Callable[[], T], *, timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Running:
    """A worker running on an event loop of its own in a thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self.worker.run_async())
        except BaseException as exc:
            self.failure.append(exc)

    def services(self) -> set[str]:
        """The names of the worker's service tasks still running (the claimer runs in the
        worker's own task, which lives as long as the thread)."""

        async def names() -> set[str]:
            return {t.get_name() for t in asyncio.all_tasks() if not t.done()}

        if not self.thread.is_alive():
            return set()
        return asyncio.run_coroutine_threadsafe(names(), self.loop).result(10)

    def alive(self, service: str | None = None) -> bool:
        running = self.thread.is_alive() and not self.failure
        return running and (service is None or service in self.services())

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        metrics = self.worker.metrics
        assert isinstance(metrics, PrometheusWorkerMetrics)
        url = f"http://127.0.0.1:{metrics.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def database_errors(self, service: str, kind: str) -> float:
        labels = (("kind", kind), ("service", service))
        return self.scrape().get(("pgqueue_worker_database_errors_total", labels), 0.0)


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Running]:
    """Run ``worker`` until the block ends, then stop it gracefully: it must stop, with no
    error and exit code 0."""
    run = Running(worker)
    run.thread.start()
    metrics = worker.metrics
    assert isinstance(metrics, PrometheusWorkerMetrics)
    try:
        wait_until(
            lambda: run.failure or metrics.port, timeout=30, what="the worker's metrics server"
        )
        assert not run.failure, run.failure
        yield run
    finally:
        run.loop.call_soon_threadsafe(worker.request_stop)
        run.thread.join(timeout=30)
        if not run.thread.is_alive():
            run.loop.close()
    assert not run.thread.is_alive(), "the worker did not stop"
    assert not run.failure, run.failure
    assert worker.exit_code == 0


def config(**overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "concurrency": 2,
        "poll_interval": 0.1,
        "grace_period": 5,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "maintenance": MaintenanceConfig(enabled=False),
        **overrides,
    }
    return WorkerConfig(**settings)


def registry() -> TaskRegistry:
    tasks = TaskRegistry()

    @tasks.handler("ok")
    def ok(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"n": payload.get("n")}

    return tasks


def status(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> TaskStatus:
    return pgqueue.get_task(conn, task_id).status


def the_error(events: Events, service: str, name: str = "worker.database_error") -> dict[str, Any]:
    """The service's first logged error (the streak's first line)."""
    found = events.named(name, service=service)
    assert found, [e for e in events.seen if "error" in e["event"]]
    assert found[0]["failures"] == 1
    return found[0]


# --- one test a service --------------------------------------------------------------------


def test_claimer_survives_an_unexpected_database_error(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    fault = Fault(division_by_zero)
    monkeypatch.setattr(Claimer, "_claim", fault.wrap(Claimer._claim))
    worker = Worker(registry(), database_url, config())
    with running(worker) as run:
        wait_until(lambda: fault.hits, timeout=30, what="the claim's fault")
        wait_until(
            lambda: events.named("worker.database_recovered", service="claimer"),
            timeout=30,
            what="the claimer to claim again",
        )
        task_id = pgqueue.enqueue(conn, "ok", {"n": 1}).id
        wait_until(
            lambda: status(conn, task_id) is TaskStatus.COMPLETED,
            timeout=30,
            what="a task enqueued after the fault to complete",
        )
        assert run.alive()
        assert run.database_errors("claimer", "statement") == 1
    error = the_error(events, "claimer")
    assert (error["error_class"], error["sqlstate"], error["error"], error["kind"]) == (
        "DivisionByZero",
        "22012",
        "division by zero",
        "statement",
    )
    assert error["worker"] == worker.config.worker_id and error["retry_in_s"] > 0


def test_completer_survives_an_unexpected_database_error_and_records_the_completion_once(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    fault = Fault(duplicate_prepared_statement)
    monkeypatch.setattr(completer_module, "arun", fault.wrap(completer_module.arun))
    worker = Worker(registry(), database_url, config())
    with running(worker) as run:
        first = pgqueue.enqueue(conn, "ok", {"n": 1}).id
        wait_until(lambda: fault.hits, timeout=30, what="the completion's fault")
        second = pgqueue.enqueue(conn, "ok", {"n": 2}).id
        wait_until(
            lambda: {status(conn, first), status(conn, second)} == {TaskStatus.COMPLETED},
            timeout=30,
            what="both completions to be recorded",
        )
        assert run.alive("completer")
        assert run.database_errors("completer", "statement") == 1
    # The retried write was the same one, fenced by the same lease: recorded once, the
    # handler run once.
    done = pgqueue.get_task(conn, first)
    assert (done.attempts, done.result) == (1, {"n": 1})
    assert len(events.named("task.completed", task_id=first)) == 1
    assert len(events.named("task.started", task_id=first)) == 1
    error = the_error(events, "completer")
    assert (error["error_class"], error["sqlstate"], error["kind"]) == (
        "DuplicatePreparedStatement",
        "42P05",
        "statement",
    )
    assert "pgqueue_test_fault" in error["error"]


def test_heartbeat_survives_an_unexpected_database_error_and_extends_the_lease(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    fault = Fault(missing_prepared_statement)
    monkeypatch.setattr(aio, "heartbeat", fault.wrap(aio.heartbeat))
    release = threading.Event()
    tasks = TaskRegistry()

    @tasks.handler("held")
    def held(payload: dict[str, Any], ctx: Any) -> None:
        release.wait(60)

    def expiry(task_id: uuid.UUID) -> datetime:
        row = conn.execute(
            "SELECT lease_expires_at FROM pgqueue.tasks WHERE id = %s", (task_id,)
        ).fetchone()
        assert row is not None and row[0] is not None
        return row[0]  # type: ignore[no-any-return]

    worker = Worker(tasks, database_url, config(lease_seconds=3))  # a beat every second
    try:
        with running(worker) as run:
            task_id = pgqueue.enqueue(conn, "held", {}).id
            wait_until(lambda: fault.hits, timeout=30, what="the heartbeat's fault")
            faulted_at = expiry(task_id)
            wait_until(
                lambda: expiry(task_id) > faulted_at,
                timeout=30,
                what="a heartbeat after the fault to extend the lease",
            )
            assert run.alive("heartbeat")
            assert run.database_errors("heartbeat", "statement") == 1
            release.set()
            wait_until(
                lambda: status(conn, task_id) is TaskStatus.COMPLETED,
                timeout=30,
                what="the held task to complete",
            )
    finally:
        release.set()
    assert not events.named("task.lease_lost") and not events.named("task.lease_expired")
    error = the_error(events, "heartbeat")
    assert (error["error_class"], error["sqlstate"], error["kind"]) == (
        "InvalidSqlStatementName",
        "26000",
        "statement",
    )
    assert error["error"] == 'prepared statement "pgqueue_test_fault" does not exist'


@pytest.mark.parametrize("fail", [statement_timeout, undecodable_row], ids=lambda f: f.__name__)
def test_listener_survives_an_unexpected_error_and_a_notify_wakes_the_claimer_again(
    database_url: str,
    conn: psycopg.Connection[Any],
    events: Events,
    monkeypatch: Any,
    fail: Failing,
) -> None:
    fault = Fault(fail)
    connect = Listener._connect

    async def faulty(self: Listener) -> psycopg.AsyncConnection[Any]:
        listening = await connect(self)
        if not fault.hits:
            try:
                await fault.wrap(connect)(listening)
            finally:
                await listening.close()
        return listening

    monkeypatch.setattr(Listener, "_connect", faulty)
    # Polls 30 s apart: a task done within 15 s was claimed on its NOTIFY.
    worker = Worker(registry(), database_url, config(poll_interval=30))
    with running(worker) as run:
        wait_until(
            lambda: events.named("worker.database_recovered", service="listener"),
            timeout=30,
            what="the listener to listen again",
        )
        # The first may be claimed on the wake-up of the listener's reconnection; by the
        # second, the claimer sleeps until a NOTIFY.
        for n in (1, 2):
            task_id = pgqueue.enqueue(conn, "ok", {"n": n}).id
            wait_until(
                lambda: status(conn, task_id) is TaskStatus.COMPLETED,  # noqa: B023
                timeout=15,
                what="the NOTIFY of an enqueue to wake the claimer",
            )
        assert run.alive("listener")
        kind = "conflict" if fail is statement_timeout else "client"
        assert run.database_errors("listener", kind) == 1
    error = the_error(events, "listener", "worker.listen_lost")
    if fail is statement_timeout:
        assert (error["error_class"], error["sqlstate"]) == ("QueryCanceled", "57014")
        assert error["error"] == "canceling statement due to statement timeout"
    else:
        assert (error["error_class"], error["sqlstate"]) == ("JSONDecodeError", None)
        assert error["error"].startswith("Expecting value")


@pytest.mark.parametrize("fail", [row_locked, undecodable_row], ids=lambda f: f.__name__)
def test_maintenance_survives_an_unexpected_database_error_and_prunes(
    database_url: str,
    conn: psycopg.Connection[Any],
    connect: Callable[..., psycopg.Connection[Any]],
    events: Events,
    monkeypatch: Any,
    fail: Failing,
) -> None:
    conn.execute("CREATE TABLE fault_lock (id int)")
    conn.execute("INSERT INTO fault_lock VALUES (1)")
    holder = connect(autocommit=False)
    holder.execute("SELECT * FROM fault_lock FOR UPDATE")  # held until the fault has hit
    old = datetime.now(UTC) - timedelta(days=2)
    task_id = pgqueue.enqueue(conn, "ok", {}, now=old).id
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="earlier", now=old)
    pgqueue.complete(conn, claimed.lease, now=old)  # finished two days ago: past retention

    fault = Fault(fail)
    monkeypatch.setattr(Maintenance, "analyze_once", fault.wrap(Maintenance.analyze_once))
    maintenance = MaintenanceConfig(sweep_interval=0.1, prune_interval=0.2)
    worker = Worker(registry(), database_url, config(maintenance=maintenance))
    with running(worker) as run:
        wait_until(lambda: fault.hits, timeout=30, what="the maintenance round's fault")
        holder.rollback()
        wait_until(
            lambda: (
                not conn.execute("SELECT 1 FROM pgqueue.tasks WHERE id = %s", (task_id,)).fetchone()
            ),
            timeout=30,
            what="maintenance to prune the old task",
        )
        assert run.alive("maintenance")
        kind = "conflict" if fail is row_locked else "client"
        assert run.database_errors("maintenance", kind) == 1
    assert events.named("maintenance.prune")
    error = the_error(events, "maintenance", "maintenance.error")
    if fail is row_locked:
        assert (error["error_class"], error["sqlstate"], error["kind"]) == (
            "LockNotAvailable",
            "55P03",
            "conflict",
        )
        assert "fault_lock" in error["error"]
    else:
        assert (error["error_class"], error["sqlstate"], error["kind"]) == (
            "JSONDecodeError",
            None,
            "client",
        )


def test_scheduler_survives_an_unexpected_error_and_enqueues_its_tick(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    fault = Fault(undecodable_row)
    monkeypatch.setattr(aio, "run_schedule", fault.wrap(aio.run_schedule))
    tasks = registry()
    tasks.periodic("tick", "* * * * * *", type="ok")  # every second
    worker = Worker(tasks, database_url, config())
    with running(worker) as run:
        wait_until(lambda: fault.hits, timeout=30, what="the schedule's fault")
        enqueued = wait_until(
            lambda: events.named("schedule.enqueued", schedule="tick"),
            timeout=30,
            what="the scheduler to enqueue a tick after the fault",
        )
        assert pgqueue.get_task(conn, enqueued[0]["task_id"]).type == "ok"
        assert run.alive("scheduler")
        assert run.database_errors("scheduler", "client") == 1
    error = the_error(events, "scheduler")
    assert (error["schedule"], error["error_class"], error["sqlstate"], error["kind"]) == (
        "tick",
        "JSONDecodeError",
        None,
        "client",
    )


def test_a_failure_write_survives_an_unexpected_database_error_naming_its_task(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    """Not a loop of its own, but the runner's outcome writes go through the same retry, and
    their errors name the task."""
    fault = Fault(division_by_zero)
    monkeypatch.setattr(runner_module, "_fail", fault.wrap(runner_module._fail))
    tasks = TaskRegistry()

    @tasks.handler("boom", max_attempts=1)
    def boom(payload: dict[str, Any], ctx: Any) -> None:
        raise ValueError("boom")

    worker = Worker(tasks, database_url, config())
    with running(worker) as run:
        task_id = pgqueue.enqueue(conn, "boom", {}).id
        wait_until(
            lambda: status(conn, task_id) is TaskStatus.FAILED,
            timeout=30,
            what="the failure to be recorded after the fault",
        )
        assert run.database_errors("runner", "statement") == 1
    error = the_error(events, "runner")
    assert (error["task_id"], error["type"], error["attempt"]) == (task_id, "boom", 1)
    assert (error["error_class"], error["sqlstate"]) == ("DivisionByZero", "22012")
    assert len(events.named("task.dead", task_id=task_id)) == 1


def test_a_failure_write_that_keeps_failing_on_its_task_gives_up_and_frees_the_slot(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    """An error that repeats on one task's write is that task's: after a bounded number of
    tries the runner gives up on it (its lease expires and the sweep counts the attempt),
    and the slot it held runs the next task, instead of retrying and renewing for ever."""
    monkeypatch.setattr(database_module, "TASK_STATEMENT_TRIES", 3)

    async def always_failing(*args: Any, **kwargs: Any) -> Any:
        conn = next(a for a in args if isinstance(a, psycopg.AsyncConnection))
        await division_by_zero(conn)
        raise RuntimeError("division_by_zero did not fail")

    monkeypatch.setattr(runner_module, "_fail", always_failing)
    tasks = TaskRegistry()

    @tasks.handler("boom", max_attempts=1)
    def boom(payload: dict[str, Any], ctx: Any) -> None:
        raise ValueError("boom")

    @tasks.handler("ok")
    def ok(payload: dict[str, Any], ctx: Any) -> None:
        return None

    worker = Worker(tasks, database_url, config(concurrency=1))
    with running(worker) as run:
        poisoned = pgqueue.enqueue(conn, "boom", {}).id
        wait_until(
            lambda: run.database_errors("runner", "statement") >= 3,
            timeout=30,
            what="three failed tries of the failure write",
        )
        after = pgqueue.enqueue(conn, "ok", {}).id
        wait_until(
            lambda: status(conn, after) is TaskStatus.COMPLETED,
            timeout=30,
            what="the one slot, given up by the poisoned task, to run the next",
        )
        assert run.database_errors("runner", "statement") == 3
        assert status(conn, poisoned) is TaskStatus.RUNNING  # left to its lease's expiry


def test_a_bug_in_a_service_stops_the_worker_with_exit_code_1_naming_it(
    database_url: str, conn: psycopg.Connection[Any], events: Events, monkeypatch: Any
) -> None:
    """A programming error is not retried: the worker says which service and stops."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug of the worker's own")

    monkeypatch.setattr(aio, "heartbeat", broken)
    release = threading.Event()
    tasks = TaskRegistry()

    @tasks.handler("held")
    def held(payload: dict[str, Any], ctx: Any) -> None:
        release.wait(60)

    worker = Worker(tasks, database_url, config(lease_seconds=3))
    run = Running(worker)
    run.thread.start()
    try:
        pgqueue.enqueue(conn, "held", {})
        wait_until(
            lambda: events.named("worker.service_failed"), timeout=30, what="the heartbeat's bug"
        )
        release.set()
        run.thread.join(timeout=30)
    finally:
        release.set()
        if run.thread.is_alive():
            run.loop.call_soon_threadsafe(lambda: worker.request_stop(force=True))
            run.thread.join(timeout=30)
    assert not run.thread.is_alive() and not run.failure
    run.loop.close()
    assert worker.exit_code == 1
    [failed] = events.named("worker.service_failed")
    assert failed["service"] == "heartbeat" and "TypeError" in failed["traceback"]
    assert not events.named("worker.database_error", service="heartbeat")


# --- Database.call on its own ------------------------------------------------------------------


def test_an_error_that_keeps_repeating_backs_off_and_is_logged_only_as_it_doubles(
    database_url: str, events: Events
) -> None:
    tries: list[float] = []

    async def always_failing(conn: psycopg.AsyncConnection[Any]) -> None:
        tries.append(time.monotonic())
        await division_by_zero(conn)

    async def scenario() -> None:
        db = Database(database_url, WorkerConfig(), StopRequest())
        pool = await db.open()
        try:
            call = asyncio.ensure_future(db.call("claimer", always_failing))
            await asyncio.sleep(2.0)
            assert not call.done()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        finally:
            await pool.close()

    asyncio.run(scenario())
    # 0.1, 0.2, 0.4, 0.8 s apart at least: 5 tries in 2 s on an idle machine, never a spin.
    assert 2 <= len(tries) <= 5, len(tries)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(gap >= 0.095 * 2**i for i, gap in enumerate(gaps)), gaps
    logged = [e["failures"] for e in events.named("worker.database_error", service="claimer")]
    assert logged == [n for n in (1, 2, 4, 8) if n <= len(tries)]


def test_a_forced_stop_and_a_cancellation_end_a_backoff_at_once(
    database_url: str, events: Events, monkeypatch: Any
) -> None:
    from pgqueue.worker import database_errors

    monkeypatch.setattr(database_errors, "BACKOFF_FIRST", 5.0)  # the longest, from the start

    async def scenario() -> tuple[float, float]:
        stop = StopRequest()
        db = Database(database_url, WorkerConfig(), stop)
        pool = await db.open()
        try:
            call = asyncio.ensure_future(db.call("completer", division_by_zero))
            await asyncio.wait_for(_until(lambda: bool(events.seen)), 30)
            began = time.monotonic()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            cancelled_in = time.monotonic() - began

            call = asyncio.ensure_future(db.call("completer", division_by_zero))
            await asyncio.sleep(0.2)  # in its 5 s wait
            began = time.monotonic()
            stop.stopping = stop.force = True
            stop.requested.set()
            stop.forced.set()
            assert await asyncio.wait_for(call, 30) is None
            return cancelled_in, time.monotonic() - began
        finally:
            await pool.close()

    cancelled_in, forced_in = asyncio.run(scenario())
    assert cancelled_in < 2.5 and forced_in < 2.5, (cancelled_in, forced_in)


def test_a_bug_of_the_workers_own_is_not_retried(database_url: str, events: Events) -> None:
    calls = 0

    async def buggy(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal calls
        calls += 1
        raise AttributeError("'NoneType' object has no attribute 'lease'")

    async def scenario() -> None:
        db = Database(database_url, WorkerConfig(), StopRequest())
        pool = await db.open()
        try:
            with pytest.raises(AttributeError):
                await asyncio.wait_for(db.call("heartbeat", buggy), 30)
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert calls == 1 and not events.named("worker.database_error")


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)
