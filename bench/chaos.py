"""The chaos run: real worker processes drain a stream of tasks while the faults production
brings are injected on a seeded schedule, and then every task is accounted for.

    python -m bench.chaos                      # the full run: 20,000 tasks, every scenario
    python -m bench.chaos --smoke              # CI: 300 tasks, one of each fault, 1-1.5 min
    python -m bench.chaos --scenarios pinned_xid,pinned_readers --tasks 3000
    python -m bench.chaos --seed 7 --scenarios kill9,sigstop --tasks 5000
    python -m bench.chaos --scenarios workflow --tasks 3000 --seed 1
    python -m bench.chaos --scenarios executor --tasks 600 --seed 1
    python -m bench.chaos --scenarios failover_async,failover_sync --tasks 3000 --seed 1

It starts a private PostgreSQL server of its own (never the machine's shared one: it restarts
and kills it), migrates it, and starts ``--workers`` real ``pgqueue worker`` processes, which
it restarts whenever one dies. The tasks are split over the scenarios, which run one after
the other; in each, a producer submits the scenario's tasks at ``--rate`` per second (each
with an idempotency key, retried until it is known to be stored, so "accepted" is exact)
while the scenario's faults are injected:

========================  =================================================================
``kill9``                 SIGKILL of a random worker process, repeatedly; a replacement is
                          started at once
``terminate``             ``pg_terminate_backend`` of every worker and handler connection
``restart_fast``          the server is stopped (``-m fast``) and started again
``restart_immediate``     the same with ``-m immediate``: a crash, then crash recovery
``hang``                  a handler blocks its worker's event loop for 2.5 leases (no
                          heartbeat): the tasks run elsewhere, the late outcomes are fenced
``suicide``               a handler kills its own process on its first attempt; another
                          kills it on every attempt (poison: must end dead-lettered)
``sigstop``               SIGSTOP of a worker for 2.5 leases, then SIGCONT: its late
                          completions must be fenced off, not overwrite the new holder's
``pinned_xid``            a session runs ``BEGIN; SELECT txid_current();`` and
                          stays idle in its transaction (a forgotten transaction holding an
                          XID), so vacuum cannot clean pgqueue.tasks while it is open
``pinned_readers``        2 sessions, each in one REPEATABLE READ transaction,
                          loop ``SELECT count(*) FROM pgqueue.tasks`` (0.5 s between counts:
                          a report)
``workflow``              the tasks are workflows (below); SIGKILLs of workers and
                          ``pg_terminate_backend`` of their connections, ``--repeats`` of
                          each, and one restart ``-m immediate``, in a seeded order
``keyed``                 tasks with a concurrency key (299 keys and a hot one that submits
                          half the tasks) of a type with a per-key limit of 2, a tenth of
                          them long (up to 0.45 lease); SIGKILLs of workers and
                          ``pg_terminate_backend`` of their connections, ``--repeats`` of each,
                          and one restart ``-m fast``, in a seeded order
``executor``              the workers run every handler in the process executor's children
                          (``--executor process --process-pool-size 4 --memory-limit
                          200``); handlers that segfault, ``os._exit(3)``, hang in C past
                          the hard limit, pass the memory limit or loop past their soft
                          limit, ``--repeats`` of each on their first attempt only and one
                          of each on every attempt (poison), among innocent tasks; and
                          ``--repeats`` SIGKILLs of workers
``failover_async``        on a primary and a streaming standby of its own: the standby
                          gets nothing for ``--failover-lag`` s, the primary crashes
                          (``-m immediate``), the standby is promoted ``--failover-down`` s
                          later (a lease by default); producers and workers have both
                          servers in one URL (``target_session_attrs=read-write``)
``failover_sync``         the same with the standby synchronous
                          (``synchronous_standby_names``)
========================  =================================================================

The failover scenarios run on servers of their own (bench/replication.py): a fresh primary,
migrated, and a ``pg_basebackup`` of it streaming from it through a relay of ours (the
link, which the failover holds up so that the standby is behind, as one under load is, then
cuts as the primary dies). Their workers are restarted with the pair's URL
(``postgresql://postgres@127.0.0.1,127.0.0.1/postgres?port=P1,P2&target_session_attrs=
read-write``), at log level INFO (their ``task.completed`` lines are the acknowledged
completions) and with ``CHAOS_JOURNAL``, where every execution is recorded outside the
database (asynchronous replication loses ``chaos.executions`` rows too); the producer gets
the same servers as libpq keywords (``host=127.0.0.1,127.0.0.1 port=P1,P2
target_session_attrs=read-write``), and retries a submit cut off by the failover (an enqueue
not acknowledged is not a loss). At least 200 tasks over at least 4 s; once the standby is
promoted the driver submits 2 long tasks per worker (1.5 leases each). Checked, besides the
rest (an acknowledgement before the promotion came from the old primary: the standby refuses
writes until then): with synchronous replication, no acknowledged enqueue lost and no task
run again after its completion was acknowledged (a task running at the failover may run
again: a claim's commit waits for no flush, see pgqueue/sql/claiming.sql); with asynchronous
replication, how many of each, counted, not failed (what the mode allows; the lost ones are
not in the lost column); in both, no enqueue or completion acknowledged after the promotion
lost or run again, every worker of the crash alive, LISTENing on the promoted standby and
running statements there at the end (by the application_name each worker's sessions get from
``PGAPPNAME``), each long task run exactly once (a heartbeat that did not carry on lets its
lease expire). Reported: how far behind the standby was, the seconds from the crash to the
promotion, and each worker's from the promotion to its first completion.

The executor scenario restarts the workers (SIGTERM, then the same command with the process
executor's options; not counted as deaths) before it, and again after it if another scenario
follows. Its producer spreads its tasks over at least 8 s, so that the kills fall among the
faults. Every execution there records its end too (``chaos.executions.ended_at``; a child
that dies records none) and, at its start, the other executions of the task without an end
whose process (pid and start time, from /proc) still runs. Checked at its end, besides the
rest: two executions of one task at once (the second started before the first's recorded
end, or found the first's process still running), unless the first ran for a worker the run
SIGKILLed before the second started (its lease had to expire first); an extra attempt of an
innocent task (``chaos.work``, ``chaos.proc_work``, in children too) unless it was not failed
(no ``task.retried``: a crashing neighbour must not cost it an attempt), the sweep requeued
it within a lease + 3 s of a SIGKILL, and any execution it had ran for a killed worker; a
poison one dead-lettered without its fault's text in ``last_error`` ("worker child died:
SIGSEGV", "worker child exited with code 3", "timed out after 1" and "killed after the hard
limit", "memory limit exceeded", "timed out after 1"; a last attempt lost to a kill is
counted apart), or a first-attempt fault whose ``task.retried`` error lacks it; and a worker
that died though the run did not kill it. Reported: ``task.lease_lost`` logged for the very
attempt that completed (by mode).

The workflow scenario's producer submits, through the public API, chains of 3-4 function
tasks (each receiving the previous one's result), groups of 3-6, chords of 20-50 members and
a callback (half of them followed by one more step), DAGs written by ``enqueue_many`` with
``depends_on`` (a diamond and a step after it and the root), and, for ~1 % poison, doomed
workflows: a poison step after a normal one, its dependant and that one's (to be cancelled,
each naming its parent), a clean-up step run anyway after the poison, and another after a
cancelled step and a completed one. At least 150 tasks over at least 6 s, paced at
``--rate`` tasks per second. Idempotency keys are refused with ``depends_on``, so each workflow
is one transaction that first inserts the workflow's key into ``chaos.workflows`` (then its
id and task ids): a retry whose insert finds the key (waiting for a commit still in flight)
knows the earlier one stored, so "accepted" is exact here too.

The keyed scenario sets its type's limit (``pgqueue.limits``, ``per_key_max_running`` 2)
before its producer starts and removes it once its tasks are finished, so the scenarios after
it run without a limit to probe (``pgqueue.set_limit``, ``pgqueue.clear_limit``). Its producer
gives each task its key (``pgqueue.enqueue(..., concurrency_key=...)``), at least 200 tasks
over at least 4 s. Its handlers journal each execution's start and
end in a file outside the database (``CHAOS_KEYED_JOURNAL``), first and last; checked from
those lines alone, besides the rest: no moment at which a key had more executions running
than its limit, an execution without an end line ending at the SIGKILL of its process (by
the run) or else at its process's death (as the reaper saw it, a little late), and none
with neither (it would count as running to the end). Reported: the most one key ran at once
and for how many seconds some key ran at its limit (the hot key's backlog keeps it there:
the limit is put to the test).

A pinned scenario's pressure opens at 20 % of its producer window and ends at 80 % (where
the other scenarios' faults fall). It runs on the driver's own connections (never terminated
by a fault) to the chaos database itself: a snapshot held in another database would not hold
back pgqueue.tasks' vacuum. Its producer spreads the tasks over at least 6 s (fewer per second
than ``--rate`` if need be, as in the smoke), so that tasks keep arriving all through it.

Every scenario also carries ~1 % poison tasks that always raise. The handlers
(``bench/chaos_handlers.py``) record every execution in a commit of its own, and half the
normal tasks also write an effect in the transaction that records their completion. At the
end of each scenario the run waits until its tasks are finished and checks, from the
database: tasks lost (accepted but missing, cancelled or never finished; must be 0), stuck
``running`` with an expired lease (0), dead-lettered tasks that are not poison (0), executions
beyond the first and whether each is explained by a lost lease (each on a lease of its own, no
more executions than claims), transactional effects that are not exactly one per completed
task (0), late outcomes fenced (from the workers' logs), and the seconds from the last fault
until every task accepted before it had finished. Any violation fails the run (exit 1).

For tasks with parents (the workflow scenario's; ``check_dependants``), also from the
database: a dependant whose first execution (``chaos.executions.started_at``, server clock)
began before a parent's ``finished_at`` (a run-anyway one included: it runs once its failed
parent is final); one still ``waiting`` though every parent is final (a lost release; and any
task left waiting, queued or running counts as lost, as above); a dependant of a
dead-lettered or cancelled parent that is not cancelled with ``cancelled_by`` that parent and
a reason naming it, or that ran; a run-anyway one that did not complete; one cancelled by a
parent though none failed; and a step that did not receive its parents' results in
depends_on order (each execution records what it got; a chord callback's must be its
members' 0, 1, ... in order). A dependant run twice by a double release is an execution no
failure or lost lease explains: counted with the re-runs. A dependant rightly cancelled is
not lost (its own column). Reported, not checked: the release delay, a dependant's first
start less its last parent's ``finished_at`` (p50, p99, max; the pickup latency is then of
the tasks without parents only), with the evidence behind its max (``slowest_release``), and
how much of it was the release itself: from that ``finished_at`` to when the dependant became
ready (``ready_since`` or ``visible_after``), 0 when it was released in the transaction that
finished its last parent (``release_lag_max_s``, ``released_late``); the rest is the claim's.

Reported with each scenario, not checked: the oldest snapshot seen while it ran (sampled every
second from pg_stat_activity of the chaos database: the oldest ``backend_xmin`` or
``backend_xid`` of a client backend, aged in seconds since the xid counter passed it, from the
samples' own history of ``pg_current_snapshot()``; ``now() - xact_start`` would overstate a
READ COMMITTED transaction that idled before its latest statement), and its tasks' pickup
latency (first execution's start in ``chaos.executions`` less the task's ``created_at``;
p50, p99 and max), which such a snapshot is what slows down.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from bench.chaos_handlers import POISON, PROCESS_FAULTS, SURVIVE, link
from bench.private_postgres import PrivateServer, private_server
from bench.replication import Failover, Pair, standby
from pgqueue import migrate

REPO = Path(__file__).resolve().parent.parent
RESULTS_MD = REPO / "bench" / "CHAOS.md"
SCENARIOS = (
    "kill9",
    "terminate",
    "restart_fast",
    "restart_immediate",
    "hang",
    "suicide",
    "sigstop",
    "pinned_xid",
    "pinned_readers",
    "workflow",
    "keyed",
    "executor",
    "failover_async",
    "failover_sync",
)
# The failover scenarios, each on a primary and a standby of its own: whether the standby is
# synchronous. At least FAILOVER_MIN_TASKS tasks over at least FAILOVER_MIN_WINDOW seconds
# (the failover falls among them even in the smoke), and FAILOVER_PROBES long tasks per worker
# submitted once the standby is promoted, each 1.5 leases long: one that runs twice had its
# lease expire under a live worker, whose heartbeat did not carry on.
FAILOVER = {"failover_async": False, "failover_sync": True}
FAILOVER_MIN_TASKS = 200
FAILOVER_MIN_WINDOW = 4.0
FAILOVER_PROBES = 2
STALLED_AFTER = 5.0  # seconds without a statement after which a worker has not carried on
PINNED = frozenset({"pinned_xid", "pinned_readers"})
PINNED_READERS = 2  # REPEATABLE READ sessions of pinned_readers
READER_PAUSE = 0.5  # seconds between one reader's counts
PINNED_MIN_WINDOW = 6.0  # seconds: a pinned scenario's producer runs at least this long
PROCESS_POISON = {f"chaos.proc_{kind}_always": kind for kind in PROCESS_FAULTS}
PROCESS_FLAKY = {f"chaos.proc_{kind}": kind for kind in PROCESS_FAULTS}
POISON_TYPES = frozenset({"chaos.poison", "chaos.suicide_always", *PROCESS_POISON})
# The tasks that must simply complete: recovery is measured on them.
NORMAL_TYPES = frozenset(
    {"chaos.work", "chaos.step", "chaos.link", "chaos.proc_work", "chaos.keyed"}
)
# The executor scenario: its workers' options (every handler in a child), the least time its
# producer spreads its tasks over, and its innocent tasks (in children too).
EXECUTOR_ARGS = (*("--executor", "process", "--process-pool-size", "4", "--memory-limit", "200"),)
EXECUTOR_MIN_WINDOW = 8.0
INNOCENT_TYPES = frozenset({"chaos.work", "chaos.proc_work"})
# Workflow steps that record what their parents gave them (chaos.executions.received).
RECEIVING_TYPES = frozenset({"chaos.step", "chaos.link"})
FINAL = frozenset({"completed", "failed", "cancelled"})
WORKFLOW_MIN_WINDOW = 6.0  # seconds: the workflow scenario's producer runs at least this long
WORKFLOW_MIN_TASKS = 150  # and submits at least this many tasks (a few chords even in the smoke)
# The keyed scenario: its tasks' type, the per-key limit on it (per_key_max_running), the
# keys (one hot, which submits KEYED_HOT_SHARE of the tasks, more than it can run at its
# limit, so that it runs at its limit with a backlog), the share of long tasks (that run
# through a fault; under half a lease, so that no outage the scenario makes outlives a lease
# they hold), and its least size and window (the faults fall among its tasks even in the
# smoke).
KEYED_TYPE = "chaos.keyed"
KEYED_LIMIT = 2
KEYED_KEYS = 300
KEYED_HOT = "hot"
KEYED_HOT_SHARE = 0.5
KEYED_LONG_SHARE = 0.1
KEYED_MIN_TASKS = 200
KEYED_MIN_WINDOW = 4.0
KEYED_JOURNAL = "keyed-journal.jsonl"
QUEUE = "chaos"
DRIVER = "chaos-driver"  # application_name of our own connections: never terminated by us

SIDE_TABLES = """
CREATE SCHEMA chaos;
-- One row per execution, committed on its own before the handler does anything else.
CREATE TABLE chaos.executions (
    task_id     uuid        NOT NULL,
    lease_token uuid        NOT NULL,
    attempt     integer     NOT NULL,
    pid         integer     NOT NULL,  -- the process that ran the handler (a child, or the worker)
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    received    jsonb,      -- a workflow step's parents' results as it got them (else NULL)
    worker_pid  integer,    -- the worker whose child (or thread, or loop) ran it
    proc_start  bigint,     -- pid's start time (/proc/PID/stat): a reused pid is not it
    ended_at    timestamptz,  -- the executor scenario: the handler's end (NULL: it died)
    live_others text[]      -- the executor scenario: other executions of the task still
                            -- running when this one started ("attempt N pid P")
);
CREATE INDEX ON chaos.executions (task_id);
-- One row per effect written in the completion's own transaction (no unique key on purpose:
-- a double effect must be counted, not prevented by us).
CREATE TABLE chaos.effects (
    task_id     uuid        NOT NULL,
    lease_token uuid        NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos.effects (task_id);
-- One row per workflow the producer submitted, written in the workflow's own transaction
-- (so "accepted" is exact without idempotency keys, which depends_on refuses): the key is
-- inserted first, and a retry whose insert finds it there knows the earlier commit happened.
CREATE TABLE chaos.workflows (
    key         text        PRIMARY KEY,
    kind        text        NOT NULL,
    workflow_id uuid,
    task_ids    uuid[]
);
"""


@dataclasses.dataclass
class Settings:
    tasks: int
    seed: int
    workers: int
    concurrency: int
    lease: float
    rate: float
    repeats: int  # how many times each repeated fault (kill, terminate, hang, ...) is injected
    settle_timeout: float
    scenarios: tuple[str, ...]
    pg_version: int
    smoke: bool
    failover_lag: float = 0.5  # seconds the link to the standby is held before a failover
    failover_down: float | None = None  # seconds from the crash to the promotion (None: a lease)
    keyed_restart: str = "fast"  # the keyed scenario's restart: fast, or immediate (a crash)

    @property
    def down(self) -> float:
        return self.lease if self.failover_down is None else self.failover_down


def log(message: str) -> None:
    print(f"[chaos {datetime.now(UTC).strftime('%H:%M:%S')}] {message}", file=sys.stderr)


# --- the worker fleet --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """What the workers run with: the database URL (a failover scenario's names both servers
    of its pair), extra options (the executor scenario's), environment variables (a failover
    scenario's journal of executions) and the log level (INFO in a failover scenario, whose
    acknowledged completions are its ``task.completed`` lines)."""

    url: str
    extra: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    log_level: str = "WARNING"


class Fleet:
    """``workers`` real ``pgqueue worker`` processes (no supervisor: a kill must hit the
    worker itself), each restarted as soon as it is found dead."""

    def __init__(self, url: str, settings: Settings, log_dir: Path) -> None:
        self.config = FleetConfig(url)  # the current scenario's (see reconfigure)
        self.settings = settings
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopped: set[int] = set()  # pids under SIGSTOP
        self.deaths: list[tuple[float, int, int]] = []  # (when, pid, exit code)
        self.killed: dict[int, float] = {}  # pid -> when the run sent it SIGKILL
        self.lock = threading.RLock()
        self._closing = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True)

    @property
    def url(self) -> str:
        return self.config.url

    def command(self) -> list[str]:
        s, c = self.settings, self.config
        return [
            *(sys.executable, "-m", "pgqueue", "--database-url", c.url, "worker"),
            *("bench.chaos_handlers:tasks", "--queue", QUEUE),
            *("--concurrency", str(s.concurrency), "--lease-seconds", str(s.lease)),
            *("--sweep-interval", "0.5", "--poll-interval", "0.5", "--grace-period", "5"),
            *("--log-format", "json", "--log-level", c.log_level),
            *c.extra,
        ]

    def _spawn(self, slot: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), CHAOS_DATABASE_URL=self.url)
        # libpq's default application_name: the worker's sessions say whose they are (the
        # handlers' side pool names its own).
        env["PGAPPNAME"] = f"chaos-worker-{slot}"
        # Where the keyed scenario's handlers journal their starts and ends.
        env["CHAOS_KEYED_JOURNAL"] = str(self.log_dir / KEYED_JOURNAL)
        env.update(self.config.env)
        with (self.log_dir / f"worker-{slot}.log").open("ab") as out:
            self.procs[slot] = subprocess.Popen(
                self.command(),
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> None:
        for slot in range(self.settings.workers):
            self._spawn(slot)
        self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._closing.wait(0.1):
            with self.lock:
                for slot, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is not None:
                        self.deaths.append((time.time(), proc.pid, code))
                        self._spawn(slot)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every worker LISTENs: a fault injected while they still start would test
        their startup, not the recovery of running workers."""
        deadline = time.monotonic() + timeout
        with connect(self.url) as conn:
            while scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN pgqueue'"
                " AND datname = current_database()",
            ) < len(self.procs):
                if time.monotonic() > deadline:
                    raise SystemExit(f"workers not ready after {timeout} s: see their logs")
                time.sleep(0.1)

    def reconfigure(self, config: FleetConfig) -> None:
        """Restart every worker with this configuration (gracefully: SIGTERM, then wait),
        unless they already run with it. Not a fault: these exits are not deaths."""
        if config == self.config:
            return
        with self.lock:  # the reaper waits: it must not restart the old command meanwhile
            self.config = config
            for proc in self.procs.values():
                proc.send_signal(signal.SIGTERM)
            for slot, proc in list(self.procs.items()):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
                self._spawn(slot)
        self.wait_ready()

    def alive(self) -> list[int]:
        with self.lock:
            return [
                p.pid for p in self.procs.values() if p.poll() is None and p.pid not in self.stopped
            ]

    def signal_one(self, rng: random.Random, sig: int) -> int | None:
        pids = self.alive()
        if not pids:
            return None
        pid = rng.choice(pids)
        if sig == signal.SIGKILL:
            self.killed[pid] = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return pid

    def resume(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        with self.lock:
            self.stopped.discard(pid)

    def stop(self) -> None:
        self._closing.set()
        self._reaper.join(5)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


# --- database access that survives the faults ------------------------------------------------


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5, application_name=DRIVER)


