"""Does pgqueue hold as the table grows? Claim latency and drain rate in three table states.

    python -m bench.growth --server-url postgresql://postgres@127.0.0.1:5432/postgres \
        [--rows 1000000] [--claims 2000] [--drain-tasks 20000] [--repeats 3] \
        [--processes 2] [--concurrency 50]

The first performance round asks that throughput and claim latency stay within 2x of the empty-table
figures with 1 million finished tasks still in the table (before pruning) and with a 1-million-task
backlog. The claim is the statement that degrades first in every queue on PostgreSQL (an index that
stops serving its ORDER BY, dead tuples in the claim index), and it only shows at size, so this
measures the same things in three states of one scratch database:

  (a) empty: nothing but the tasks the measurement itself enqueues;
  (b) finished: ``--rows`` completed tasks, finished over the last 12 hours, so still inside
      the 24 h retention (the worker's own pruning leaves them alone during the run);
  (c) backlog: ``--rows`` queued tasks waiting, nothing finished.

Between states the table is truncated and refilled with one INSERT ... SELECT FROM
generate_series (ids time-ordered like pgqueue's own UUIDv7, 100-byte payloads like
bench.drain's), then VACUUM ANALYZE and CHECKPOINT, as a table that grew over time would have
been vacuumed and analysed by then, and so that checkpoint I/O from the fill does not land in
the measurements. States are isolated (not cumulative) so a regression points at its cause.
Within a state the table is vacuumed again between measurements, never during one: what
autovacuum would do meanwhile, done by hand so that a server with autovacuum off (this
machine's CI configuration) measures the same thing; the header says which it was.

In each state:

1. **Claim latency.** ``--claims`` rounds of ``pgqueue.claim(conn, ["default"], limit=k)``
   with k cycling 1..10 (the sizes a worker with a few free slots asks for), then
   ``pgqueue.complete_many`` for what was claimed, each in its own transaction as a worker
   does. Only the claim call is timed, not its commit, so the figure is the statement (and the
   library around it), not fsync. The connection prepares the statement after five runs, as
   the worker's does, so a generic plan, if the server picks one, is what gets measured.
2. **Drain rate.** Real ``pgqueue worker bench.handlers:tasks`` processes (the CLI, no-op
   async handlers) run until ``--drain-tasks`` tasks have completed; ``--repeats`` times, and
   the median counts. In (a) and (b) the tasks are fresh ones enqueued before the workers
   start; in (c) they are the head of the backlog (fresh tasks would queue behind a million
   others, and what matters is whether workers take tasks off a big backlog as fast as off an
   empty one). The rate is read from the tasks' own ``finished_at`` over the middle 80% of
   those completions, the same way in every state, so start-up and the last partial batches
   do not count. Each drain leaves its tasks in the table, a few percent of a state's rows.

The table gives each figure with its ratio to the empty-table figure (target: within 2x), and
beside them what makes a figure trustworthy or not: drained tasks that ran more than once;
tasks the stopped workers still held (claimed, outcome never written; they are released back
to the queue before the next drain); and the machine's load average, since on a shared 2-core
machine a neighbour's benchmark moves these figures more than a million rows do. A second
table gives the size of the table and of each index in every state; worker warnings (lease
losses and the like) are counted from the workers' logs.

Everything is bounded: statement timeouts on every connection, a deadline on every wait,
worker process groups killed in a ``finally``, the scratch database dropped (WITH (FORCE)) at
the end whatever happened. Use ``--rows 100000`` while developing; the full run fills two
million rows.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue
from pgqueue import migrate

REPO = Path(__file__).resolve().parent.parent
QUEUE = "default"
TASK_TYPE = "bench.noop"
PAYLOAD = {"data": "x" * 100}
CLAIM_SIZES = range(1, 11)
STATEMENT_TIMEOUT_MS = 600_000  # the fill of a million rows and its VACUUM take seconds
DRAIN_TIMEOUT_S = 600.0


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Every connection of the benchmark: no statement can hang it."""
    return psycopg.connect(
        url,
        autocommit=autocommit,
        connect_timeout=10,
        options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
    )


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A migrated database of its own, dropped at the end even if a worker still holds a
    connection to it. Yields (url, name)."""
    name = f"pgqueue_growth_{uuid.uuid4().hex[:8]}"
    with connect(server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(server_url, name)
        migrate.upgrade(url)
        yield url, name
    finally:
        with connect(server_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- filling the table -----------------------------------------------------------------------

# (%% is a literal % in statements sent with parameters.)
# A time-ordered id like pgqueue.enqueue's UUIDv7: 48 bits of milliseconds, then a version
# nibble, a per-row sequence, the variant and md5 noise. Random ids would scatter the
# primary-key inserts and bloat that index in a way pgqueue's own ids do not.
_ID = """(lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
          || lpad(to_hex(i %% 4096), 3, '0') || to_hex(8 + i %% 4)
          || substr(md5(i::text), 1, 15))::uuid"""

FILL_FINISHED = f"""
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, status, attempts, visible_after,
                           created_at, started_at, finished_at)
