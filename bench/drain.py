"""Drain a backlog: enqueue N no-op tasks, start `pgqueue worker` processes, time the drain.

    python -m bench.drain --tasks 20000 --processes 2 --concurrency 50 \
        --server-url postgresql://postgres@127.0.0.1:5432/postgres

It creates a scratch database on the server (dropped afterwards), migrates it, enqueues in
batches with enqueue_many (the enqueue rate is reported too), runs the real worker CLI, polls
until every task is completed, and checks in the database that each ran exactly once.
Durability is whatever the server has (the machine's PostgreSQL: fsync and synchronous_commit
on).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue
from pgqueue import migrate


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--type", default="bench.noop", choices=["bench.noop", "bench.noop_sync"])
    parser.add_argument("--payload-bytes", type=int, default=100)
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")

    name = f"pgqueue_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(args.server_url, name)
    worker: subprocess.Popen[bytes] | None = None
    try:
        migrate.upgrade(url)
        payload = {"data": "x" * args.payload_bytes}
        started = time.perf_counter()
        with psycopg.connect(url) as conn:
            for start in range(0, args.tasks, 5000):
                n = min(5000, args.tasks - start)
                pgqueue.enqueue_many(conn, [{"type": args.type, "payload": payload}] * n)
                conn.commit()
        enqueue_s = time.perf_counter() - started

        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        command = [
            sys.executable,
            "-m",
            "pgqueue",
            "--database-url",
            url,
            "worker",
            "bench.handlers:tasks",
            "--processes",
            str(args.processes),
            "--concurrency",
            str(args.concurrency),
            "--log-level",
            "WARNING",
        ]
        started = time.perf_counter()
        worker = subprocess.Popen(command, env=env)
        first_done = None
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'),"
                    "       count(*) FILTER (WHERE attempts > 1)"
                    "  FROM pgqueue.tasks"
                ).fetchone()
                assert row is not None
                done, repeated = row
                if done and first_done is None:
                    first_done = time.perf_counter()
                if done == args.tasks:
                    break
                if worker.poll() is not None:
                    raise SystemExit(f"worker exited with {worker.returncode}")
                time.sleep(0.1)
            total_s = time.perf_counter() - started
            assert first_done is not None
            drain_s = time.perf_counter() - first_done
        result = {
            "tasks": args.tasks,
            "processes": args.processes,
            "concurrency": args.concurrency,
            "type": args.type,
            "enqueue_per_s": round(args.tasks / enqueue_s),
            "drain_s_including_startup": round(total_s, 2),
            "drain_per_s_after_first_completion": round(args.tasks / drain_s),
            "ran_more_than_once": repeated,
        }
        print(json.dumps(result))
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(30)
        with psycopg.connect(args.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
