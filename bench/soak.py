"""A soak at a fixed submit rate with retention pruning on: does throughput, table and index
size and the dead-tuple count stay flat over time?

    python -m bench.soak --server-url postgresql://postgres@127.0.0.1:5432/postgres \
        --rate 200 --minutes 20 --retention-seconds 60

Why (the first performance round's brief, "Over time"): a queue table is all churn (every task is
inserted, updated two or three times and deleted), so a queue that is fast on a fresh table can
still degrade over hours as dead tuples and index bloat pile up, or as pruning falls behind. The
peers' most reported slowdown is exactly that. So this runs the real ``pgqueue worker`` CLI with its
built-in maintenance and a short ``--completed-retention`` (so that pruning happens many times
within the run, not once a day), submits open loop at a fixed rate (one task per transaction, small
payload, no-op handler), and every ``--sample-seconds`` records:

* submitted and completed in the interval (completed from ``finished_at``, which is why the
  retention must be longer than the sample interval), and the pickup latency of the tasks
  created in it;
* the ready backlog and the running count;
* ``pg_relation_size``, ``pg_indexes_size``, ``pg_total_relation_size`` and each index's size;
* ``n_live_tup``, ``n_dead_tup``, rows deleted (pruned) in the interval, ``last_autovacuum``
  and ``autovacuum_count`` from ``pg_stat_user_tables``;
* the CPU the workers and the database's backends used in the interval.

At the end it prints the series as a markdown table, a verdict comparing the last third of
the run with the middle third (the first third is the ramp-up: the table fills up to its
retention), the table's reloptions (the autovacuum settings the migration chose) and the
server's autovacuum settings, and one JSON line. Accounting: every submitted task must either
still be in the table, completed on its first attempt, or have been deleted by pruning
(``n_tup_del``), and the worker log must have no lease expiry.

``--kept-queue NAME=SECONDS`` adds a second queue with its own retention
(``pgqueue.set_queue_retention``, set before the first submit): the producer alternates tasks
between "default" and NAME, the workers serve both, and every sample also counts the rows of
each queue. Pruning reads each queue as its own range of ``tasks_retention_idx``, so the
question becomes whether each queue is held at its own retention (NAME's rows about
SECONDS / retention times the default's) while the table as a whole still stays flat.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from bench.loadkit import (
    CONNECT_OPTIONS,
    CpuMeter,
    LibraryProducer,
    descendants,
    exit_on_sigterm,
    idle_busy_cores,
    log_events,
    log_samples,
    md_table,
    payload_of,
    percentile,
    private_server,
    process_group,
    progress,
    scratch_database,
    stop_group,
    wait_for_workers,
    worker_command,
)
from pgqueue.worker.maintenance import MaintenanceConfig

SAMPLE_QUERY = """
SELECT extract(epoch FROM now())::float8,
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'queued' AND visible_after <= now()),
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'running'),
       (SELECT count(*) FROM pgqueue.tasks),
       (SELECT count(*) FROM pgqueue.tasks
         WHERE status = 'completed' AND finished_at > to_timestamp(%(since)s)
           AND finished_at <= now()),
       pg_relation_size('pgqueue.tasks'),
       pg_indexes_size('pgqueue.tasks'),
       pg_total_relation_size('pgqueue.tasks'),
       s.n_live_tup, s.n_dead_tup, s.n_tup_del, s.autovacuum_count, s.autoanalyze_count,
       extract(epoch FROM now() - s.last_autovacuum)::float8,
       array(SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid())
  FROM pg_stat_user_tables AS s
 WHERE s.relid = 'pgqueue.tasks'::regclass
"""

PICKUP_QUERY = """
SELECT percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY d)
  FROM (SELECT extract(epoch FROM started_at - created_at)::float8 AS d
          FROM pgqueue.tasks
         WHERE attempts = 1 AND started_at IS NOT NULL
           AND created_at > to_timestamp(%(since)s) AND created_at <= to_timestamp(%(until)s))
       AS x
"""

INDEX_QUERY = """
SELECT indexrelname, pg_relation_size(indexrelid)
  FROM pg_stat_user_indexes WHERE relid = 'pgqueue.tasks'::regclass ORDER BY indexrelname
