"""The queue while the database holds an old snapshot open. Open-loop 800 tasks/s of
~1 ms tasks to ONE worker process with 32 slots, 60 s clean, 180 s under pressure, 60 s after;
a table per 5-second window and a verdict against the targets.

    python -m bench.pinned_snapshot --pressure idle-xid
    python -m bench.pinned_snapshot --pressure all --pgqueue-tree /tmp/pgqueue-before
    python -m bench.pinned_snapshot --pressure rr-readers --warmup 10 --pressure-seconds 20 \
        --after 10 --rate 200                                 # a smoke of a minute

Why it is built this way:

* **What pins the snapshot.** While any transaction of this database holds a snapshot older
  than a row's deletion, vacuum may not remove that dead version, and btree entries pointing
  at it are never marked dead either. The claim walks ``tasks_claim_idx`` in (priority,
  created_at) order from the start, so under a pinned snapshot every claim walks past the
  index entries of every task claimed since the snapshot was taken. The pressures are the
  three ways production pins one: ``idle-xid`` (a session that ran ``BEGIN; SELECT
  txid_current();`` and went idle: a forgotten transaction), ``rr-readers`` (four sessions in
  one REPEATABLE READ transaction each, looping ``SELECT count(*) FROM pgqueue.tasks``: a
  report), and ``pg-dump`` (the real ``pg_dump`` of this database, holding 1,000,000 finished
  tasks, whose output is read at ``--dump-read-kbps`` so that its one snapshot stays open for
  the whole pressure, as a dump to a slow disk or network does). They all connect to the
  queue's own database: a snapshot in another database does not hold back this table's vacuum.
  ``none`` is the control: the same run with nothing pinned.
* **The readers pause between counts** (``--reader-pause``, 1 s): the snapshot is what pins
  vacuum, not the scanning, and on a 2-core machine four back-to-back sequential scans of a
  table that only grows would measure CPU starvation instead. Their CPU is reported apart.
* **Open loop** (bench.loadkit.LibraryProducer): task *i* is submitted at ``t0 + i/rate``
  whatever the queue does, one ``pgqueue.enqueue`` and commit each, so a slow queue shows up
  as a backlog and pickup latency, never as a lower load. "Offered" is what the producer
  actually got into the table per window (``created_at``), so a producer that could not keep
  the rate is visible rather than hidden in the ratio; the verdict says INCONCLUSIVE when
  the queue kept up with less than 95 % of the rate. The producer is ``--producer-processes``
  processes (2) of ``--producers`` threads (8) on one interleaved schedule: on two shared
  cores one process could not keep 800/s on schedule.
* **The task.** ``--task-work sleep`` (default) is bench.load_handlers' ``bench.sleep`` with
  ``--task-ms`` of ``await asyncio.sleep``: ~1 ms of waiting, and present in every pgqueue tree
  since the load benchmarks, so an older tree runs the very same handler. ``--task-work spin``
  burns ``--task-ms`` of CPU in a sync handler defined here (``pinned.spin``; the tree given to
  ``--pgqueue-tree`` then needs a copy of this file): 800/s of it is 0.8 of a core in one
  process, which a 2-core machine that also runs PostgreSQL and the producer may not have.
* **Which pgqueue is measured.** The worker is the real CLI, ``pgqueue worker --processes 1
  --concurrency 32``, started with ``PYTHONPATH`` and cwd set to ``--pgqueue-tree`` (default:
  this checkout), and the scratch database is migrated by that tree's own migrations, so a
  before/after comparison runs the same harness, load and measurements against two trees. The
  file the worker imports pgqueue from is printed, with the tree's commit.
* **Everything from the database's clock.** Windows are 5 s from the producer's start. Pickup
  is ``started_at - created_at`` (``started_at`` is the claim time of the task's latest
  attempt; tasks with more than one attempt are counted), per window by claim time; the
  verdict's pickup p99 is over the tasks *created* under pressure, each one not claimed by the
  end counting as its age then, so that a task submitted under pressure and claimed only after
  it still counts against the pressure. Completions are ``finished_at``; all of it is read once
  after the run, from the rows (no per-window query competes with the queue meanwhile).
* **Sampled every second:** the ready backlog, running tasks, the oldest cleanup horizon a
  client backend of this database holds (``age()`` of its ``backend_xmin`` or XID, in
  transactions, and in seconds: since the xid counter passed it, from the samples' own
  history of ``pg_current_snapshot()``, because ``now() - xact_start`` overstates it for a
  READ COMMITTED transaction that idled before its latest statement; with who holds it),
  dead tuples and vacuums of the table, the claim index's size, and CPU per component
  (bench.loadkit.CpuMeter: the worker, the queue's PostgreSQL backends, the pressure's
  backends and pg_dump, the whole server, the machine).
  The backlog count walks the same index the claims do: it is one such walk a second.
* **The verdict** is the targets, once the rate is known to have been offered:
  completions >= 90 % of offered in every window of the pressure (and over it), pickup p99
  < 1 s, the backlog bounded (its least-squares slope over the pressure adds less than one
  second of submits over the whole pressure; its peak reported), and recovery within 30 s:
  the end of the first window after the pressure from which on every window completes
  >= 90 % of offered with a backlog no higher than the clean phase's highest, or than 1/20 s
  of submits if that is higher (resolution: one window).
* **A shared machine.** The CPU other work uses is measured before each run (and the
  machine's busy cores per window are in the table); ``--quiet-below CORES`` waits, at most
  ``--quiet-wait`` seconds, for it to fall below that before a run starts.

Tables go to stdout, ending with one JSON line; progress to stderr. Every wait is bounded; the
worker, pg_dump and the pressure sessions are stopped in ``finally``; each run has a fresh
scratch database, dropped afterwards, on a private PostgreSQL started for the run (fsync and
synchronous_commit on, autovacuum on with the server's defaults: the machine's PostgreSQL 15
binaries when present, like the brief's server, else the embedded 18) unless ``--server-url``
names one. The exit code is 0 whatever the verdict, unless ``--strict``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg

import pgqueue
from bench.loadkit import (
    CONNECT_OPTIONS,
    CpuMeter,
    LibraryProducer,
    ProducerStats,
    descendants,
    exit_on_sigterm,
    fmt,
    idle_busy_cores,
    log_events,
    log_samples,
    machine_busy_seconds,
    md_table,
    payload_of,
    percentile,
    postgres_pids,
    private_server,
    progress,
    slope,
    stop_group,
    wait_for_workers,
    with_database,
    worker_command,
)

REPO = Path(__file__).resolve().parent.parent
PRESSURES = ("idle-xid", "rr-readers", "pg-dump", "none")
APP = "pinned-snapshot"  # application_name prefix of this harness's own sessions
PG15 = Path("/usr/lib/postgresql/15/bin")

# The handler for --task-work spin (the default, sleep, is bench.load_handlers' bench.sleep).
tasks = pgqueue.TaskRegistry()


@tasks.handler("pinned.spin")
def spin(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    """Burns ``ms`` milliseconds of CPU: work, not waiting."""
    end = time.perf_counter() + float(payload.get("ms", 1)) / 1000
    while time.perf_counter() < end:
        pass


# --- queries -------------------------------------------------------------------------------

SAMPLE_QUERY = """
SELECT extract(epoch FROM clock_timestamp())::float8,
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'queued' AND visible_after <= now()),
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'running'),
       (SELECT max(extract(epoch FROM clock_timestamp() - xact_start))::float8
          FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND backend_type = 'client backend'
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)),
       (SELECT max(greatest(age(backend_xmin), age(backend_xid))) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND backend_type = 'client backend'),
       array(SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()),
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgqueue.tasks'::regclass),
       (SELECT autovacuum_count + vacuum_count FROM pg_stat_user_tables
         WHERE relid = 'pgqueue.tasks'::regclass),
       pg_relation_size('pgqueue.tasks_claim_idx'),
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       (SELECT coalesce(application_name, '') || ' (' || coalesce(state, '') || '): '
               || left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 60)
          FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND backend_type = 'client backend'
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
         -- Every snapshot taken meanwhile has the holder's xid as its xmin too: of those
         -- tied, the one whose transaction began first is the holder.
         ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC, xact_start LIMIT 1)
