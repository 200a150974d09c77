"""Concurrency keys under a skewed load: the fair claim's acceptance figures, from the
handlers' own records.

    python -m bench.fair_keys --smoke          # CI: a minute; fails only on a limit violation
    python -m bench.fair_keys                  # the phases once (about 4 min)
    python -m bench.fair_keys --long           # the capped phase until 1,000,000 claims
    python -m bench.fair_keys --cost-only      # only the claim's cost, keyed against unkeyed

It starts a private PostgreSQL server (bench/private_postgres.py: fsync and
synchronous_commit on), migrates it, gives the task type ``fair.work`` a per-key limit
(``per_key_max_running`` ``--limit``, 4) and runs ``pgqueue worker --processes 2
--concurrency 16`` (32 slots) on bench/fair_handlers.py, whose handlers sleep ``--sleep-ms``
(10) and record their own start and finish (task id, key, pid). Tasks go to the queue
"default", at normal priority, with ``--promote-after 0``: the default promotion (a task
waiting 300 s moves up a priority) would put the oldest backlog above every other key's
fresh work, which is not what is measured here.

10,000 keys: ``hot`` and 9,999 cold ones (``c0001``...). The phases, one after the other
(each window opens 2 s after its load starts; the seconds between windows are in none):

``baseline``  no key and no limit yet: an unkeyed backlog (``fair.plain``) and the ordinary
              one-statement claim, the fleet at full tilt. What the idle-slot figures of an
              unkeyed fleet are on this machine; drained before the next phase.
``unloaded``  the per-key limit is set, and a cold stream starts that runs to the end:
              ``--cold-rate`` (50) tasks a second, one per transaction, Poisson arrivals,
              each the next cold key of a seeded permutation (every cold key in turn). The
              baseline of cold-key pickup.
``hot``       100,000 tasks of the hot key are copied in (``--hot-backlog``), then the hot
              key submits nine times the cold rate (90 % of the live submissions, in
              transactions of 10): it runs at its limit with a backlog that only grows,
              while the cold stream goes on as before.
              ``unloaded`` and ``hot`` come in ``--rounds`` (3) pairs of ``--unloaded-seconds``
              and ``--hot-seconds`` (15 each); between two, the hot stream stops and the hot
              key's waiting tasks are deleted (set-up: the records' bookkeeping counts them
              out at the delete's commit), so that each ``unloaded`` has no hot backlog. The
              machine is shared: a burst of other work in one window moves one round, not
              the verdict, which takes the median of the rounds' ratios.
``capped``    backlogs for 5 more keys: with the hot key, 6 keys run at their limit
              (24 slots; what is left is the cold keys'), so that claims keep meeting keys
              at their limit. ``--capped-seconds`` (30), or with ``--long`` until
              ``--claims`` (1,000,000) handlers have started in all.
``fair``      deep backlogs for ``--deep-keys`` (24) more keys and for unkeyed tasks of an
              unlimited type (``fair.plain``: the fair claim's unkeyed turn, one more
              "key"): with the hot and capped keys 31 backlogs compete for 32 slots, more than
              the limits alone share out (31 x 4 > 32): what each gets is the claim's doing.
              ``--fair-seconds`` (60).

Live tasks go in through the producer API (``pgqueue.enqueue(..., concurrency_key=...)``, and
``pgqueue.enqueue_many`` of ``pgqueue.prepare(..., concurrency_key=...)`` for the hot key's
transactions of 10), the limit through ``pgqueue.set_limit(..., per_key_max_running=...)``;
the backlogs (100,000 tasks and more at once) with one SQL COPY each, as a bulk load would.

Every figure comes from the handlers' records and the producer's own (each live task's id,
key and the moment its commit returned; a backlog's keys, sizes and commit time), never from
pgqueue's tables:

- **violations**: moments where a key had more than ``--limit`` handlers running (a sweep of
  every start and finish; at equal times a finish counts first), over the whole run.
- **cold-key pickup**: from a cold task's commit to its handler's start, p50/p99/max, per
  phase; the target: p99 in ``hot`` at most 2x p99 in ``unloaded``, the median of the
  rounds' ratios (each round's, and the p99s of all the rounds' windows pooled, reported).
- **Jain's fairness index** over 10-second windows of ``fair``: x is the number of handlers a
  key started in the window, among the keys backlogged all through it (a key is, if more of
  its tasks were waiting at the window's start than it started in the window: then one was
  waiting at every moment); target: each window at least 0.95.
- **idle slots**: at each moment, the usable idle slots are min(32 - handlers running, the
  sum over keys of min(tasks waiting, limit - running)) (an unkeyed task: no per-key limit).
  Reported per phase: the share of the time that was more than zero (the brief's "fewer than
  32 running while a key under its limit had ready work") and its longest stretch; the slot
  time lost (the integral, as a share of 32 slots x the phase); and each idle slot's age,
  first come first filled, from the moment it became usable (a finish, a commit) to the start
  that filled it. A claim needs some milliseconds after a finish (the completion's write,
  which frees the key's count in the database, then a claim round under the limits lock, then
  the start mark), so ages up to ``--tolerance-ms`` (25) are the claim's latency, not idle
  slots; the target is no slot time lost beyond it in any keyed phase (reported as a share,
  with the longest age). The baseline's figures are the same measure for the ordinary claim.
- throughput: handlers started per second, per phase.

Then the claim's cost (``--cost-only`` alone, ``--no-cost`` without): on a database of its
own, with the fleet stopped, one claimer calls ``claiming.claim_round`` (batch 16, with the
rotation a worker keeps, pgqueue/worker/key_rotation.py) on queues holding ``--cost-backlog``
(100,000) tasks of a per-key-limited type over 100, 1,000, 10,000 and 100,000 keys, and the
ordinary ``claiming.task_claim`` (what a worker with no keys and no limits runs) on a queue
of the same backlog without keys, alternating, ``--cost-samples`` (500) each after 20 left
out; what a claim took is completed (not timed), as a worker would. Autovacuum is off for
the table and a VACUUM runs every 50 rounds (untimed): every claim adds an entry per task to
the index of running tasks (``tasks_lease_idx``), which the fair claim reads whole to count
what runs per key, and only vacuum removes them, so its cost depends on when vacuum last ran;
50 rounds add about 4,000. Reported per kind: the
whole claim (keyed: probe and limits lock, the fair claim, commit; unkeyed: the one
statement) and the claim statement alone (``task_claim_keyed``, ``task_claim``), p50/p99.
Targets: the whole keyed claim's p99 within 2 ms of the unkeyed one's at every key count, and
flat (the largest p99 of the key counts at most 1.5x the smallest). And, for the fair claim at
each key count, EXPLAIN ANALYZE of its generic plan (the plan a worker runs, prepared) just
after a VACUUM, its time per CTE; the whole plans go into the JSON. Then the growth under an
old snapshot (an xid held open, the pinned-snapshot pressure): ``--cost-growth`` (1,600) rounds of a
keyed claim of 4 on a queue of two deep keys and an unkeyed claim of 16 with a worker's claim
starts, the medians per quarter against the keyed tasks claimed since the xid.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import glob
import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import pgqueue
from bench.loadkit import machine_busy_seconds, stop_group
from bench.private_postgres import private_server
from pgqueue import migrate
from pgqueue.key_rotation import KeyRotation
from pgqueue.models import ClaimedTask
from pgqueue.queries import claiming, driver, leased
from pgqueue.worker.claim_starts import ClaimStarts

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TYPE = "fair.work"  # keyed, under the per-key limit
PLAIN = "fair.plain"  # unkeyed, no limit: the fair claim's unkeyed turn
HOT = "hot"
UNKEYED = "-"  # how the records name the unkeyed tasks
PROCESSES = 2
CONCURRENCY = 16
SLOTS = PROCESSES * CONCURRENCY
WINDOW = 10.0  # seconds: Jain's index windows
SETTLE = 2.0  # seconds after a phase's load starts before its window opens
HOT_BATCH = 10  # the hot key's tasks per transaction
CAPPED_KEYS = 5  # keys besides the hot one that run at their limit in the capped phase
BASELINE_RATE = 2200  # unkeyed tasks a second the baseline's backlog is sized for
CONNECT: dict[str, Any] = {"autocommit": True, "connect_timeout": 10}


@dataclasses.dataclass
class Settings:
    smoke: bool
    long: bool
    cost: bool
    fleet: bool
    seed: int
    limit: int
    sleep_ms: float
    keys: int
    cold_rate: float
    hot_backlog: int
    capped_backlog: int
    deep_keys: int
    deep_backlog: int
    baseline_s: float
    rounds: int
    unloaded_s: float
    hot_s: float
    capped_s: float
    fair_s: float
    claims: int
    tolerance_ms: float
    cost_keys: tuple[int, ...]
    cost_backlog: int
    cost_samples: int
    cost_growth: int
    keep: Path | None = None  # keep the handlers' records here
    json: Path | None = None  # where the result goes (default: under bench/results)

    @property
    def hot_rate(self) -> float:
        return 9 * self.cold_rate


def log(message: str) -> None:
    print(f"[fair {datetime.now(UTC).strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- producing -------------------------------------------------------------------------------


def submit(conn: psycopg.Connection[Any], keys: Sequence[str]) -> list[str]:
    """Keyed ``fair.work`` tasks in one transaction, through the producer API (one
    ``pgqueue.enqueue``, or ``pgqueue.enqueue_many`` of prepared tasks for several), which
    wakes the workers. Returns the tasks' ids (hex)."""
    with conn.transaction():
        if len(keys) == 1:
            results = [pgqueue.enqueue(conn, TYPE, {"k": keys[0]}, concurrency_key=keys[0])]
        else:
            prepared = [pgqueue.prepare(TYPE, {"k": k}, concurrency_key=k) for k in keys]
            results = pgqueue.enqueue_many(conn, prepared)
    return [r.task.id.hex for r in results]


