"""Progress reports (``ctx.set_progress``): stored on the task while its handler runs, seen
by a concurrent reader through the library, the CLI and the HTTP API before it completes,
coalesced, bounded, fenced by the lease, and kept after the task finishes.

Real workers run in this process (a thread with its own event loop); a handler waits on an
event the test sets once it has seen what it looks for, and every wait polls a condition
against a deadline. Writes are counted by a trigger on the test database's tasks table.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
from boundaries import Api, run_main

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.errors import ValidationError
from pgqueue.models import Lease
from pgqueue.progress import MAX_PROGRESS_BYTES, PROGRESS_INTERVAL, ProgressWriter, encode_progress
from pgqueue.queries.driver import run
from pgqueue.queries.leased import task_progress

DEADLINE = 60.0

COUNT_WRITES = """
CREATE TABLE progress_writes (task_id uuid NOT NULL, progress jsonb,
                              at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes (task_id, progress) VALUES (NEW.id, NEW.progress);
    RETURN NEW;
END $$;
CREATE TRIGGER count_progress_write AFTER UPDATE OF progress ON pgqueue.tasks
    FOR EACH ROW EXECUTE FUNCTION count_progress_write();
"""


def eventually(condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return value


class RunningWorker:
    """A real worker in a thread of this process, stopped gracefully at the end."""

    def __init__(self, database_url: str, registry: pgqueue.TaskRegistry) -> None:
        config = pgqueue.WorkerConfig(concurrency=2, poll_interval=0.1, queues=["default"])
        self.worker = pgqueue.Worker(registry, database_url, config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self.worker.run_async(),), daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.worker.request_stop)
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.loop.close()


@pytest.fixture
def start_worker(database_url: str) -> Iterator[Callable[[pgqueue.TaskRegistry], RunningWorker]]:
    started: list[RunningWorker] = []

    def start(registry: pgqueue.TaskRegistry) -> RunningWorker:
        started.append(RunningWorker(database_url, registry))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def writes(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> list[Any]:
    rows = conn.execute(
        "SELECT progress FROM progress_writes WHERE task_id = %s ORDER BY at", (task_id,)
    ).fetchall()
    return [r[0] for r in rows]


def final(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.Task:
    result: pgqueue.Task = eventually(
        lambda: (t := pgqueue.get_task(conn, task_id)).status.is_final and t,
        f"task {task_id} to finish",
    )
    return result


# --- what a reader sees ------------------------------------------------------------------------


def test_a_running_handlers_progress_is_seen_by_library_cli_and_http_before_it_completes(
    database_url: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    registry = pgqueue.TaskRegistry()
    go_on = threading.Event()

    @registry.handler("import_rows")
    def import_rows(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
        ctx.set_progress({"done": 40, "of": 100, "stage": "rows"})
        assert go_on.wait(DEADLINE)
        ctx.set_progress({"done": 100, "of": 100, "stage": "rows"})
        return "imported"

    task_id = pgqueue.enqueue(conn, "import_rows", {}).id
    start_worker(registry)
    api = Api(ApiSettings(database_url=database_url))
    try:
        seen = eventually(
            lambda: pgqueue.get_task(conn, task_id).progress, "the first report to be stored"
        )
        assert seen == {"done": 40, "of": 100, "stage": "rows"}
        assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.RUNNING

        table = run_main(database_url, "status", str(task_id))
        assert table.code == 0, table.stderr
        (line,) = [line for line in table.stdout.splitlines() if line.startswith("progress")]
        assert json.loads(line.partition(":")[2]) == seen  # jsonb's key order
        shown = json.loads(run_main(database_url, "--json", "status", str(task_id)).stdout)
        assert (shown["status"], shown["progress"]) == ("running", seen)

        body = api.request("GET", f"/api/v1/tasks/{task_id}").json()
        assert (body["status"], body["progress"]) == ("running", seen)
        listed = api.request("GET", "/api/v1/tasks?fields=summary").json()["items"]
        assert [t["progress"] for t in listed if t["task_id"] == str(task_id)] == [seen]

        go_on.set()
        # A waiter's Task carries the last report, written before the completion.
        waited = pgqueue.wait(conn, task_id, timeout=DEADLINE)
        assert (waited.status, waited.result) == (pgqueue.TaskStatus.COMPLETED, "imported")
        assert waited.progress == {"done": 100, "of": 100, "stage": "rows"}
        body = api.request("GET", f"/api/v1/tasks/{task_id}").json()
        assert body["progress"] == {"done": 100, "of": 100, "stage": "rows"}
    finally:
        go_on.set()  # whatever failed: the handler returns, the worker can stop
        api.close()


def test_a_task_without_reports_shows_no_progress(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "quiet", {}).id
    assert pgqueue.get_task(conn, task_id).progress is None
    table = run_main(database_url, "status", str(task_id))
    assert "progress" not in table.stdout
    assert (
        json.loads(run_main(database_url, "--json", "status", str(task_id)).stdout)["progress"]
        is None
    )


def test_the_readmes_function_task_reports_progress_and_a_waiter_reads_the_last(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    tasks = pgqueue.TaskRegistry()
    stored: list[Any] = []

    def read(file: str) -> list[int]:
        return list(range(250))

    def store(row: int) -> None:
        stored.append(row)

    @tasks.task()
    def import_rows(file: str, ctx: pgqueue.TaskContext) -> int:
        rows = read(file)
        for n, row in enumerate(rows, 1):
            store(row)
            ctx.set_progress({"done": n, "of": len(rows)})  # cheap: call it as often as you like
        return len(rows)

    task_id = import_rows.enqueue(conn, "rows.csv").id
    conn.commit()
    start_worker(tasks)
    task = pgqueue.wait(conn, task_id, timeout=DEADLINE)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, 250)
    assert task.progress == {"done": 250, "of": 250}


# --- coalescing ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reports_in_a_tight_loop_cost_at_most_two_writes_a_second_and_the_last_is_kept(
    kind: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    conn.execute(COUNT_WRITES)
    registry = pgqueue.TaskRegistry()
    calls: list[int] = []
    seconds: list[float] = []
    span = 1.6

    if kind == "sync":

        @registry.handler("busy")
        def busy(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
            began = time.monotonic()
            n = 0
            while time.monotonic() - began < span:
                n += 1
                ctx.set_progress({"n": n})
            calls.append(n)
            seconds.append(time.monotonic() - began)

    else:

        @registry.handler("busy")
        async def abusy(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
            began = time.monotonic()
            n = 0
            while time.monotonic() - began < span:
                n += 1
                ctx.set_progress({"n": n})
                if n % 100 == 0:
                    await asyncio.sleep(0)  # a real handler awaits its work now and then
            calls.append(n)
            seconds.append(time.monotonic() - began)

    task_id = pgqueue.enqueue(conn, "busy", {}).id
    start_worker(registry)
    task = final(conn, task_id)

    assert task.status is pgqueue.TaskStatus.COMPLETED
    (n,) = calls
    assert n > 1000  # a flood, had every report been written
    stored = writes(conn, task_id)
    # The first at once, then at most one per interval, and the last one at the end.
    assert 2 <= len(stored) <= 1 + math.ceil(seconds[0] / PROGRESS_INTERVAL) + 1, stored
    assert stored[-1] == {"n": n} == task.progress
    ns = [s["n"] for s in stored]
    assert ns == sorted(ns)  # never an older report over a newer one
    print(f"\n{kind}: {n} reports in {seconds[0]:.2f} s, {len(stored)} writes")


# --- kept on failure, retry and in the handler's transaction ---------------------------------


def test_the_last_report_before_a_failure_is_kept_on_the_dead_task(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    registry = pgqueue.TaskRegistry()

    @registry.handler("doomed", max_attempts=1)
    def doomed(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        ctx.set_progress({"step": 1})  # written at once
        ctx.set_progress({"step": 2})  # held back by the interval: the flush writes it
        raise ValueError("step 3 failed")

    task_id = pgqueue.enqueue(conn, "doomed", {}).id
    start_worker(registry)
    task = final(conn, task_id)
    assert task.status is pgqueue.TaskStatus.FAILED
    assert task.progress == {"step": 2}


def test_a_retry_keeps_the_last_attempts_report_until_the_next_attempt_reports(
    database_url: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    registry = pgqueue.TaskRegistry()
    seen_by_second_attempt: list[Any] = []

    @registry.handler("flaky", max_attempts=2)
    def flaky(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
        if ctx.attempt == 1:
            ctx.set_progress({"attempt": 1, "done": 7})
            raise pgqueue.Retry("try again", after=0)
        with psycopg.connect(payload["url"]) as own:
            seen_by_second_attempt.append(pgqueue.get_task(own, ctx.task_id).progress)
        ctx.set_progress({"attempt": 2, "done": 10})
        return "ok"

    task_id = pgqueue.enqueue(conn, "flaky", {"url": database_url}).id
    start_worker(registry)
    task = final(conn, task_id)
    assert (task.status, task.attempts) == (pgqueue.TaskStatus.COMPLETED, 2)
    assert seen_by_second_attempt == [{"attempt": 1, "done": 7}]
    assert task.progress == {"attempt": 2, "done": 10}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_last_report_commits_with_a_completion_written_in_the_handlers_transaction(
    kind: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    conn.execute("CREATE TABLE shipped (n int)")
    registry = pgqueue.TaskRegistry()

    if kind == "sync":

        @registry.handler("ship")
        def ship(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
            ctx.set_progress({"shipped": 0})
            ctx.connection.execute("INSERT INTO shipped VALUES (1)")
            ctx.set_progress({"shipped": 1})  # within the interval of the first
            return "done"

    else:

        @registry.handler("ship")
        async def aship(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
            ctx.set_progress({"shipped": 0})
            await (await ctx.aconnection()).execute("INSERT INTO shipped VALUES (1)")
            ctx.set_progress({"shipped": 1})
            return "done"

    task_id = pgqueue.enqueue(conn, "ship", {}).id
    start_worker(registry)
    task = final(conn, task_id)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "done")
    assert task.progress == {"shipped": 1}
    assert conn.execute("SELECT count(*) FROM shipped").fetchone() == (1,)


# --- bounds ----------------------------------------------------------------------------------


def test_an_oversized_or_non_object_report_raises_in_the_handler_and_leaves_the_stored_one(
    conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    registry = pgqueue.TaskRegistry()
    errors: list[str] = []

    @registry.handler("chatty")
    def chatty(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
        ctx.set_progress({"done": 1})
        for bad in ({"log": "x" * MAX_PROGRESS_BYTES}, ["not", "an", "object"], {"f": math.nan}):
            try:
                ctx.set_progress(bad)  # type: ignore[arg-type]
            except ValidationError as exc:
                errors.append(str(exc))
        return "fine"

    task_id = pgqueue.enqueue(conn, "chatty", {}).id
    start_worker(registry)
    task = final(conn, task_id)
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "fine")
    assert task.progress == {"done": 1}
    too_large, not_object, not_json = errors
    assert too_large.startswith("progress: is 4107 bytes as stored")
    assert f"the limit is {MAX_PROGRESS_BYTES} bytes" in too_large
    assert not_object == "progress: must be a JSON object (a dict), not list"
    assert not_json.startswith("progress: is not JSON-serialisable")


def test_a_report_at_the_bound_is_stored_and_one_byte_more_is_refused() -> None:
    filler = MAX_PROGRESS_BYTES - len('{"s": ""}')
    assert len(encode_progress({"s": "é" * (filler // 2)}).encode()) <= MAX_PROGRESS_BYTES
    assert len(encode_progress({"s": "x" * filler}).encode()) == MAX_PROGRESS_BYTES
    with pytest.raises(ValidationError, match="is 4097 bytes as stored"):
        encode_progress({"s": "x" * (filler + 1)})
    # Measured as PostgreSQL prints it: 1e300 takes 301 digits, not 5 characters.
    with pytest.raises(ValidationError, match="bytes as stored"):
        encode_progress({"n": [1e300] * 14})


# --- the lease -------------------------------------------------------------------------------


def test_a_report_under_a_lost_lease_writes_nothing_over_the_new_holders(
    conn: psycopg.Connection[Any],
) -> None:
    task_id = pgqueue.enqueue(conn, "moved", {}, max_attempts=3).id
    (first,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="old")
    assert run(conn, task_progress(first.lease, '{"by": "old"}')) is True
    pgqueue.release(conn, [first.lease])  # the old holder's lease ends here
    (second,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="new")
    assert run(conn, task_progress(second.lease, '{"by": "new"}')) is True

    assert run(conn, task_progress(first.lease, '{"by": "old, late"}')) is False
    assert pgqueue.get_task(conn, task_id).progress == {"by": "new"}

    pgqueue.complete(conn, second.lease, None)
    assert run(conn, task_progress(second.lease, '{"by": "new, after"}')) is False
    assert pgqueue.get_task(conn, task_id).progress == {"by": "new"}


def test_a_workers_writer_stops_writing_once_its_lease_is_refused(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(COUNT_WRITES)
    pgqueue.enqueue(conn, "moved", {})
    (task,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="old")
    stale = Lease(task.id, uuid.uuid4())  # a token the row does not hold

    async def report() -> ProgressWriter:
        pool = psycopg_pool.AsyncConnectionPool(database_url, min_size=1, open=False)
        await pool.open()

        async def get_pool() -> psycopg_pool.AsyncConnectionPool[Any]:
            return pool

        writer = ProgressWriter(stale, get_pool, asyncio.get_running_loop(), interval=0.01)
        try:
            writer.report('{"n": 1}')
            while not writer.refused:
                await asyncio.sleep(0.01)
            writer.report('{"n": 2}')
            await writer.flush()
        finally:
            await pool.close()
        return writer

    writer = asyncio.run(asyncio.wait_for(report(), 15))
    assert writer.refused and writer.writes == 1  # tried once; nothing after the refusal
    assert writes(conn, task.id) == []
    assert pgqueue.get_task(conn, task.id).progress is None


def test_many_tasks_reporting_at_once_borrow_at_most_two_connections_of_the_worker(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(COUNT_WRITES)
    pgqueue.enqueue_many(conn, [{"type": "busy", "payload": {"n": i}} for i in range(20)])
    claimed = pgqueue.claim(conn, ["default"], limit=20, worker_id="w")
    assert len(claimed) == 20

    async def report_all() -> dict[str, int]:
        # The handler pool as the worker makes it: as large as its concurrency.
        pool = psycopg_pool.AsyncConnectionPool(database_url, min_size=0, max_size=20, open=False)
        await pool.open()

        async def get_pool() -> psycopg_pool.AsyncConnectionPool[Any]:
            return pool

        loop = asyncio.get_running_loop()
        try:
            writers = [ProgressWriter(t.lease, get_pool, loop) for t in claimed]
            for w in writers:
                w.report('{"stage": "started"}')
            await asyncio.gather(*(w.flush() for w in writers))
            return dict(pool.get_stats())
        finally:
            await pool.close()

    stats = asyncio.run(asyncio.wait_for(report_all(), DEADLINE))
    assert stats["connections_num"] <= 2, stats  # not one per task
    assert sorted(
        r[0] for r in conn.execute("SELECT task_id FROM progress_writes").fetchall()
    ) == sorted(t.id for t in claimed)