"""

# Per window of --window seconds from t0 (the producer's start, database clock). Rows created
# before t0 - 1 s are the pre-filled finished tasks of pg-dump: not part of the run.
OFFERED_QUERY = """
SELECT greatest(0, floor((extract(epoch FROM created_at) - %(t0)s) / %(w)s))::int, count(*)
  FROM pgqueue.tasks WHERE created_at >= to_timestamp(%(t0)s - 1)
 GROUP BY 1 ORDER BY 1
"""

COMPLETED_QUERY = """
SELECT greatest(0, floor((extract(epoch FROM finished_at) - %(t0)s) / %(w)s))::int, count(*)
  FROM pgqueue.tasks
 WHERE created_at >= to_timestamp(%(t0)s - 1) AND status = 'completed'
 GROUP BY 1 ORDER BY 1
"""

PICKUP_QUERY = """
SELECT w, count(*),
       percentile_disc(0.5) WITHIN GROUP (ORDER BY d),
       percentile_disc(0.99) WITHIN GROUP (ORDER BY d),
       max(d)
  FROM (SELECT greatest(0, floor((extract(epoch FROM started_at) - %(t0)s) / %(w)s))::int AS w,
               extract(epoch FROM started_at - created_at)::float8 AS d
          FROM pgqueue.tasks
         WHERE created_at >= to_timestamp(%(t0)s - 1) AND started_at IS NOT NULL) AS x
 GROUP BY w ORDER BY w
"""

# Pickup of the tasks created in [lo, hi) (database epoch seconds); a task not claimed by
# %(end)s counts as its age then.
CREATED_PICKUP_QUERY = """
SELECT count(*), count(*) FILTER (WHERE started_at IS NULL),
       percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY d), max(d)
  FROM (SELECT started_at,
               extract(epoch FROM coalesce(started_at, to_timestamp(%(end)s)) - created_at)::float8
                   AS d
          FROM pgqueue.tasks
         WHERE created_at >= to_timestamp(%(lo)s) AND created_at < to_timestamp(%(hi)s)) AS x
"""

CLAIMED_PICKUP_QUERY = """
SELECT count(*), percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY d), max(d)
  FROM (SELECT extract(epoch FROM started_at - created_at)::float8 AS d
          FROM pgqueue.tasks
         WHERE created_at >= to_timestamp(%(t0)s - 1)
           AND started_at >= to_timestamp(%(lo)s) AND started_at < to_timestamp(%(hi)s)) AS x
"""

CHECK_QUERY = """
SELECT count(*),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE attempts > 1),
       count(*) FILTER (WHERE status <> 'completed')
  FROM pgqueue.tasks WHERE created_at >= to_timestamp(%(t0)s - 1)
"""

# The pre-filled finished tasks of pg-dump: what a day of a busy queue leaves behind, spread
# over the 12 hours before the fill (inside the default 24 h retention, so the worker's
# pruning leaves them alone), ids time-ordered like pgqueue's own, ~payload-bytes payloads.
FILL_QUERY = """
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, status, attempts, max_attempts,
                           visible_after, created_at, started_at, finished_at)