@dataclasses.dataclass(frozen=True)
class Enqueued:
    """Tasks of one key that became ready together (one commit): a live task, or a backlog."""

    key: str
    count: int
    at: float  # time.time() when the commit returned


class Stream(threading.Thread):
    """Open loop: batch *i* is sent at its scheduled moment whatever happened to the one
    before (``gaps``: seconds between batches), each in a transaction of its own. ``acked``:
    every task's id, key and the moment its commit returned."""

    def __init__(
        self, url: str, name: str, keys: Callable[[], str], batch: int, gaps: Iterator[float]
    ) -> None:
        super().__init__(daemon=True, name=name)
        self.url, self.keys, self.batch, self.gaps = url, keys, batch, gaps
        self.acked: list[tuple[str, str, float]] = []
        self.lateness: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, **CONNECT) as conn:
            due = time.monotonic()
            while not self.halt.is_set():
                due += next(self.gaps)
                delay = due - time.monotonic()
                if delay > 0 and self.halt.wait(delay):
                    break
                self.lateness.append(max(0.0, -delay))
                keys = [self.keys() for _ in range(self.batch)]
                try:
                    ids = submit(conn, keys)
                except psycopg.Error as exc:
                    self.errors += 1
                    self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"[:300]
                    continue
                at = time.time()
                self.acked.extend((i, k, at) for i, k in zip(ids, keys, strict=True))

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def poisson(rate: float, rng: random.Random) -> Iterator[float]:
    while True:
        yield rng.expovariate(rate)


def steady(rate: float) -> Iterator[float]:
    while True:
        yield 1.0 / rate


def copy_backlog(url: str, backlog: Mapping[str | None, int]) -> list[Enqueued]:
    """``count`` tasks per key in one COPY and one commit (key None: unkeyed ``fair.plain``
    tasks), interleaved by key so that no key's rows sit together on disk."""
    left = dict(backlog)
    with psycopg.connect(url, **CONNECT) as conn:
        with (
            conn.transaction(),
            conn.cursor().copy(
                "COPY pgqueue.tasks (id, type, payload, concurrency_key) FROM STDIN"
            ) as copy,
        ):
            while left:
                for key in list(left):
                    if key is None:
                        copy.write_row((uuid.uuid4(), PLAIN, "{}", None))
                    else:
                        copy.write_row((uuid.uuid4(), TYPE, json.dumps({"k": key}), key))
                    left[key] -= 1
                    if left[key] <= 0:
                        del left[key]
        at = time.time()
        conn.execute("ANALYZE pgqueue.tasks")
    return [Enqueued(UNKEYED if k is None else k, n, at) for k, n in backlog.items()]


# --- the fleet -------------------------------------------------------------------------------


@contextlib.contextmanager
def fleet(url: str, records: Path, settings: Settings, log_path: Path) -> Iterator[None]:
    """``pgqueue worker --processes 2 --concurrency 16`` on the fair handlers, until every
    child LISTENs; stopped (SIGTERM, a grace of 10 s) on exit."""
    command = [
        *(sys.executable, "-m", "pgqueue", "--database-url", url, "worker"),
        *("bench.fair_handlers:tasks", "--processes", str(PROCESSES)),
        *("--concurrency", str(CONCURRENCY), "--promote-after", "0", "--grace-period", "10"),
        *("--log-format", "json", "--log-level", "WARNING"),
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        FAIR_RECORDS=str(records),
        FAIR_SLEEP_MS=f"{settings.sleep_ms:g}",
    )
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        with psycopg.connect(url, **CONNECT) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN pgqueue'"
                    " AND datname = current_database()"
                ).fetchone()
                if row is not None and row[0] >= PROCESSES:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the workers did not start: see {log_path}")
                time.sleep(0.2)
        yield
    finally:
        stop_group(proc, signal.SIGTERM, 20)


