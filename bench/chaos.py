"""The chaos run: real worker processes drain a stream of tasks while the faults production
brings are injected on a seeded schedule, and then every task is accounted for.

    python -m bench.chaos                      # the full run: 20,000 tasks, every scenario
    python -m bench.chaos --smoke              # CI: 300 tasks, one of each fault, ~1 min
    python -m bench.chaos --seed 7 --scenarios kill9,sigstop --tasks 5000

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
========================  =================================================================

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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
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
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from bench.chaos_handlers import POISON, SURVIVE
from bench.private_postgres import PrivateServer, private_server
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
)
POISON_TYPES = frozenset({"chaos.poison", "chaos.suicide_always"})
QUEUE = "chaos"
DRIVER = "chaos-driver"  # application_name of our own connections: never terminated by us

SIDE_TABLES = """
CREATE SCHEMA chaos;
-- One row per execution, committed on its own before the handler does anything else.
CREATE TABLE chaos.executions (
    task_id     uuid        NOT NULL,
    lease_token uuid        NOT NULL,
    attempt     integer     NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp()
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


def log(message: str) -> None:
    print(f"[chaos {datetime.now(UTC).strftime('%H:%M:%S')}] {message}", file=sys.stderr)


# --- the worker fleet --------------------------------------------------------------------


class Fleet:
    """``workers`` real ``pgqueue worker`` processes (no supervisor: a kill must hit the
    worker itself), each restarted as soon as it is found dead."""

    def __init__(self, url: str, settings: Settings, log_dir: Path) -> None:
        self.url = url
        self.settings = settings
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopped: set[int] = set()  # pids under SIGSTOP
        self.deaths: list[tuple[float, int, int]] = []  # (when, pid, exit code)
        self.lock = threading.RLock()
        self._closing = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True)

    def command(self) -> list[str]:
        s = self.settings
        return [
            *(sys.executable, "-m", "pgqueue", "--database-url", self.url, "worker"),
            *("bench.chaos_handlers:tasks", "--queue", QUEUE),
            *("--concurrency", str(s.concurrency), "--lease-seconds", str(s.lease)),
            *("--sweep-interval", "0.5", "--poll-interval", "0.5", "--grace-period", "5"),
            *("--log-format", "json", "--log-level", "WARNING"),
        ]

    def _spawn(self, slot: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), CHAOS_DATABASE_URL=self.url)
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


# --- one scenario ----------------------------------------------------------------------------


@dataclasses.dataclass
class Planned:
    type: str
    payload: dict[str, Any]
    key: str
    policy: pgqueue.RetryPolicy


@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # epoch seconds, when it was injected (or, for handler faults, when it began)
    detail: str


