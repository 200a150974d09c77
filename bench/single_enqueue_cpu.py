"""A single enqueue against the bare one-row INSERT, one transaction per call, with the WAL
flush's wait taken out: what is left is CPU (the client's, the server's) and the round trip.

    python -m bench.single_enqueue_cpu                      # 100-byte payloads
    python -m bench.single_enqueue_cpu --payload-bytes 2048

Why: bench.compare's durable single enqueues on a machine with a shared disk measure the
flush's weather (their rates moved 10x between steps minutes apart). Here every connection
runs with ``synchronous_commit`` off (the statements and their commits are otherwise the
same). Besides the wall time per call, it counts this process's CPU time per call and the
server backend's own on-CPU time per call (read from ``/proc/<pid>/schedstat``, so the server
must run on this machine). Three loops in turn, 300 calls a block, 6 counted rounds after one
uncounted: ``pgqueue.enqueue``, the same with ``notify=False``, and baseline_insert.py's bare
INSERT, each on its own connection to a scratch database of the server given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb


def on_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.single_enqueue_cpu", description=__doc__)
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--calls", type=int, default=300, help="calls per block")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    import pgqueue
    from pgqueue import migrate

    data = {"data": "x" * args.payload_bytes}
    name = f"pgqueue_single_cpu_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(args.database_url, dbname=name)
    conns: list[psycopg.Connection[Any]] = []
    try:
        migrate.upgrade(url)
        for _ in range(3):
            conn = psycopg.connect(url, autocommit=True)
            conn.execute("SET synchronous_commit = off")
            conns.append(conn)
        enqueue, quiet, bare = conns
        bare.execute(
            "CREATE TABLE bare_insert (id uuid PRIMARY KEY, payload jsonb NOT NULL,"
            " priority smallint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        insert = "INSERT INTO bare_insert (id, payload, priority) VALUES (%s, %s, %s)"
        loops: dict[str, tuple[Callable[[], object], psycopg.Connection[Any]]] = {
            "pgqueue.enqueue": (lambda: pgqueue.enqueue(enqueue, "bench.noop", data), enqueue),
            "pgqueue.enqueue, notify=False": (
                lambda: pgqueue.enqueue(quiet, "bench.noop", data, notify=False),
                quiet,
            ),
            "bare INSERT": (lambda: bare.execute(insert, (uuid.uuid4(), Jsonb(data), 1)), bare),
        }
        pids = {}
        for key, (_, conn) in loops.items():
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pids[key] = row[0]
        server: dict[str, list[float]] = {k: [] for k in loops}
        wall: dict[str, list[float]] = {k: [] for k in loops}
        client: dict[str, list[float]] = {k: [] for k in loops}
        for rnd in range(args.rounds + 1):
            for key in loops if rnd % 2 == 0 else list(loops)[::-1]:
                call = loops[key][0]
                cpu, started = on_cpu_ns(pids[key]), time.perf_counter()
                own = time.process_time()
                for _ in range(args.calls):
                    call()
                if rnd:
                    wall[key].append((time.perf_counter() - started) / args.calls * 1e6)
                    client[key].append((time.process_time() - own) / args.calls * 1e6)
                    server[key].append((on_cpu_ns(pids[key]) - cpu) / args.calls / 1000)
    finally:
        for conn in conns:
            conn.close()
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"{args.payload_bytes}-byte payloads, synchronous_commit off, {args.calls} calls a block")
    print()
    print(
        "| loop | wall µs per call, median | client CPU µs per call, median "
        "| server backend on-CPU µs per call, median |"
    )
    print("|---|---|---|---|")
    for key in loops:
        w, c, b = (statistics.median(d[key]) for d in (wall, client, server))
        print(f"| {key} | {w:.0f} | {c:.1f} | {b:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