SELECT {_ID}, %(queue)s, %(type)s, %(payload)s::jsonb, 1, 'completed', 1, at, at, at,
       at + interval '5 milliseconds'
  FROM generate_series(1, %(rows)s) AS i,
       LATERAL (SELECT now() - interval '12 hours' * (1 - i::double precision / %(rows)s)
                       - interval '1 minute' AS at) AS t
"""

# One in ten tasks of high priority, one in ten low: the claim's index order is
# (queue, priority, created_at, id), so the backlog is not one uniform run of the index.
FILL_BACKLOG = f"""
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, status, visible_after,
                           created_at)
SELECT {_ID}, %(queue)s, %(type)s, %(payload)s::jsonb,
       CASE WHEN i %% 10 = 0 THEN 0 WHEN i %% 10 = 9 THEN 2 ELSE 1 END, 'queued', at, at
  FROM generate_series(1, %(rows)s) AS i,
       LATERAL (SELECT now() - interval '1 hour' * (1 - i::double precision / %(rows)s)
                       - interval '1 minute' AS at) AS t
"""


def reset(url: str, fill: str | None, rows: int) -> float:
    """Empty the table, fill it (if ``fill``), VACUUM ANALYZE and CHECKPOINT; the seconds the
    fill took."""
    with connect(url) as conn:
        conn.execute("TRUNCATE pgqueue.tasks")
        started = time.perf_counter()
        if fill is not None:
            params = {"queue": QUEUE, "type": TASK_TYPE, "payload": json.dumps(PAYLOAD)}
            conn.execute(fill, {**params, "rows": rows})
        filled = time.perf_counter() - started
        conn.execute("VACUUM ANALYZE pgqueue.tasks")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")  # superuser or pg_checkpoint only; else skip it
    return filled


def vacuum(url: str) -> None:
    """VACUUM ANALYZE between measurements (never during one): what autovacuum would have done
    meanwhile on a server that runs it, so each measurement starts from a vacuumed table even
    where autovacuum is off (as on this machine's CI-configured server)."""
    with connect(url) as conn:
        conn.execute("VACUUM ANALYZE pgqueue.tasks")


def server_settings(url: str) -> str:
    """The settings that move these figures, for the report's header."""
    names = ["server_version", "autovacuum", "fsync", "synchronous_commit", "shared_buffers"]
    values: list[str] = []
    with connect(url) as conn:
        for name in names:
            row = conn.execute(f"SHOW {name}").fetchone()
            values.append(f"{name}={row[0] if row else '?'}")
    return ", ".join(values)


def relation_sizes(url: str) -> dict[str, int]:
    """Bytes on disk: the table's heap, its TOAST, and each of its indexes."""
    with connect(url) as conn:
        rows = conn.execute(
            """
            SELECT 'heap', pg_relation_size('pgqueue.tasks')
            UNION ALL
            SELECT 'toast', coalesce(pg_total_relation_size(reltoastrelid), 0)
              FROM pg_class WHERE oid = 'pgqueue.tasks'::regclass
            UNION ALL
            (SELECT c.relname, pg_relation_size(c.oid)
               FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
              WHERE i.indrelid = 'pgqueue.tasks'::regclass
              ORDER BY c.relname)
            """
        ).fetchall()
    return {str(name): int(size) for name, size in rows}


def count_tasks(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


def enqueue(url: str, n: int) -> None:
    """``n`` fresh no-op tasks through the library, in committed batches of 5,000."""
    with connect(url, autocommit=False) as conn:
        for start in range(0, n, 5000):
            batch = min(5000, n - start)
            pgqueue.enqueue_many(conn, [{"type": TASK_TYPE, "payload": PAYLOAD}] * batch)
            conn.commit()


# --- (1) claim latency -----------------------------------------------------------------------


def measure_claims(url: str, rounds: int) -> tuple[list[float], list[float]]:
    """Claim-then-complete rounds as a worker runs them; the milliseconds of each claim call
    and of each completion call (neither includes its commit)."""
    sizes = [CLAIM_SIZES[i % len(CLAIM_SIZES)] for i in range(rounds)]
    enqueue(url, sum(sizes))  # enough for every round, whatever the state holds already
    claim_ms: list[float] = []
    complete_ms: list[float] = []
    with connect(url, autocommit=False) as conn:
        for size in sizes:
            started = time.perf_counter()
            claimed = pgqueue.claim(conn, [QUEUE], limit=size, worker_id="bench-growth")
            claim_ms.append((time.perf_counter() - started) * 1000)
            conn.commit()
            if len(claimed) != size:
                raise SystemExit(f"claimed {len(claimed)} tasks, asked for {size}")
            started = time.perf_counter()
            done = pgqueue.complete_many(conn, [(task.lease, None) for task in claimed])
            complete_ms.append((time.perf_counter() - started) * 1000)
            conn.commit()
            if len(done) != size:
                raise SystemExit(f"completed {len(done)} of {size} claimed tasks")
    return claim_ms, complete_ms


# --- (2) drain rate --------------------------------------------------------------------------


def worker_command(url: str, processes: int, concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pgqueue",
        "--database-url",
        url,
        "worker",
        "bench.handlers:tasks",
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--log-format",
        "json",
        "--log-level",
        "WARNING",
    ]


@contextlib.contextmanager
def workers(
    url: str, processes: int, concurrency: int, log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The worker CLI in a session of its own, so that one killpg in ``finally`` reaches the
    supervisor and every worker process it started, however the run ended. Its output goes to
    ``log_path``: warnings (lease losses, retries) are counted from there afterwards."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            worker_command(url, processes, concurrency),
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # graceful: in-flight tasks are released
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def completed_since(conn: psycopg.Connection[Any], since: datetime) -> int:
    # status + finished_at: tasks_finished_idx answers it without reading the backlog.
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed' AND finished_at >= %s",
        (since,),
    ).fetchone()
    assert row is not None
    return int(row[0])


@dataclasses.dataclass
class Drain:
    per_s: float
    ran_again: int  # drained tasks that needed more than one attempt
    left_running: int  # tasks the stopped workers still held (claimed, outcome not written)
    warnings: dict[str, int]  # worker log events at WARNING and above, by name


def count_events(log_path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    if log_path.exists():
        for line in log_path.read_text(errors="replace").splitlines():
            try:
                name = str(json.loads(line).get("event", "?"))
            except (ValueError, AttributeError):
                name = "unparsed"
            counts[name] = counts.get(name, 0) + 1
    return counts


def release_leftovers(conn: psycopg.Connection[Any]) -> int:
    """Tasks still 'running' once the workers are gone: claimed, but their outcome never
    written before the worker stopped (SIGTERM, then SIGKILL after 15 s). Counted, then handed
    back with pgqueue.release (their lease tokens read from the table), as the worker's own
    graceful shutdown would have done, so that the next drain starts from the same state and
    does not wait out their leases or trip over them in the claim index."""
    rows = conn.execute(
        "SELECT id, lease_token FROM pgqueue.tasks WHERE status = 'running'"
    ).fetchall()
    leases = [pgqueue.Lease(task_id, token) for task_id, token in rows]
    for start in range(0, len(leases), 10_000):
        pgqueue.release(conn, leases[start : start + 10_000])
    return len(leases)


def measure_drain(
    url: str, tasks: int, processes: int, concurrency: int, log_path: Path, *, fresh: bool
) -> Drain:
    """Tasks per second over the middle 80% of the first ``tasks`` completions by real worker
    processes (``fresh``: enqueue them first; else they come from the backlog)."""
    if fresh:
        enqueue(url, tasks)
    with connect(url) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        since: datetime = row[0]
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        with workers(url, processes, concurrency, log_path) as proc:
            while completed_since(conn, since) < tasks:
                if proc.poll() is not None:
                    raise SystemExit(f"the worker exited with {proc.returncode}; see {log_path}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"{tasks} tasks not completed in {DRAIN_TIMEOUT_S} s")
                time.sleep(0.2)
        drained = conn.execute(
            "SELECT finished_at, attempts FROM pgqueue.tasks"
            " WHERE status = 'completed' AND finished_at >= %s"
            " ORDER BY finished_at LIMIT %s",
            (since, tasks),
        ).fetchall()
        left_running = release_leftovers(conn)
    finished = [r[0] for r in drained]
    low, high = int(tasks * 0.1), int(tasks * 0.9) - 1
    seconds = (finished[high] - finished[low]).total_seconds()
    return Drain(
        per_s=(high - low) / seconds if seconds > 0 else float("inf"),
        ran_again=sum(1 for r in drained if r[1] > 1),
        left_running=left_running,
        warnings=count_events(log_path),
    )


# --- reporting -------------------------------------------------------------------------------


@dataclasses.dataclass
class StateResult:
    name: str
    tasks_in_table: int
    fill_s: float
    sizes: dict[str, int]
    claim_ms: list[float]
    complete_ms: list[float]
    drains: list[Drain]
    load: tuple[float, float]  # 1-minute load average at the state's start and end

    @property
    def drain_per_s(self) -> float:
        """The median of the repeated drains: a neighbour's burst hits one, not all."""
        return statistics.median(d.per_s for d in self.drains)

    @property
    def ran_again(self) -> int:
        return sum(d.ran_again for d in self.drains)

    @property
    def left_running(self) -> int:
        return sum(d.left_running for d in self.drains)

    @property
    def warnings(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.drains:
            for name, n in d.warnings.items():
                out[name] = out.get(name, 0) + n
        return out


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def results_table(results: Sequence[StateResult]) -> str:
    base = results[0]
    headers = [
        "state",
        "tasks in table",
        "claim p50 ms",
        "x empty",
        "claim p99 ms",
        "x empty",
        "complete p50 ms",
        "drain tasks/s (median)",
        "range",
        "x empty",
        "within 2x",
        "ran again",
        "left running at stop",
        "load avg",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    b50, b99 = percentile(base.claim_ms, 50), percentile(base.claim_ms, 99)
    for r in results:
        p50, p99 = percentile(r.claim_ms, 50), percentile(r.claim_ms, 99)
        ok = p50 <= 2 * b50 and p99 <= 2 * b99 and r.drain_per_s >= base.drain_per_s / 2
        cells = [
            r.name,
            f"{r.tasks_in_table:,}",
            f"{p50:.2f}",
            ratio(p50, b50),
            f"{p99:.2f}",
            ratio(p99, b99),
            f"{statistics.median(r.complete_ms):.2f}",
            f"{r.drain_per_s:,.0f}",
            f"{min(d.per_s for d in r.drains):,.0f}-{max(d.per_s for d in r.drains):,.0f}",
            ratio(r.drain_per_s, base.drain_per_s),
            "yes" if ok else "NO",
            f"{r.ran_again:,}",
            f"{r.left_running:,}",
            f"{r.load[0]:.1f} / {r.load[1]:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sizes_table(results: Sequence[StateResult]) -> str:
    names = list(dict.fromkeys(name for r in results for name in r.sizes))
    headers = ["state (MiB, after fill + VACUUM)", *names]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in results:
        lines.append("| " + " | ".join([r.name, *(mib(r.sizes.get(n, 0)) for n in names)]) + " |")
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"[growth] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished / backlog rows")
    parser.add_argument("--claims", type=int, default=2_000, help="claim rounds per state")
    parser.add_argument("--drain-tasks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3, help="drains per state (median)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")
    if args.rows < 1 or args.claims < 10 or args.drain_tasks < 100 or args.repeats < 1:
        parser.error("--rows >= 1, --claims >= 10, --drain-tasks >= 100, --repeats >= 1")

    states = [
        ("(a) empty", None),
        (f"(b) {args.rows:,} finished", FILL_FINISHED),
        (f"(c) {args.rows:,} queued", FILL_BACKLOG),
    ]
    log_dir = Path(tempfile.mkdtemp(prefix="pgqueue-growth-"))
    results: list[StateResult] = []
    started = time.perf_counter()
    with scratch_database(args.server_url) as (url, _name):
        settings = server_settings(url)
        progress(settings)
        for number, (name, fill) in enumerate(states):
            load_before = os.getloadavg()[0]
            progress(f"{name}: filling")
            fill_s = reset(url, fill, args.rows)
            sizes = relation_sizes(url)
            in_table = count_tasks(url)
            progress(f"{name}: {in_table:,} tasks ({fill_s:.1f} s); {args.claims} claims")
            claim_ms, complete_ms = measure_claims(url, args.claims)
            vacuum(url)
            drains: list[Drain] = []
            for repeat in range(args.repeats):
                progress(f"{name}: drain {repeat + 1}/{args.repeats} of {args.drain_tasks:,}")
                drains.append(
                    measure_drain(
                        url,
                        args.drain_tasks,
                        args.processes,
                        args.concurrency,
                        log_dir / f"workers-{'abc'[number]}{repeat + 1}.log",
                        fresh=fill is not FILL_BACKLOG,
                    )
                )
                vacuum(url)
            load = (load_before, os.getloadavg()[0])
            result = StateResult(name, in_table, fill_s, sizes, claim_ms, complete_ms, drains, load)
            results.append(result)
            progress(
                f"{name}: claim p50 {percentile(claim_ms, 50):.2f} ms,"
                f" p99 {percentile(claim_ms, 99):.2f} ms;"
                f" drains {', '.join(f'{d.per_s:,.0f}' for d in drains)} tasks/s;"
                f" worker warnings {result.warnings or 'none'}"
            )
    print(
        f"\npgqueue growth: {args.claims} claims (limit 1..10) per state; {args.repeats} drains of "
        f"{args.drain_tasks:,} no-op tasks by {args.processes} worker processes x concurrency "
        f"{args.concurrency}; {time.perf_counter() - started:.0f} s in all; "
        f"{os.cpu_count()} CPUs; worker logs in {log_dir}\nserver: {settings}\n"
    )
    print(results_table(results))
    print()
    print(sizes_table(results))
    for r in results:
        if r.warnings:
            print(f"\nworker warnings in {r.name}: {r.warnings}")


if __name__ == "__main__":
    main()
