"""Where the time goes on the two hot paths, by sampling: the server backend behind a loop of
single enqueues (``perf``), and a worker process draining a backlog (``py-spy``).

    python -m bench.hot_profile enqueue [--bare] [--seconds 8]   # needs perf, a local server
    python -m bench.hot_profile drain [--tasks 200000] [--concurrency 1000] [--seconds 8]
    python -m bench.hot_profile split [--tasks 200000] [--processes 2] [--concurrency 1000]

``enqueue``: one connection with ``synchronous_commit`` off (so the backend's time is CPU, not
the flush) runs ``pgqueue.enqueue`` (or, ``--bare``, baseline_insert.py's bare INSERT) in a
loop while ``perf record -g`` samples its backend process; prints the functions that hold the
most of its samples, with their callees (``perf report --children``). ``drain``: a backlog of
no-op tasks (bench/contenders/pgqueue_contender.py's async handler) drained by one worker
process run under ``py-spy record``; prints the frames that hold the most samples themselves
(the worker's Python cost per task, by function), and how busy the process was. ``split``:
the same backlog drained by ``--processes`` workers without a profiler; the CPU the workers
and the server's processes (every ``postgres`` process of this machine: run it with the
server otherwise idle) spent per task, read from /proc, and how many of the cores were busy.

Both work on a scratch database of the server given, dropped at the end. The figures are
shares of samples: they say what to look at, not how fast anything is (bench.compare does).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

CONTENDERS = Path(__file__).resolve().parent / "contenders"


def _scratch(server_url: str) -> tuple[str, str]:
    name = f"pgqueue_hot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, psycopg.conninfo.make_conninfo(server_url, dbname=name)


def _drop(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def profile_enqueue(url: str, bare: bool, seconds: float, payload_bytes: int) -> None:
    import pgqueue

    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Debian: apt-get install linux-perf)")
    data = {"data": "x" * payload_bytes}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute(
            "CREATE TABLE bare_insert (id uuid PRIMARY KEY, payload jsonb NOT NULL,"
            " priority smallint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        pid = conn.info.backend_pid
        out = Path(tempfile.mkdtemp()) / "perf.data"
        record = subprocess.Popen(
            ["perf", "record", "-F", "2000", "-g", "-p", str(pid), "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            if bare:
                conn.execute(
                    "INSERT INTO bare_insert (id, payload, priority) VALUES (%s, %s, %s)",
                    (uuid.uuid4(), Jsonb(data), 1),
                )
            else:
                pgqueue.enqueue(conn, "bench.noop", data)
            calls += 1
        elapsed = time.perf_counter() - started
        record.send_signal(2)
        record.wait(30)
    what = "bare INSERT" if bare else "pgqueue.enqueue"
    print(f"{what}: {calls} calls in {elapsed:.1f} s ({calls / elapsed:,.0f}/s), backend {pid}")
    report = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            str(out),
            "--children",
            "--sort",
            "symbol",
            "--stdio",
            "-g",
            "none",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # (without the frames perf could not name, and the process's entry points above them all)
    rows = [
        line
        for line in report.splitlines()
        if line.strip() and not line.startswith("#") and "0x0000" not in line
    ][4:]
    print("share of the backend's samples (with callees, then own), by function:")
    for line in rows[:45]:
        print("  " + line.strip())


def _backlog(url: str, tasks: int, size: int) -> None:
    import pgqueue

    with psycopg.connect(url) as conn:
        for start in range(0, tasks, 5000):
            n = min(5000, tasks - start)
            pgqueue.enqueue_columns(conn, "bench.noop", [{"data": "x" * size}] * n)
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueue.tasks")
        conn.execute("CHECKPOINT")


def _cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _postgres_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().startswith("postgres"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def cpu_split(url: str, tasks: int, processes: int, concurrency: int, size: int) -> None:
    _backlog(url, tasks, size)
    cli = str(Path(sys.executable).parent / "pgqueue")
    env = {**os.environ, "PGQUEUE_DATABASE_URL": url, "PYTHONPATH": str(CONTENDERS)}
    command = [cli, "worker", "pgqueue_contender:tasks", "--concurrency", str(concurrency)]
    server_before = _cpu_seconds(_postgres_pids())
    started = time.perf_counter()
    workers = [
        subprocess.Popen([*command, "--log-level", "WARNING"], env=env, cwd=CONTENDERS)
        for _ in range(processes)
    ]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            done = "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'"
            while (conn.execute(done).fetchone() or (0,))[0] < tasks:
                time.sleep(0.05)
        elapsed = time.perf_counter() - started
        worker_cpu = _cpu_seconds([w.pid for w in workers])  # start-up included
        server_cpu = _cpu_seconds(_postgres_pids()) - server_before
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()
    print(
        f"{processes} worker process(es), concurrency {concurrency}: {tasks / elapsed:,.0f} tasks/s"
    )
    print(f"  per task: workers' CPU {worker_cpu / tasks * 1e6:.1f} us (their start-up included),")
    server_us, wall_us = server_cpu / tasks * 1e6, elapsed / tasks * 1e6
    print(f"  the server's processes {server_us:.1f} us, wall {wall_us:.1f} us")
    print(f"  cores busy: {(worker_cpu + server_cpu) / elapsed:.2f} of {os.cpu_count()}")


def profile_drain(url: str, tasks: int, concurrency: int, seconds: float, size: int) -> None:

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    _backlog(url, tasks, size)
    raw = Path(tempfile.mkdtemp()) / "drain.raw"
    cli = str(Path(sys.executable).parent / "pgqueue")
    env = {**os.environ, "PGQUEUE_DATABASE_URL": url, "PYTHONPATH": str(CONTENDERS)}
    command = [pyspy, "record", "-o", str(raw), "-f", "raw", "-r", "250", "-d", str(round(seconds))]
    command += ["--nonblocking", "--", sys.executable, cli, "worker", "pgqueue_contender:tasks"]
    command += ["--concurrency", str(concurrency), "--log-level", "WARNING"]
    worker = subprocess.Popen(
        command,
        env=env,
        cwd=CONTENDERS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # py-spy stops sampling after --duration but writes its file only once the worker exits,
    # which a worker with nothing left to do never does: an interrupt makes it write and end.
    time.sleep(seconds + 3)
    os.killpg(worker.pid, signal.SIGINT)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'")
        done = row.fetchone()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        own[stack.split(";")[-1]] += int(count)
    possible = 250 * seconds
    print(f"worker: {done[0] if done else 0} of {tasks} completed; {total} samples while busy")
    print(f"(of {possible:.0f} at 250 Hz: busy {100 * total / possible:.0f} % of the time)")
    print("share of the busy samples, by the frame that held them:")
    for frame, count in own.most_common(30):
        print(f"  {100 * count / max(total, 1):5.1f} %  {frame}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hot_profile", description=__doc__)
    p.add_argument("path", choices=("enqueue", "drain", "split"))
    p.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--bare", action="store_true", help="enqueue: the bare INSERT instead")
    p.add_argument("--tasks", type=int, default=200_000, help="drain: the backlog")
    p.add_argument("--concurrency", type=int, default=1000, help="drain: the worker's")
    p.add_argument("--processes", type=int, default=2, help="split: worker processes")
    args = p.parse_args(argv)
    from pgqueue import migrate

    name, url = _scratch(args.server_url)
    try:
        migrate.upgrade(url)
        if args.path == "enqueue":
            profile_enqueue(url, args.bare, args.seconds, args.payload_bytes)
        elif args.path == "drain":
            profile_drain(url, args.tasks, args.concurrency, args.seconds, args.payload_bytes)
        else:
            cpu_split(url, args.tasks, args.processes, args.concurrency, args.payload_bytes)
    finally:
        _drop(args.server_url, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