def plan(scenario: str, n: int, settings: Settings, rng: random.Random) -> list[Planned]:
    """The scenario's tasks in submission order: normal work, ~1 % poison, and the scenario's
    fault tasks placed in the middle third of the stream."""
    hang_s = round(settings.lease * 2.5, 2)
    out = [
        Planned(
            "chaos.work",
            {"ms": rng.randint(5, 40), "mode": "tx" if i % 2 else "sep", "scenario": scenario},
            "",
            SURVIVE,
        )
        for i in range(n)
    ]
    special: list[Planned] = [
        Planned("chaos.poison", {"scenario": scenario}, "", POISON) for _ in range(max(1, n // 100))
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
    for task in special:
        out.insert(rng.randint(len(out) // 3, max(len(out) // 3, 2 * len(out) // 3)), task)
    for i, task in enumerate(out):
        task.key = f"chaos:{scenario}:{i}"
    return out


class Producer(threading.Thread):
    """Submits the planned tasks at ``rate`` per second, each retried (same idempotency key)
    until it is known to be stored: a commit cut off by a restart is either there or not, and
    the retry finds out which."""

    def __init__(self, url: str, tasks: list[Planned], rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.tasks, self.rate = url, tasks, rate
        self.accepted: dict[str, uuid.UUID] = {}
        self.retries = 0
        self.failed: list[str] = []

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
                    result = pgqueue.enqueue(
                        conn,
                        task.type,
                        task.payload,
                        queue=QUEUE,
                        idempotency_key=task.key,
                        retry=task.policy,
                    )
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
    window (the handler faults inject themselves and are read back from the database)."""
    faults: list[Fault] = []
    resumes: list[threading.Timer] = []
    count = settings.repeats
    if scenario in ("hang", "suicide"):
        return faults
    t0 = time.monotonic()
    moments = sorted(rng.uniform(0.2, 0.8) * window for _ in range(count))
    for moment in moments:
        wait = t0 + moment - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        at = time.time()
        if scenario == "kill9":
            pid = fleet.signal_one(rng, signal.SIGKILL)
            faults.append(Fault("SIGKILL", at, f"pid {pid}"))
        elif scenario == "terminate":
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
        elif scenario in ("restart_fast", "restart_immediate"):
            mode = scenario.split("_", 1)[1]
            down = server.restart(mode)
            faults.append(Fault(f"restart -m {mode}", at, f"down {down:.2f} s"))
        elif scenario == "sigstop":
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


def wait_finished(url: str, prefix: str, timeout: float) -> bool:
    """Until none of the scenario's tasks is queued or running (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = retrying(
            url,
            lambda c: scalar(
                c,
                "SELECT count(*) FROM pgqueue.tasks WHERE queue = %s"
                " AND idempotency_key LIKE %s AND status IN ('queued', 'running')",
                (QUEUE, prefix + "%"),
            ),
        )
        if left == 0:
            return True
        time.sleep(0.25)
    return False


def verify(
    url: str,
    scenario: str,
    producer: Producer,
    faults: list[Fault],
    settings: Settings,
) -> dict[str, Any]:
    """Account for every accepted task of the scenario, from the database."""
    ids = list(producer.accepted.values())

    def fetch(conn: psycopg.Connection[Any]) -> tuple[list[Any], list[Any], dict[Any, Any]]:
        tasks = conn.execute(
            "SELECT id, type, status, attempts, payload->>'mode',"
            " status = 'running' AND lease_expires_at < now(),"
            " extract(epoch FROM created_at), extract(epoch FROM finished_at)"
            " FROM pgqueue.tasks WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
        runs = conn.execute(
            "SELECT task_id, lease_token, attempt, extract(epoch FROM started_at), pid"
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
        return tasks, runs, effects

    tasks, runs, effects = retrying(url, fetch)
    by_id = {row[0]: row for row in tasks}
    runs_of: dict[uuid.UUID, list[Any]] = {}
    for run in runs:
        runs_of.setdefault(run[0], []).append(run)

    lost = len(ids) - len(by_id) + sum(1 for r in tasks if r[2] == "cancelled")
    unfinished = sum(1 for r in tasks if r[2] in ("queued", "running") and not r[5])
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
    # Two on one lease, or more executions than claims, cannot be explained at all.
    earlier = [
        {"task_id": str(tid), "attempt": r[2], "pid": r[4], "all": [(x[2], x[4]) for x in rs]}
        for tid, rs in multi.items()
        for r in rs[:-1]
    ]
    double_leases = sum(
        1
        for tid, rs in multi.items()
        if len({r[1] for r in rs}) != len(rs) or len(rs) > by_id[tid][3]
    )
    tx_done = [r for r in tasks if r[4] == "tx" and r[2] == "completed"]
    effects_bad = sum(1 for r in tx_done if effects.get(r[0], 0) != 1)

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
            r for r in tasks if r[1] == "chaos.work" and float(r[6]) <= last and r[7] is not None
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
    return {
        "scenario": scenario,
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
        "double_leases": double_leases,
        "_earlier": earlier,
        "_ids": {str(i) for i in ids},
        "tx_completed": len(tx_done),
        "tx_effects_not_once": effects_bad,
        "recovered_s": recovered_s,
        "slowest_to_recover": slowest,
    }


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
    }
    return [f"{name}: {count}" for name, count in checks.items() if count]


# --- the worker logs -------------------------------------------------------------------------


def log_events(log_dir: Path) -> list[dict[str, Any]]:
    """Every JSON line the workers wrote, with ``at`` (epoch seconds) added; other lines (a
    traceback from a crash) as event ``unparsed``."""
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
        try:
            fleet.wait_ready()
            per = settings.tasks // len(settings.scenarios)
            for k, scenario in enumerate(settings.scenarios):
                rng = random.Random(f"{settings.seed}:{scenario}")
                n = per + (settings.tasks - per * len(settings.scenarios) if k == 0 else 0)
                tasks = plan(scenario, n, settings, rng)
                window = len(tasks) / settings.rate
                log(f"{scenario}: {len(tasks)} tasks over {window:.1f} s")
                began = time.time()
                producer = Producer(url, tasks, settings.rate)
                producer.start()
                faults = inject(scenario, settings, server, fleet, url, window, rng)
                producer.join()
                done = wait_finished(url, f"chaos:{scenario}:", settings.settle_timeout)
                row = verify(url, scenario, producer, faults, settings)
                row["finished_in_time"] = done
                row["seconds"] = round(time.time() - began, 1)
                rows.append(row)
                log(
                    f"{scenario}: {row['completed']} completed, {row['dead_lettered']} dead, "
                    f"{row['lost'] + row['unfinished']} lost, {row['stuck']} stuck, "
                    f"{row['extra_executions']} re-runs"
                )
        finally:
            fleet.stop()
        events = log_events(log_dir)
        deaths = list(fleet.deaths)
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
        "unparsed_log_lines": unparsed,
        "passed": not any(row["violations"] for row in rows),
    }


TABLE_HEADERS = (
    "scenario",
    "faults",
    "accepted",
    "completed",
    "dead-lettered (poison)",
    "lost",
    "stuck",
    "ran >1",
    "re-runs: failed / lease lost / unexplained",
    "tx effects ≠ 1",
    "late outcomes fenced",
    "recovered (s)",
)
SUMMED = (
    "fault_count",
    "accepted",
    "completed",
    "dead_lettered",
    "dead_poison",
    "lost",
    "unfinished",
    "stuck",
    "ran_more_than_once",
    "reruns_after_failure",
    "reruns_after_lost_lease",
    "unexplained",
    "tx_effects_not_once",
    "late_outcomes_fenced",
)


def _cells(row: dict[str, Any]) -> list[Any]:
    recovered = row.get("recovered_s")
    return [
        row["fault_count"],
        row["accepted"],
        row["completed"],
        f"{row['dead_lettered']} ({row['dead_poison']})",
        row["lost"] + row["unfinished"],
        row["stuck"],
        row["ran_more_than_once"],
        f"{row['reruns_after_failure']} / {row['reruns_after_lost_lease']} / "
        f"{row['unexplained'] + row['double_leases']}",
        row["tx_effects_not_once"],
        row["late_outcomes_fenced"],
        "" if recovered is None else f"{recovered:.1f}",
    ]


def table(result: dict[str, Any]) -> str:
    """The run as a Markdown table, one row per scenario and a total."""
    lines = ["| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    rows = result["scenarios"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in [row["scenario"], *_cells(row)]) + " |")
    total: dict[str, Any] = {key: sum(row[key] for row in rows) for key in SUMMED}
    total["double_leases"] = sum(row["double_leases"] for row in rows)
    lines.append("| **all** | " + " | ".join(str(c) for c in _cells(total)) + " |")
    return "\n".join(lines)


def command_line(settings: Settings) -> str:
    if settings.smoke:
        return f"python -m bench.chaos --smoke --seed {settings.seed}"
    return (
        f"python -m bench.chaos --tasks {settings.tasks} --seed {settings.seed}"
        f" --workers {settings.workers} --concurrency {settings.concurrency}"
        f" --lease {settings.lease:g} --rate {settings.rate:g}"
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
