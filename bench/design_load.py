"""The design's own sizing: 350 submits/s of ~5 s tasks (~1,750 running at once), and a 105,000
task backlog; measured with real worker processes on a scratch database.

    python -m bench.design_load --server-url postgresql://postgres@127.0.0.1:5432/postgres \
        --via library --rate 350 --duration 120 --task-seconds 5
    python -m bench.design_load --server-url ... --via http --rate 350 --duration 120
    python -m bench.design_load --server-url ... --backlog 105000

Why it is built this way (the first performance round's brief, "It must also hold when it matters"):

* The brief sizes pgqueue for 10 M tasks/day, 350/s at peak, each ~5 s, ~2 KB payloads. So
  the load here is exactly that, submitted **open loop** (task *i* at ``t0 + i/rate`` by the
  wall clock): a producer that waits for completions would slow down with the queue and hide
  a backlog. The rate actually achieved, and how late submits were against the schedule, are
  reported, so a producer that could not keep up is visible rather than silently lowering
  the load.
* Workers are the real ``pgqueue worker`` CLI (``--processes 2 --concurrency 1000`` by
  default: 2,000 slots for ~1,750 concurrent tasks) with an async handler that sleeps, as an
  I/O-bound task would. Pickup latency comes from the database (``started_at - created_at``
  of each task's first attempt), not from the producer's clock.
* The backlog (ready queued tasks) and the running count are sampled every second; "it must
  not grow" is judged on a least-squares slope over the submit window.
* CPU is reported per component (workers, API server, producer threads, the scratch
  database's PostgreSQL backends, all PostgreSQL processes, the whole machine), because on 2
  shared cores "it kept up" only means something next to what it cost.
* After the run drains, every submitted task must be in the database, completed, with
  ``attempts = 1``: the load may not be bought with a lost or repeated task.

``--backlog N`` instead enqueues N tasks in bulk and times their drain with no-op handlers
(2 processes, concurrency 50 by default), with a progress line every few seconds.

Tables go to stdout, ending with one JSON line; progress goes to stderr. Every wait is
bounded, worker and API processes are killed with their process groups in ``finally``, and
the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from bench.loadkit import (
    CONNECT_OPTIONS,
    TOKEN,
    CpuMeter,
    HttpProducer,
    LibraryProducer,
    descendants,
    exit_on_sigterm,
    free_port,
    idle_busy_cores,
    log_events,
    log_samples,
    md_table,
    payload_of,
    percentile,
    postgres_pids,
    process_group,
    progress,
    scratch_database,
    serve_command,
    slope,
    stop_group,
    wait_for_api,
    wait_for_workers,
    worker_command,
)

SAMPLE_QUERY = """
SELECT extract(epoch FROM now())::float8,
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'queued' AND visible_after <= now()),
       (SELECT count(*) FROM pgqueue.tasks WHERE status = 'running'),
       array(SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid())
"""

PICKUP_QUERY = """
SELECT count(*),
       percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY d),
       max(d)
  FROM (SELECT extract(epoch FROM started_at - created_at)::float8 AS d
          FROM pgqueue.tasks
         WHERE attempts = 1 AND started_at IS NOT NULL
           AND created_at >= (SELECT max(created_at) FROM pgqueue.tasks)
                             - %(last)s * interval '1 second') AS x
"""

WINDOW_QUERY = """
WITH t0 AS (SELECT min(created_at) AS t0 FROM pgqueue.tasks)
SELECT floor(extract(epoch FROM created_at - t0) / %(w)s)::int AS w,
       count(*) AS submitted,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           FILTER (WHERE attempts = 1),
       percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           FILTER (WHERE attempts = 1),
       max(extract(epoch FROM started_at - created_at)) FILTER (WHERE attempts = 1)
  FROM pgqueue.tasks, t0
 GROUP BY 1 ORDER BY 1