class Counter:
    """Handlers started so far, from the records' sizes (lines appended, counted as read)."""

    def __init__(self, records: Path) -> None:
        self.records = records
        self.offsets: dict[str, int] = {}
        self.lines = 0

    def count(self) -> int:
        for path in glob.glob(str(self.records / "*.log")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            done = chunk.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + done
            self.lines += chunk.count(b"\n", 0, done)
        return self.lines


# --- the records -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Execution:
    task: str
    key: str
    start: float
    end: float
    pid: int


def read_records(records: Path) -> list[Execution]:
    out = []
    for path in glob.glob(str(records / "*.log")):
        with open(path) as f:
            for line in f:
                task, key, start, end, pid = line.split()
                out.append(Execution(task, key, float(start), float(end), int(pid)))
    return out


def limit_violations(runs: Iterable[Execution], limit: int) -> list[dict[str, Any]]:
    """Each stretch in which a key had more than ``limit`` handlers running (unkeyed tasks
    have no per-key limit): its key, start, length and peak. At equal times a finish counts
    before a start: only an overlap in time is a violation."""
    events = []
    for r in runs:
        if r.key != UNKEYED:
            events.append((r.end, 0, r.key))
            events.append((r.start, 1, r.key))
    events.sort()
    running: dict[str, int] = collections.Counter()
    open_: dict[str, list[float]] = {}  # key -> [began, peak]
    out = []
    for at, kind, key in events:
        running[key] += 1 if kind else -1
        n = running[key]
        if n > limit:
            stretch = open_.setdefault(key, [at, n])
            stretch[1] = max(stretch[1], n)
        elif key in open_:
            began, peak = open_.pop(key)
            out.append({"key": key, "at": began, "seconds": at - began, "peak": int(peak)})
    return out


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank (None of nothing)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def jain(xs: Sequence[float]) -> float | None:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1 when all are equal, 1/n when one
    takes all. None for no x or all zero."""
    total, squares = sum(xs), sum(x * x for x in xs)
    return None if not xs or squares == 0 else total * total / (len(xs) * squares)


@dataclasses.dataclass
class IdleSlots:
    """What ``idle_slots`` measured in one window."""

    seconds: float
    busy_share: float  # share of the window with a usable idle slot (raw, no tolerance)
    longest_busy_s: float  # the longest stretch of it
    lost_share: float  # usable idle slot time / (slots x window)
    lost_beyond_share: float  # the part of it beyond the tolerance
    ages: list[tuple[float, int]]  # (age, slots), each usable idle slot's from usable to filled
    running_mean: float  # handlers running, time-weighted mean

    def age_quantile(self, q: float) -> float | None:
        if not self.ages:
            return None
        ordered = sorted(self.ages)
        total = sum(n for _, n in ordered)
        rank, seen = q * total, 0
        for age, n in ordered:
            seen += n
            if seen >= rank:
                return age
        return ordered[-1][0]


def idle_slots(
    runs: Iterable[Execution],
    enqueued: Iterable[Enqueued],
    *,
    slots: int,
    limit: int,
    windows: Mapping[str, tuple[float, float]],
    tolerance: float,
    snapshots: Sequence[float] = (),
) -> tuple[dict[str, IdleSlots], dict[float, dict[str, int]]]:
    """The idle-slot figures of each window (see the module's docstring), and the tasks
    waiting per key at each moment of ``snapshots`` (for Jain's backlogged keys).

    One sweep over every finish, commit and start in time order (at equal times in that
    order: a start after the commit that made its task ready). Waiting counts may dip below
    zero for a moment (a commit's acknowledgement read after the handler already started);
    only what is above zero is usable. Idle slots are filled first come, first filled."""
    events: list[tuple[float, int, str, int]] = []
    for r in runs:
        events.append((r.end, 0, r.key, 0))
        events.append((r.start, 2, r.key, 0))
    for e in enqueued:
        events.append((e.at, 1, e.key, e.count))
    events.sort()
    bounds = sorted({t for lo_hi in windows.values() for t in lo_hi} | set(snapshots))
    waiting: dict[str, int] = collections.Counter()
    running: dict[str, int] = collections.Counter()
    total_running = 0
    usable_sum = 0  # sum over keys of what each could start now

    def room(key: str) -> int:
        ready = max(0, waiting[key])
        return ready if key == UNKEYED else max(0, min(ready, limit - running[key]))

    acc = {
        name: {"busy": 0.0, "longest": 0.0, "stretch": 0.0, "lost": 0.0, "run": 0.0}
        for name in windows
    }
    ages: dict[str, list[tuple[float, int]]] = {name: [] for name in windows}
    fifo: collections.deque[list[float]] = collections.deque()  # [since, slots]
    usable = 0
    snaps: dict[float, dict[str, int]] = {}
    last = events[0][0] if events else 0.0
    b = 0

    def advance(to: float) -> None:
        nonlocal last
        if to <= last:
            return
        for name, (lo, hi) in windows.items():
            span = min(to, hi) - max(last, lo)
            if span <= 0:
                continue
            a = acc[name]
            a["run"] += total_running * span
            a["lost"] += usable * span
            if usable > 0:
                a["busy"] += span
                a["stretch"] += span
                a["longest"] = max(a["longest"], a["stretch"])
            else:
                a["stretch"] = 0.0
        last = to

    def fill(at: float, n: int) -> None:
        while n > 0 and fifo:
            since, k = fifo[0]
            took = min(n, int(k))
            for name, (lo, hi) in windows.items():
                if lo <= since < hi:
                    ages[name].append((at - since, took))
            n -= took
            if took == k:
                fifo.popleft()
            else:
                fifo[0][1] = k - took

    for at, kind, key, count in events:
        while b < len(bounds) and bounds[b] < at:
            advance(bounds[b])
            if bounds[b] in snapshots:
                snaps[bounds[b]] = {k: v for k, v in waiting.items() if v > 0}
            for name, (lo, hi) in windows.items():
                if bounds[b] in (lo, hi):
                    acc[name]["stretch"] = 0.0
            b += 1
        advance(at)
        before = room(key)
        if kind == 0:
            running[key] -= 1
            total_running -= 1
        elif kind == 1:
            waiting[key] += count
        else:
            waiting[key] -= 1
            running[key] += 1
            total_running += 1
        usable_sum += room(key) - before
        now_usable = max(0, min(slots - total_running, usable_sum))
        if now_usable > usable:
            fifo.append([at, now_usable - usable])
        elif now_usable < usable:
            fill(at, usable - now_usable)
        usable = now_usable
    while b < len(bounds):
        advance(bounds[b])
        if bounds[b] in snapshots:
            snaps[bounds[b]] = {k: v for k, v in waiting.items() if v > 0}
        b += 1
    out = {}
    for name, (lo, hi) in windows.items():
        span = max(hi - lo, 1e-9)
        a = acc[name]
        # Idle slots still unfilled when the window closed: their age so far.
        pending = [(hi - since, int(k)) for since, k in fifo if lo <= since < hi]
        window_ages = ages[name] + pending
        beyond = sum(max(0.0, age - tolerance) * n for age, n in window_ages)
        out[name] = IdleSlots(
            seconds=hi - lo,
            busy_share=a["busy"] / span,
            longest_busy_s=a["longest"],
            lost_share=a["lost"] / (slots * span),
            lost_beyond_share=beyond / (slots * span),
            ages=window_ages,
            running_mean=a["run"] / span,
        )
    return out, snaps


def fairness(
    runs: Iterable[Execution],
    waiting_at: Mapping[float, Mapping[str, int]],
    windows: Sequence[tuple[float, float]],
) -> list[dict[str, Any]]:
    """Jain's index per window among the keys backlogged all through it (more of its tasks
    waiting at the window's start than it started in the window), x = handlers started."""
    starts = sorted((r.start, r.key) for r in runs)
    times = [s for s, _ in starts]
    out = []
    for lo, hi in windows:
        started: dict[str, int] = collections.Counter(
            key for _, key in starts[bisect.bisect_left(times, lo) : bisect.bisect_left(times, hi)]
        )
        waiting = waiting_at.get(lo, {})
        backlogged = {k: started.get(k, 0) for k, n in waiting.items() if n > started.get(k, 0)}
        xs = sorted(backlogged.values())
        index = jain(xs)
        out.append(
            {
                "window": (lo, hi),
                "keys": len(xs),
                "jain": index,
                "min": xs[0] if xs else None,
                "median": quantile(xs, 0.5),
                "max": xs[-1] if xs else None,
                "least": min(backlogged, key=lambda k: backlogged[k]) if xs else None,
                "most": max(backlogged, key=lambda k: backlogged[k]) if xs else None,
            }
        )
    return out


def pickups(
    runs: Iterable[Execution], acked: Iterable[tuple[str, str, float]]
) -> dict[str, tuple[float, float]]:
    """Task id -> (commit acknowledged, first handler start) of the live tasks that ran."""
    first: dict[str, float] = {}
    for r in runs:
        if r.task not in first or r.start < first[r.task]:
            first[r.task] = r.start
    return {task: (at, first[task]) for task, _, at in acked if task in first}


# --- the phases ------------------------------------------------------------------------------


def cold_keys(n: int, rng: random.Random) -> Callable[[], str]:
    """The next of ``n`` cold keys, in a seeded order, every one in turn."""
    names = [f"c{i:04d}" for i in range(1, n)]
    rng.shuffle(names)
    state = {"i": 0}

    def next_key() -> str:
        key = names[state["i"] % len(names)]
        state["i"] += 1
        return key

    return next_key


@dataclasses.dataclass
class FleetRun:
    windows: dict[str, tuple[float, float]]
    enqueued: list[Enqueued]
    acked: dict[str, list[tuple[str, str, float]]]  # stream -> its tasks
    busy_cores: dict[str, float]
    lateness_p99: dict[str, float | None]
    stream_errors: dict[str, tuple[int, str | None]]
    deep: list[str]


def wait_window(seconds: float, counter: Counter | None = None, claims: int = 0) -> None:
    """``seconds``, or with ``claims``, until the counter reaches them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or (counter is not None and counter.count() < claims):
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        if counter is not None and claims and counter.count() >= claims:
            break


def run_fleet(url: str, settings: Settings, records: Path, work: Path) -> FleetRun:
    """The phases on a running fleet (see the module's docstring)."""
    rng = random.Random(settings.seed)
    windows: dict[str, tuple[float, float]] = {}
    enqueued: list[Enqueued] = []
    busy: dict[str, float] = {}
    counter = Counter(records)
    cold = Stream(url, "cold", cold_keys(settings.keys, rng), 1, poisson(settings.cold_rate, rng))
    hots: list[Stream] = []
    capped = [f"p{i}" for i in range(CAPPED_KEYS)]
    deep = [f"d{i:02d}" for i in range(settings.deep_keys)]

    def phase(name: str, seconds: float, claims: int = 0) -> None:
        time.sleep(SETTLE)
        cpu0, lo = machine_busy_seconds(), time.time()
        log(f"{name}: window open" + (f" until {claims:,} claims" if claims else ""))
        wait_window(seconds, counter if claims else None, claims)
        hi = time.time()
        windows[name] = (lo, hi)
        busy[name] = round((machine_busy_seconds() - cpu0) / (hi - lo), 2)
        log(f"{name}: {hi - lo:.1f} s, {counter.count():,} claims so far")

    def copy(name: str, backlog: Mapping[str | None, int]) -> None:
        log(f"{name}: copying {sum(backlog.values()):,} tasks over {len(backlog)} keys")
        enqueued.extend(copy_backlog(url, backlog))

    with fleet(url, records, settings, work / "workers.log"):
        # No limit and no key yet: the workers take the ordinary one-statement claim.
        plain = math.ceil(BASELINE_RATE * (settings.baseline_s + SETTLE + 1))
        copy("baseline", {None: plain})
        phase("baseline", settings.baseline_s)
        deadline = time.monotonic() + 120
        while counter.count() < plain and time.monotonic() < deadline:
            time.sleep(0.2)  # the rest of the unkeyed backlog, before keys and limits arrive
        with psycopg.connect(url, **CONNECT) as conn:
            pgqueue.set_limit(conn, type=TYPE, per_key_max_running=settings.limit)
        cold.start()
        for r in range(1, settings.rounds + 1):
            phase(f"unloaded-{r}", settings.unloaded_s)
            copy(f"hot-{r}", {HOT: settings.hot_backlog})
            hot = Stream(url, "hot", lambda: HOT, HOT_BATCH, steady(settings.hot_rate / HOT_BATCH))
            hot.start()
            hots.append(hot)
            phase(f"hot-{r}", settings.hot_s)
            if r < settings.rounds:  # the next round's unloaded phase has no hot backlog
                hot.stop()
                enqueued.append(drop_backlog(url, HOT))
        copy("capped", dict.fromkeys(capped, settings.capped_backlog))
        phase("capped", settings.capped_s, settings.claims if settings.long else 0)
        backlog: dict[str | None, int] = dict.fromkeys(deep, settings.deep_backlog)
        backlog[None] = settings.deep_backlog
        copy("fair", backlog)
        phase("fair", settings.fair_s)
        cold.stop()
        hots[-1].stop()
    streams = [cold, *hots]
    for stream in streams:
        enqueued += [Enqueued(k, 1, at) for _, k, at in stream.acked]
    return FleetRun(
        windows=windows,
        enqueued=enqueued,
        acked={"cold": cold.acked, "hot": [x for h in hots for x in h.acked]},
        busy_cores=busy,
        lateness_p99={
            "cold": quantile(cold.lateness, 0.99),
            "hot": quantile([x for h in hots for x in h.lateness], 0.99),
        },
        stream_errors={
            "cold": (cold.errors, cold.first_error),
            "hot": (sum(h.errors for h in hots), next((h.first_error for h in hots), None)),
        },
        deep=deep,
    )


def drop_backlog(url: str, key: str) -> Enqueued:
    """Delete the key's waiting tasks (the harness's set-up, between rounds): a negative
    backlog, at the delete's commit, for the records' bookkeeping of what waits."""
    with psycopg.connect(url, **CONNECT) as conn:
        cur = conn.execute(
            "DELETE FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key = %s", (key,)
        )
        at = time.time()
    log(f"dropped {cur.rowcount:,} waiting tasks of {key}")
    return Enqueued(key, -cur.rowcount, at)


def analyse(run: FleetRun, runs: list[Execution], settings: Settings) -> dict[str, Any]:
    """Every figure and verdict of the fleet part, from the records."""
    tolerance = settings.tolerance_ms / 1000
    violations = limit_violations(runs, settings.limit)
    fair_lo, fair_hi = run.windows["fair"]
    jain_windows = [
        (fair_lo + i * WINDOW, fair_lo + (i + 1) * WINDOW)
        for i in range(int((fair_hi - fair_lo) // WINDOW))
    ]
    idle, waiting_at = idle_slots(
        runs,
        run.enqueued,
        slots=SLOTS,
        limit=settings.limit,
        windows=run.windows,
        tolerance=tolerance,
        snapshots=[w[0] for w in jain_windows],
    )
    fair = fairness(runs, waiting_at, jain_windows)
    picked = pickups(runs, run.acked["cold"])
    hot_starts = sorted(r.start for r in runs if r.key == HOT)
    hot_commits = sorted((e.at, e.count) for e in run.enqueued if e.key == HOT)
    hot_times = [at for at, _ in hot_commits]
    hot_totals = list(itertools.accumulate(n for _, n in hot_commits))

    def hot_waiting(t: float) -> int:
        i = bisect.bisect_left(hot_times, t)
        return (hot_totals[i - 1] if i else 0) - bisect.bisect_left(hot_starts, t)

    phases: dict[str, Any] = {}
    for name, (lo, hi) in run.windows.items():
        lat = [start - at for at, start in picked.values() if lo <= at < hi]
        started = sum(1 for r in runs if lo <= r.start < hi)
        i = idle[name]
        phases[name] = {
            "seconds": round(hi - lo, 1),
            "started": started,
            "throughput": round(started / (hi - lo), 1),
            "busy_cores": run.busy_cores[name],
            "running_mean": round(i.running_mean, 1),
            "cold_tasks": len(lat),
            "cold_pickup_p50_ms": ms(quantile(lat, 0.5)),
            "cold_pickup_p99_ms": ms(quantile(lat, 0.99)),
            "cold_pickup_max_ms": ms(max(lat, default=None)),
            "idle_busy_share": round(i.busy_share, 4),
            "idle_longest_busy_s": round(i.longest_busy_s, 3),
            "idle_lost_share": round(i.lost_share, 4),
            "idle_lost_beyond_share": round(i.lost_beyond_share, 5),
            "idle_age_p50_ms": ms(i.age_quantile(0.5)),
            "idle_age_p99_ms": ms(i.age_quantile(0.99)),
            "idle_age_max_ms": ms(max((a for a, _ in i.ages), default=None)),
            "idle_slots_filled": sum(n for _, n in i.ages),
        }
        phases[name]["hot_waiting_at_open_close"] = [hot_waiting(lo), hot_waiting(hi)]
    ids = collections.Counter(r.task for r in runs)
    keyed = {k: p for k, p in phases.items() if k != "baseline"}
    ratios = []
    for r in range(1, settings.rounds + 1):
        unloaded = phases[f"unloaded-{r}"]["cold_pickup_p99_ms"]
        loaded = phases[f"hot-{r}"]["cold_pickup_p99_ms"]
        if loaded and unloaded:
            ratios.append(round(loaded / unloaded, 2))
    pooled = {
        kind: ms(
            quantile(
                [
                    start - at
                    for at, start in picked.values()
                    if any(
                        lo <= at < hi
                        for name, (lo, hi) in run.windows.items()
                        if name.startswith(kind)
                    )
                ],
                0.99,
            )
        )
        for kind in ("unloaded-", "hot-")
    }
    ratio = statistics.median(ratios) if ratios else None
    jains = [w["jain"] for w in fair if w["jain"] is not None]
    targets = {
        "violations": {"value": len(violations), "target": "0", "pass": not violations},
        "claims": {
            "value": len(runs),
            "target": f">= {settings.claims:,}" if settings.long else "(not the long mode)",
            "pass": len(runs) >= settings.claims if settings.long else None,
        },
        "cold_pickup_p99_ratio": {
            "value": ratio,
            "rounds": ratios,
            "pooled_p99_ms": pooled,
            "target": "<= 2 (hot p99 / unloaded p99, the median of the rounds)",
            "pass": ratio is not None and ratio <= 2,
        },
        "jain_min": {
            "value": round(min(jains), 4) if jains else None,
            "target": ">= 0.95 in every 10 s window",
            "pass": bool(jains) and min(jains) >= 0.95,
        },
        "idle_lost_beyond_tolerance": {
            "value": {k: p["idle_lost_beyond_share"] for k, p in keyed.items()},
            "target": f"0 slot time lost beyond {settings.tolerance_ms:g} ms, every keyed phase",
            "pass": all(p["idle_lost_beyond_share"] == 0 for p in keyed.values()),
        },
    }
    return {
        "phases": phases,
        "violations": violations[:20],
        "violation_count": len(violations),
        "claims": len(runs),
        "tasks_run_twice": sum(1 for n in ids.values() if n > 1),
        "keys_run": len({r.key for r in runs}),
        "jain_windows": [
            {
                **w,
                "window": [round(w["window"][0] - fair_lo, 1), round(w["window"][1] - fair_lo, 1)],
            }
            for w in fair
        ],
        "stream_errors": run.stream_errors,
        "producer_lateness_p99_ms": {k: ms(v) for k, v in run.lateness_p99.items()},
        "targets": targets,
    }


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


# --- the claim's cost ------------------------------------------------------------------------


def timed(op: driver.Op[Any], times: dict[str, float]) -> Generator[Any, Any, Any]:
    """``op``, with the time each of its statements took (from the step's yield to its reply,
    as the driver runs it) added to ``times`` by name."""
    try:
        step = next(op)
        while True:
            began = time.perf_counter()
            reply = yield step
            times[step.name] = times.get(step.name, 0.0) + time.perf_counter() - began
            step = op.send(reply)
    except StopIteration as stop:
        return stop.value


def complete(conn: psycopg.Connection[Any], tasks: Sequence[ClaimedTask]) -> None:
    if tasks:
        driver.run(conn, leased.task_complete_many([(t.lease, None) for t in tasks]))


def explain_generic(conn: psycopg.Connection[Any], op: driver.Op[Any], fmt: str = "TEXT") -> Any:
    """EXPLAIN ANALYZE of the first statement of ``op`` run as a worker runs it: prepared, with
    a generic plan (limits_probe asks for one), under the limits lock, in a transaction rolled
    back. ``fmt`` TEXT: the plan's lines joined; JSON: the plan's tree."""
    step = next(op)
    assert isinstance(step, driver.Query)
    text = driver.statements()[step.name]
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", placeholder, text)
    args = sql.SQL(", ").join(sql.Literal(step.params[n]) for n in names)
    options = sql.SQL(f"ANALYZE, BUFFERS, COSTS OFF, FORMAT {fmt}")
    with conn.transaction(force_rollback=True):
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('pgqueue.limits')::bigint)")
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(sql.SQL("PREPARE fair_explain AS {}").format(sql.SQL(prepared)))
        rows = conn.execute(
            sql.SQL("EXPLAIN ({}) EXECUTE fair_explain({})").format(options, args)
        ).fetchall()
        conn.execute("DEALLOCATE fair_explain")
    if fmt == "JSON":
        return rows[0][0][0]
    return "\n".join(r[0] for r in rows)


def plan_stages(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Where a fair claim's time went: its execution and planning time, the time of each of
    its CTEs (inclusive: a CTE is produced when first read, and ``room`` reads ``running``,
    ``locked`` reads ``rotation`` and ``room``), how many rows the keys offered (the largest
    Append under ``locked``: every visited key's next tasks, before the rounds cut them to
    the batch), and what the counts of running tasks read from the indexes of running tasks
    (the lease index, the running keyed tasks' index: each keeps an entry per claim until
    vacuum removes it): the scans, and the rows they returned (a bitmap scan's are every
    entry, the dead ones included)."""
    stages: dict[str, float] = {}
    offered = 0
    running = {"index_entries": 0, "scans": 0}

    def walk(node: Mapping[str, Any], cte: str) -> None:
        nonlocal offered
        name = node.get("Subplan Name", "")
        if name.startswith("CTE "):
            cte = name[4:]
            stages[cte] = round(node["Actual Total Time"] * node["Actual Loops"], 3)
        rows = round(node["Actual Rows"] * node["Actual Loops"])
        if cte == "locked" and node["Node Type"] in ("Append", "Merge Append"):
            offered = max(offered, rows)
        if node.get("Index Name") in RUNNING_INDEXES:
            running["index_entries"] += rows  # a bitmap scan's: every entry, dead ones too
            running["scans"] += node["Actual Loops"]
        for child in node.get("Plans", []):
            walk(child, cte)

    walk(plan["Plan"], "")
    return {
        "execution_ms": round(plan["Execution Time"], 3),
        "planning_ms": round(plan.get("Planning Time", 0.0), 3),
        "ctes_ms": stages,
        "offered_rows": offered,
        "running": running,
    }


RUNNING_INDEXES = ("tasks_lease_idx", "tasks_running_key_idx")
VACUUM_EVERY = 50  # rounds of the cost's claims between two VACUUMs (about 4,000 lease entries)


def one_claim(
    conn: psycopg.Connection[Any], kind: str, rotation: KeyRotation, limit: int = 16
) -> tuple[float, float, list[ClaimedTask]]:
    """One claim of 16 as a worker makes it, timed: the whole claim and its claim statement
    alone (keyed: claim_round with the rotation, in a transaction of its own; unkeyed: the
    ordinary claim, one statement). What it took is completed afterwards, untimed."""
    times: dict[str, float] = {}
    args: dict[str, Any] = {"queues": [kind], "limit": limit, "owner": "cost", "lease_seconds": 30}
    began = time.perf_counter()
    if kind == "plain":
        tasks = driver.run(conn, timed(claiming.task_claim(**args), times))
    else:
        op = claiming.claim_round(**args, rotation=rotation.current())
        tasks, _ = driver.run(conn, timed(op, times), atomic=True)
    took = time.perf_counter() - began
    if kind != "plain":
        rotation.claimed(tasks)
    complete(conn, tasks)
    return took, times.get("task_claim_keyed", times.get("task_claim", 0.0)), tasks


def claim_cost(server_url: str, settings: Settings) -> dict[str, Any]:
    """The claim's cost with keys against without (see the module's docstring)."""
    name = f"fair_cost_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, **CONNECT) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = re.sub(r"/[^/]*$", f"/{name}", server_url)
    try:
        migrate.upgrade(url)
        n = settings.cost_backlog
        with psycopg.connect(url, **CONNECT) as conn:
            pgqueue.set_limit(conn, type="cost.keyed", per_key_max_running=settings.limit)
            with (
                conn.transaction(),
                conn.cursor().copy(
                    "COPY pgqueue.tasks (queue, type, payload, concurrency_key) FROM STDIN"
                ) as copy,
            ):
                for i in range(n):
                    copy.write_row(("plain", "cost.plain", "{}", None))
                    for keys in settings.cost_keys:
                        copy.write_row((f"k{keys}", "cost.keyed", "{}", f"{i % keys:06d}"))
            # Vacuum when we say: the claims' cost depends on it (see the growth below).
            conn.execute("ALTER TABLE pgqueue.tasks SET (autovacuum_enabled = false)")
            conn.execute("VACUUM ANALYZE pgqueue.tasks")
        log(f"cost: {n:,} tasks in each of {len(settings.cost_keys) + 1} queues")
        kinds = [*(f"k{k}" for k in settings.cost_keys), "plain"]
        whole: dict[str, list[float]] = {k: [] for k in kinds}
        alone: dict[str, list[float]] = {k: [] for k in kinds}
        claimed: dict[str, list[int]] = {k: [] for k in kinds}
        rotations = {k: KeyRotation() for k in kinds}
        warmup = 20
        with psycopg.connect(url, **CONNECT) as conn:
            for i in range(warmup + settings.cost_samples):
                if i == warmup:  # statistics of a table that has seen claims, as a live one
                    conn.execute("ANALYZE pgqueue.tasks")
                if i % VACUUM_EVERY == 0:
                    conn.execute("VACUUM pgqueue.tasks")
                for keys in settings.cost_keys:  # alternating: keyed, unkeyed, keyed, ...
                    for kind in (f"k{keys}", "plain"):
                        took, statement, tasks = one_claim(conn, kind, rotations[kind])
                        if i >= warmup and (kind != "plain" or keys == settings.cost_keys[0]):
                            whole[kind].append(took)
                            alone[kind].append(statement)
                            claimed[kind].append(len(tasks))
            conn.execute("VACUUM pgqueue.tasks")
            plans: dict[str, Any] = {}

            def keyed_claim(kind: str) -> driver.Op[Any]:
                return claiming.task_claim_keyed(
                    queues=[kind],
                    limit=16,
                    owner="cost",
                    lease_seconds=30,
                    rotation=rotations[kind].current(),
                )

            for keys in settings.cost_keys:
                kind = f"k{keys}"
                tree = explain_generic(conn, keyed_claim(kind), "JSON")
                plans[kind] = {
                    **plan_stages(tree),
                    "text": explain_generic(conn, keyed_claim(kind)),
                }
            growth = lease_growth(conn, settings, rotations)
        rows = {}
        for kind in kinds:
            rows[kind] = {
                "samples": len(whole[kind]),
                "claimed_mean": round(sum(claimed[kind]) / max(1, len(claimed[kind])), 1),
                "whole_p50_ms": ms(quantile(whole[kind], 0.5)),
                "whole_p99_ms": ms(quantile(whole[kind], 0.99)),
                "statement_p50_ms": ms(quantile(alone[kind], 0.5)),
                "statement_p99_ms": ms(quantile(alone[kind], 0.99)),
            }
        plain_p99 = quantile(whole["plain"], 0.99) or 0.0
        p99s = [quantile(whole[f"k{k}"], 0.99) or 0.0 for k in settings.cost_keys]
        worst_gap = (max(p99s) - plain_p99) * 1000
        return {
            "backlog": n,
            "vacuum_every_rounds": VACUUM_EVERY,
            "kinds": rows,
            "explain": plans,
            "growth": growth,
            "targets": {
                "within_2ms_p99": {
                    "value": round(worst_gap, 2),
                    "target": "keyed p99 - unkeyed p99 <= 2 ms at every key count",
                    "pass": worst_gap <= 2.0,
                },
                "flat": {
                    "value": round(max(p99s) / min(p99s), 2),
                    "target": "the largest p99 of the key counts <= 1.5x the smallest (flat)",
                    "pass": max(p99s) <= 1.5 * min(p99s),
                },
            },
        }
    finally:
        with psycopg.connect(server_url, **CONNECT) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def lease_growth(
    conn: psycopg.Connection[Any], settings: Settings, rotations: Mapping[str, KeyRotation]
) -> dict[str, Any]:
    """The claims' cost while an old snapshot is held (a transaction holding an xid, the
    pinned-snapshot pressure: vacuum can then remove nothing, and no scan may mark an entry dead):
    every claim leaves an entry per task in the indexes of running tasks, which the fair claim reads
    to count a key's running tasks. A queue of two keys with deep backlogs, claimed 4 at a time (the
    per-key limit leaves no more), and the unkeyed queue claimed 16 at a time with the claim starts
    a worker keeps (pgqueue/worker/claim_starts.py: its walk steps over no dead entry),
    ``--cost-growth`` rounds of both after a VACUUM and the xid; medians per quarter against the
    tasks claimed since."""
    per_key = settings.cost_growth * 4
    with (
        conn.transaction(),
        conn.cursor().copy(
            "COPY pgqueue.tasks (queue, type, payload, concurrency_key) FROM STDIN"
        ) as copy,
    ):
        for _ in range(per_key):
            for key in ("a", "b"):
                copy.write_row(("growth", "cost.keyed", "{}", key))
    conn.execute("VACUUM ANALYZE pgqueue.tasks")
    rotation = KeyRotation()
    starts = ClaimStarts(0.5, 30)
    rounds: list[tuple[int, float, float]] = []
    claimed = 0
    with psycopg.connect(conn.info.dsn, **CONNECT) as pin:
        pin.execute("BEGIN")
        pin.execute("SELECT txid_current()")
        for _ in range(settings.cost_growth):
            keyed, _, tasks = one_claim(conn, "growth", rotation, limit=4)
            walk = starts.next()
            began = time.perf_counter()
            more = driver.run(
                conn,
                claiming.task_claim(
                    queues=["plain"], limit=16, owner="cost", lease_seconds=30, starts=walk
                ),
            )
            plain = time.perf_counter() - began
            starts.claimed(more, starts=walk, seconds=plain)
            complete(conn, more)
            rounds.append((claimed, keyed, plain))
            claimed += len(tasks)
        pin.execute("COMMIT")
    quarter = max(1, len(rounds) // 4)
    out = []
    for q in range(0, len(rounds), quarter):
        part = rounds[q : q + quarter]
        out.append(
            {
                "keyed_claimed": [part[0][0], part[-1][0]],
                "keyed_p50_ms": ms(quantile([k for _, k, _ in part], 0.5)),
                "unkeyed_p50_ms": ms(quantile([u for _, _, u in part], 0.5)),
            }
        )
    return {"kind": "growth", "quarters": out}


# --- output ----------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "FAIL"


def report(result: dict[str, Any], settings: Settings) -> str:
    lines = [f"command: {result['command']}", ""]
    fleet_part = result.get("fleet")
    if fleet_part:
        lines += [
            "| phase | seconds | started | tasks/s | cores busy | handlers running (mean)"
            " | cold tasks | cold pickup p50 / p99 / max (ms) | hot key waiting (open, close)"
            " | usable idle slot: share of time / longest (s) | slot time lost / beyond"
            f" {settings.tolerance_ms:g} ms | idle slot age p50 / p99 / max (ms) |",
            "|" + "---|" * 12,
        ]
        for name, p in fleet_part["phases"].items():
            lines.append(
                f"| {name} | {p['seconds']} | {p['started']:,} | {p['throughput']:,} |"
                f" {p['busy_cores']} | {p['running_mean']} | {p['cold_tasks']:,} |"
                f" {p['cold_pickup_p50_ms']} / {p['cold_pickup_p99_ms']} /"
                f" {p['cold_pickup_max_ms']} | {p['hot_waiting_at_open_close'][0]:,},"
                f" {p['hot_waiting_at_open_close'][1]:,} |"
                f" {p['idle_busy_share']:.1%} / {p['idle_longest_busy_s']} |"
                f" {p['idle_lost_share']:.2%} / {p['idle_lost_beyond_share']:.3%} |"
                f" {p['idle_age_p50_ms']} / {p['idle_age_p99_ms']} / {p['idle_age_max_ms']} |"
            )
        lines += ["", "Jain's index, 10 s windows of the fair phase (x: handlers started):", ""]
        lines += ["| window (s) | backlogged keys | index | x min / median / max | least, most |"]
        lines += ["|---|---|---|---|---|"]
        for w in fleet_part["jain_windows"]:
            index = "-" if w["jain"] is None else f"{w['jain']:.4f}"
            lines.append(
                f"| {w['window'][0]}-{w['window'][1]} | {w['keys']} | {index} |"
                f" {w['min']} / {w['median']} / {w['max']} | {w['least']}, {w['most']} |"
            )
        lines += [
            "",
            f"claims (handlers started): {fleet_part['claims']:,}; keys that ran:"
            f" {fleet_part['keys_run']:,}; tasks run twice: {fleet_part['tasks_run_twice']};"
            f" per-key limit violations: {fleet_part['violation_count']}; producer errors:"
            f" {fleet_part['stream_errors']}; producer lateness p99 (ms):"
            f" {fleet_part['producer_lateness_p99_ms']}",
        ]
    cost = result.get("cost")
    if cost:
        lines += [
            "",
            f"Claim cost, one claimer, batch 16, {cost['backlog']:,} tasks per queue:",
            "",
            "| queue | claimed (mean) | whole claim p50 / p99 (ms) | statement alone p50 / p99"
            " (ms) |",
            "|---|---|---|---|",
        ]
        for kind, r in cost["kinds"].items():
            label = "unkeyed (task_claim)" if kind == "plain" else f"{int(kind[1:]):,} keys"
            lines.append(
                f"| {label} | {r['claimed_mean']} | {r['whole_p50_ms']} / {r['whole_p99_ms']}"
                f" | {r['statement_p50_ms']} / {r['statement_p99_ms']} |"
            )
        lines += [
            "",
            "The fair claim's statement after the samples, EXPLAIN ANALYZE of its generic plan"
            " (ms; a CTE's time includes the CTEs it reads):",
            "",
            "| keys | execution | planning | its CTEs | rows offered"
            " | running-task indexes: scans / rows read |",
            "|---|---|---|---|---|---|",
        ]
        for kind, p in cost["explain"].items():
            ctes = ", ".join(f"{name} {t}" for name, t in p["ctes_ms"].items() if name != "clock")
            lines.append(
                f"| {int(kind[1:]):,} | {p['execution_ms']} | {p['planning_ms']} | {ctes} |"
                f" {p['offered_rows']} | {p['running']['scans']} /"
                f" {p['running']['index_entries']} |"
            )
        lines += [
            "",
            "With an xid held open (vacuum removes nothing): two deep keys claimed 4 at a time,"
            " and the unkeyed queue 16 at a time with a worker's claim starts, in turn"
            " (medians per quarter of the rounds):",
            "",
            "| keyed tasks claimed since the xid | keyed claim p50 (ms) | unkeyed p50 (ms) |",
            "|---|---|---|",
        ]
        for q in cost["growth"]["quarters"]:
            lo, hi = q["keyed_claimed"]
            lines.append(f"| {lo:,}-{hi:,} | {q['keyed_p50_ms']} | {q['unkeyed_p50_ms']} |")
    lines += ["", "| target | value | wanted | verdict |", "|---|---|---|---|"]
    for part in ("fleet", "cost"):
        for name, t in (result.get(part) or {}).get("targets", {}).items():
            value = t["value"]
            if "rounds" in t:
                value = f"{value} (rounds {t['rounds']}; pooled p99 ms {t['pooled_p99_ms']})"
            lines.append(f"| {name} | {value} | {t['target']} | {verdict(t['pass'])} |")
    return "\n".join(lines)


def command_line(argv: Sequence[str]) -> str:
    return " ".join(["python -m bench.fair_keys", *argv])


def parse(argv: Sequence[str]) -> Settings:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CI: a few thousand claims, < 1 min")
    ap.add_argument("--long", action="store_true", help="the capped phase until --claims")
    ap.add_argument("--cost-only", action="store_true", help="only the claim's cost")
    ap.add_argument("--no-cost", action="store_true", help="without the claim's cost")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=4, help="per_key_max_running (4)")
    ap.add_argument("--sleep-ms", type=float, default=10.0, help="handler duration (10)")
    ap.add_argument("--keys", type=int, default=10_000, help="keys, the hot one included")
    ap.add_argument("--cold-rate", type=float, default=50.0, help="cold tasks a second (50)")
    ap.add_argument("--hot-backlog", type=int, help="hot tasks copied in (100,000)")
    ap.add_argument("--deep-keys", type=int, help="keys with deep backlogs (24; smoke 8)")
    ap.add_argument("--deep-backlog", type=int, help="tasks per deep key (auto)")
    ap.add_argument("--baseline-seconds", type=float, help="(20; smoke 4)")
    ap.add_argument("--rounds", type=int, help="unloaded and hot phases, in turn (3; smoke 1)")
    ap.add_argument("--unloaded-seconds", type=float, help="each (15; smoke 5)")
    ap.add_argument("--hot-seconds", type=float, help="each (15; smoke 6)")
    ap.add_argument("--capped-seconds", type=float, help="(30; smoke 5; --long: until --claims)")
    ap.add_argument("--fair-seconds", type=float, help="(60; smoke 10)")
    ap.add_argument("--claims", type=int, default=1_000_000, help="--long: claims at least")
    ap.add_argument("--tolerance-ms", type=float, default=25.0)
    ap.add_argument("--cost-keys", default="100,1000,10000,100000")
    ap.add_argument("--cost-backlog", type=int, help="tasks per cost queue (100,000)")
    ap.add_argument("--cost-samples", type=int, help="claims per kind (500)")
    ap.add_argument("--cost-growth", type=int, help="rounds with an xid held (1,600; smoke 200)")
    ap.add_argument("--json", type=Path, help="the result as JSON (default under bench/results)")
    ap.add_argument("--keep-records", type=Path, help="keep the handlers' records here")
    args = ap.parse_args(argv)
    smoke = args.smoke
    deep_keys = args.deep_keys or (8 if smoke else 24)
    fair_s = args.fair_seconds or (10.0 if smoke else 60.0)
    capped_s = args.capped_seconds or (5.0 if smoke else 30.0)
    # Enough for the phase at 2,000 handlers a second shared by the deep keys, the unkeyed
    # backlog, the hot key and the capped ones.
    deep = args.deep_backlog or math.ceil(2000 * (fair_s + SETTLE) / (deep_keys + 2))
    # A capped key runs at most --limit handlers of --sleep-ms: enough for the phase (with
    # --long, for all the claims asked).
    at_most = 1000 / args.sleep_ms * args.limit
    capped = math.ceil(args.claims * 0.2 if args.long else at_most * (capped_s + SETTLE + 5))
    settings = Settings(
        smoke=smoke,
        long=args.long,
        cost=not args.no_cost,
        fleet=not args.cost_only,
        seed=args.seed,
        limit=args.limit,
        sleep_ms=args.sleep_ms,
        keys=args.keys,
        cold_rate=args.cold_rate,
        hot_backlog=args.hot_backlog or (5_000 if smoke else 100_000),
        capped_backlog=capped,
        deep_keys=deep_keys,
        deep_backlog=deep,
        baseline_s=args.baseline_seconds or (4.0 if smoke else 20.0),
        rounds=args.rounds or (1 if smoke else 3),
        unloaded_s=args.unloaded_seconds or (5.0 if smoke else 15.0),
        hot_s=args.hot_seconds or (6.0 if smoke else 15.0),
        capped_s=capped_s,
        fair_s=fair_s,
        claims=args.claims,
        tolerance_ms=args.tolerance_ms,
        cost_keys=tuple(int(k) for k in args.cost_keys.split(",")),
        cost_backlog=args.cost_backlog or (10_000 if smoke else 100_000),
        cost_samples=args.cost_samples or (40 if smoke else 500),
        cost_growth=args.cost_growth or (200 if smoke else 1600),
    )
    if smoke and args.cost_keys == "100,1000,10000,100000":
        settings.cost_keys = (100, 1000, 10_000)
    settings.keep = args.keep_records
    settings.json = args.json
    return settings


# The targets a smoke run fails on: correctness, not timing.
SMOKE_JUDGED = frozenset({"violations"})


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = parse(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, Any] = {
        "command": command_line(argv),
        "started": stamp,
        "settings": dataclasses.asdict(settings),
    }
    keep = settings.keep
    with private_server() as server, tempfile.TemporaryDirectory(prefix="fair-keys-") as tmp:
        work = Path(tmp)
        records = keep or work / "records"
        records.mkdir(parents=True, exist_ok=True)
        url = server.url()
        migrate.upgrade(url)
        with psycopg.connect(url, **CONNECT) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            result["server_version"] = row[0] if row else "?"
        log(f"private PostgreSQL {result['server_version']} on port {server.port}")
        if settings.fleet:
            run = run_fleet(url, settings, records, work)
            runs = read_records(records)
            log(f"analysing {len(runs):,} executions")
            result["fleet"] = analyse(run, runs, settings)
        if settings.cost:
            result["cost"] = claim_cost(url, settings)
    text = report(result, settings)
    print(text)
    # A smoke (CI) leaves no file behind unless asked: the full runs' go under bench/results.
    path = settings.json or (None if settings.smoke else RESULTS / f"fair-keys-{stamp}.json")
    if path is not None:
        path.write_text(json.dumps(result, indent=2, default=str))
        log(f"written {path}")
    # The smoke (CI, on a machine shared with other work) fails on what no load excuses, a
    # key past its limit; the timing targets are reported, and judged by the full runs.
    judged = SMOKE_JUDGED if settings.smoke else None
    verdicts = [
        t["pass"]
        for part in ("fleet", "cost")
        for name, t in (result.get(part) or {}).get("targets", {}).items()
        if judged is None or name in judged
    ]
    return 1 if False in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