"""

SETTINGS_QUERY = """
SELECT name, setting, unit FROM pg_settings
 WHERE name IN ('autovacuum', 'autovacuum_naptime', 'autovacuum_max_workers',
                'autovacuum_vacuum_threshold', 'autovacuum_vacuum_scale_factor',
                'autovacuum_vacuum_insert_threshold', 'autovacuum_vacuum_cost_delay',
                'autovacuum_vacuum_cost_limit', 'vacuum_cost_limit', 'maintenance_work_mem',
                'autovacuum_work_mem', 'fsync', 'synchronous_commit', 'shared_buffers')
 ORDER BY name
"""


def mb(n: float) -> float:
    return round(n / 2**20, 2)


QUEUE_ROWS_QUERY = "SELECT queue, count(*) FROM pgqueue.tasks GROUP BY queue ORDER BY queue"


def sample(
    conn: psycopg.Connection[Any], since_db: float, db_pids: list[int], cpu: CpuMeter
) -> dict[str, Any]:
    row = conn.execute(SAMPLE_QUERY, {"since": since_db}).fetchone()
    assert row is not None
    db_pids[:] = row[14]
    cpu.sample()
    out = dict(
        zip(
            (
                "db", "ready", "running", "rows", "completed_in", "table", "indexes", "total",
                "live", "dead", "deleted", "autovacuums", "autoanalyzes", "since_autovacuum",
            ),
            row[:14],
            strict=True,
        )
    )  # fmt: skip
    out["index_sizes"] = dict(conn.execute(INDEX_QUERY).fetchall())
    # A full read of the table (a few tens of thousands of rows here) every sample: cheap
    # next to the load, and exact, which n_live_tup per queue could not be.
    out["rows_by_queue"] = dict(conn.execute(QUEUE_ROWS_QUERY).fetchall())
    return out


def kept_queue(value: str) -> tuple[str, float]:
    """``NAME=SECONDS`` for ``--kept-queue``."""
    name, sep, seconds = value.rpartition("=")
    try:
        kept = float(seconds)
    except ValueError:
        kept = -1.0
    if not sep or not name or kept <= 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS (seconds > 0), got {value!r}")
    return name, kept


def thirds(values: list[float]) -> tuple[list[float], list[float]]:
    """The middle and the last third of a series (the first third is the ramp-up)."""
    n = len(values)
    k = max(1, n // 3)
    return values[n - 2 * k : n - k], values[n - k :]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def verdict(points: list[dict[str, Any]], rate: float) -> list[tuple[str, str, str, bool]]:
    """(what, middle third, last third, flat?) with the rule in the row itself."""
    out: list[tuple[str, str, str, bool]] = []
    thr = [p["completed_per_s"] for p in points]
    mid, last = thirds(thr)
    ok = abs(mean(last) - mean(mid)) <= 0.1 * mean(mid) and mean(last) >= 0.95 * rate
    out.append(
        (
            "throughput, completed/s (last within 10 % of middle, and >= 95 % of the rate)",
            f"{mean(mid):.1f}",
            f"{mean(last):.1f}",
            ok,
        )
    )
    for key, label in (("total", "table + indexes + TOAST"), ("indexes", "indexes")):
        mid, last = thirds([float(p[key]) for p in points])
        ok = max(last) <= 1.1 * max(mid)
        out.append(
            (
                f"{label} size, MB max (last <= 1.1 x middle)",
                f"{mb(max(mid))}",
                f"{mb(max(last))}",
                ok,
            )
        )
    mid, last = thirds([float(p["dead"]) for p in points])
    ok = max(last) <= 1.2 * max(mid) + 5 * rate
    out.append(
        (
            f"n_dead_tup, max (last <= 1.2 x middle + 5 s of submits, {5 * rate:.0f})",
            f"{max(mid):.0f}",
            f"{max(last):.0f}",
            ok,
        )
    )
    mid, last = thirds([float(p["ready_max"]) for p in points])
    ok = max(last) <= rate
    out.append(
        (
            f"ready backlog at samples, max (last <= 1 s of submits = {rate:.0f})",
            f"{max(mid):.0f}",
            f"{max(last):.0f}",
            ok,
        )
    )
    mid, last = thirds([float(p["pickup_p99_ms"]) for p in points])
    ok = mean(last) <= 2 * mean(mid) + 5
    out.append(
        (
            "pickup p99 ms, mean of samples (last <= 2 x middle + 5 ms)",
            f"{mean(mid):.1f}",
            f"{mean(last):.1f}",
            ok,
        )
    )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    maintenance = MaintenanceConfig()
    payload = payload_of(args.payload_bytes, sleep=args.task_seconds)
    task_type = "bench.sleep" if args.task_seconds > 0 else "bench.noop"
    duration = args.minutes * 60
    kept_name: str | None = args.kept_queue[0] if args.kept_queue else None
    kept_seconds: float | None = args.kept_queue[1] if args.kept_queue else None
    queues = ["default", kept_name] if kept_name else ["default"]
    points: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="pgqueue-soak-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        url, database = stack.enter_context(scratch_database(args.server_url, "pgqueue_soak"))
        idle = idle_busy_cores()
        progress(f"scratch database {database}; other load on the machine: {idle} cores")
        worker_log = Path(tmp, "worker.log")
        worker = stack.enter_context(
            process_group(
                worker_command(
                    url,
                    processes=args.processes,
                    concurrency=args.concurrency,
                    completed_retention=args.retention_seconds,
                    queues=queues if kept_name else (),
                ),
                worker_log,
            )
        )
        wait_for_workers(url, database, args.processes, worker)
        conn = stack.enter_context(psycopg.connect(url, autocommit=True, **CONNECT_OPTIONS))
        if kept_name:
            pgqueue.set_queue_retention(conn, kept_name, completed=kept_seconds)
        reloptions = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'pgqueue.tasks'::regclass"
        ).fetchone()
        settings = conn.execute(SETTINGS_QUERY).fetchall()
        db_pids: list[int] = []
        cpu = CpuMeter({"workers": lambda: descendants(worker.pid), "postgres_db": lambda: db_pids})
        producer = LibraryProducer(
            url,
            rate=args.rate,
            duration=duration,
            task_type=task_type,
            payload=payload,
            threads=args.producers,
            queues=queues,
        )
        cpu.start()
        prev = sample(conn, 0.0, db_pids, cpu)
        prev_cpu = cpu.seconds()
        prev_ok = 0
        producer.start()
        t0 = time.monotonic()
        progress(
            f"submitting {args.rate}/s for {args.minutes} min; retention "
            f"{args.retention_seconds} s"
            + (f" ({kept_name}: {kept_seconds} s)" if kept_name else "")
            + f", prune every {maintenance.prune_interval} s per worker "
            f"process, at most {maintenance.max_batches} x {maintenance.batch_size} rows a round"
        )
        tick = 0
        ready_max = 0
        # Sample the backlog every second (cheap, partial index), the rest every interval.
        while producer.running() and time.monotonic() < t0 + duration + 60:
            tick += 1
            time.sleep(max(0.0, t0 + tick - time.monotonic()))
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE status = 'queued'"
                " AND visible_after <= now()"
            ).fetchone()
            ready_max = max(ready_max, row[0] if row is not None else 0)
            if tick % args.sample_seconds:
                continue
            now = sample(conn, prev["db"], db_pids, cpu)
            seconds = now["db"] - prev["db"]
            ok = producer.stats.ok
            pick = conn.execute(PICKUP_QUERY, {"since": prev["db"], "until": now["db"]}).fetchone()
            p50, p99 = (pick[0] if pick is not None and pick[0] else [None, None])[:2]
            used = cpu.seconds()
            point = {
                "t_min": round((time.monotonic() - t0) / 60, 2),
                "submitted_per_s": round((ok - prev_ok) / seconds, 1),
                "completed_per_s": round(now["completed_in"] / seconds, 1),
                "pickup_p50_ms": round(1000 * p50, 1) if p50 is not None else float("nan"),
                "pickup_p99_ms": round(1000 * p99, 1) if p99 is not None else float("nan"),
                "ready_max": ready_max,
                "pruned": now["deleted"] - prev["deleted"],
                "workers_cores": round((used["workers"] - prev_cpu["workers"]) / seconds, 2),
                "postgres_cores": round(
                    (used["postgres_db"] - prev_cpu["postgres_db"]) / seconds, 2
                ),
                **{k: v for k, v in now.items() if k != "completed_in"},
            }
            points.append(point)
            progress(
                f"t={point['t_min']} min submitted/s={point['submitted_per_s']} "
                f"completed/s={point['completed_per_s']} rows={now['rows']} "
                + "".join(f"rows_{q}={now['rows_by_queue'].get(q, 0)} " for q in queues)
                + f"table={mb(now['table'])} indexes={mb(now['indexes'])} "
                f"total={mb(now['total'])} MB dead={now['dead']} pruned={point['pruned']} "
                f"autovacuums={now['autovacuums']}"
            )
            prev, prev_cpu, prev_ok, ready_max = now, used, ok, 0
        producer.join(30)
        cpu.stop()
        p = producer.stats
        # Let the last tasks finish, then stop the workers so that their backends flush
        # their statistics (n_tup_del) on exit before the accounting reads them.
        drain_deadline = time.monotonic() + 60
        while time.monotonic() < drain_deadline:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE status IN ('queued', 'running')"
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.5)
        stop_group(worker, signal.SIGTERM, 30)
        time.sleep(1.5)
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed' AND attempts = 1),"
            "       (SELECT n_tup_del FROM pg_stat_user_tables"
            "         WHERE relid = 'pgqueue.tasks'::regclass)"
            "  FROM pgqueue.tasks"
        ).fetchone()
        assert row is not None
        left, left_once, deleted = row
        events = log_events(worker_log)
        event_lines = log_samples(worker_log)

    # --- report ------------------------------------------------------------------------------
    accounted = left + deleted == p.ok and left_once == left
    # A lease expiry (the sweep requeued a task: it runs twice) or an error fails the run;
    # other warnings are shown with their first lines as evidence.
    no_expiry = not any("lease_expired" in k or k.startswith("error") for k in events)
    print(
        f"\n## Soak: {args.rate:.0f}/s for {args.minutes} min, retention "
        f"{args.retention_seconds:.0f} s"
        + (f" (queue {kept_name}: {kept_seconds:.0f} s, every other task)" if kept_name else "")
        + f", {args.processes} worker processes x concurrency "
        f"{args.concurrency}, {task_type}, {args.payload_bytes} B payloads\n"
    )
    print(
        f"Submitted {p.ok:,} of {p.target:,} ({p.achieved_rate:.1f}/s achieved, "
        f"{sum(p.errors.values())} errors, late p99 {1000 * percentile(p.lateness, 99):.1f} ms); "
        f"other load before the run: {idle} cores of {os.cpu_count()}. Maintenance per worker "
        f"process: sweep every {maintenance.sweep_interval} s, prune every "
        f"{maintenance.prune_interval} s, up to {maintenance.max_batches} batches of "
        f"{maintenance.batch_size} rows a round (MaintenanceConfig defaults; the CLI sets only "
        "the retentions).\n"
    )
    print(
        md_table(
            [
                "t min", "submitted/s", "completed/s", "pickup p50 ms", "p99 ms", "ready max",
                "rows", *[f"rows {q}" for q in queues], "table MB", "indexes MB", "total MB",
                "n_live_tup", "n_dead_tup", "pruned", "autovacuums", "last autovacuum s ago",
                "workers cores", "PG cores",
            ],
            [
                [
                    q["t_min"], q["submitted_per_s"], q["completed_per_s"], q["pickup_p50_ms"],
                    q["pickup_p99_ms"], q["ready_max"], q["rows"],
                    *[q["rows_by_queue"].get(name, 0) for name in queues], mb(q["table"]),
                    mb(q["indexes"]), mb(q["total"]), q["live"], q["dead"], q["pruned"],
                    q["autovacuums"],
                    round(q["since_autovacuum"]) if q["since_autovacuum"] is not None else "-",
                    q["workers_cores"], q["postgres_cores"],
                ]
                for q in points
            ],
        )
    )  # fmt: skip
    names = sorted({name for q in points for name in q["index_sizes"]})
    print("\nIndex sizes, KB:\n")
    print(
        md_table(
            ["t min", *names],
            [[q["t_min"], *[q["index_sizes"].get(n, 0) // 1024 for n in names]] for q in points],
        )
    )
    checks = verdict(points, args.rate) if len(points) >= 3 else []
    print("\nVerdict (middle third of the samples against the last third):\n")
    print(
        md_table(
            ["measure and rule", "middle third", "last third", "flat?"],
            [[what, mid, last, "yes" if ok else "NO"] for what, mid, last, ok in checks],
        )
    )
    flat = bool(checks) and all(ok for *_, ok in checks)
    print(
        f"\nOverall: {'FLAT' if flat else 'NOT FLAT'}"
        + ("" if checks else " (fewer than 3 samples: run longer)")
    )
    print(
        f"Accounting: {p.ok:,} submitted = {left:,} left in the table ({left_once:,} completed "
        f"on attempt 1) + {deleted:,} pruned: {'yes' if accounted else 'NO'}. Worker "
        f"warnings/errors: {events or 'none'}."
    )
    for line in event_lines:
        print(f"    {line}")
    options = reloptions[0] if reloptions else None
    print(f"\npgqueue.tasks reloptions (set by the migration): {options}")
    if dict((n, v) for n, v, _ in settings).get("autovacuum") == "off":
        print(
            "\n**This server runs with autovacuum = off**: the table's autovacuum reloptions "
            "have no effect here, so nothing but pruning's own deletes limits the dead tuples; "
            "run with --private-server for a server whose autovacuum runs."
        )
    print("\nServer settings:\n")
    print(md_table(["setting", "value", "unit"], [[n, v, u or ""] for n, v, u in settings]))
    last = points[-1] if points else {}
    return {
        "mode": "soak",
        "rate": args.rate,
        "rate_achieved": round(p.achieved_rate, 1),
        "minutes": args.minutes,
        "retention_s": args.retention_seconds,
        "kept_queue": {kept_name: kept_seconds} if kept_name else None,
        "final_rows_by_queue": last.get("rows_by_queue", {}),
        "samples": len(points),
        "submitted": p.ok,
        "pruned": deleted,
        "final_total_mb": mb(last.get("total", 0)),
        "max_total_mb": mb(max((q["total"] for q in points), default=0)),
        "max_dead_tuples": max((q["dead"] for q in points), default=0),
        "autovacuums": last.get("autovacuums", 0),
        "verdict": {what: ok for what, _, _, ok in checks},
        "flat": flat,
        "accounted": accounted,
        "no_lease_expiry": no_expiry,
        "worker_log_events": events,
        "reloptions": reloptions[0] if reloptions else None,
        "server_autovacuum": dict((n, v) for n, v, _ in settings).get("autovacuum"),
        "other_load_cores": idle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--rate", type=float, default=200.0, help="submits per second")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument(
        "--retention-seconds", type=float, default=60.0, help="pgqueue worker --completed-retention"
    )
    parser.add_argument(
        "--kept-queue",
        type=kept_queue,
        default=None,
        metavar="NAME=SECONDS",
        help="also submit every other task to queue NAME, kept SECONDS by its own retention",
    )
    parser.add_argument("--sample-seconds", type=int, default=30)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument(
        "--task-seconds", type=float, default=0.0, help="handler sleep (0: the no-op handler)"
    )
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument(
        "--private-server",
        action="store_true",
        help="run on a throwaway PostgreSQL cluster with autovacuum on, started here",
    )
    parser.add_argument("--pg-bin", default=None, help="with --private-server: initdb's dir")
    args = parser.parse_args()
    exit_on_sigterm()
    if not args.server_url and not args.private_server:
        parser.error("give --server-url (a server where a scratch database may be created)")
    if not 0 < args.rate <= 5000 or not 0 < args.minutes <= 24 * 60:
        parser.error("--rate must be in (0, 5000] and --minutes in (0, 1440]")
    if args.retention_seconds < args.sample_seconds + 5:
        parser.error(
            "--retention-seconds must exceed --sample-seconds by 5 s or more: completions "
            "are counted from finished_at, so they must not be pruned before the next sample"
        )
    if args.kept_queue:
        name, seconds = args.kept_queue
        if name == "default":
            parser.error("--kept-queue needs a queue other than default")
        if seconds < args.sample_seconds + 5:
            parser.error("--kept-queue's SECONDS must exceed --sample-seconds by 5 s or more")
    with contextlib.ExitStack() as stack:
        if args.private_server:
            args.server_url = stack.enter_context(private_server(args.pg_bin))
            progress(f"private PostgreSQL server at {args.server_url}")
        summary = run(args)
    print("\n" + json.dumps(summary, default=str), flush=True)
    if not (summary["accounted"] and summary["no_lease_expiry"]):
        raise SystemExit("tasks unaccounted for, or lease expiries in the worker log")


if __name__ == "__main__":
    main()