"""

FINISHED_QUERY = """
WITH t0 AS (SELECT min(created_at) AS t0 FROM pgqueue.tasks)
SELECT floor(extract(epoch FROM finished_at - t0) / %(w)s)::int, count(*)
  FROM pgqueue.tasks, t0 WHERE status = 'completed'
 GROUP BY 1 ORDER BY 1
"""

CHECK_QUERY = """
SELECT count(*),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'completed' AND attempts = 1),
       count(*) FILTER (WHERE attempts > 1),
       count(*) FILTER (WHERE status <> 'completed')
  FROM pgqueue.tasks
"""

TABLE_STATS_QUERY = """
SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, autovacuum_count,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
  FROM pg_stat_user_tables WHERE relid = 'pgqueue.tasks'::regclass
"""


def ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else round(seconds * 1000, 1)


def pickup(conn: psycopg.Connection[Any], last: float) -> dict[str, Any]:
    """Pickup latency of first attempts created in the last ``last`` seconds of submits."""
    row = conn.execute(PICKUP_QUERY, {"last": last}).fetchone()
    assert row is not None
    n, pcts, top = row
    pcts = pcts or [None, None, None]
    return {
        "tasks": n,
        "p50_ms": ms(pcts[0]),
        "p95_ms": ms(pcts[1]),
        "p99_ms": ms(pcts[2]),
        "max_ms": ms(top),
    }


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, int]:
    # Stats are flushed by backends at most every second or so: ask twice, a moment apart.
    time.sleep(1.5)
    row = conn.execute(TABLE_STATS_QUERY).fetchone()
    assert row is not None
    keys = (
        "n_tup_ins",
        "n_tup_upd",
        "n_tup_hot_upd",
        "n_tup_del",
        "n_dead_tup",
        "autovacuums",
        "xact_commit",
    )
    return dict(zip(keys, (int(v) for v in row), strict=True))


# --- the design load -----------------------------------------------------------------------


def run_design(args: argparse.Namespace) -> dict[str, Any]:
    slots = args.processes * args.concurrency
    expected_running = args.rate * args.task_seconds
    if slots < expected_running * 1.1:
        progress(
            f"warning: {slots} worker slots for ~{expected_running:.0f} tasks running at once; "
            "the backlog will grow"
        )
    payload = payload_of(args.payload_bytes, sleep=args.task_seconds)
    with (
        tempfile.TemporaryDirectory(prefix="pgqueue-load-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        url, database = stack.enter_context(scratch_database(args.server_url))
        idle = idle_busy_cores()
        progress(f"scratch database {database}; other load on the machine: {idle} cores")
        worker_log = Path(tmp, "worker.log")
        worker = stack.enter_context(
            process_group(
                worker_command(
                    url,
                    processes=args.processes,
                    concurrency=args.concurrency,
                    lease_seconds=args.lease_seconds,
                ),
                worker_log,
            )
        )
        startup = wait_for_workers(url, database, args.processes, worker)
        progress(f"{args.processes} worker processes listening after {startup:.1f} s")
        server_pid: int | None = None
        server: subprocess.Popen[bytes] | None = None
        producer: LibraryProducer | HttpProducer
        if args.via == "http":
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            server = stack.enter_context(
                process_group(
                    serve_command(url, port, args.api_workers),
                    Path(tmp, "api.log"),
                    env={"PGQUEUE_API_TOKENS": TOKEN},
                    stop_signal=signal.SIGINT,
                )
            )
            wait_for_api(base, server)
            server_pid = server.pid
            body = json.dumps(
                {"type": "bench.sleep", "payload": payload}, separators=(",", ":")
            ).encode()
            producer = HttpProducer(
                base,
                rate=args.rate,
                duration=args.duration,
                body=body,
                connections=args.http_connections,
            )
        else:
            producer = LibraryProducer(
                url,
                rate=args.rate,
                duration=args.duration,
                task_type="bench.sleep",
                payload=payload,
                threads=args.producers,
            )

        sampler = stack.enter_context(psycopg.connect(url, autocommit=True, **CONNECT_OPTIONS))
        db_pids: list[int] = []
        groups = {
            "workers": lambda: descendants(worker.pid),
            "postgres_db": lambda: db_pids,
            "postgres_all": postgres_pids,
        }
        if server_pid is not None:
            pid = server_pid
            groups["api"] = lambda: descendants(pid)
        cpu = CpuMeter(groups)
        samples: list[dict[str, Any]] = []

        def sample(phase: str, since: float) -> dict[str, Any]:
            row = sampler.execute(SAMPLE_QUERY).fetchone()
            assert row is not None
            db_pids[:] = row[3]
            cpu.sample()
            s = {"t": time.monotonic() - since, "db": row[0], "ready": row[1], "running": row[2]}
            s["phase"] = phase
            samples.append(s)
            return s

        cpu.start()
        bench_cpu0 = time.process_time()
        producer.start()
        t0 = time.monotonic()
        progress(f"submitting {producer.count} tasks at {args.rate}/s via {args.via}")
        tick = 0
        deadline = t0 + args.duration + 120
        while producer.running() and time.monotonic() < deadline:
            tick += 1
            s = sample("submit", t0)
            if tick % 10 == 0:
                progress(
                    f"t={s['t']:.0f}s submitted={producer.stats.ok} ready={s['ready']} "
                    f"running={s['running']} errors={sum(producer.stats.errors.values())}"
                )
            time.sleep(max(0.0, t0 + tick - time.monotonic()))
        finished_in_time = producer.join(10)
        cpu.stop()
        bench_cpu = time.process_time() - bench_cpu0
        submit_window = cpu.wall
        progress(f"submitting done ({producer.stats.ok} ok); waiting for the queue to drain")

        drain_deadline = time.monotonic() + args.task_seconds + args.lease_seconds + 120
        drained = False
        while time.monotonic() < drain_deadline:
            s = sample("drain", t0)
            if s["ready"] == 0 and s["running"] == 0:
                # Running 0 can be read between claim and completion; confirm by status.
                row = sampler.execute(
                    "SELECT count(*) FROM pgqueue.tasks WHERE status <> 'completed'"
                ).fetchone()
                if row is not None and row[0] == 0:
                    drained = True
                    break
            time.sleep(1)
        drain_seconds = samples[-1]["t"] - (producer.stats.finished - t0)

        overall = pickup(sampler, 1e9)
        last60 = pickup(sampler, 60)
        windows = sampler.execute(WINDOW_QUERY, {"w": args.window}).fetchall()
        finished = dict(sampler.execute(FINISHED_QUERY, {"w": args.window}).fetchall())
        row = sampler.execute(
            "SELECT extract(epoch FROM min(created_at))::float8 FROM pgqueue.tasks"
        ).fetchone()
        db_t0 = row[0] if row is not None and row[0] is not None else 0.0
        check = sampler.execute(CHECK_QUERY).fetchone()
        assert check is not None
        # Stop the workers and the API now: their backends flush their table statistics
        # when they exit, instead of up to 10 s later when idle.
        stop_group(worker, signal.SIGTERM, 30)
        if server is not None:
            stop_group(server, signal.SIGINT, 30)
        stats = table_stats(sampler)
        events = log_events(worker_log)
        event_lines = log_samples(worker_log)

    # --- figures ---------------------------------------------------------------------------
    p = producer.stats
    submit_samples = [s for s in samples if s["phase"] == "submit"]
    backlog = [s["ready"] for s in submit_samples]
    steady = [s["running"] for s in submit_samples if s["t"] >= args.task_seconds + 5]
    used = cpu.seconds()
    n = max(p.ok, 1)
    cpu_rows: list[tuple[str, float]] = [("workers (supervisor + processes)", used["workers"])]
    if "api" in used:
        cpu_rows.append(("API server (pgqueue serve)", used["api"]))
    cpu_rows += [
        ("producer threads (this process)", p.cpu_seconds),
        ("PostgreSQL backends of the scratch database", used["postgres_db"]),
        (
            "PostgreSQL, all processes (any tenant; WAL writer, checkpointer...)",
            used["postgres_all"],
        ),
        ("benchmark sampler (rest of this process)", max(0.0, bench_cpu - p.cpu_seconds)),
        ("machine, all cores (/proc/stat; includes other tenants)", cpu.machine_used),
    ]
    rows_total, completed, completed_once, repeated, unfinished = check
    expected_rows = p.ok
    exactly_once = (
        drained and rows_total == expected_rows and completed_once == expected_rows and not repeated
    )
    submit_points = [(s["t"], float(s["ready"])) for s in submit_samples]
    backlog_slope = slope(submit_points)
    backlog_flat = backlog_slope * args.duration <= args.rate  # < 1 s of submits over the run

    print(
        f"\n## Design load: {args.rate}/s for {args.duration:.0f} s via {args.via}, "
        f"{args.task_seconds} s tasks, {args.payload_bytes} B payloads\n"
    )
    print(
        f"Workers: `pgqueue worker --processes {args.processes} --concurrency "
        f"{args.concurrency} --lease-seconds {args.lease_seconds}` ({slots} slots), async "
        f"handler `await asyncio.sleep({args.task_seconds})`; producer: "
        + (
            f"{args.producers} threads, `pgqueue.enqueue` + commit per task"
            if args.via == "library"
            else f"httpx async, {args.http_connections} keep-alive connections to "
            f"`pgqueue serve --workers {args.api_workers}`"
        )
        + f". Other load before the run: {idle} cores of {os.cpu_count()}.\n"
    )
    print(
        md_table(
            [
                "submits",
                "target",
                "ok",
                "errors",
                "achieved /s",
                "late p50 ms",
                "late p99 ms",
                "late max ms",
                "submit latency p50 ms",
                "p99 ms",
            ],
            [
                [
                    args.via,
                    p.target,
                    p.ok,
                    sum(p.errors.values()),
                    round(p.achieved_rate, 1),
                    ms(percentile(p.lateness, 50)),
                    ms(percentile(p.lateness, 99)),
                    ms(max(p.lateness, default=float("nan"))),
                    ms(percentile(p.latency, 50)),
                    ms(percentile(p.latency, 99)),
                ]
            ],
        )
    )
    print(
        "\n(late: sent after its scheduled time; submit latency: from the schedule to the "
        "commit or the 202.)\n"
    )
    print(
        md_table(
            [
                "pickup latency (started_at - created_at, attempt 1)",
                "tasks",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
            ],
            [
                [
                    "whole run",
                    *[overall[k] for k in ("tasks", "p50_ms", "p95_ms", "p99_ms", "max_ms")],
                ],
                [
                    "last 60 s of submits",
                    *[last60[k] for k in ("tasks", "p50_ms", "p95_ms", "p99_ms", "max_ms")],
                ],
            ],
        )
    )
    print()
    print(
        md_table(
            [
                "backlog (ready, sampled 1/s while submitting)",
                "first",
                "last",
                "max",
                "mean",
                "slope tasks/s",
                "flat?",
            ],
            [
                [
                    "ready queued tasks",
                    backlog[0] if backlog else 0,
                    backlog[-1] if backlog else 0,
                    max(backlog, default=0),
                    round(sum(backlog) / max(len(backlog), 1), 1),
                    round(backlog_slope, 3),
                    "yes" if backlog_flat else "NO",
                ]
            ],
        )
    )
    print(
        f"\n(flat: the fitted line grows by less than one second of submits, {args.rate:.0f} "
        f"tasks, over the {args.duration:.0f} s.) Running at once after the first "
        f"{args.task_seconds + 5:.0f} s: mean {sum(steady) / max(len(steady), 1):.0f}, max "
        f"{max(steady, default=0)} (expected ~ rate x task time = "
        f"{p.achieved_rate * args.task_seconds:.0f}).\n"
    )
    window_rows = []
    for w, submitted, p50, p99, top in windows:
        in_w = [s for s in samples if int((s["db"] - db_t0) // args.window) == w]
        window_rows.append(
            [
                f"{w * args.window:.0f}-{(w + 1) * args.window:.0f}",
                round(submitted / args.window, 1),
                round(finished.get(w, 0) / args.window, 1),
                max((s["ready"] for s in in_w), default=float("nan")),
                max((s["running"] for s in in_w), default=float("nan")),
                ms(p50),
                ms(p99),
                ms(top),
            ]
        )
    print(
        md_table(
            [
                "window s",
                "submitted /s",
                "completed /s",
                "ready max",
                "running max",
                "pickup p50 ms",
                "p99 ms",
                "max ms",
            ],
            window_rows,
        )
    )
    print(f"\nCPU while submitting ({submit_window:.1f} s window):\n")
    print(
        md_table(
            ["component", "CPU s", "cores", "ms per task"],
            [
                [name, round(sec, 1), round(sec / submit_window, 2), round(1000 * sec / n, 2)]
                for name, sec in cpu_rows
            ],
        )
    )
    print(f"\nWorker processes' peak resident memory: {cpu.max_rss_mb('workers')} MB.\n")
    per_task = {k: round(v / max(stats["n_tup_ins"], 1), 2) for k, v in stats.items()}
    print(
        md_table(
            [
                "outcome",
                "submitted ok",
                "rows",
                "completed",
                "completed on attempt 1",
                "attempts > 1",
                "not completed",
                "drained",
                "exactly once",
            ],
            [
                [
                    args.via,
                    p.ok,
                    rows_total,
                    completed,
                    completed_once,
                    repeated,
                    unfinished,
                    f"yes, {drain_seconds:.1f} s after the last submit" if drained else "NO",
                    "yes" if exactly_once else "NO",
                ]
            ],
        )
    )
    print(
        f"\nTable activity (pg_stat_user_tables): {stats}; per inserted row: "
        f"{per_task['n_tup_upd']} updates ({per_task['n_tup_hot_upd']} HOT), "
        f"{per_task['xact_commit']} committed transactions in the database (pg_stat_database; "
        "all clients: producer, workers, sampler)."
    )
    print(f"Worker warnings/errors in the log: {events or 'none'}.")
    for line in event_lines:
        print(f"    {line}")
    if p.errors:
        print(f"Producer errors: {p.errors}.")
    if not finished_in_time:
        print("The producer did not finish its schedule in time.")

    return {
        "mode": "design",
        "via": args.via,
        "rate_target": args.rate,
        "rate_achieved": round(p.achieved_rate, 1),
        "duration_s": args.duration,
        "task_seconds": args.task_seconds,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "submitted": p.ok,
        "submit_errors": sum(p.errors.values()),
        "late_p99_ms": ms(percentile(p.lateness, 99)),
        "pickup": overall,
        "pickup_last_60s": last60,
        "backlog_first": backlog[0] if backlog else 0,
        "backlog_last": backlog[-1] if backlog else 0,
        "backlog_max": max(backlog, default=0),
        "backlog_slope_per_s": round(backlog_slope, 3),
        "backlog_flat": backlog_flat,
        "running_mean": round(sum(steady) / max(len(steady), 1)),
        "running_max": max(steady, default=0),
        "cpu_window_s": round(submit_window, 1),
        "cpu_s": {k: round(v, 1) for k, v in used.items()}
        | {"producer": round(p.cpu_seconds, 1), "machine": round(cpu.machine_used, 1)},
        "worker_rss_mb": cpu.max_rss_mb("workers"),
        "completed": completed,
        "exactly_once": exactly_once,
        "worker_log_events": events,
        "other_load_cores": idle,
    }


# --- the backlog drain ---------------------------------------------------------------------


def run_backlog(args: argparse.Namespace) -> dict[str, Any]:
    total = args.backlog
    payload = payload_of(args.payload_bytes)
    with (
        tempfile.TemporaryDirectory(prefix="pgqueue-load-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        url, database = stack.enter_context(scratch_database(args.server_url))
        idle = idle_busy_cores()
        progress(f"scratch database {database}; other load on the machine: {idle} cores")
        started = time.perf_counter()
        with psycopg.connect(url, **CONNECT_OPTIONS) as conn:
            for start in range(0, total, 5000):
                count = min(5000, total - start)
                pgqueue.enqueue_many(conn, [{"type": "bench.noop", "payload": payload}] * count)
                conn.commit()
        enqueue_s = time.perf_counter() - started
        progress(f"enqueued {total} tasks in {enqueue_s:.1f} s ({total / enqueue_s:,.0f}/s)")

        sampler = stack.enter_context(psycopg.connect(url, autocommit=True, **CONNECT_OPTIONS))
        db_pids: list[int] = []
        worker_log = Path(tmp, "worker.log")
        command = worker_command(url, processes=args.processes, concurrency=args.concurrency)
        worker_pid: list[int] = []
        cpu = CpuMeter(
            {
                "workers": lambda: descendants(worker_pid[0]) if worker_pid else [],
                "postgres_db": lambda: db_pids,
                "postgres_all": postgres_pids,
            }
        )
        row = sampler.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        db_start: float = row[0]
        cpu.start()
        t0 = time.monotonic()
        worker = stack.enter_context(process_group(command, worker_log))
        worker_pid.append(worker.pid)
        last_report = (t0, 0)
        drained = False
        lines: list[tuple[float, int, int]] = []
        deadline = t0 + args.drain_timeout
        tick = 0
        while time.monotonic() < deadline:
            tick += 1
            row = sampler.execute(SAMPLE_QUERY).fetchone()
            assert row is not None
            db_pids[:] = row[3]
            cpu.sample()
            now = time.monotonic()
            remaining = row[1] + row[2]
            done = total - remaining
            if now - last_report[0] >= args.progress_every or remaining == 0:
                rate = (done - last_report[1]) / (now - last_report[0])
                lines.append((now - t0, done, remaining))
                progress(
                    f"t={now - t0:5.1f}s done={done:>7} remaining={remaining:>7} "
                    f"last {now - last_report[0]:.0f} s: {rate:,.0f}/s"
                )
                last_report = (now, done)
            if remaining == 0:
                drained = True
                break
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited with {worker.returncode}")
            time.sleep(max(0.0, t0 + tick * args.poll - time.monotonic()))
        end = time.monotonic()
        cpu.stop()
        # The last completions may still be in flight between "running = 0" and "completed".
        time.sleep(1)
        check = sampler.execute(CHECK_QUERY).fetchone()
        assert check is not None
        # The drain's span from the database's own timestamps, not from this poll loop:
        # worker start to the last completion, and first claim (or completion) to the last.
        row = sampler.execute(
            "SELECT extract(epoch FROM max(finished_at))::float8 - %s,"
            "       extract(epoch FROM max(finished_at) - min(started_at))::float8,"
            "       extract(epoch FROM max(finished_at) - min(finished_at))::float8"
            "  FROM pgqueue.tasks",
            (db_start,),
        ).fetchone()
        assert row is not None
        events = log_events(worker_log)
        event_lines = log_samples(worker_log)

    poll_s = end - t0
    total_s, claim_s, drain_s = (v if v else float("nan") for v in row)
    used = cpu.seconds()
    rows_total, completed, completed_once, repeated, unfinished = check
    exactly_once = drained and completed_once == total and rows_total == total
    print(
        f"\n## Backlog drain: {total:,} no-op tasks, {args.payload_bytes} B payloads, "
        f"{args.processes} processes x concurrency {args.concurrency}\n"
    )
    print(
        md_table(
            ["measure", "seconds", "tasks/s"],
            [
                ["enqueue_many (5,000 a statement, one commit each)", enqueue_s, total / enqueue_s],
                ["drain: worker start to last completion", total_s, total / total_s],
                ["drain: first claim to last completion", claim_s, total / claim_s],
                ["drain: first completion to last completion", drain_s, total / drain_s],
            ],
        )
    )
    print(
        "\n(times from the database's own clock: started_at, finished_at and the time the "
        f"worker command was launched; the poll loop saw the queue empty after {poll_s:.1f} s.)"
        "\n"
    )
    print(
        md_table(
            ["completed", "on attempt 1", "attempts > 1", "not completed", "exactly once"],
            [[completed, completed_once, repeated, unfinished, "yes" if exactly_once else "NO"]],
        )
    )
    print(f"\nCPU during the drain ({cpu.wall:.1f} s):\n")
    n = max(total, 1)
    print(
        md_table(
            ["component", "CPU s", "cores", "ms per task"],
            [
                [name, round(sec, 1), round(sec / cpu.wall, 2), round(1000 * sec / n, 3)]
                for name, sec in [
                    ("workers", used["workers"]),
                    ("PostgreSQL backends of the scratch database", used["postgres_db"]),
                    ("PostgreSQL, all processes", used["postgres_all"]),
                    ("machine, all cores (includes other tenants)", cpu.machine_used),
                ]
            ],
        )
    )
    print(f"\nProgress: {[(round(t, 1), d, r) for t, d, r in lines]}")
    print(f"Worker warnings/errors in the log: {events or 'none'}.")
    for line in event_lines:
        print(f"    {line}")
    return {
        "mode": "backlog",
        "tasks": total,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "enqueue_per_s": round(total / enqueue_s),
        "drain_s_from_worker_start": round(total_s, 2),
        "drain_s_from_first_claim": round(claim_s, 2),
        "drain_s_from_first_completion": round(drain_s, 2),
        "tasks_per_s_from_worker_start": round(total / total_s),
        "tasks_per_s_from_first_claim": round(total / claim_s),
        "tasks_per_s_from_first_completion": round(total / drain_s),
        "cpu_s": {k: round(v, 1) for k, v in used.items()}
        | {"machine": round(cpu.machine_used, 1)},
        "exactly_once": exactly_once,
        "worker_log_events": events,
        "other_load_cores": idle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--via", choices=["library", "http"], default="library")
    parser.add_argument("--rate", type=float, default=350.0, help="submits per second")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of submitting")
    parser.add_argument("--task-seconds", type=float, default=5.0, help="each handler sleeps")
    parser.add_argument("--payload-bytes", type=int, default=2048)
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="per process (default: 1000; 50 with --backlog)",
    )
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--producers", type=int, default=4, help="library producer threads")
    parser.add_argument("--api-workers", type=int, default=1, help="pgqueue serve --workers")
    parser.add_argument("--http-connections", type=int, default=64)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per table row")
    parser.add_argument(
        "--backlog",
        type=int,
        default=None,
        help="instead: enqueue this many no-op tasks in bulk and time the drain",
    )
    parser.add_argument("--drain-timeout", type=float, default=900.0, help="--backlog only")
    parser.add_argument("--poll", type=float, default=1.0, help="--backlog: seconds per check")
    parser.add_argument("--progress-every", type=float, default=5.0)
    args = parser.parse_args()
    exit_on_sigterm()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")
    if args.concurrency is None:
        args.concurrency = 50 if args.backlog else 1000
    if not 0 < args.rate <= 5000 or not 0 < args.duration <= 3600:
        parser.error("--rate must be in (0, 5000] and --duration in (0, 3600]")
    if args.backlog is not None and not 0 < args.backlog <= 10_000_000:
        parser.error("--backlog must be in (0, 10000000]")
    summary = run_backlog(args) if args.backlog else run_design(args)
    print("\n" + json.dumps(summary, default=str), flush=True)
    if not summary["exactly_once"]:
        raise SystemExit("not every task completed exactly once")


if __name__ == "__main__":
    main()