def scalar(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def retrying(url: str, fn: Callable[[psycopg.Connection[Any]], Any], timeout: float = 90) -> Any:
    """``fn`` on a fresh connection, retried while the server is down or restarting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with connect(url) as conn:
                return fn(conn)
        except (psycopg.OperationalError, pgqueue.DatabaseUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# --- old snapshots: the pinned scenarios' pressure, and the sampler of every scenario -------


class Pin:
    """What holds an old snapshot open in the chaos database, from ``hold()``'s
    start to its end. ``pinned_xid``: one session that ran ``BEGIN; SELECT txid_current();``
    and went idle in its transaction (a forgotten transaction: it holds an XID).
    ``pinned_readers``: PINNED_READERS sessions, each in one REPEATABLE READ transaction that
    loops ``SELECT count(*) FROM pgqueue.tasks`` with READER_PAUSE seconds between counts (a
    report). Its connections are the driver's (``DRIVER``): no fault of the run touches them.
    ``report()``'s ``held_s`` is how long its transactions were open, by their own clock."""

    def __init__(self, url: str, scenario: str) -> None:
        self.url = url
        self.scenario = scenario
        self.conns: list[psycopg.Connection[Any]] = []
        self.threads: list[threading.Thread] = []
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.held: list[float] = []  # seconds each transaction was open, read before COMMIT
        self.counts = 0
        self.xid: int | None = None

    def _error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        held = scalar(conn, "SELECT extract(epoch FROM clock_timestamp() - now())::float8")
        conn.execute("COMMIT")
        with self.lock:
            self.held.append(float(held))

    def _read(self, conn: psycopg.Connection[Any], ready: threading.Barrier) -> None:
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            first = True
            while True:
                conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
                with self.lock:
                    self.counts += 1
                if first:
                    first = False
                    ready.wait()
                if self.stop_event.wait(READER_PAUSE):
                    break
            self._commit(conn)
        except (psycopg.Error, threading.BrokenBarrierError) as exc:
            self._error(exc)

    def open(self) -> None:
        try:
            if self.scenario == "pinned_xid":
                conn = connect(self.url)
                self.conns.append(conn)
                conn.execute("BEGIN")
                self.xid = int(scalar(conn, "SELECT txid_current()"))
                return
            ready = threading.Barrier(PINNED_READERS + 1, timeout=30)
            for _ in range(PINNED_READERS):
                conn = connect(self.url)
                self.conns.append(conn)
                thread = threading.Thread(target=self._read, args=(conn, ready), daemon=True)
                thread.start()
                self.threads.append(thread)
            ready.wait()  # every reader holds its snapshot
        except (psycopg.Error, threading.BrokenBarrierError) as exc:
            self._error(exc)

    def close(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(60)
            if thread.is_alive():
                self._error(RuntimeError("a reader did not stop within 60 s"))
        if self.scenario == "pinned_xid" and self.conns:
            try:
                self._commit(self.conns[0])
            except psycopg.Error as exc:
                self._error(exc)
        for conn in self.conns:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def hold(self, window: float, sampler: SnapshotSampler | None = None) -> Fault:
        """Opens the pressure at 20 % of the producer's ``window`` and ends it at 80 %, with
        a last sample of ``sampler`` just before."""
        t0 = time.monotonic()
        time.sleep(0.2 * window)
        at = time.time()
        try:
            self.open()
            time.sleep(max(0.0, t0 + 0.8 * window - time.monotonic()))
            if sampler is not None:
                sampler.sample_now()
        finally:
            self.close()
        held = f"held {max(self.held):.1f} s" if self.held else "not held"
        if self.scenario == "pinned_xid":
            return Fault("idle in transaction", at, f"xid {self.xid}, {held}")
        return Fault(
            "REPEATABLE READ readers",
            at,
            f"{PINNED_READERS} sessions, {self.counts} counts, {held}",
        )

    def report(self) -> dict[str, Any]:
        return {
            "held_s": round(max(self.held), 2) if self.held else None,
            "xid": self.xid,
            "counts": self.counts,
            "errors": self.errors[:5],
        }


SNAPSHOT_QUERY = """
SELECT extract(epoch FROM clock_timestamp())::float8,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       h.horizon, h.xact_s, h.holder,
       (SELECT max(extract(epoch FROM clock_timestamp() - xact_start))::float8
          FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND backend_type = 'client backend'
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL))
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
       SELECT (CASE WHEN backend_xmin IS NULL OR age(backend_xid) >= age(backend_xmin)
                    THEN backend_xid ELSE backend_xmin END)::text::bigint AS horizon,
              extract(epoch FROM clock_timestamp() - xact_start)::float8 AS xact_s,
              coalesce(application_name, '') || ' (' || coalesce(state, '') || '): '
              || left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 60) AS holder
         FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND backend_type = 'client backend'
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
        -- Every snapshot taken meanwhile has the holder's xid as its xmin too: of those
        -- tied, the one whose transaction began first is the holder.
        ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC, xact_start
        LIMIT 1) AS h ON true
"""


class SnapshotSampler(threading.Thread):
    """Every second, the oldest cleanup horizon a client backend of the chaos database holds
    (its ``backend_xmin`` or ``backend_xid``, whichever is older, and who holds it), aged in
    seconds. The age is the holder's ``now() - xact_start``, kept within what the samples'
    history of the xid counter (``pg_current_snapshot()``'s xmax) allows: the horizon came
    into being after the last sample the counter had not passed it yet and before the first
    one it had. That is exact for a transaction that took its snapshot or XID first thing
    (both pressures), and overstates a READ COMMITTED transaction that idled before its latest
    statement by at most the sampling interval. Survives restarts (a failed sample is
    skipped); ``sample_now()`` takes one at once (a pressure's last, just before its end)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[dict[str, Any]] = []
        self._next_xids: list[int] = []  # the samples' xmax, in order (never decreases)
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._begun = 0  # samples begun: each sample records its number

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._halt.is_set():
            began = time.monotonic()
            self._begun += 1
            seq = self._begun
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url)
                row = conn.execute(SNAPSHOT_QUERY).fetchone()
                assert row is not None
                self._add(seq, time.time(), *row)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self._wake.wait(max(0.0, 1.0 - (time.monotonic() - began)))
            self._wake.clear()
        if conn is not None:
            conn.close()

    def sample_now(self, timeout: float = 2.0) -> None:
        """Until a sample begun after this call is taken (or ``timeout``)."""
        if not self.is_alive():
            return
        begun = self._begun
        self._wake.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
            self.samples and self.samples[-1]["seq"] > begun
        ):
            time.sleep(0.01)

    def _add(
        self,
        seq: int,
        at: float,
        db: float,
        xmax: int,
        horizon: int | None,
        holder_xact: float | None,
        holder: str | None,
        xact: float | None,
    ) -> None:
        age_s, xids = 0.0, 0
        if horizon is not None:
            # The 32-bit xid in the epoch nearest xmax (a running xid may be at or past it).
            horizon += xmax & ~0xFFFFFFFF
            if horizon - xmax > 1 << 31:
                horizon -= 1 << 32
            elif xmax - horizon > 1 << 31:
                horizon += 1 << 32
            xids = max(0, xmax - horizon)
            k = bisect.bisect_right(self._next_xids, horizon)  # the first sample past it
            lower = db - self.samples[k]["db"] if k < len(self.samples) else 0.0
            upper = db - self.samples[k - 1]["db"] if k > 0 else float("inf")
            age_s = max(0.0, lower, min(upper, holder_xact or 0.0))
        self.samples.append(
            {
                "seq": seq,
                "at": at,
                "db": db,
                "xmax": xmax,
                "snapshot_s": age_s,
                "xids": xids,
                "xact_s": xact or 0.0,
                "holder": holder,
            }
        )
        self._next_xids.append(xmax)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        self.join(10)

    def during(self, lo: float, hi: float) -> dict[str, Any]:
        """The oldest snapshot seen between epoch seconds ``lo`` and ``hi``."""
        xs = [x for x in list(self.samples) if lo <= x["at"] <= hi]
        worst = max(xs, key=lambda x: x["snapshot_s"], default=None)
        return {
            "oldest_snapshot_s": None if worst is None else round(worst["snapshot_s"], 1),
            "oldest_snapshot_xids": max((x["xids"] for x in xs), default=None),
            "oldest_xact_s": round(max((x["xact_s"] for x in xs), default=0.0), 1),
            "oldest_snapshot_holder": (
                worst["holder"] if worst is not None and worst["snapshot_s"] >= 1.0 else None
            ),
            "snapshot_samples": len(xs),
        }


# --- one scenario ----------------------------------------------------------------------------


@dataclasses.dataclass
class Planned:
    type: str
    payload: dict[str, Any]
    key: str
    policy: pgqueue.RetryPolicy
    concurrency_key: str | None = None


@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # epoch seconds, when it was injected (or, for handler faults, when it began)
    detail: str


def plan(scenario: str, n: int, settings: Settings, rng: random.Random) -> list[Planned]:
    """The scenario's tasks in submission order: normal work, ~1 % poison, and the scenario's
    fault tasks placed in the middle third of the stream."""
    hang_s = round(settings.lease * 2.5, 2)
    executor = scenario == "executor"
    # The executor scenario's tasks record their end too (``spans``); its innocent tasks are
    # half chaos.work (async, in a child by the workers' --executor process) and half
    # chaos.proc_work (a sync executor="process" type).
    extra: dict[str, Any] = {"spans": True} if executor else {}
    out = [
        Planned(
            "chaos.proc_work" if executor and i % 4 >= 2 else "chaos.work",
            {
                "ms": rng.randint(5, 40),
                "mode": "tx" if i % 2 else "sep",
                "scenario": scenario,
                **extra,
            },
            "",
            SURVIVE,
        )
        for i in range(n)
    ]
    special: list[Planned] = [
        Planned("chaos.poison", {"scenario": scenario, **extra}, "", POISON)
        for _ in range(max(1, n // 100))
    ]
    if scenario == "hang":
        special += [
            Planned("chaos.hang", {"hang_s": hang_s, "scenario": scenario}, "", SURVIVE)
            for _ in range(settings.repeats)
        ]
    if scenario == "suicide":
        special += [
            Planned("chaos.suicide", {"scenario": scenario}, "", SURVIVE)
            for _ in range(settings.repeats)
        ]
        special.append(Planned("chaos.suicide_always", {"scenario": scenario}, "", POISON))
    if executor:  # each fault: on the first attempt of `repeats` tasks, and one poison
        for kind in PROCESS_FAULTS:
            special += [
                Planned(f"chaos.proc_{kind}", {"scenario": scenario}, "", SURVIVE)
                for _ in range(settings.repeats)
            ]
            special.append(Planned(f"chaos.proc_{kind}_always", {"scenario": scenario}, "", POISON))
    if scenario == "keyed":
        for task in out:
            key = (
                KEYED_HOT
                if rng.random() < KEYED_HOT_SHARE
                else f"k{rng.randrange(KEYED_KEYS - 1):03d}"
            )
            task.type, task.concurrency_key = KEYED_TYPE, key
            task.payload["k"] = key
            if rng.random() < KEYED_LONG_SHARE:  # runs through a fault, within a lease
                task.payload["ms"] = round(rng.uniform(0.15, 0.45) * settings.lease * 1000)
    for task in special:
        out.insert(rng.randint(len(out) // 3, max(len(out) // 3, 2 * len(out) // 3)), task)
    for i, task in enumerate(out):
        task.key = f"chaos:{scenario}:{i}"
    return out


def submit(conn: psycopg.Connection[Any], task: Planned) -> pgqueue.EnqueueResult:
    """``pgqueue.enqueue`` of a planned task under its idempotency key (and its concurrency
    key, the keyed scenario's)."""
    return pgqueue.enqueue(
        conn,
        task.type,
        task.payload,
        queue=QUEUE,
        idempotency_key=task.key,
        retry=task.policy,
        concurrency_key=task.concurrency_key,
    )


class Producer(threading.Thread):
    """Submits the planned tasks at ``rate`` per second, each retried (same idempotency key)
    until it is known to be stored: a commit cut off by a restart is either there or not, and
    the retry finds out which. ``acked_at``: when each submit's commit was acknowledged."""

    def __init__(self, url: str, tasks: list[Planned], rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.tasks, self.rate = url, tasks, rate
        self.accepted: dict[str, uuid.UUID] = {}
        self.acked_at: dict[str, float] = {}
        self.retries = 0
        self.failed: list[str] = []

    def task_ids(self) -> list[uuid.UUID]:
        return list(self.accepted.values())

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        t0 = time.monotonic()
        for i, task in enumerate(self.tasks):
            delay = t0 + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            deadline = time.monotonic() + 90
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = connect(self.url)
                    result = submit(conn, task)
                    self.acked_at[task.key] = time.time()
                    self.accepted[task.key] = result.task.id
                    break
                except (psycopg.Error, pgqueue.DatabaseUnavailable):
                    self.retries += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    if time.monotonic() > deadline:
                        self.failed.append(task.key)
                        break
                    time.sleep(0.1)
        if conn is not None:
            conn.close()


# --- the workflow scenario ----------------------------------------------------------


@dataclasses.dataclass
class PlannedFlow:
    """One workflow of the workflow scenario: ``submit`` writes it on the connection it is
    given (in the caller's transaction) and returns its workflow id and task ids."""

    kind: str
    tasks: int
    submit: Callable[[psycopg.Connection[Any]], tuple[uuid.UUID, list[uuid.UUID]]]


class FlowPlanner:
    """Builds the workflow scenario's workflows with the public API, half their steps
    writing a transactional effect (as ``chaos.work`` does)."""

    def __init__(self, scenario: str, rng: random.Random) -> None:
        self.scenario, self.rng, self.count = scenario, rng, 0

    def payload(self, i: int, **extra: Any) -> dict[str, Any]:
        self.count += 1
        mode = "tx" if self.count % 2 else "sep"
        ms = self.rng.randint(5, 40)
        return {"i": i, "ms": ms, "mode": mode, "scenario": self.scenario, **extra}

    def step(self, i: int, **extra: Any) -> pgqueue.Step:
        return pgqueue.step("chaos.step", self.payload(i, **extra), queue=QUEUE, retry=SURVIVE)

    def link(self, i: int, first: bool) -> pgqueue.Step:
        p = self.payload(i)
        del p["scenario"]  # a function task's arguments are its parameters
        fn = link.options(queue=QUEUE)
        return fn.s(None, **p) if first else fn.s(**p)  # the first link binds prev=None

    def poison(self) -> pgqueue.Step:
        return pgqueue.step("chaos.poison", {"scenario": self.scenario}, queue=QUEUE, retry=POISON)

    def flow(self, kind: str) -> PlannedFlow:
        rng = self.rng
        node: Any
        if kind == "chain":  # 3-4 function tasks, each receiving the previous one's result
            n = rng.randint(3, 4)
            node = pgqueue.chain(*(self.link(i, i == 0) for i in range(n)))
        elif kind == "group":
            n = rng.randint(3, 6)
            node = pgqueue.group(*(self.step(i) for i in range(n)))
        elif kind == "chord":  # 20-50 members, a callback with their results; half with a tail
            members = rng.randint(20, 50)
            node = pgqueue.chord(
                [self.step(i) for i in range(members)], self.step(0, collect=members)
            )
            n = members + 1
            if rng.random() < 0.5:
                node = pgqueue.chain(node, self.step(0))
                n += 1
        elif kind == "doomed":
            # A poison step (dead-lettered): its dependant and that one's are cancelled, each
            # naming its parent; the clean-up steps (run anyway) run, one after the poison, one
            # after a cancelled step and a completed one.
            node = pgqueue.chain(
                self.step(0),
                self.poison(),
                pgqueue.group(pgqueue.chain(self.step(0), self.step(1)), self.step(2).run_anyway()),
                self.step(0).run_anyway(),
            )
            n = 6
        elif kind == "dag":  # by depends_on: a diamond a -> (b, c) -> d, and e after (d, a)
            return PlannedFlow(kind, 5, self._dag([self.payload(i) for i in range(5)]))
        else:
            raise ValueError(kind)

        def submit(conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, list[uuid.UUID]]:
            handle = node.enqueue(conn)
            return handle.id, [t.id for t in handle.tasks]

        return PlannedFlow(kind, n, submit)

    @staticmethod
    def _dag(
        payloads: list[dict[str, Any]],
    ) -> Callable[[psycopg.Connection[Any]], tuple[uuid.UUID, list[uuid.UUID]]]:
        def submit(conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, list[uuid.UUID]]:
            workflow_id = uuid.uuid4()

            def task(k: int, *parents: Any) -> Any:  # a prepared task (pgqueue.prepare)
                return pgqueue.prepare(
                    "chaos.step",
                    payloads[k],
                    queue=QUEUE,
                    retry=SURVIVE,
                    depends_on=parents or None,
                    workflow_id=workflow_id,
                )

            a = task(0)
            b, c = task(1, a), task(2, a)
            d = task(3, b, c)
            e = task(4, d, a)
            results = pgqueue.enqueue_many(conn, [a, b, c, d, e])
            return workflow_id, [r.task.id for r in results]

        return submit


def plan_workflows(scenario: str, n: int, rng: random.Random) -> list[PlannedFlow]:
    """At least ``n`` tasks in workflows, in submission order: at least one of each kind,
    the rest chains, groups, chords and DAGs drawn at random, and ~1 % of the tasks poison
    (a doomed workflow each), spread over the stream."""
    planner = FlowPlanner(scenario, rng)
    doomed = max(2, round(n / 100))
    flows = [planner.flow(k) for k in ("chain", "group", "chord", "dag")]
    total = sum(f.tasks for f in flows) + 6 * doomed
    while total < n:
        flow = planner.flow(rng.choices(("chain", "group", "chord", "dag"), (3, 1, 1, 2))[0])
        flows.append(flow)
        total += flow.tasks
    rng.shuffle(flows)
    for _ in range(doomed):
        flows.insert(rng.randint(0, len(flows)), planner.flow("doomed"))
    return flows


class WorkflowProducer(threading.Thread):
    """Submits the planned workflows at ``rate`` tasks per second, each in one transaction
    that first inserts its key into ``chaos.workflows``; a submit cut off by a fault is
    retried, and a retry whose key insert finds the key there (it waits for an earlier
    commit still in flight) knows the earlier one is stored: "accepted" is exact."""

    def __init__(self, url: str, scenario: str, flows: list[PlannedFlow], rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.scenario, self.flows, self.rate = url, scenario, flows, rate
        self.accepted: dict[str, tuple[str, uuid.UUID, list[uuid.UUID]]] = {}
        self.retries = 0
        self.failed: list[str] = []

    def task_ids(self) -> list[uuid.UUID]:
        return [t for _, _, ids in self.accepted.values() for t in ids]

    def _submit(
        self, conn: psycopg.Connection[Any], key: str, flow: PlannedFlow
    ) -> tuple[uuid.UUID, list[uuid.UUID]]:
        with conn.transaction():
            fresh = conn.execute(
                "INSERT INTO chaos.workflows (key, kind) VALUES (%s, %s)"
                " ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, flow.kind),
            ).fetchone()
            if fresh is None:
                row = conn.execute(
                    "SELECT workflow_id, task_ids FROM chaos.workflows WHERE key = %s", (key,)
                ).fetchone()
                assert row is not None
                return row[0], list(row[1])
            workflow_id, ids = flow.submit(conn)
            conn.execute(
                "UPDATE chaos.workflows SET workflow_id = %s, task_ids = %s WHERE key = %s",
                (workflow_id, ids, key),
            )
            return workflow_id, ids

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        t0 = time.monotonic()
        before = 0  # tasks planned before this workflow: it is due at before / rate
        for i, flow in enumerate(self.flows):
            delay = t0 + before / self.rate - time.monotonic()
            before += flow.tasks
            if delay > 0:
                time.sleep(delay)
            key = f"chaos:{self.scenario}:{i}"
            deadline = time.monotonic() + 90
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = connect(self.url)
                    workflow_id, ids = self._submit(conn, key, flow)
                    self.accepted[key] = (flow.kind, workflow_id, ids)
                    break
                except (psycopg.Error, pgqueue.DatabaseUnavailable):
                    self.retries += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    if time.monotonic() > deadline:
                        self.failed.append(key)
                        break
                    time.sleep(0.1)
        if conn is not None:
            conn.close()


def workflow_faults(settings: Settings) -> list[str]:
    """The workflow scenario's faults: SIGKILLs and terminated backends, ``repeats`` of each,
    and one server restart (``-m immediate``: a crash, then crash recovery)."""
    return ["kill9"] * settings.repeats + ["terminate"] * settings.repeats + ["restart_immediate"]


def keyed_faults(settings: Settings) -> list[str]:
    """The keyed scenario's faults: SIGKILLs and terminated backends, ``repeats`` of each,
    and one server restart (``-m fast`` by default: every session ends, the server is back
    within a second or two, less than a lease; ``--keyed-restart immediate``: a crash)."""
    kills = ["kill9"] * settings.repeats + ["terminate"] * settings.repeats
    return [*kills, f"restart_{settings.keyed_restart}"]


def inject(
    scenario: str,
    settings: Settings,
    server: PrivateServer,
    fleet: Fleet,
    url: str,
    window: float,
    rng: random.Random,
) -> list[Fault]:
    """The scenario's faults from the driver's side, at seeded moments inside the producer's
    window (the handler faults inject themselves and are read back from the database). The
    workflow scenario mixes the kinds of workflow_faults() in a seeded order."""
    faults: list[Fault] = []
    resumes: list[threading.Timer] = []
    if scenario in ("hang", "suicide"):
        return faults
    kinds = (
        workflow_faults(settings)
        if scenario == "workflow"
        else keyed_faults(settings)
        if scenario == "keyed"
        else ["kill9"] * settings.repeats
        if scenario == "executor"
        else [scenario] * settings.repeats
    )
    t0 = time.monotonic()
    moments = sorted(rng.uniform(0.2, 0.8) * window for _ in kinds)
    if scenario in ("workflow", "keyed"):
        rng.shuffle(kinds)
    for moment, kind in zip(moments, kinds, strict=True):
        wait = t0 + moment - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        at = time.time()
        if kind == "kill9":
            pid = fleet.signal_one(rng, signal.SIGKILL)
            faults.append(Fault("SIGKILL", at, f"pid {pid}"))
        elif kind == "terminate":
            killed = retrying(
                url,
                lambda c: scalar(
                    c,
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend' AND application_name <> %s",
                    (DRIVER,),
                ),
            )
            faults.append(Fault("pg_terminate_backend", at, f"{killed} connections"))
        elif kind in ("restart_fast", "restart_immediate"):
            mode = kind.split("_", 1)[1]
            down = server.restart(mode)
            faults.append(Fault(f"restart -m {mode}", at, f"down {down:.2f} s"))
        elif kind == "sigstop":
            with fleet.lock:  # under the lock: two stops never pick the same process
                if len(fleet.alive()) < 2:
                    continue  # never stop the last running worker: the run would stall
                pid = fleet.signal_one(rng, signal.SIGSTOP)
                if pid is None:
                    continue
                fleet.stopped.add(pid)
            timer = threading.Timer(settings.lease * 2.5, fleet.resume, (pid,))
            timer.start()
            resumes.append(timer)
            faults.append(Fault("SIGSTOP", at, f"pid {pid} for {settings.lease * 2.5:.1f} s"))
    for timer in resumes:
        timer.join()
    return faults


# --- the keyed scenario -----------------------------------------------------------------------


def set_keyed_limit(url: str, limit: int | None) -> None:
    """The keyed scenario's per-key limit on its type (None: removed again, so that the
    scenarios after it run as they always did, without a limit to probe)."""

    def write(conn: psycopg.Connection[Any]) -> None:
        if limit is None:
            pgqueue.clear_limit(conn, type=KEYED_TYPE)
        else:
            pgqueue.set_limit(conn, type=KEYED_TYPE, per_key_max_running=limit)

    retrying(url, write)


def read_keyed_journal(path: Path) -> list[dict[str, Any]]:
    """The keyed journal's lines (``start`` and ``end`` of every keyed execution)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def check_keyed(
    lines: Iterable[Mapping[str, Any]],
    limit: int,
    killed: Mapping[int, float],
    deaths: Iterable[tuple[float, int, int]],
) -> dict[str, Any]:
    """The per-key limit, from the handlers' own journal alone: each execution runs from its
    ``start`` line to its ``end`` line or, without one, to the SIGKILL of its process by the
    run (it ended then at the latest) or else its process's death as the reaper saw it (a
    little after it); an execution with none of these ends never (it counts as running to
    the end). ``violations``: each stretch in which a key had more than ``limit``
    executions running (at equal times an end counts before a start), with the executions
    involved; ``peak``: the most one key ever ran at once; ``at_limit_s``: the seconds some
    key ran at its limit (how much the limit was put to the test)."""
    starts: dict[tuple[str, str, int], dict[str, Any]] = {}
    ends: dict[tuple[str, str, int], float] = {}
    for x in lines:
        ident = (str(x["task_id"]), str(x["lease"]), int(x["pid"]))
        if x["e"] == "start":
            starts[ident] = dict(x)
        else:
            ends[ident] = float(x["at"])
    died: dict[int, list[float]] = {}
    for at, pid, _ in deaths:
        died.setdefault(pid, []).append(at)
    events: list[tuple[float, int, str, str]] = []
    by_kill = by_death = unended = 0
    for ident, x in starts.items():
        began = float(x["at"])
        end = ends.get(ident)
        if end is None and killed.get(ident[2], -1.0) >= began:
            end, by_kill = killed[ident[2]], by_kill + 1
        elif end is None and any(at >= began for at in died.get(ident[2], [])):
            end, by_death = min(at for at in died[ident[2]] if at >= began), by_death + 1
        elif end is None:
            end, unended = math.inf, unended + 1
        label = f"{ident[0]} attempt {x['attempt']} pid {ident[2]}"
        events += [(end, 0, str(x["key"]), label), (began, 1, str(x["key"]), label)]
    events.sort()
    running: dict[str, set[str]] = {}
    violations: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    peak = 0
    at_limit = 0.0
    full: dict[str, float] = {}  # key -> since when it runs at its limit
    for at, kind, key, label in events:
        now = running.setdefault(key, set())
        if kind == 0:
            now.discard(label)
        else:
            now.add(label)
        n = len(now)
        peak = max(peak, n)
        if n >= limit and key not in full:
            full[key] = at
        elif n < limit and key in full:
            at_limit += at - full.pop(key)
        if n > limit:
            v = open_.setdefault(key, {"key": key, "at": at, "peak": n, "executions": set()})
            v["peak"] = max(v["peak"], n)
            v["executions"] |= now
        elif key in open_:
            v = open_.pop(key)
            violations.append(
                {**v, "seconds": round(at - v["at"], 3), "executions": sorted(v["executions"])}
            )
    for v in open_.values():
        violations.append({**v, "seconds": None, "executions": sorted(v["executions"])})
    return {
        "limit": limit,
        "executions": len(starts),
        "ended_by_kill": by_kill,
        "ended_by_death": by_death,
        "unended": unended,
        "keys": len({str(x["key"]) for x in starts.values()}),
        "peak": peak,
        "at_limit_s": round(at_limit, 1),
        "violations": violations,
    }


# --- the failover scenarios -------------------------------------------------------------------


@contextlib.contextmanager
def replicated(settings: Settings, synchronous: bool) -> Iterator[Pair]:
    """A failover scenario's servers: a primary of its own (the run's server never fails
    over: the other scenarios run on it), migrated and with the side tables, and its standby,
    streaming (synchronously or not) once they are there."""
    with private_server(settings.pg_version) as primary:
        migrate.upgrade(primary.url())
        with connect(primary.url()) as conn:
            conn.execute(SIDE_TABLES)
        with standby(primary, synchronous=synchronous) as pair:
            yield pair


@dataclasses.dataclass
class FailoverRun:
    """What inject_failover did, for the checks once the workers' logs are in."""

    failover: Failover
    workers: dict[str, int]  # the workers running at the crash: log name -> pid
    probes: list[str]  # the long tasks submitted once the standby was promoted (their ids)


def inject_failover(
    scenario: str,
    settings: Settings,
    pair: Pair,
    fleet: Fleet,
    producer: Producer,
    window: float,
    rng: random.Random,
) -> tuple[list[Fault], FailoverRun]:
    """At a seeded moment inside the producer's window: the standby's link held
    ``failover_lag`` seconds, the primary crashed, the standby promoted ``down`` seconds
    later (replication.py). Then FAILOVER_PROBES long tasks per worker, submitted by the
    driver (accepted like the producer's), to see the heartbeats carry on."""
    time.sleep(rng.uniform(0.2, 0.8) * window)
    with fleet.lock:
        workers = {f"worker-{slot}": proc.pid for slot, proc in fleet.procs.items()}
    failover = pair.fail_over(settings.failover_lag, settings.down)
    lacked = "?" if failover.lacked_bytes is None else f"{failover.lacked_bytes / 1024:.1f} kB"
    mode = "synchronous" if failover.synchronous else "asynchronous"
    fault = Fault(
        "failover",
        failover.crashed_at,
        f"{mode}; the standby's link held {failover.lag_s:g} s, the standby {lacked} behind;"
        f" primary stopped -m immediate, standby promoted {failover.down_s:.2f} s later",
    )
    probes: list[str] = []
    ms = round(settings.lease * 1.5 * 1000)
    for i in range(FAILOVER_PROBES * settings.workers):
        key = f"chaos:{scenario}:probe:{i}"
        payload = {"ms": ms, "mode": "sep", "scenario": scenario, "probe": True}

        def submit(conn: psycopg.Connection[Any], key: str = key, payload: Any = payload) -> Any:
            return pgqueue.enqueue(
                conn, "chaos.work", payload, queue=QUEUE, idempotency_key=key, retry=SURVIVE
            )

        task_id = retrying(producer.url, submit).task.id
        producer.acked_at[key] = time.time()
        producer.accepted[key] = task_id
        probes.append(str(task_id))
    return [fault], FailoverRun(failover, workers, probes)


def check_failover(
    synchronous: bool,
    requested_at: float,
    promoted_at: float,
    acked: Mapping[str, float],
    missing: Iterable[str],
    executions: Iterable[tuple[str, float, int]],
    completions: Iterable[tuple[str, float, str]],
    workers: Collection[str],
    sessions: Mapping[str, tuple[bool, float | None]],
    probes: Iterable[str],
    poison: Collection[str] = (),
) -> dict[str, Any]:
    """A failover scenario's accounting. ``requested_at``: when the standby's promotion was
    requested; ``promoted_at``: when it accepted writes; ``acked``: task id -> when its
    enqueue was acknowledged; ``missing``: accepted tasks the promoted standby does not have;
    ``executions``: (task id, start, pid) of every execution, from the journal outside the
    database; ``completions``: (task id, when, worker log) of every ``task.completed`` line,
    logged once the completion's commit returned; ``workers``: the workers running at the
    crash (their log names, ``worker-N``, which are their sessions' application_name too,
    ``chaos-worker-N``); ``sessions``: worker name -> (whether it LISTENs on the promoted
    standby, seconds since its latest statement there) at the scenario's end; ``probes``: the
    long tasks submitted after the promotion; ``poison``: the poison tasks (they run several
    times by design).

    An acknowledgement before ``requested_at`` came from the old primary (the standby refuses
    writes until promoted, and the old primary was down before the request), one after it
    from the promoted standby (an answer of the old primary read that late would have waited
    the whole ``--failover-down``). Lost:
    ``lost_acked_before`` (allowed by asynchronous replication only), ``lost_acked_after``
    (never allowed). Run again: ``completed_rerun_before``, a task whose completion was
    acknowledged before the promotion and which started again after that (asynchronous
    only), ``completed_rerun_after`` (never); ``running_rerun``, a task that ran more than
    once with an execution begun before the promotion and no completion acknowledged before
    another began (at-least-once allows it in both modes: a claim's commit does not wait for
    the standby). ``stalled_workers``: a worker of the crash that does not LISTEN on the
    promoted standby at the end, or ran no statement there in the last STALLED_AFTER seconds
    (an idle worker polls every 0.5 s); ``worker_back_s``: each one's seconds from the
    promotion to its first completion after it (a worker that got no task after it has none).
    ``probes_rerun``: long tasks that did not run exactly once (they land where the claims put
    them: they show the heartbeat of the workers that ran them carried on). ``violations``
    names what fails the scenario in its mode."""
    runs: dict[str, list[float]] = {}
    for task_id, at, _pid in executions:
        runs.setdefault(task_id, []).append(at)
    first_ack: dict[str, float] = {}
    back: dict[str, float] = {}
    for task_id, at, worker in completions:
        first_ack[task_id] = min(at, first_ack.get(task_id, at))
        if at >= promoted_at:
            back[worker] = min(at - promoted_at, back.get(worker, at - promoted_at))
    lost = sorted(missing)
    lost_before = [t for t in lost if acked.get(t, requested_at) < requested_at]
    lost_after = [t for t in lost if t not in set(lost_before)]
    rerun_before: list[str] = []
    rerun_after: list[str] = []
    running_rerun: list[str] = []
    for task_id, starts in runs.items():
        ack = first_ack.get(task_id)
        if ack is not None and any(at > ack for at in starts):
            (rerun_before if ack < requested_at else rerun_after).append(task_id)
        elif len(starts) > 1 and min(starts) < requested_at and task_id not in poison:
            running_rerun.append(task_id)
    stalled = []
    for name in sorted(workers):
        listens, idle = sessions.get(name, (False, None))
        if not listens or idle is None or idle > STALLED_AFTER:
            stalled.append(name)
    probes_rerun = [t for t in probes if len(runs.get(t, ())) != 1]
    violations = {
        "acknowledged enqueues lost with synchronous replication": (
            len(lost_before) if synchronous else 0
        ),
        "enqueues acknowledged after the promotion lost": len(lost_after),
        "completions acknowledged with synchronous replication run again": (
            len(rerun_before) if synchronous else 0
        ),
        "completions acknowledged after the promotion run again": len(rerun_after),
        "workers that did not carry on after the failover (not listening on the promoted"
        " standby, or silent there)": len(stalled),
        "long tasks submitted after the promotion that did not run exactly once (a heartbeat"
        " that did not carry on)": len(probes_rerun),
    }
    return {
        "lost_acked_before": lost_before,
        "lost_acked_before_had_run": [t for t in lost_before if t in runs],
        "lost_acked_after": lost_after,
        "completed_rerun_before": sorted(rerun_before),
        "completed_rerun_after": sorted(rerun_after),
        "running_rerun": sorted(running_rerun),
        "stalled_workers": stalled,
        "worker_back_s": {k: round(v, 3) for k, v in sorted(back.items())},
        "probes_rerun": probes_rerun,
        "violations": {k: v for k, v in violations.items() if v},
    }


def read_journal(path: Path) -> list[tuple[str, float, int]]:
    """The failover journal's executions: (task id, start, pid)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            x = json.loads(line)
            out.append((str(x["task_id"]), float(x["at"]), int(x["pid"])))
    return out


def finish_failover(row: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """A failover scenario's checks, once the workers' logs are in (``row["_failover"]``)."""
    data = row.pop("_failover", None)
    if not data:
        return
    run: FailoverRun = data["run"]
    ids = data["ids"]
    completions = [
        (str(e["task_id"]), float(e["at"]), str(e.get("slot")))
        for e in events
        if e.get("event") == "task.completed" and str(e.get("task_id")) in ids
    ]
    checked = check_failover(
        run.failover.synchronous,
        run.failover.promote_requested_at,
        run.failover.promoted_at,
        data["acked"],
        row.pop("_missing"),
        [x for x in data["executions"] if x[0] in ids],
        completions,
        run.workers,
        data["sessions"],
        run.probes,
        row.pop("_poison_ids"),
    )
    if not run.failover.synchronous:  # what asynchronous replication allows: its own column
        row["lost"] -= len(checked["lost_acked_before"])
    # A claim commits without waiting for any flush (pgqueue/sql/claiming.sql), so the
    # promoted standby may not have one: the task is claimed again under the same attempt
    # number, and the execution of the lost claim, whose side connection reached the promoted
    # standby, leaves a row there too. More executions than claims is then what at-least-once
    # allows, for a task that was running at the failover; two on one lease never is.
    lost_claims = [
        t
        for t, kind in row.pop("_double_leases")
        if kind == "more than claims" and t in checked["running_rerun"]
    ]
    row["double_leases"] -= len(lost_claims)
    checked["lost_claims"] = lost_claims
    row["failover"] = {
        "mode": "sync" if run.failover.synchronous else "async",
        **{k: v for k, v in dataclasses.asdict(run.failover).items() if k != "synchronous"},
        "down_s": round(run.failover.down_s, 3),
        "sessions": data["sessions"],
        **checked,
    }


def worker_sessions(url: str) -> dict[str, tuple[bool, float | None]]:
    """Each worker's sessions on the server at ``url`` (the promoted standby, after a
    failover), by their application_name (``chaos-worker-N``, from PGAPPNAME): whether one
    LISTENs (its LISTEN is the session's last statement), and the seconds since the latest
    statement any of them began."""

    def fetch(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute(
            "SELECT application_name, bool_or(query = 'LISTEN pgqueue'),"
            " extract(epoch FROM now() - max(query_start))::float8"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'chaos-worker-%' GROUP BY 1"
        ).fetchall()

    return {
        name.removeprefix("chaos-"): (bool(listens), None if idle is None else float(idle))
        for name, listens, idle in retrying(url, fetch)
    }


def wait_finished(url: str, prefix: str, ids: list[uuid.UUID], timeout: float) -> bool:
    """Until none of the scenario's tasks (its keys' or its accepted ``ids``, the workflow
    scenario's) is waiting, queued or running (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = retrying(
            url,
            lambda c: scalar(
                c,
                "SELECT count(*) FROM pgqueue.tasks WHERE queue = %s"
                " AND (idempotency_key LIKE %s OR id = ANY(%s))"
                " AND status IN ('waiting', 'queued', 'running')",
                (QUEUE, prefix + "%", ids),
            ),
        )
        if left == 0:
            return True
        time.sleep(0.25)
    return False


def check_dependants(
    tasks: Mapping[uuid.UUID, Mapping[str, Any]],
    edges: Iterable[tuple[uuid.UUID, uuid.UUID, int, bool]],
    runs: Mapping[uuid.UUID, Sequence[tuple[float, Any]]],
) -> dict[str, Any]:
    """The workflow rules, checked for every dependant (a task with parents).

    ``tasks``: id -> ``type``, ``status``, ``finished_at`` (epoch seconds or None),
    ``cancelled_by``, ``last_error``, ``result`` and ``collect`` (a chord callback's member
    count, else None); ``edges``: (child, parent, position, run_anyway); ``runs``: id -> each
    execution's (start in epoch seconds, what it received from its parents or None).

    Violations, each a list of dependants: ``started_early``, its first execution began
    before a parent was final (before its ``finished_at``, whatever its outcome);
    ``stalled``, still waiting though every parent is final; ``cancel_rule``, a parent was
    dead-lettered or cancelled and the dependant is not cancelled with ``cancelled_by`` that
    parent and a reason naming it, or ran; a run-anyway one that did not complete; or one
    cancelled by a parent though none failed; ``results_wrong``, an execution of a receiving
    type that did not get its parents' results in depends_on order (None for a parent that
    did not complete), or a chord callback whose members' indexes are not 0, 1, ... in order.
    Also ``cancelled_by_parent`` (the dependants rightly cancelled: not lost),
    ``ran_anyway``, ``releases`` (seconds from the last parent's finish to the first start)
    ``slowest_release`` (the longest: seconds, the dependant, its last parent's finish) and
    ``release_lags`` (from the last parent's finish to when the dependant became ready, its
    ``ready_since`` or ``visible_after``: 0 when the release is in the finishing transaction;
    the rest of the release delay is the claim's)."""
    parents_of: dict[uuid.UUID, list[tuple[int, uuid.UUID, bool]]] = {}
    for child, parent, position, run_anyway in edges:
        parents_of.setdefault(child, []).append((position, parent, run_anyway))
    out: dict[str, Any] = {
        k: [] for k in ("started_early", "stalled", "cancel_rule", "results_wrong")
    }
    cancelled_ok: set[uuid.UUID] = set()
    ran_anyway = 0
    releases: list[float] = []
    release_lags: list[float] = []
    slowest: tuple[float, uuid.UUID | None, float] = (0.0, None, 0.0)  # delay, child, release
    for child, rows in parents_of.items():
        d = tasks.get(child)
        if d is None:
            continue  # lost: counted as such
        rows.sort()
        parents = [tasks.get(p) for _, p, _ in rows]
        run_anyway = any(r for _, _, r in rows)
        all_final = all(p is not None and p["status"] in FINAL for p in parents)
        bad = {
            pid
            for (_, pid, _), p in zip(rows, parents, strict=True)
            if p is not None and p["status"] in ("failed", "cancelled")
        }
        executions = runs.get(child, ())
        done_at = [p["finished_at"] for p in parents if p is not None]
        last_parent = max(done_at) if all_final and None not in done_at else None
        if executions:
            first = min(at for at, _ in executions)
            if last_parent is None or first < last_parent:
                out["started_early"].append(child)
            else:
                releases.append(first - last_parent)
                if first - last_parent >= slowest[0]:
                    slowest = (first - last_parent, child, last_parent)
            if last_parent is not None and d.get("ready_at") is not None:
                # Released in the transaction that finished its last parent: both now().
                release_lags.append(d["ready_at"] - last_parent)
        if d["status"] == "waiting" and all_final:
            out["stalled"].append(child)
        if bad and not run_anyway:
            if d["status"] == "cancelled":
                cancelled_ok.add(child)
            if not (
                d["status"] == "cancelled"
                and d["cancelled_by"] in bad
                and str(d["cancelled_by"]) in (d["last_error"] or "")
                and not executions
            ):
                out["cancel_rule"].append(child)
        elif bad:  # run anyway: must have run once its parents were final, and completed
            if d["status"] == "completed" and d["cancelled_by"] is None:
                ran_anyway += 1
            elif d["status"] in FINAL:
                out["cancel_rule"].append(child)
        elif d["cancelled_by"] is not None:
            out["cancel_rule"].append(child)
        if d["type"] in RECEIVING_TYPES:
            expected = [p["result"] if p and p["status"] == "completed" else None for p in parents]
            got = [received for _, received in executions]
            wrong = any(r != expected for r in got)
            if d["collect"] is not None and got:
                wrong = wrong or any(
                    [x.get("i") if isinstance(x, dict) else None for x in r]
                    != list(range(d["collect"]))
                    for r in got
                )
            if wrong:
                out["results_wrong"].append(child)
    out["dependants"] = len(parents_of)
    out["cancelled_by_parent"] = cancelled_ok
    out["ran_anyway"] = ran_anyway
    out["releases"] = releases
    out["slowest_release"] = slowest
    out["release_lags"] = release_lags
    return out


@dataclasses.dataclass(frozen=True)
class Execution:
    """One execution of a task, as its handler recorded it (the executor scenario's)."""

    attempt: int
    pid: int  # the process that ran the handler (a child)
    worker_pid: int  # the worker it ran for
    started: float  # epoch seconds, server clock
    ended: float | None  # None: the process died in the handler (or the end was not written)
    live_others: tuple[str, ...] = ()  # "attempt N pid P" still running when this started

    def label(self) -> str:
        return f"attempt {self.attempt} pid {self.pid}"


def find_overlaps(
    runs: Mapping[Any, Sequence[Execution]], killed: Mapping[int, float]
) -> list[dict[str, Any]]:
    """Every two executions of one task that ran at the same time. Ordered by start, the
    second overlaps the first if it started before the first's recorded end, or if either
    found the other's process still running, and the first's end unrecorded, when it started
    (a process that died records no end: its start-time check, ``live_others``, is what
    shows it was still running). Each pair is ``explained`` if the first ran for a worker
    the run SIGKILLed before the second started: its children die with it, but its lease
    is only swept once it expires, and the lost-lease accounting explains that re-run."""
    out: list[dict[str, Any]] = []
    for task_id, executions in runs.items():
        ordered = sorted(executions, key=lambda x: x.started)
        for j, second in enumerate(ordered):
            for first in ordered[:j]:
                by_interval = first.ended is not None and second.started < first.ended
                alive = first.label() in second.live_others or second.label() in first.live_others
                if not (by_interval or alive):
                    continue
                kill = killed.get(first.worker_pid)
                out.append(
                    {
                        "task_id": str(task_id),
                        "first": first.label(),
                        "second": second.label(),
                        "how": "interval" if by_interval else "alive",
                        "explained": kill is not None and kill <= second.started,
                    }
                )
    return out


def innocent_reruns(
    attempts: Mapping[str, int],
    runs: Mapping[str, Sequence[Execution]],
    retried: Mapping[tuple[str, int], str],
    expired: Mapping[tuple[str, int], float],
    killed: Mapping[int, float],
    lease: float,
) -> list[dict[str, Any]]:
    """The attempts an innocent task spent beyond its first that a SIGKILL of its worker
    does not explain. Attempt k of a task with more is explained only if it was not failed
    (no ``task.retried``: a neighbour's crash must never cost an innocent an attempt), the
    sweep requeued it (``task.lease_expired``) within ``lease`` + 3 s of one of the run's
    SIGKILLs, and any execution it had ran for a worker the run killed (none: it was
    claimed but not yet in a child)."""
    out: list[dict[str, Any]] = []
    for task_id, n in attempts.items():
        for k in range(1, n):
            why = None
            ran_on = {x.worker_pid for x in runs.get(task_id, ()) if x.attempt == k}
            at = expired.get((task_id, k))
            if (task_id, k) in retried:
                why = f"failed: {retried[(task_id, k)][:160]}"
            elif at is None:
                why = "no task.lease_expired for it"
            elif not any(t <= at <= t + lease + 3.0 for t in killed.values()):
                why = "its lease expired with no SIGKILL before it"
            elif ran_on - set(killed):
                why = f"ran for workers {sorted(ran_on - set(killed))}, not killed"
            if why is not None:
                out.append({"task_id": task_id, "attempt": k, "attempts": n, "why": why})
    return out


def wrong_causes(
    poison: Sequence[tuple[str, str, str, float]],
    flaky: Mapping[str, str],
    retried: Mapping[tuple[str, int], str],
    killed: Mapping[int, float],
    lease: float,
) -> tuple[list[dict[str, Any]], int]:
    """Process faults recorded with the wrong cause: a dead-lettered poison task (id, fault,
    last_error, finished_at) whose last_error lacks its fault's texts (PROCESS_FAULTS), and
    a first-attempt fault whose ``task.retried`` error does. A poison task whose last attempt
    was lost to a SIGKILL ("lease expired on the last attempt", within ``lease`` + 3 s of
    one) is not wrong but counted apart (second value)."""
    out: list[dict[str, Any]] = []
    lost_to_kill = 0
    for task_id, kind, error, finished in poison:
        if all(text in error for text in PROCESS_FAULTS[kind][3]):
            continue
        if "lease expired" in error and any(
            t <= finished <= t + lease + 3.0 for t in killed.values()
        ):
            lost_to_kill += 1
            continue
        out.append({"task_id": task_id, "fault": kind, "error": error[:200]})
    for task_id, kind in flaky.items():
        first = retried.get((task_id, 1))
        if first is not None and not all(text in first for text in PROCESS_FAULTS[kind][3]):
            out.append({"task_id": task_id, "fault": kind, "attempt": 1, "error": first[:200]})
    return out, lost_to_kill


def check_executor(
    row: dict[str, Any],
    events: list[dict[str, Any]],
    killed: Mapping[int, float],
    own_deaths: int,
    lease: float,
) -> None:
    """The executor scenario's checks, once the workers' logs are in (``row["_executor"]``
    from verify): overlaps, innocent re-runs, causes, and workers that died unkilled."""
    data = row.pop("_executor")
    if not data:
        return
    retried: dict[tuple[str, int], str] = {}
    expired: dict[tuple[str, int], float] = {}
    for e in events:
        key = (str(e.get("task_id")), int(e.get("attempt") or 0))
        if e.get("event") == "task.retried":
            retried[key] = str(e.get("error", ""))
        elif e.get("event") == "task.lease_expired":
            expired.setdefault(key, float(e["at"]))
    runs = {str(k): v for k, v in data["runs"].items()}
    overlaps = find_overlaps(runs, killed)
    innocent = innocent_reruns(data["innocent"], runs, retried, expired, killed, lease)
    wrong, lost = wrong_causes(data["poison"], data["flaky"], retried, killed, lease)
    row["overlaps"] = [x for x in overlaps if not x["explained"]]
    row["overlaps_explained"] = sum(1 for x in overlaps if x["explained"])
    row["innocent_reruns"] = innocent
    row["innocent_reruns_explained"] = sum(n - 1 for n in data["innocent"].values()) - len(innocent)
    row["wrong_causes"] = wrong
    row["poison_lost_to_kill"] = lost
    row["executions_without_end"] = sum(1 for xs in runs.values() for x in xs if x.ended is None)
    row["workers_died_unkilled"] = own_deaths
    # Reported, not checked: "task.lease_lost" logged for the very attempt that completed (the
    # heartbeat found the lease gone because the completion had just been committed), by mode.
    completed = data["completed"]
    false_lost: dict[str, int] = {}
    for task_id, attempt in {
        (str(e.get("task_id")), int(e.get("attempt") or 0))
        for e in events
        if e.get("event") == "task.lease_lost"
    }:
        if task_id in completed and completed[task_id][0] == attempt:
            mode = completed[task_id][1] or "?"
            false_lost[mode] = false_lost.get(mode, 0) + 1
    row["lease_lost_logged_for_completed_attempt"] = false_lost


def verify(
    url: str,
    scenario: str,
    producer: Producer | WorkflowProducer,
    faults: list[Fault],
    settings: Settings,
) -> dict[str, Any]:
    """Account for every accepted task of the scenario, from the database."""
    ids = producer.task_ids()

    def fetch(
        conn: psycopg.Connection[Any],
    ) -> tuple[list[Any], list[Any], dict[Any, Any], list[Any]]:
        tasks = conn.execute(
            "SELECT id, type, status, attempts, payload->>'mode',"
            " status = 'running' AND lease_expires_at < now(),"
            " extract(epoch FROM created_at), extract(epoch FROM finished_at),"
            " cancelled_by, last_error, result, (payload->>'collect')::integer,"
            # When it first became ready: a dependant's release (kept through retries).
            " extract(epoch FROM coalesce(ready_since, visible_after))"
            " FROM pgqueue.tasks WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
        runs = conn.execute(
            # The worker's pid (a child's worker, for the process executor): what a SIGKILL
            # of a worker explains.
            "SELECT task_id, lease_token, attempt, extract(epoch FROM started_at),"
            " coalesce(worker_pid, pid), received, pid, extract(epoch FROM ended_at),"
            " live_others"
            # By attempt: a worker stopped between its claim and its handler's first write
            # records attempt 1 after another worker recorded attempt 2.
            " FROM chaos.executions WHERE task_id = ANY(%s) ORDER BY attempt, started_at",
            (ids,),
        ).fetchall()
        effects = dict(
            conn.execute(
                "SELECT task_id, count(*) FROM chaos.effects WHERE task_id = ANY(%s)"
                " GROUP BY task_id",
                (ids,),
            ).fetchall()
        )
        edges = conn.execute(
            "SELECT child_id, parent_id, position, run_anyway FROM pgqueue.task_dependencies"
            " WHERE child_id = ANY(%s)",
            (ids,),
        ).fetchall()
        return tasks, runs, effects, edges

    tasks, runs, effects, edges = retrying(url, fetch)
    by_id = {row[0]: row for row in tasks}
    runs_of: dict[uuid.UUID, list[Any]] = {}
    for run in runs:
        runs_of.setdefault(run[0], []).append(run)
    deps = check_dependants(
        {
            r[0]: {
                "type": r[1],
                "status": r[2],
                "finished_at": None if r[7] is None else float(r[7]),
                "cancelled_by": r[8],
                "last_error": r[9],
                "result": r[10],
                "collect": r[11],
                "ready_at": float(r[12]),
            }
            for r in tasks
        },
        edges,
        {tid: [(float(x[3]), x[5]) for x in rs] for tid, rs in runs_of.items()},
    )
    dependants = {e[0] for e in edges}

    # A task cancelled because a parent failed is accounted for (the rule is checked above);
    # any other cancelled task is lost.
    lost = len(ids) - len(by_id)
    lost += sum(1 for r in tasks if r[2] == "cancelled" and r[0] not in deps["cancelled_by_parent"])
    unfinished = sum(1 for r in tasks if r[2] in ("waiting", "queued", "running") and not r[5])
    stuck = sum(1 for r in tasks if r[5])
    completed = sum(1 for r in tasks if r[2] == "completed")
    dead = [r for r in tasks if r[2] == "failed"]
    dead_poison = sum(1 for r in dead if r[1] in POISON_TYPES)
    poison_total = sum(1 for r in tasks if r[1] in POISON_TYPES)
    # Poison tasks run max_attempts times by design: not counted as re-runs.
    multi = {
        tid: rs for tid, rs in runs_of.items() if len(rs) > 1 and by_id[tid][1] not in POISON_TYPES
    }
    # Executions that were followed by another; why each was is settled from the logs later.
    # Two on one lease, or more executions than claims, cannot be explained at all (but by a
    # failover, whose promoted standby may not have a claim: see finish_failover).
    earlier = [
        {"task_id": str(tid), "attempt": r[2], "pid": r[4], "all": [(x[2], x[4]) for x in rs]}
        for tid, rs in multi.items()
        for r in rs[:-1]
    ]
    double = [
        (str(tid), "one lease" if len({r[1] for r in rs}) != len(rs) else "more than claims")
        for tid, rs in multi.items()
        if len({r[1] for r in rs}) != len(rs) or len(rs) > by_id[tid][3]
    ]
    tx_done = [r for r in tasks if r[4] == "tx" and r[2] == "completed"]
    effects_bad = sum(1 for r in tx_done if effects.get(r[0], 0) != 1)
    # Pickup: from the task's creation to the start of its first execution (database clock);
    # a dependant's wait for its parents is its release delay instead.
    pickups = [
        min(float(x[3]) for x in runs_of[r[0]]) - float(r[6])
        for r in tasks
        if r[0] in runs_of and r[0] not in dependants
    ]

    # Handler faults began when their first attempt started (from the executions table).
    all_faults = list(faults)
    for r in tasks:
        if r[1] in ("chaos.hang", "chaos.suicide", "chaos.suicide_always"):
            for run in runs_of.get(r[0], []):
                if run[2] == 1 or r[1] == "chaos.suicide_always":
                    all_faults.append(Fault(r[1].split(".")[1], float(run[3]), f"task {r[0]}"))
    recovered_s: float | None = None
    slowest: dict[str, Any] | None = None
    if all_faults:
        last = max(f.at for f in all_faults)
        before = [
            r for r in tasks if r[1] in NORMAL_TYPES and float(r[6]) <= last and r[7] is not None
        ]
        if before:
            worst = max(before, key=lambda r: float(r[7]))
            recovered_s = max(0.0, float(worst[7]) - last)
            slowest = {  # the evidence behind recovered_s
                "task_id": str(worst[0]),
                "created_s": round(float(worst[6]) - last, 3),
                "finished_s": round(float(worst[7]) - last, 3),
                "runs": [
                    {"attempt": x[2], "pid": x[4], "started_s": round(float(x[3]) - last, 3)}
                    for x in runs_of.get(worst[0], [])
                ],
            }
        else:
            recovered_s = 0.0
    executor: dict[str, Any] = {}
    if scenario == "executor":
        executor = {
            "runs": {
                tid: [
                    Execution(
                        attempt=x[2],
                        pid=x[6],
                        worker_pid=x[4],
                        started=float(x[3]),
                        ended=None if x[7] is None else float(x[7]),
                        live_others=tuple(x[8] or ()),
                    )
                    for x in rs
                ]
                for tid, rs in runs_of.items()
            },
            "innocent": {
                str(r[0]): r[3] for r in tasks if r[1] in INNOCENT_TYPES and r[2] == "completed"
            },
            "poison": [
                (str(r[0]), PROCESS_POISON[r[1]], r[9] or "", float(r[7] or 0))
                for r in tasks
                if r[1] in PROCESS_POISON and r[2] == "failed"
            ],
            "flaky": {str(r[0]): PROCESS_FLAKY[r[1]] for r in tasks if r[1] in PROCESS_FLAKY},
            # Completed tasks: attempts and mode ("tx": the child committed the completion).
            "completed": {str(r[0]): (r[3], r[4]) for r in tasks if r[2] == "completed"},
        }
    return {
        "scenario": scenario,
        "_executor": executor,
        "faults": [dataclasses.asdict(f) for f in all_faults],
        "fault_count": len(all_faults),
        "accepted": len(ids),
        "not_accepted": len(producer.failed),
        "submit_retries": producer.retries,
        "completed": completed,
        "dead_lettered": len(dead),
        "dead_poison": dead_poison,
        "poison_total": poison_total,
        "dead_not_poison": len(dead) - dead_poison,
        "lost": lost,
        "unfinished": unfinished,
        "stuck": stuck,
        "ran_more_than_once": len(multi),
        "extra_executions": sum(len(rs) - 1 for rs in multi.values()),
        "double_leases": len(double),
        "_double_leases": double,
        "_earlier": earlier,
        "_ids": {str(i) for i in ids},
        "_missing": [str(i) for i in ids if i not in by_id],
        "_poison_ids": {str(r[0]) for r in tasks if r[1] in POISON_TYPES},
        "tx_completed": len(tx_done),
        "tx_effects_not_once": effects_bad,
        "recovered_s": recovered_s,
        "slowest_to_recover": slowest,
        "pickup_p50_s": rounded(quantile(pickups, 0.5), 3),
        "pickup_p99_s": rounded(quantile(pickups, 0.99), 3),
        "pickup_max_s": rounded(max(pickups, default=None), 3),
        "_pickups": pickups,
        # Workflows: counted for every scenario, nonzero only where tasks have
        # parents.
        "dependants": deps["dependants"],
        "cancelled_by_parent": len(deps["cancelled_by_parent"]),
        "ran_anyway": deps["ran_anyway"],
        "dependant_reruns": sum(1 for tid in multi if tid in dependants),
        "dep_started_early": len(deps["started_early"]),
        "dep_stalled": len(deps["stalled"]),
        "dep_cancel_rule": len(deps["cancel_rule"]),
        "dep_results_wrong": len(deps["results_wrong"]),
        "dependant_violations": {  # a few of each, to look at
            k: [str(t) for t in deps[k][:5]]
            for k in ("started_early", "stalled", "cancel_rule", "results_wrong")
            if deps[k]
        },
        "release_p50_s": rounded(quantile(deps["releases"], 0.5), 3),
        "release_p99_s": rounded(quantile(deps["releases"], 0.99), 3),
        "release_max_s": rounded(max(deps["releases"], default=None), 3),
        # Of which the release itself (0: in the transaction that finished the last parent);
        # the rest is the claim's.
        "release_lag_max_s": rounded(max(deps["release_lags"], default=None), 3),
        "released_late": sum(1 for x in deps["release_lags"] if x > 0.001),
        "_releases": deps["releases"],
        "slowest_release": slowest_release(deps["slowest_release"], by_id, runs_of, all_faults),
    }


def slowest_release(
    slowest: tuple[float, uuid.UUID | None, float],
    by_id: Mapping[uuid.UUID, Any],
    runs_of: Mapping[uuid.UUID, list[Any]],
    faults: list[Fault],
) -> dict[str, Any] | None:
    """The evidence behind the release delay's max: the dependant, the faults injected from
    a second before its release to its first start, and its executions, in seconds from its
    release (the last parent's finished_at)."""
    delay, child, released = slowest
    if child is None:
        return None
    return {
        "task_id": str(child),
        "type": by_id[child][1],
        "release_delay_s": round(delay, 3),
        "ready_s": round(float(by_id[child][12]) - released, 3),  # 0: released with its parent
        "faults": [
            {"kind": f.kind, "detail": f.detail, "at_s": round(f.at - released, 3)}
            for f in faults
            if released - 1.0 <= f.at <= released + delay
        ],
        "runs": [
            {"attempt": x[2], "pid": x[4], "started_s": round(float(x[3]) - released, 3)}
            for x in runs_of.get(child, [])
        ],
    }


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (None of nothing)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def failures(row: dict[str, Any]) -> list[str]:
    checks = {
        "lost": row["lost"],
        "not accepted": row["not_accepted"],
        "unfinished": row["unfinished"],
        "stuck running without a live lease": row["stuck"],
        "dead-lettered but not poison": row["dead_not_poison"],
        "poison not dead-lettered": row["poison_total"] - row["dead_poison"],
        "re-runs not explained by a failure or a lost lease": row["unexplained"],
        "two executions on one lease": row["double_leases"],
        "transactional effects not exactly once": row["tx_effects_not_once"],
        "dependants started before a parent was final": row["dep_started_early"],
        "dependants left waiting though every parent is final": row["dep_stalled"],
        "dependants of a failed or cancelled parent not cancelled by it (or run-anyway ones"
        " not completed)": row["dep_cancel_rule"],
        "dependants that did not receive their parents' results in order": row["dep_results_wrong"],
        "snapshot pressure not held as planned": len(row.get("pressure", {}).get("errors", [])),
        "two executions of one task at once, not explained by a SIGKILL of the first's worker": len(
            row.get("overlaps", [])
        ),
        "attempts spent by innocent process tasks that a SIGKILL of their worker does not"
        " explain": len(row.get("innocent_reruns", [])),
        "process faults recorded with the wrong cause": len(row.get("wrong_causes", [])),
        "workers that died though the run did not kill them": row.get("workers_died_unkilled", 0),
        "moments a key ran more handlers than its per-key limit (the handlers' journal)": len(
            row.get("keyed", {}).get("violations", [])
        ),
        "keyed executions with neither an end nor a known death": row.get("keyed", {}).get(
            "unended", 0
        ),
    }
    failover = row.get("failover")
    if failover is not None:
        checks.update(failover["violations"])
    return [f"{name}: {count}" for name, count in checks.items() if count]


# --- the worker logs -------------------------------------------------------------------------


def log_events(log_dir: Path) -> list[dict[str, Any]]:
    """Every JSON line the workers wrote, with ``at`` (epoch seconds) and ``slot`` (the log's
    name, ``worker-N``) added; other lines (a traceback from a crash) as event ``unparsed``."""
    out: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record["at"] = datetime.fromisoformat(record["ts"]).timestamp()
            except (ValueError, KeyError, TypeError, AttributeError):
                record = {"at": 0.0, "level": "?", "event": "unparsed", "line": line[:300]}
            record["slot"] = path.stem
            out.append(record)
    return out


def explain(row: dict[str, Any], events: list[dict[str, Any]], dead_pids: set[int]) -> None:
    """Sort each execution that was followed by another into why: its attempt failed and was
    retried (``task.retried``), or its lease was lost (the sweep requeued it:
    ``task.lease_expired``; its late outcome was fenced: ``task.lease_lost``; or the process
    that ran it died, which can happen between the sweep's commit and its log line)."""
    why: dict[tuple[str, int], str] = {}
    for e in events:
        key = (str(e.get("task_id")), int(e.get("attempt") or 0))
        if e.get("event") == "task.retried":
            why.setdefault(key, "failed")
        elif e.get("event") in ("task.lease_expired", "task.lease_lost"):
            why[key] = "lease_lost"
    earlier = row.pop("_earlier")
    reasons = [
        why.get((x["task_id"], x["attempt"]), "lease_lost" if x["pid"] in dead_pids else "?")
        for x in earlier
    ]
    row["unexplained_reruns"] = [x for x, r in zip(earlier, reasons, strict=True) if r == "?"]
    row["reruns_after_failure"] = reasons.count("failed")
    row["reruns_after_lost_lease"] = reasons.count("lease_lost")
    row["unexplained"] = reasons.count("?")


# --- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_dir(keep: Path | None) -> Iterator[Path]:
    """``keep`` (created if need be) if given, else a temporary directory deleted after."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="pgqueue-chaos-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(settings: Settings, keep: Path | None = None) -> dict[str, Any]:
    started = time.time()
    rows: list[dict[str, Any]] = []
    with private_server(settings.pg_version) as server, scratch_dir(keep) as log_dir:
        url = server.url()
        migrate.upgrade(url)
        with connect(url) as conn:
            conn.execute(SIDE_TABLES)
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        log(f"private PostgreSQL {version} on port {server.port}; {settings.workers} workers")
        fleet = Fleet(url, settings, log_dir)
        fleet.start()
        sampler = SnapshotSampler(url)
        # The failover scenarios' servers (a pair each), closed once no worker uses them.
        pairs: list[contextlib.ExitStack] = []
        try:
            fleet.wait_ready()
            sampler.start()
            per = settings.tasks // len(settings.scenarios)
            for k, scenario in enumerate(settings.scenarios):
                rng = random.Random(f"{settings.seed}:{scenario}")
                n = per + (settings.tasks - per * len(settings.scenarios) if k == 0 else 0)
                # Where the scenario's tasks go: the run's server, or a failover pair (both
                # servers in one URL, the standby taken once promoted).
                target, config = url, FleetConfig(url)
                pair: Pair | None = None
                if scenario in FAILOVER:
                    pairs.append(contextlib.ExitStack())
                    pair = pairs[-1].enter_context(replicated(settings, FAILOVER[scenario]))
                    target = pair.dsn()
                    journal = log_dir / f"journal-{scenario}.jsonl"
                    config = FleetConfig(
                        pair.url(), env=(("CHAOS_JOURNAL", str(journal)),), log_level="INFO"
                    )
                elif scenario == "executor":
                    config = FleetConfig(url, EXECUTOR_ARGS)
                producer: Producer | WorkflowProducer
                rate = settings.rate
                if scenario == "workflow":
                    flows = plan_workflows(scenario, max(n, WORKFLOW_MIN_TASKS), rng)
                    planned = sum(f.tasks for f in flows)
                    # Releases must keep happening for the whole window, faults and all.
                    rate = min(rate, planned / WORKFLOW_MIN_WINDOW)
                    producer = WorkflowProducer(url, scenario, flows, rate)
                    what = f"{planned} tasks in {len(flows)} workflows"
                else:
                    if pair is not None:  # a failover must fall among tasks, even in the smoke
                        n = max(n, FAILOVER_MIN_TASKS)
                    if scenario == "keyed":
                        n = max(n, KEYED_MIN_TASKS)
                    tasks = plan(scenario, n, settings, rng)
                    planned = len(tasks)
                    if scenario in PINNED:  # tasks must keep arriving for the whole pressure
                        rate = min(rate, planned / PINNED_MIN_WINDOW)
                    if scenario == "executor":  # the kills must fall among the faults
                        rate = min(rate, planned / EXECUTOR_MIN_WINDOW)
                    if pair is not None:
                        rate = min(rate, planned / FAILOVER_MIN_WINDOW)
                    if scenario == "keyed":  # the faults must fall among keyed tasks
                        rate = min(rate, planned / KEYED_MIN_WINDOW)
                    producer = Producer(target, tasks, rate)
                    what = f"{planned} tasks"
                window = planned / rate
                fleet.reconfigure(config)
                while len(pairs) > (1 if pair is not None else 0):  # no worker uses them now
                    pairs.pop(0).close()
                if scenario == "keyed":
                    set_keyed_limit(url, KEYED_LIMIT)
                log(f"{scenario}: {what} over {window:.1f} s")
                began = time.time()
                # A failover pair's own sampler: the run's server is not where its tasks are.
                watch = SnapshotSampler(target) if pair is not None else sampler
                if watch is not sampler:
                    watch.start()
                producer.start()
                pin = Pin(url, scenario) if scenario in PINNED else None
                failover: FailoverRun | None = None
                if pin is not None:
                    faults = [pin.hold(window, sampler)]
                elif pair is not None:
                    assert isinstance(producer, Producer)
                    faults, failover = inject_failover(
                        scenario, settings, pair, fleet, producer, window, rng
                    )
                else:
                    faults = inject(scenario, settings, server, fleet, url, window, rng)
                producer.join()
                done = wait_finished(
                    target, f"chaos:{scenario}:", producer.task_ids(), settings.settle_timeout
                )
                ended = time.time()
                row = verify(target, scenario, producer, faults, settings)
                if scenario == "keyed":
                    set_keyed_limit(url, None)
                    row["_keyed"] = read_keyed_journal(log_dir / KEYED_JOURNAL)
                if isinstance(producer, WorkflowProducer):
                    kinds = [kind for kind, _, _ in producer.accepted.values()]
                    row["workflows"] = {k: kinds.count(k) for k in sorted(set(kinds))}
                if failover is not None:
                    assert isinstance(producer, Producer)
                    row["_failover"] = {
                        "run": failover,
                        "ids": set(row["_ids"]),
                        "acked": {
                            str(producer.accepted[key]): at for key, at in producer.acked_at.items()
                        },
                        "journal": journal,
                        "sessions": worker_sessions(target),
                    }
                row["finished_in_time"] = done
                row["_window"] = (began, ended)
                row["seconds"] = round(time.time() - began, 1)
                row["rate"] = round(rate, 1)
                row.update(watch.during(began, ended))
                if watch is not sampler:
                    watch.stop()
                if pin is not None:
                    row["pressure"] = pin.report()
                rows.append(row)
                log(
                    f"{scenario}: {row['completed']} completed, {row['dead_lettered']} dead, "
                    f"{row['lost'] + row['unfinished']} lost, {row['stuck']} stuck, "
                    f"{row['extra_executions']} re-runs; oldest snapshot "
                    f"{row['oldest_snapshot_s']} s, pickup p99 {row['pickup_p99_s']} s"
                    + (
                        f"; {row['dependants']} dependants, {row['cancelled_by_parent']}"
                        f" cancelled by a parent, release p99 {row['release_p99_s']} s"
                        if row["dependants"]
                        else ""
                    )
                    + (
                        f"; promoted {failover.failover.down_s:.2f} s after the crash (lost:"
                        " before the mode's allowance, settled once the logs are in)"
                        if failover is not None
                        else ""
                    )
                )
        finally:
            sampler.stop()
            fleet.stop()
            for stack in pairs:
                stack.close()
        events = log_events(log_dir)
        for row in rows:  # the failover journals, before a temporary log_dir goes
            if "_failover" in row:
                row["_failover"]["executions"] = read_journal(row["_failover"].pop("journal"))
        deaths = list(fleet.deaths)
        killed = dict(fleet.killed)
    pickups = [x for row in rows for x in row.pop("_pickups")]
    releases = [x for row in rows for x in row.pop("_releases")]
    for row in rows:
        ids = row.pop("_ids")
        # Distinct attempts: the heartbeat that finds a lease gone and the dropped outcome
        # each log the same loss.
        row["late_outcomes_fenced"] = len(
            {
                (e["task_id"], e.get("attempt"))
                for e in events
                if e.get("event") == "task.lease_lost" and e.get("task_id") in ids
            }
        )
        explain(row, events, {pid for _, pid, _ in deaths})
        lo, hi = row.pop("_window")
        own_deaths = sum(1 for at, pid, _ in deaths if lo <= at <= hi and pid not in killed)
        check_executor(row, events, killed, own_deaths, settings.lease)
        if "_keyed" in row:
            row["keyed"] = check_keyed(row.pop("_keyed"), KEYED_LIMIT, killed, deaths)
        if "_failover" in row:
            row["workers_died_unkilled"] = own_deaths  # the failover kills no worker
        finish_failover(row, events)
        for key in ("_missing", "_poison_ids", "_double_leases"):
            row.pop(key, None)
        row["violations"] = failures(row)
    counts: dict[str, int] = {}
    for e in events:
        name = f"{e.get('level', '?')}:{e.get('event', '?')}"
        counts[name] = counts.get(name, 0) + 1
    unparsed = [e["line"] for e in events if e.get("event") == "unparsed"][:20]
    return {
        "settings": dataclasses.asdict(settings),
        "server_version": version,
        "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
        "worker_deaths": len(deaths),
        "worker_exit_codes": sorted({code for _, _, code in deaths}),
        "worker_log_events": dict(sorted(counts.items())),
        "scenarios": rows,
        "oldest_snapshot_s": max(
            (r["oldest_snapshot_s"] for r in rows if r["oldest_snapshot_s"] is not None),
            default=None,
        ),
        "pickup_p99_s": rounded(quantile(pickups, 0.99), 3),
        "release_p50_s": rounded(quantile(releases, 0.5), 3),
        "release_p99_s": rounded(quantile(releases, 0.99), 3),
        "release_max_s": rounded(max(releases, default=None), 3),
        "unparsed_log_lines": unparsed,
        "passed": not any(row["violations"] for row in rows),
    }


TABLE_HEADERS = (
    "scenario",
    "faults",
    "accepted",
    "completed",
    "dead-lettered (poison)",
    "cancelled by a parent",
    "lost",
    "stuck",
    "ran >1",
    "re-runs: failed / lease lost / unexplained",
    "tx effects ≠ 1",
    "late outcomes fenced",
    "recovered (s)",
    "oldest snapshot (s)",
    "pickup p99 (s)",
    "dependants: started early / stalled / cancel rule / results",
    "release p50 / p99 / max (s)",
    "process: overlaps / innocent re-runs / wrong cause",
    "failover: acked enqueues lost / acked completions re-run / running re-run / promoted (s) /"
    " workers back (s)",
    "per-key limit: violations / most at once / limit / some key at it (s)",
)
SUMMED = (
    "fault_count",
    "accepted",
    "completed",
    "dead_lettered",
    "dead_poison",
    "cancelled_by_parent",
    "lost",
    "unfinished",
    "stuck",
    "ran_more_than_once",
    "reruns_after_failure",
    "reruns_after_lost_lease",
    "unexplained",
    "tx_effects_not_once",
    "late_outcomes_fenced",
    "dependants",
    "dep_started_early",
    "dep_stalled",
    "dep_cancel_rule",
    "dep_results_wrong",
)


def _seconds(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _cells(row: dict[str, Any]) -> list[Any]:
    recovered = row.get("recovered_s")
    return [
        row["fault_count"],
        row["accepted"],
        row["completed"],
        f"{row['dead_lettered']} ({row['dead_poison']})",
        row["cancelled_by_parent"],
        row["lost"] + row["unfinished"],
        row["stuck"],
        row["ran_more_than_once"],
        f"{row['reruns_after_failure']} / {row['reruns_after_lost_lease']} / "
        f"{row['unexplained'] + row['double_leases']}",
        row["tx_effects_not_once"],
        row["late_outcomes_fenced"],
        "" if recovered is None else f"{recovered:.1f}",
        _seconds(row.get("oldest_snapshot_s")),
        _seconds(row.get("pickup_p99_s"), 2),
        (
            f"{row['dep_started_early']} / {row['dep_stalled']} / {row['dep_cancel_rule']} / "
            f"{row['dep_results_wrong']}"
            if row["dependants"]
            else ""
        ),
        (
            " / ".join(
                _seconds(row.get(k), 2) for k in ("release_p50_s", "release_p99_s", "release_max_s")
            )
            if row.get("release_p50_s") is not None
            else ""
        ),
        (
            f"{len(row['overlaps'])} / {len(row['innocent_reruns'])} / {len(row['wrong_causes'])}"
            if "overlaps" in row
            else ""
        ),
        _failover_cell(row.get("failover")),
        _keyed_cell(row.get("keyed")),
    ]


def _keyed_cell(k: dict[str, Any] | None) -> str:
    if k is None:
        return ""
    return f"{len(k['violations'])} / {k['peak']} / {k['limit']} / {k['at_limit_s']}"


def _failover_cell(f: dict[str, Any] | None) -> str:
    """Lost and re-run as the mode allows, with the mode: ``3 async`` is three acknowledged
    enqueues lost with asynchronous replication (allowed), ``0 sync`` none with synchronous."""
    if f is None:
        return ""
    lost = len(f["lost_acked_before"]) + len(f["lost_acked_after"])
    rerun = len(f["completed_rerun_before"]) + len(f["completed_rerun_after"])
    back = max(f["worker_back_s"].values(), default=None)
    return (
        f"{lost} / {rerun} / {len(f['running_rerun'])} ({f['mode']}) / "
        f"{_seconds(f['down_s'], 2)} / {_seconds(back, 2)}"
    )


def table(result: dict[str, Any]) -> str:
    """The run as a Markdown table, one row per scenario and a total."""
    lines = ["| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    rows = result["scenarios"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in [row["scenario"], *_cells(row)]) + " |")
    total: dict[str, Any] = {key: sum(row[key] for row in rows) for key in SUMMED}
    total["double_leases"] = sum(row["double_leases"] for row in rows)
    total["oldest_snapshot_s"] = result.get("oldest_snapshot_s")
    total["pickup_p99_s"] = result.get("pickup_p99_s")
    for key in ("release_p50_s", "release_p99_s", "release_max_s"):
        total[key] = result.get(key)
    if any("overlaps" in row for row in rows):
        for key in ("overlaps", "innocent_reruns", "wrong_causes"):
            total[key] = [x for row in rows for x in row.get(key, [])]
    # The failover column is per mode: the total leaves it empty.
    lines.append("| **all** | " + " | ".join(str(c) for c in _cells(total)) + " |")
    return "\n".join(lines)


def command_line(settings: Settings) -> str:
    """The command that repeats this run (the scenarios and repeats only when not all and not
    the default)."""
    extra = ""
    if settings.scenarios != SCENARIOS:
        extra += f" --scenarios {','.join(settings.scenarios)}"
    if settings.repeats != (1 if settings.smoke else 3):
        extra += f" --repeats {settings.repeats}"
    if any(s in FAILOVER for s in settings.scenarios):
        if settings.failover_lag != 0.5:
            extra += f" --failover-lag {settings.failover_lag:g}"
        if settings.failover_down is not None:
            extra += f" --failover-down {settings.failover_down:g}"
    if "keyed" in settings.scenarios and settings.keyed_restart != "fast":
        extra += f" --keyed-restart {settings.keyed_restart}"
    if settings.smoke:
        return f"python -m bench.chaos --smoke --seed {settings.seed}{extra}"
    return (
        f"python -m bench.chaos --tasks {settings.tasks} --seed {settings.seed}"
        f" --workers {settings.workers} --concurrency {settings.concurrency}"
        f" --lease {settings.lease:g} --rate {settings.rate:g}{extra}"
    )


def write_results(result: dict[str, Any], settings: Settings) -> None:
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else ""
    marker = "<!-- chaos:last-run -->"
    head = text.split(marker, 1)[0] if marker in text else text
    body = [
        marker,
        "",
        f"## Last full run ({result['started']}, PostgreSQL {result['server_version']})",
        "",
        "```",
        command_line(settings),
        "```",
        "",
        table(result),
        "",
        "Oldest snapshot (s): the oldest cleanup horizon (`backend_xmin` or `backend_xid`) a"
        " client backend of the chaos database held while the scenario ran, sampled every"
        " second. Pickup p99 (s): of the scenario's tasks, from `created_at` to the start of"
        " their first execution. Both are reported, not checked.",
        "",
        f"Verdict: **{'PASS' if result['passed'] else 'FAIL'}** in {result['seconds']} s;"
        f" {result['worker_deaths']} worker processes died (killed or killed themselves)"
        " and were replaced.",
        "",
        "Worker log events (level:event, count): "
        + ", ".join(f"`{k}` {v}" for k, v in result["worker_log_events"].items()),
        "",
        "Faults injected:",
        "",
    ]
    for row in result["scenarios"]:
        details = "; ".join(f"{f['kind']} ({f['detail']})" for f in row["faults"][:8])
        more = len(row["faults"]) - 8
        body.append(
            f"- **{row['scenario']}**: {details}" + (f"; and {more} more" if more > 0 else "")
        )
    RESULTS_MD.write_text(head.rstrip() + "\n\n" + "\n".join(body) + "\n")


def parse(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--smoke", action="store_true", help="the CI form: few tasks, each fault once")
    ap.add_argument("--tasks", type=int, help="tasks in all (default 20,000; smoke 300)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=3, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=20, help="tasks at once per worker")
    ap.add_argument("--lease", type=float, help="lease seconds (default 3; smoke 2)")
    ap.add_argument("--rate", type=float, help="tasks submitted per second (default 250)")
    ap.add_argument("--repeats", type=int, help="injections of each repeated fault (default 3)")
    ap.add_argument("--settle-timeout", type=float, default=120.0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--pg-version", type=int, default=18, choices=(16, 18))
    ap.add_argument(
        "--failover-lag",
        type=float,
        default=0.5,
        help="seconds the standby receives nothing before a failover (default 0.5;"
        " 0: the standby as far behind as it happens to be)",
    )
    ap.add_argument(
        "--failover-down",
        type=float,
        help="seconds from the primary's crash to the standby's promotion (default a lease)",
    )
    ap.add_argument(
        "--keyed-restart",
        choices=("fast", "immediate"),
        default="fast",
        help="the keyed scenario's server restart (default fast; immediate: a crash)",
    )
    ap.add_argument("--json", type=Path, help="write the whole result as JSON here")
    ap.add_argument("--log-dir", type=Path, help="keep the workers' logs here")
    ap.add_argument(
        "--write-results", action="store_true", help=f"record the run in {RESULTS_MD.name}"
    )
    args = ap.parse_args(argv)
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        ap.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    settings = Settings(
        tasks=args.tasks or (300 if args.smoke else 20_000),
        seed=args.seed,
        workers=args.workers if not args.smoke else min(args.workers, 2),
        concurrency=args.concurrency if not args.smoke else min(args.concurrency, 8),
        lease=args.lease or (2.0 if args.smoke else 3.0),
        rate=args.rate or (100.0 if args.smoke else 250.0),
        repeats=args.repeats or (1 if args.smoke else 3),
        settle_timeout=args.settle_timeout,
        scenarios=scenarios,
        pg_version=args.pg_version,
        smoke=args.smoke,
        failover_lag=args.failover_lag,
        failover_down=args.failover_down,
        keyed_restart=args.keyed_restart,
    )
    if settings.tasks < 10 * len(scenarios):
        ap.error(f"give at least {10 * len(scenarios)} tasks for {len(scenarios)} scenarios")
    return settings, args


def main(argv: list[str] | None = None) -> int:
    settings, args = parse(argv)
    result = run(settings, args.log_dir)
    print(table(result))
    print(f"\n{'PASS' if result['passed'] else 'FAIL'}: {command_line(settings)}")
    for row in result["scenarios"]:
        for problem in row["violations"]:
            print(f"  {row['scenario']}: {problem}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if args.write_results:
        write_results(result, settings)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
