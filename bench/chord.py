"""A chord's drain against a plain drain of as many tasks (the bar workflows must meet:
within 1.5x), and how soon the callback starts after the last member completed (bar: within
100 ms).

    python -m bench.chord --members 10000 --rounds 3 --processes 2 \
        --server-url postgresql://postgres@127.0.0.1:5432/postgres

Each round drains, in a scratch database of its own and in alternating order, (a) 10,000 no-op
members and one callback that depends on all of them (``depends_on``, one transaction), and
(b) 10,001 plain no-op tasks, with the same real ``pgqueue worker --processes N`` command.
Times are from the worker's launch (start-up included) to the last completion, read from the
database (``finished_at``), and the callback's delay is its ``started_at`` less the latest
member's ``finished_at``, both on the server's clock. The machine is shared: compare the
ratios of one round, and read the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue
from pgqueue import migrate

TYPE = "bench.noop"


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def enqueue(url: str, members: int, chord: bool) -> uuid.UUID | None:
    """The tasks, committed: members (and the callback, last) or members + 1 plain tasks."""
    with psycopg.connect(url) as conn:
        ids: list[uuid.UUID] = []
        for start in range(0, members, 5000):
            n = min(5000, members - start)
            ids += [r.task.id for r in pgqueue.enqueue_many(conn, [{"type": TYPE}] * n)]
        if chord:
            callback = pgqueue.enqueue(conn, TYPE, {"callback": True}, depends_on=ids).task.id
        else:
            pgqueue.enqueue(conn, TYPE, {})
            callback = None
        conn.commit()
    return callback


def drain(url: str, total: int, processes: int, concurrency: int) -> float:
    """Seconds from the worker's launch until all ``total`` tasks completed (server clock)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    command = [sys.executable, "-m", "pgqueue", "--database-url", url, "worker"]
    command += ["bench.handlers:tasks", "--processes", str(processes)]
    command += ["--concurrency", str(concurrency), "--log-level", "WARNING"]
    with psycopg.connect(url, autocommit=True) as conn:
        launched = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        worker = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), max(finished_at)"
                    " FROM pgqueue.tasks"
                ).fetchone()
                assert row is not None
                if row[0] == total:
                    return float((row[1] - launched).total_seconds())
                if worker.poll() is not None:
                    raise SystemExit(f"worker exited with {worker.returncode}")
                time.sleep(0.05)
        finally:
            worker.terminate()
            worker.wait(30)


def one(server_url: str, members: int, chord: bool, processes: int, concurrency: int) -> Any:
    name = f"pgqueue_chord_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    try:
        migrate.upgrade(url)
        callback = enqueue(url, members, chord)
        seconds = drain(url, members + 1, processes, concurrency)
        out: dict[str, Any] = {"drain_s": round(seconds, 3)}
        with psycopg.connect(url) as conn:
            runs = conn.execute("SELECT count(*) FROM pgqueue.tasks WHERE attempts <> 1")
            out["attempts_not_1"] = runs.fetchone()[0]  # type: ignore[index]
            if callback is not None:
                row = conn.execute(
                    "SELECT c.started_at - m.last, c.started_at >= m.last"
                    "  FROM pgqueue.tasks AS c,"
                    "       (SELECT max(finished_at) AS last FROM pgqueue.tasks"
                    "         WHERE id <> %s) AS m"
                    " WHERE c.id = %s",
                    (callback, callback),
                ).fetchone()
                assert row is not None
                out["callback_after_last_member_ms"] = round(row[0].total_seconds() * 1000, 1)
                out["callback_after_every_member"] = row[1]
        return out
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url (a server where a scratch database may be created)")
    rounds = []
    for k in range(args.rounds):
        order = (True, False) if k % 2 == 0 else (False, True)
        got = {}
        for chord in order:
            key = "chord" if chord else "plain"
            got[key] = one(args.server_url, args.members, chord, args.processes, args.concurrency)
        got["ratio"] = round(got["chord"]["drain_s"] / got["plain"]["drain_s"], 3)
        print(json.dumps(got), flush=True)
        rounds.append(got)
    summary = {
        "members": args.members,
        "processes": args.processes,
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
        "ratio_range": [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)],
        "callback_ms_median": statistics.median(
            r["chord"]["callback_after_last_member_ms"] for r in rounds
        ),
        "callback_ms_max": max(r["chord"]["callback_after_last_member_ms"] for r in rounds),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