SELECT (lpad(to_hex((extract(epoch FROM c) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(i::text || random()::text), 1, 3) || '8'
        || substr(md5(random()::text || i::text), 1, 15))::uuid,
       'default', %(type)s,
       jsonb_build_object('sleep', 0.001, 'n', i, 'pad', repeat('x', %(pad)s)),
       1, 'completed', 1, 3, c, c, c + interval '4 ms', c + interval '6 ms'
  FROM (SELECT i, to_timestamp(%(end)s) - (%(rows)s - i) * %(step)s * interval '1 second' AS c
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i) AS g
"""


# --- the tree the worker comes from ---------------------------------------------------------


def tree_env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree))


def tree_python(tree: Path, code: str, timeout: float = 120) -> str:
    """Run ``code`` with the venv's Python in the tree's environment; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=tree_env(tree),
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"in {tree}: {code!r} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def describe_tree(tree: Path, registry: str) -> dict[str, str]:
    """Which pgqueue (file, version) and handler module a worker started in ``tree`` imports,
    and the tree's commit (and whether it has uncommitted changes)."""
    module = registry.split(":")[0]
    out = tree_python(
        tree,
        "import importlib, pgqueue; "
        f"m = importlib.import_module({module!r}); "
        "print(pgqueue.__file__); print(m.__file__); "
        "print(getattr(pgqueue, '__version__', '?'))",
    )
    pg_file, handlers_file, version = [*out.splitlines(), "?", "?", "?"][:3]
    commit = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        log = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if log.returncode == 0:
            commit = log.stdout.strip()[:90]
            changed = len(dirty.stdout.splitlines())
            if changed:
                commit += f" (+{changed} files changed, uncommitted)"
    return {
        "tree": str(tree),
        "pgqueue_file": pg_file,
        "handlers_file": handlers_file,
        "version": version,
        "commit": commit,
    }


@contextlib.contextmanager
def fresh_database(server_url: str, tree: Path) -> Iterator[tuple[str, str]]:
    """A new database migrated by ``tree``'s own migrations (its schema is the one its worker
    expects), dropped even if something still holds a connection to it. Yields (url, name)."""
    name = f"pgqueue_pinned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(server_url, name)
        tree_python(tree, f"from pgqueue import migrate; migrate.upgrade({url!r})")
        yield url, name
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def tree_process(
    command: list[str], log_path: Path, tree: Path, grace: float = 15.0
) -> Iterator[subprocess.Popen[bytes]]:
    """loadkit.process_group, but importing from ``tree``: its own session, killed with its
    whole group on the way out."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            env=tree_env(tree),
            cwd=tree,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_group(proc, signal.SIGTERM, grace)


# --- the pressures ---------------------------------------------------------------------------


def connect(url: str, role: str, **extra: Any) -> psycopg.Connection[Any]:
    options = dict(CONNECT_OPTIONS, **extra)
    return psycopg.connect(url, autocommit=True, application_name=f"{APP}-{role}", **options)


def db_now(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


class Pressure:
    """Something that pins a snapshot in the queue's database from ``start()`` to ``stop()``.

    ``backend_pids`` are its PostgreSQL backends (for the CPU table), ``process_pids`` any
    local process of its own (pg_dump). ``held_s`` is how long its oldest snapshot was open:
    from the holder's ``xact_start`` to the moment its transaction was seen gone."""

    name = "none"

    def __init__(self, url: str, args: argparse.Namespace, log_dir: Path) -> None:
        self.url = url
        self.args = args
        self.log_dir = log_dir
        self.backend_pids: list[int] = []
        self.started_db: float | None = None  # xact_start of the oldest holder
        self.ended_db: float | None = None
        self.notes: dict[str, Any] = {}

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def process_pids(self) -> list[int]:
        return []

    def describe(self) -> str:
        return "nothing: the control run"

    @property
    def held_s(self) -> float:
        if self.started_db is None or self.ended_db is None:
            return float("nan")
        return self.ended_db - self.started_db

    def _xact_start(self, conn: psycopg.Connection[Any]) -> float:
        row = conn.execute(
            "SELECT extract(epoch FROM min(xact_start))::float8 FROM pg_stat_activity"
            " WHERE pid = ANY(%s)",
            (self.backend_pids,),
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else db_now(conn)

    def _wait_gone(self, pids: list[int], timeout: float = 15) -> float:
        """Wait until none of ``pids`` has a transaction open; the database time then."""
        deadline = time.monotonic() + timeout
        with connect(self.url, "observer") as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
                    " AND xact_start IS NOT NULL",
                    (pids,),
                ).fetchone()
                if (row is not None and row[0] == 0) or time.monotonic() > deadline:
                    return db_now(conn)
                time.sleep(0.05)


class IdleXid(Pressure):
    name = "idle-xid"

    def __init__(self, url: str, args: argparse.Namespace, log_dir: Path) -> None:
        super().__init__(url, args, log_dir)
        self.conn: psycopg.Connection[Any] | None = None

    def describe(self) -> str:
        return "one session: `BEGIN; SELECT txid_current();` then idle in transaction"

    def start(self) -> None:
        self.conn = connect(self.url, "idle-xid")
        self.conn.execute("BEGIN")
        row = self.conn.execute("SELECT txid_current(), pg_backend_pid()").fetchone()
        assert row is not None
        self.notes["xid"] = int(row[0])
        self.backend_pids = [int(row[1])]
        with connect(self.url, "observer") as obs:
            self.started_db = self._xact_start(obs)

    def stop(self) -> None:
        if self.conn is None:
            return
        with contextlib.suppress(psycopg.Error):
            self.conn.execute("COMMIT")
        with contextlib.suppress(psycopg.Error):
            self.conn.close()
        self.conn = None
        self.ended_db = self._wait_gone(self.backend_pids)


class RRReaders(Pressure):
    name = "rr-readers"

    def __init__(self, url: str, args: argparse.Namespace, log_dir: Path) -> None:
        super().__init__(url, args, log_dir)
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.conns: list[psycopg.Connection[Any]] = []
        self.durations: list[float] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def describe(self) -> str:
        return (
            f"{self.args.readers} sessions, each `BEGIN ISOLATION LEVEL REPEATABLE READ` then "
            f"`SELECT count(*) FROM pgqueue.tasks` in a loop in that one transaction "
            f"({self.args.reader_pause:g} s pause between counts)"
        )

    def start(self) -> None:
        ready = threading.Barrier(self.args.readers + 1, timeout=30)
        for k in range(self.args.readers):
            conn = connect(self.url, f"rr-reader-{k}", options="-c statement_timeout=0")
            self.conns.append(conn)
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            self.backend_pids.append(int(row[0]))
            thread = threading.Thread(target=self._loop, args=(conn, ready), daemon=True)
            thread.start()
            self.threads.append(thread)
        ready.wait()
        with connect(self.url, "observer") as obs:
            self.started_db = self._xact_start(obs)

    def _loop(self, conn: psycopg.Connection[Any], ready: threading.Barrier) -> None:
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            first = True
            while not self.stop_event.is_set():
                began = time.perf_counter()
                conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
                with self.lock:
                    self.durations.append(time.perf_counter() - began)
                if first:
                    first = False
                    ready.wait()
                self.stop_event.wait(self.args.reader_pause)
            conn.execute("COMMIT")
        except (psycopg.Error, threading.BrokenBarrierError) as exc:
            with self.lock:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def stop(self) -> None:
        if not self.threads:
            return
        self.stop_event.set()
        for thread in self.threads:
            thread.join(60)
        for conn in self.conns:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self.ended_db = self._wait_gone(self.backend_pids)
        self.threads = []
        d = self.durations
        self.notes.update(
            counts=len(d),
            count_s_first=round(d[0], 3) if d else None,
            count_s_mean=round(sum(d) / len(d), 3) if d else None,
            count_s_max=round(max(d), 3) if d else None,
            count_s_last=round(d[-1], 3) if d else None,
            errors=self.errors[:3],
        )


class PgDump(Pressure):
    name = "pg-dump"

    def __init__(self, url: str, args: argparse.Namespace, log_dir: Path) -> None:
        super().__init__(url, args, log_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.bytes_read = 0
        self.eof_at: float | None = None  # time.time() when its output ended by itself
        self.stderr_path = log_dir / "pg_dump.stderr"

    def describe(self) -> str:
        return (
            f"`{self.args.pg_dump} --format=plain` of the queue's database (holding "
            f"{self.args.dump_rows:,} finished tasks), its output read at "
            f"{self.args.dump_read_kbps:g} KB/s"
        )

    def process_pids(self) -> list[int]:
        return descendants(self.proc.pid) if self.proc is not None else []

    def start(self) -> None:
        command = [self.args.pg_dump, "--dbname", self.url, "--format=plain", "--no-owner"]
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env=dict(os.environ, PGAPPNAME=f"{APP}-pg_dump"),
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        # Its backend, once its transaction (and so its snapshot) is open.
        deadline = time.monotonic() + 30
        with connect(self.url, "observer") as obs:
            while True:
                row = obs.execute(
                    "SELECT pid, extract(epoch FROM xact_start)::float8 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s"
                    " AND backend_xmin IS NOT NULL",
                    (f"{APP}-pg_dump",),
                ).fetchone()
                if row is not None:
                    self.backend_pids = [int(row[0])]
                    self.started_db = float(row[1])
                    return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pg_dump did not open its transaction (exit {self.proc.poll()}): "
                        + self.stderr_path.read_text(errors="replace")[-1000:]
                    )
                time.sleep(0.05)

    def _read(self) -> None:
        """Read pg_dump's output at --dump-read-kbps: it blocks on a full pipe meanwhile,
        inside its one transaction."""
        assert self.proc is not None and self.proc.stdout is not None
        rate = self.args.dump_read_kbps * 1024
        began = time.monotonic()
        out = self.proc.stdout
        with contextlib.suppress(OSError, ValueError):
            while not self.stop_event.is_set():
                chunk = out.read1(16384)
                if not chunk:
                    self.eof_at = time.time()
                    return
                self.bytes_read += len(chunk)
                self.stop_event.wait(max(0.0, began + self.bytes_read / rate - time.monotonic()))

    def stop(self) -> None:
        if self.proc is None:
            return
        finished = self.proc.poll() is not None or self.eof_at is not None
        if not finished:
            # The pressure ends with the dump's snapshot: end its session, then pg_dump.
            with connect(self.url, "observer") as obs:
                obs.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                            (self.backend_pids,))  # fmt: skip
        self.stop_event.set()
        ended = self._wait_gone(self.backend_pids)
        if finished and self.eof_at is not None:
            ended = min(ended, self.eof_at)
        self.ended_db = ended
        stop_group(self.proc, signal.SIGTERM, 5)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        if self.reader is not None:
            self.reader.join(10)
        self.notes.update(
            finished_by_itself=finished,
            exit_code=self.proc.returncode,
            bytes_read=self.bytes_read,
            stderr_tail=self.stderr_path.read_text(errors="replace")[-300:].strip(),
        )
        self.proc = None


def make_pressure(name: str, url: str, args: argparse.Namespace, log_dir: Path) -> Pressure:
    kinds: dict[str, type[Pressure]] = {
        "idle-xid": IdleXid,
        "rr-readers": RRReaders,
        "pg-dump": PgDump,
        "none": Pressure,
    }
    return kinds[name](url, args, log_dir)


# --- the producer ----------------------------------------------------------------------------


class _ScheduledProducer(LibraryProducer):
    """loadkit's LibraryProducer, started at a given monotonic ``t0`` (one clock for every
    process on the machine) instead of "now": the processes of a ProducerPool share one
    schedule."""

    def start_at(self, t0: float) -> None:
        self.stats.started = t0
        for k in range(self.threads):
            thread = threading.Thread(target=self._run, args=(k, t0), daemon=True)
            thread.start()
            self._threads.append(thread)


def _producer_process(
    spec: dict[str, Any], t0: Any, go: Any, stop: Any, ok: Any, results: Any
) -> None:
    """One producer process: its share of the schedule, its count in ``ok`` as it goes, its
    figures on ``results`` at the end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when it stops
    producer = _ScheduledProducer(
        spec["url"], rate=spec["rate"], duration=spec["duration"],
        task_type=spec["task_type"], payload=spec["payload"], threads=spec["threads"],
    )  # fmt: skip
    go.wait(60)
    cpu0 = time.process_time()
    producer.start_at(t0.value + spec["offset"])
    while producer.running():
        ok.value = producer.stats.ok
        if stop.wait(0.5):
            producer.stop_event.set()  # behind its schedule at the end: stop, report
    producer.join(15)
    st = producer.stats
    ok.value = st.ok
    results.put(
        {
            "target": st.target,
            "ok": st.ok,
            "errors": st.errors,
            "lateness": st.lateness,
            "cpu_seconds": time.process_time() - cpu0,
        }
    )


class ProducerPool:
    """``processes`` producer processes, each a LibraryProducer of ``threads`` threads at
    ``rate / processes``, their schedules interleaved (process j's task i at
    ``t0 + (i * processes + j) / rate``): one open-loop schedule of ``rate``.

    Why processes: on 2 cores that other work also uses, one Python process with many
    threads gets too little CPU and GIL time to keep 800 submits/s on schedule (seen: 400 to
    650/s offered, seconds late) although the queue kept up with whatever it was offered."""

    def __init__(self, spec: dict[str, Any], processes: int) -> None:
        import multiprocessing

        self.ctx = multiprocessing.get_context("spawn")
        self.processes = processes
        self.rate = spec["rate"]
        self.t0 = self.ctx.Value("d", 0.0)
        self.go = self.ctx.Event()
        self.stop_event = self.ctx.Event()
        self.results = self.ctx.Queue()
        self.counts = [self.ctx.Value("q", 0) for _ in range(processes)]
        self.procs = []
        for j in range(processes):
            share = dict(spec, rate=spec["rate"] / processes, offset=j / spec["rate"])
            proc = self.ctx.Process(
                target=_producer_process,
                args=(share, self.t0, self.go, self.stop_event, self.counts[j], self.results),
                daemon=True,
            )
            self.procs.append(proc)
        self.stats = ProducerStats(target=int(spec["rate"] / processes * spec["duration"]))
        self.stats.target *= processes
        self.started = 0.0

    def start(self) -> float:
        """Start the processes (bounded), then their common schedule; returns its t0."""
        for proc in self.procs:
            proc.start()
        # Every child imports this module (spawn): give them time before the schedule.
        time.sleep(2.0)
        self.started = time.monotonic() + 0.5
        self.t0.value = self.started
        self.go.set()
        return self.started

    @property
    def ok(self) -> int:
        return sum(int(c.value) for c in self.counts)

    def join(self, timeout: float) -> bool:
        """Wait for the schedule to end; after ``timeout`` s tell the processes to stop where
        they are (a producer behind its schedule) and collect what they did. True if they all
        finished their schedule in time."""
        deadline = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        in_time = True
        while len(got) < self.processes:
            if time.monotonic() > deadline:
                if not in_time:
                    break
                in_time = False
                self.stop_event.set()
                deadline = time.monotonic() + 30
            with contextlib.suppress(Exception):
                got.append(self.results.get(timeout=1))
        for proc in self.procs:
            proc.join(5)
        self.stop()
        st = self.stats
        st.ok = sum(r["ok"] for r in got)
        for r in got:
            for kind, n in r["errors"].items():
                st.errors[kind] = st.errors.get(kind, 0) + n
            st.lateness.extend(r["lateness"])
        st.cpu_seconds = sum(r["cpu_seconds"] for r in got)
        return in_time and len(got) == self.processes

    def stop(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


# --- the pre-fill ---------------------------------------------------------------------------


def fill_finished(url: str, rows: int, payload_bytes: int, task_type: str) -> dict[str, Any]:
    """``rows`` completed tasks in one INSERT ... SELECT generate_series per 100,000, then
    VACUUM (ANALYZE) and a CHECKPOINT so that the run starts from a settled table."""
    began = time.monotonic()
    batch = 100_000
    pad = max(0, payload_bytes - 45)
    with connect(url, "fill", options="-c statement_timeout=0") as conn:
        end = db_now(conn) - 60
        for lo in range(1, rows + 1, batch):
            hi = min(rows, lo + batch - 1)
            conn.execute(
                FILL_QUERY,
                {
                    "type": task_type, "pad": pad, "end": end, "rows": rows,
                    "step": 12 * 3600 / rows, "lo": lo, "hi": hi,
                },
            )  # fmt: skip
            progress(f"  filled {hi:,} of {rows:,} finished tasks")
        conn.execute("VACUUM (ANALYZE) pgqueue.tasks")
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT pg_total_relation_size('pgqueue.tasks'), pg_relation_size('pgqueue.tasks')"
        ).fetchone()
        assert row is not None
    return {
        "rows": rows,
        "seconds": round(time.monotonic() - began, 1),
        "table_mb": round(row[1] / 2**20),
        "with_indexes_mb": round(row[0] / 2**20),
    }


# --- one run -----------------------------------------------------------------------------------


def nan_if_none(value: Any) -> float:
    return float("nan") if value is None else float(value)


def wait_quiet(args: argparse.Namespace, label: str) -> float:
    """The cores other work uses now; with --quiet-below, first wait (at most --quiet-wait
    seconds) until that is below it."""
    idle = idle_busy_cores()
    deadline = time.monotonic() + args.quiet_wait
    while args.quiet_below and idle >= args.quiet_below and time.monotonic() < deadline:
        progress(f"[{label}] other work uses {idle} cores; waiting for < {args.quiet_below}")
        time.sleep(10)
        idle = idle_busy_cores()
    return idle


def server_pids(conn: psycopg.Connection[Any]) -> Callable[[], list[int]]:
    """Every process of the server the queue is on (postmaster and its children), when its
    data directory is readable here; else every PostgreSQL process on the machine (which
    then counts other servers too, such as a shared one other people's tests use)."""
    with contextlib.suppress(psycopg.Error, OSError, ValueError, IndexError):
        row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        postmaster = int(Path(row[0], "postmaster.pid").read_text().splitlines()[0])
        if psutil.pid_exists(postmaster):
            return lambda: descendants(postmaster)
    return postgres_pids


def run_one(
    args: argparse.Namespace, server_url: str, pressure_name: str, tree_info: dict[str, str]
) -> dict[str, Any]:
    tree = Path(args.pgqueue_tree)
    w = args.window
    total = args.warmup + args.pressure_seconds + args.after
    if args.task_work == "spin":
        task_type, payload = "pinned.spin", payload_of(args.payload_bytes, ms=args.task_ms)
    else:
        task_type = "bench.sleep"
        payload = payload_of(args.payload_bytes, sleep=args.task_ms / 1000)
    command = worker_command(
        "URL", processes=args.processes, concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
    )  # fmt: skip
    command[command.index("bench.load_handlers:tasks")] = args.registry

    with (
        tempfile.TemporaryDirectory(prefix="pgqueue-pinned-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        url, database = stack.enter_context(fresh_database(server_url, tree))
        command[command.index("URL")] = url
        progress(f"[{pressure_name}] scratch database {database}, migrated by {tree}")
        fill: dict[str, Any] | None = None
        if pressure_name == "pg-dump":
            progress(f"[{pressure_name}] filling {args.dump_rows:,} finished tasks")
            fill = fill_finished(url, args.dump_rows, args.payload_bytes, task_type)
            progress(f"[{pressure_name}] filled: {fill}")
        idle = wait_quiet(args, pressure_name)
        worker_log = Path(tmp, "worker.log")
        worker = stack.enter_context(tree_process(command, worker_log, tree))
        startup = wait_for_workers(url, database, args.processes, worker)
        progress(f"[{pressure_name}] worker listening after {startup:.1f} s; other load {idle}")

        pressure = make_pressure(pressure_name, url, args, Path(tmp))
        stack.callback(pressure.stop)
        sampler = stack.enter_context(connect(url, "sampler"))
        db_pids: list[int] = []

        def queue_backends() -> list[int]:
            return [p for p in db_pids if p not in pressure.backend_pids]

        def pressure_pids() -> list[int]:
            return [*pressure.backend_pids, *pressure.process_pids()]

        cpu = CpuMeter(
            {
                "worker": lambda: descendants(worker.pid),
                "queue_db": queue_backends,
                "pressure": pressure_pids,
                "postgres_all": server_pids(sampler),
            }
        )
        spec = {"url": url, "rate": args.rate, "duration": total, "task_type": task_type,
                "payload": payload, "threads": args.producers}  # fmt: skip
        producer = ProducerPool(spec, args.producer_processes)
        stack.callback(producer.stop)
        samples: list[dict[str, Any]] = []

        holders: dict[str, float] = {}

        def horizon_age(db: float, next_xid: int, xmin_age: int, xact_age: float) -> float:
            """Seconds since the xid counter passed the oldest horizon (next xid minus its
            age in xids), from the samples' history: how old the cleanup horizon is, which
            ``now() - xact_start`` is not for a READ COMMITTED transaction that idled before
            its latest statement. Before the first sample: the transaction's age."""
            horizon = next_xid - xmin_age
            if not samples or samples[0]["next_xid"] > horizon:
                return xact_age
            passed = next((x for x in samples if x["next_xid"] > horizon), None)
            return max(0.0, db - passed["db"]) if passed is not None else 0.0

        def sample(k: int) -> dict[str, Any]:
            row = sampler.execute(SAMPLE_QUERY).fetchone()
            assert row is not None
            db_pids[:] = row[5]
            cpu.sample()
            age_s = horizon_age(row[0], row[9], row[4] or 0, row[3] or 0.0)
            if row[10] and age_s >= 1.0:
                holders[row[10]] = max(holders.get(row[10], 0.0), age_s)
            s = {
                "k": k,
                "mono": time.monotonic(),
                "db": row[0],
                "ready": row[1],
                "running": row[2],
                "snapshot_s": age_s,
                "xact_s": row[3] or 0.0,
                "xmin_age": row[4] or 0,
                "next_xid": row[9],
                "dead": row[6],
                "vacuums": row[7],
                "claim_idx_mb": row[8] / 2**20,
                "cpu": cpu.seconds(),
                "machine": machine_busy_seconds(),
            }
            samples.append(s)
            return s

        cpu.start()
        bench_cpu0 = time.process_time()
        t0m = producer.start()
        offset = db_now(sampler) - time.monotonic()
        t0 = t0m + offset  # the producer's start on the database's clock
        progress(
            f"[{pressure_name}] {args.rate:g}/s for {total:g} s: {args.warmup:g} s clean, "
            f"{args.pressure_seconds:g} s {pressure_name}, {args.after:g} s after"
        )
        pressure_at = (args.warmup, args.warmup + args.pressure_seconds)
        phase_db: dict[str, float] = {}
        for k in range(int(total) + 1):
            delay = t0m + k - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if k == pressure_at[0] and pressure_name != "none":
                pressure.start()
                progress(f"[{pressure_name}] pressure on: {pressure.describe()}")
            if k == pressure_at[1] and pressure_name != "none":
                pressure.stop()
                progress(f"[{pressure_name}] pressure off: snapshot held {pressure.held_s:.1f} s")
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}: see its log")
            s = sample(k)
            if k in pressure_at:
                phase_db["pressure_on" if k == pressure_at[0] else "pressure_off"] = s["db"]
            if k % 5 == 0:
                progress(
                    f"[{pressure_name}] t={k:>3}s submitted={producer.ok:>7} "
                    f"ready={s['ready']:>6} running={s['running']:>3} "
                    f"oldest snapshot={s['snapshot_s']:6.1f}s dead={s['dead']:>7} "
                    f"claim idx={s['claim_idx_mb']:.1f} MB"
                )
        finished_in_time = producer.join(10)
        # The last tasks' completions (bounded: after a collapse the backlog may be large).
        drain_deadline = time.monotonic() + 10
        while time.monotonic() < drain_deadline:
            s = sample(len(samples))
            if s["ready"] == 0 and s["running"] == 0:
                break
            time.sleep(0.5)
        cpu.stop()
        bench_cpu = time.process_time() - bench_cpu0
        pressure.stop()
        end_db = db_now(sampler)
        stop_group(worker, signal.SIGTERM, 15)
        progress(f"[{pressure_name}] load done; reading the windows from the database")

        params = {"t0": t0, "w": w}
        offered = dict(sampler.execute(OFFERED_QUERY, params).fetchall())
        completed = dict(sampler.execute(COMPLETED_QUERY, params).fetchall())
        pickups = {r[0]: r[1:] for r in sampler.execute(PICKUP_QUERY, params).fetchall()}
        lo, hi = t0 + pressure_at[0], t0 + pressure_at[1]
        created = sampler.execute(
            CREATED_PICKUP_QUERY, {"lo": lo, "hi": hi, "end": end_db}
        ).fetchone()
        claimed = sampler.execute(CLAIMED_PICKUP_QUERY, {"t0": t0, "lo": lo, "hi": hi}).fetchone()
        check = sampler.execute(CHECK_QUERY, params).fetchone()
        settings = dict(
            sampler.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN"
                " ('server_version', 'fsync', 'synchronous_commit', 'autovacuum',"
                " 'autovacuum_naptime', 'shared_buffers', 'max_connections')"
            ).fetchall()
        )
        events = log_events(worker_log)
        event_lines = log_samples(worker_log)

    # --- figures -------------------------------------------------------------------------------
    assert created is not None and claimed is not None and check is not None
    nwin = int(total // w)

    def phase_of(start: float) -> str:
        if start < pressure_at[0]:
            return "clean"
        if start < pressure_at[1]:
            return "pressure"
        return "after"

    def at_tick(k: int) -> dict[str, Any]:
        return min((s for s in samples if s["k"] >= k), key=lambda s: s["k"], default=samples[-1])

    windows: list[dict[str, Any]] = []
    for i in range(nwin):
        start, stop = i * w, (i + 1) * w
        in_w = [s for s in samples if start < s["k"] <= stop]
        a, b = at_tick(int(start)), at_tick(int(stop))
        span = max(b["mono"] - a["mono"], 1e-9)
        pick = pickups.get(i, (0, None, None, None))
        done = completed.get(i, 0)
        cpu_d = {name: b["cpu"][name] - a["cpu"][name] for name in b["cpu"]}
        windows.append(
            {
                "window": f"{start:g}-{stop:g}",
                "phase": phase_of(start),
                "offered": offered.get(i, 0) / w,
                "completed": done / w,
                "backlog": in_w[-1]["ready"] if in_w else 0,
                "backlog_max": max((s["ready"] for s in in_w), default=0),
                "pickups": pick[0],
                "p50_ms": nan_if_none(pick[1]) * 1000,
                "p99_ms": nan_if_none(pick[2]) * 1000,
                "max_ms": nan_if_none(pick[3]) * 1000,
                "snapshot_s": max((s["snapshot_s"] for s in in_w), default=0.0),
                "xmin_age": max((s["xmin_age"] for s in in_w), default=0),
                "dead": in_w[-1]["dead"] if in_w else 0,
                "vacuums": (b["vacuums"] or 0) - (a["vacuums"] or 0),
                "claim_idx_mb": in_w[-1]["claim_idx_mb"] if in_w else 0.0,
                "worker_cores": cpu_d["worker"] / span,
                "db_cores": cpu_d["queue_db"] / span,
                "pressure_cores": cpu_d["pressure"] / span,
                "machine_cores": (b["machine"] - a["machine"]) / span,
                "db_ms_per_task": 1000 * cpu_d["queue_db"] / done if done else float("nan"),
            }
        )

    def phase_figures(phase: str) -> dict[str, Any]:
        ws = [x for x in windows if x["phase"] == phase]
        ks = [s for s in samples if phase_of(s["k"] - 1e-9) == phase and s["k"] > 0]
        if phase == "after":
            ks = [s for s in ks if s["k"] <= total]
        n = max(len(ws), 1)
        off = sum(x["offered"] for x in ws) / n
        comp = sum(x["completed"] for x in ws) / n
        first, last = (at_tick(int(ks[0]["k"] - 1)), ks[-1]) if ks else (samples[0], samples[0])
        span = max(last["mono"] - first["mono"], 1e-9)
        cores = {name: (last["cpu"][name] - first["cpu"][name]) / span for name in last["cpu"]}
        cores["machine"] = (last["machine"] - first["machine"]) / span
        return {
            "offered_per_s": round(off, 1),
            "completed_per_s": round(comp, 1),
            "completed_pct": round(100 * comp / off, 1) if off else float("nan"),
            "min_window_pct": round(
                min(
                    (100 * x["completed"] / x["offered"] for x in ws if x["offered"]),
                    default=float("nan"),
                ),
                1,
            ),
            "backlog_max": max((s["ready"] for s in ks), default=0),
            "backlog_slope_per_s": round(slope([(s["k"], float(s["ready"])) for s in ks]), 3),
            "snapshot_s_max": round(max((s["snapshot_s"] for s in ks), default=0.0), 1),
            "dead_max": max((s["dead"] or 0 for s in ks), default=0),
            "claim_idx_mb_max": round(max((s["claim_idx_mb"] for s in ks), default=0.0), 1),
            "cores": {k: round(v, 2) for k, v in cores.items()},
        }

    phases = {p: phase_figures(p) for p in ("clean", "pressure", "after")}
    pres = phases["pressure"]
    # Back to "clean" means a backlog no higher than the clean phase's peak, or than 1/20 s of
    # submits if that is higher: a clean peak of 3 tasks against 5 is noise, not a backlog.
    clean_backlog_max = max(phases["clean"]["backlog_max"], int(args.rate / 20))

    # The verdict.
    pressure_windows = [x for x in windows if x["phase"] == "pressure"]
    low = [x["window"] for x in pressure_windows if x["completed"] < 0.9 * x["offered"]]
    n_created, n_unclaimed, created_pcts, created_max = created
    created_pcts = created_pcts or [None, None]
    n_claimed, claimed_pcts, claimed_max = claimed
    claimed_pcts = claimed_pcts or [None, None]
    p99_created = nan_if_none(created_pcts[1])
    p99_claimed = nan_if_none(claimed_pcts[1])
    p99_ok = p99_created < 1.0 and p99_claimed < 1.0
    growth = pres["backlog_slope_per_s"] * args.pressure_seconds
    bounded = growth <= args.rate  # the fitted line adds less than 1 s of submits
    after_windows = [x for x in windows if x["phase"] == "after"]

    def good(x: dict[str, Any]) -> bool:
        return x["completed"] >= 0.9 * x["offered"] and x["backlog_max"] <= clean_backlog_max

    recovered_s: float | None = None
    for i in range(len(after_windows)):
        if all(good(x) for x in after_windows[i:]):
            recovered_s = (i + 1) * w
            break
    recovery_ok = recovered_s is not None and recovered_s <= 30
    criteria = [
        (
            "completed >= 90 % of offered in every pressure window",
            not low and bool(pressure_windows),
            f"lowest window {pres['min_window_pct']} %, over the pressure "
            f"{pres['completed_pct']} % ({pres['completed_per_s']}/s of "
            f"{pres['offered_per_s']}/s)"
            + (f"; below 90 %: {len(low)} windows ({', '.join(low[:4])}...)" if low else ""),
        ),
        (
            "pickup p99 < 1 s under pressure",
            p99_ok,
            f"tasks created under pressure: p99 {fmt(p99_created)} s (max {fmt(created_max)} s, "
            f"{n_created:,} tasks, {n_unclaimed:,} never claimed); tasks claimed under "
            f"pressure: p99 {fmt(p99_claimed)} s (max {fmt(claimed_max)} s)",
        ),
        (
            "backlog bounded over the pressure",
            bounded,
            f"slope {pres['backlog_slope_per_s']} tasks/s (adds {growth:,.0f} tasks over "
            f"{args.pressure_seconds:g} s; bound: 1 s of submits, {args.rate:,.0f}); peak "
            f"{pres['backlog_max']:,} (clean phase peak {phases['clean']['backlog_max']:,})",
        ),
        (
            "recovered within 30 s of the pressure's end",
            recovery_ok,
            (
                f"after {recovered_s:g} s (first window from which every window completes "
                f">= 90 % of offered with backlog <= {clean_backlog_max:,})"
                if recovered_s is not None
                else f"not within the {args.after:g} s after; backlog at the end "
                f"{after_windows[-1]['backlog'] if after_windows else '?'}"
            ),
        ),
    ]
    short = {
        name: f["offered_per_s"]
        for name, f in phases.items()
        if f["offered_per_s"] < 0.95 * args.rate
    }
    criteria.insert(
        0,
        (
            f"the load was offered: >= 95 % of {args.rate:g}/s in every phase",
            not short,
            "offered /s: "
            + ", ".join(f"{name} {f['offered_per_s']}" for name, f in phases.items())
            + (" (the producer could not keep the schedule)" if short else ""),
        ),
    )
    queue_ok = all(ok for _, ok, _ in criteria[1:])
    verdict = "FAIL" if not queue_ok else "PASS" if not short else "INCONCLUSIVE"
    clean = phases["clean"]
    notes: list[str] = []
    if clean["completed_per_s"] < 0.9 * args.rate:
        notes.append(
            f"the clean phase itself reached only {clean['completed_per_s']}/s of the "
            f"{args.rate:g}/s asked (offered {clean['offered_per_s']}/s; machine "
            f"{clean['cores']['machine']} cores busy of {os.cpu_count()})"
        )
    if clean["offered_per_s"] < 0.98 * args.rate:
        notes.append(
            f"the producer offered only {clean['offered_per_s']}/s clean of {args.rate:g}/s"
        )
    if pressure_name != "none" and pressure.held_s < args.pressure_seconds - 2:
        notes.append(
            f"the pressure's snapshot was held only {pressure.held_s:.1f} s of "
            f"{args.pressure_seconds:g} s"
        )
    p = producer.stats
    rows_total, rows_completed, retried, unfinished = check

    # --- output -----------------------------------------------------------------------------------
    print(
        f"\n## Pinned snapshot: {pressure_name} — {args.rate:g} tasks/s offered, "
        f"{args.warmup:g} s clean, {args.pressure_seconds:g} s under pressure, "
        f"{args.after:g} s after\n"
    )
    print(f"Pressure: {pressure.describe()}.")
    print(
        f"Worker: `pgqueue worker {args.registry} --processes {args.processes} --concurrency "
        f"{args.concurrency} --lease-seconds {args.lease_seconds:g}`, pgqueue from "
        f"{tree_info['pgqueue_file']} (version {tree_info['version']}, tree {tree_info['tree']}"
        f" at {tree_info['commit']}); handlers {tree_info['handlers_file']}."
    )
    print(
        f"Task: `{task_type}`, {args.task_ms:g} ms of "
        f"{'CPU' if args.task_work == 'spin' else 'asyncio.sleep'}, {args.payload_bytes} B "
        f"payload; producer: {args.producer_processes} processes x {args.producers} threads, "
        "`pgqueue.enqueue` + commit each, open "
        f"loop. Server: {settings}. Other load on the machine before the run: {idle} cores of "
        f"{os.cpu_count()}."
    )
    if fill is not None:
        print(
            f"Pre-filled: {fill['rows']:,} completed tasks in {fill['seconds']} s (table "
            f"{fill['table_mb']} MB, {fill['with_indexes_mb']} MB with indexes)."
        )
    print()
    print(
        md_table(
            [
                "window s",
                "phase",
                "offered /s",
                "completed /s",
                "backlog",
                "backlog max",
                "pickups",
                "pickup p50 ms",
                "p99 ms",
                "max ms",
                "oldest snapshot s",
                "xmin age",
                "dead tuples",
                "vacuums",
                "claim idx MB",
                "worker cores",
                "queue DB cores",
                "DB CPU ms/task",
                "pressure cores",
                "machine cores",
            ],
            [
                [
                    x["window"],
                    x["phase"],
                    x["offered"],
                    x["completed"],
                    x["backlog"],
                    x["backlog_max"],
                    x["pickups"],
                    round(x["p50_ms"], 1),
                    round(x["p99_ms"], 1),
                    round(x["max_ms"], 1),
                    round(x["snapshot_s"], 1),
                    x["xmin_age"],
                    x["dead"],
                    x["vacuums"],
                    round(x["claim_idx_mb"], 2),
                    x["worker_cores"],
                    x["db_cores"],
                    x["db_ms_per_task"],
                    x["pressure_cores"],
                    x["machine_cores"],
                ]
                for x in windows
            ],
        )
    )
    print()
    print(
        md_table(
            [
                "phase",
                "offered /s",
                "completed /s",
                "% of offered",
                "lowest window %",
                "backlog peak",
                "backlog slope /s",
                "oldest snapshot s",
                "dead tuples peak",
                "claim idx MB peak",
                "worker cores",
                "queue DB cores",
                "pressure cores",
                "PostgreSQL server cores",
                "machine cores",
            ],
            [
                [
                    name,
                    f["offered_per_s"],
                    f["completed_per_s"],
                    f["completed_pct"],
                    f["min_window_pct"],
                    f["backlog_max"],
                    f["backlog_slope_per_s"],
                    f["snapshot_s_max"],
                    f["dead_max"],
                    f["claim_idx_mb_max"],
                    f["cores"]["worker"],
                    f["cores"]["queue_db"],
                    f["cores"]["pressure"],
                    f["cores"]["postgres_all"],
                    f["cores"]["machine"],
                ]
                for name, f in phases.items()
            ],
        )
    )
    print(
        f"\nProducer: {p.ok:,} submitted of {p.target:,}, errors {p.errors or 'none'}, late "
        f"p99 {fmt(percentile(p.lateness, 99) * 1000)} ms, its threads' CPU "
        f"{p.cpu_seconds:.1f} s ({p.cpu_seconds / max(cpu.wall, 1e-9):.2f} cores; this "
        f"harness's own process: {bench_cpu:.1f} s)"
        + ("" if finished_in_time else "; it did NOT finish its schedule in time")
        + f". Rows: {rows_total:,}, completed {rows_completed:,}, more than one attempt "
        f"{retried:,}, not completed at the end {unfinished:,}."
    )
    if pressure_name != "none":
        print(f"Pressure: snapshot held {pressure.held_s:.1f} s; {json.dumps(pressure.notes)}.")
    top = sorted(holders.items(), key=lambda kv: -kv[1])[:5]
    print(
        "Oldest snapshot holders seen (client backends, their oldest age): "
        + ("; ".join(f"`{who}` {age:.0f} s" for who, age in top) if top else "none over 1 s")
        + "."
    )
    print(f"Worker warnings/errors in its log: {events or 'none'}.")
    for line in event_lines:
        print(f"    {line[:300]}")
    print(f"\n### Verdict ({pressure_name})\n")
    for name, ok, detail in criteria:
        print(f"- {'PASS' if ok else 'FAIL'}: {name}: {detail}")
    for note in notes:
        print(f"- note: {note}")
    print(
        f"\n**{pressure_name}: {verdict}**"
        + (
            " (the queue kept up with what it was offered, but that was less than the rate)"
            if verdict == "INCONCLUSIVE"
            else ""
        )
    )
    sys.stdout.flush()
    return {
        "pressure": pressure_name,
        "rate": args.rate,
        "phases": phases,
        "pickup_created_under_pressure": {
            "tasks": n_created,
            "never_claimed": n_unclaimed,
            "p50_s": created_pcts[0],
            "p99_s": created_pcts[1],
            "max_s": created_max,
        },
        "pickup_claimed_under_pressure": {
            "tasks": n_claimed,
            "p50_s": claimed_pcts[0],
            "p99_s": claimed_pcts[1],
            "max_s": claimed_max,
        },
        "backlog_growth_over_pressure": round(growth, 1),
        "recovered_s": recovered_s,
        "snapshot_held_s": round(pressure.held_s, 1) if pressure_name != "none" else None,
        "pressure_notes": pressure.notes,
        "snapshot_holders": dict(top),
        "fill": fill,
        "verdict": {name: ok for name, ok, _ in criteria},
        "passed": verdict == "PASS",
        "result": verdict,
        "notes": notes,
        "submitted": p.ok,
        "submit_errors": sum(p.errors.values()),
        "retried": retried,
        "unfinished": unfinished,
        "worker_log_events": events,
        "other_load_cores": idle,
        "server": settings,
        "phase_times_db": phase_db,
    }


# --- main --------------------------------------------------------------------------------------


def default_pg_bin() -> str:
    if (PG15 / "initdb").exists():
        return str(PG15)
    from bench.private_postgres import bin_dir

    return str(bin_dir(18))


def summary_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["pressure"], "error: " + r["error"][:80], *[""] * 10])
            continue
        c, p = r["phases"]["clean"], r["phases"]["pressure"]
        v = list(r["verdict"].values())
        rows.append(
            [
                r["pressure"],
                f"{c['completed_per_s']} ({c['completed_pct']} %)",
                f"{p['completed_per_s']} ({p['completed_pct']} %)",
                p["min_window_pct"],
                p["backlog_max"],
                p["backlog_slope_per_s"],
                round(nan_if_none(r["pickup_created_under_pressure"]["p99_s"]), 2),
                round(nan_if_none(r["pickup_claimed_under_pressure"]["p99_s"]), 2),
                "-" if r["recovered_s"] is None else r["recovered_s"],
                r["snapshot_held_s"] if r["snapshot_held_s"] is not None else "-",
                " ".join("PASS" if ok else "FAIL" for ok in v),
                r["result"],
            ]
        )
    return md_table(
        ["pressure", "clean completed /s", "pressure completed /s", "lowest window %",
         "backlog peak", "backlog slope /s", "pickup p99 s (created)", "pickup p99 s (claimed)",
         "recovered after s", "snapshot held s", "offered throughput p99 bounded recovery",
         "verdict"],
        rows,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pressure", choices=[*PRESSURES, "all"], default="idle-xid")
    parser.add_argument("--server-url", default=None, help="use this server, not a private one")
    parser.add_argument("--pg-bin", default=None, help="PostgreSQL bin dir (initdb, pg_dump)")
    parser.add_argument("--pgqueue-tree", default=str(REPO), help="the worker's pgqueue tree")
    parser.add_argument("--rate", type=float, default=800.0, help="tasks offered per second")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--task-ms", type=float, default=1.0, help="each task's work")
    parser.add_argument("--task-work", choices=["sleep", "spin"], default="sleep")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--producers", type=int, default=8, help="threads per process")
    parser.add_argument("--producer-processes", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=60, help="clean seconds first")
    parser.add_argument("--pressure-seconds", type=int, default=180)
    parser.add_argument("--after", type=int, default=60, help="seconds after the pressure")
    parser.add_argument("--window", type=int, default=5, help="seconds per table row")
    parser.add_argument("--readers", type=int, default=4, help="rr-readers: sessions")
    parser.add_argument("--reader-pause", type=float, default=1.0, help="rr-readers: s/count")
    parser.add_argument("--dump-rows", type=int, default=1_000_000, help="pg-dump: pre-fill")
    parser.add_argument("--dump-read-kbps", type=float, default=256.0, help="pg-dump: reading")
    parser.add_argument("--quiet-below", type=float, default=0.0, help="cores; 0: no wait")
    parser.add_argument("--quiet-wait", type=float, default=600.0, help="at most, seconds")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every run passes")
    args = parser.parse_args()
    exit_on_sigterm()
    for name in ("warmup", "pressure_seconds", "after"):
        value = getattr(args, name)
        if not 0 < value <= 3600 or value % args.window:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 3600], a multiple of "
                         f"--window ({args.window})")  # fmt: skip
    if not 0 < args.rate <= 5000:
        parser.error("--rate must be in (0, 5000]")
    if not 0 <= args.dump_rows <= 20_000_000:
        parser.error("--dump-rows must be in [0, 20000000]")
    args.pgqueue_tree = str(Path(args.pgqueue_tree).resolve())
    args.registry = (
        "bench.pinned_snapshot:tasks" if args.task_work == "spin" else "bench.load_handlers:tasks"
    )
    pressures = ["idle-xid", "rr-readers", "pg-dump"] if args.pressure == "all" else [args.pressure]

    tree_info = describe_tree(Path(args.pgqueue_tree), args.registry)
    progress(f"the worker imports {tree_info}")
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.server_url:
            server_url = args.server_url
            pg_bin = args.pg_bin
        else:
            pg_bin = args.pg_bin or default_pg_bin()
            progress(f"starting a private PostgreSQL from {pg_bin}")
            server_url = stack.enter_context(private_server(pg_bin))
        dump = Path(pg_bin, "pg_dump") if pg_bin else None
        args.pg_dump = str(dump) if dump and dump.exists() else (shutil.which("pg_dump") or "")
        if "pg-dump" in pressures and not args.pg_dump:
            parser.error("no pg_dump found: give --pg-bin")
        print(
            f"# pinned_snapshot: `{' '.join(['python -m bench.pinned_snapshot', *sys.argv[1:]])}`"
            f"\n\nServer: {'private, ' + str(pg_bin) if not args.server_url else 'given'}; "
            f"worker's pgqueue: {tree_info['pgqueue_file']} ({tree_info['commit']}); "
            f"producer's pgqueue: {pgqueue.__file__}; pg_dump: {args.pg_dump or '-'}; "
            f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}."
        )
        for name in pressures:
            try:
                results.append(run_one(args, server_url, name, tree_info))
            except (Exception, SystemExit) as exc:
                if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
                    raise
                progress(f"[{name}] failed: {type(exc).__name__}: {exc}")
                print(f"\n## {name}: the run failed: {type(exc).__name__}: {exc}\n")
                results.append({"pressure": name, "error": f"{type(exc).__name__}: {exc}"})
    if len(results) > 1:
        print("\n## Summary\n")
        print(summary_table(results))
    summary = {
        "benchmark": "pinned_snapshot",
        "tree": tree_info,
        "args": {k: v for k, v in vars(args).items() if k != "server_url"},
        "runs": results,
        "passed": all(r.get("passed") for r in results),
    }
    print("\n" + json.dumps(summary, default=str), flush=True)
    if args.strict and not summary["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
