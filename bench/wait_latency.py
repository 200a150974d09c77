"""Finish-to-return latency of waiting for a result: how long after a task is
finished its waiter has it.

    python -m bench.wait_latency --server-url postgresql://postgres@127.0.0.1:5432/postgres

Against a real ``pgqueue worker`` process (and, for the HTTP part, a real ``pgqueue serve``
process), in a scratch database created on the server and dropped after. Latency is the
waiter's wall clock when the wait returned minus the task's ``finished_at`` (the finishing
transaction's start, on the same machine's clock), so it includes the completion's commit.

* ``library``: one waiter, ``pgqueue.wait`` on an autocommit connection, one task at a time
  (a handler that sleeps ``--sleep-ms`` so the wait is registered before the task finishes),
  poll fallback set to an hour: what is measured is the notification path. A task already
  final when the wait began is counted apart, not measured.
* ``http``: ``--waiters`` concurrent ``GET /api/v1/tasks/{id}?wait=60`` on one API process
  (poll fallback an hour); their tasks are held in a paused queue until every request is
  registered, then the queue is resumed and the worker runs them all (no-op handler).
* ``fallback``: the library wait again with the notification switched off in the scratch
  database (``task_waiters_wake`` replaced by a no-op), so only the poll (the default
  ``poll_interval``, 2 s) finds the finished task.

It prints a markdown table; bench/RESULTS.md keeps the figures with this command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

import pgqueue
from pgqueue import migrate
from pgqueue.waiting import DEFAULT_POLL_INTERVAL

HANDLERS = """
import asyncio

import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.handler("bench.wait")
async def wait(payload, ctx):
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    return payload.get("n")
"""

QUEUE = "wait"
NO_POLL = 3600.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    name = f"pgqueue_wait_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(server_url, name)
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    return {**env, "PGQUEUE_DATABASE_URL": url, **extra}


@contextmanager
def worker(url: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    (workdir / "wait_bench_handlers.py").write_text(HANDLERS)
    command = [sys.executable, "-m", "pgqueue", "worker", "wait_bench_handlers:tasks"]
    command += ["--queue", QUEUE, "--concurrency", "50", "--log-level", "WARNING"]
    proc = subprocess.Popen(command, cwd=workdir, env=env_for(url))
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


@contextmanager
def api(url: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "pgqueue", "serve", "--port", str(port)]
    command += ["--log-level", "warning"]
    proc = subprocess.Popen(command, env=env_for(url, PGQUEUE_API_WAIT_POLL_SECONDS=str(NO_POLL)))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the API did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(60)


def library(url: str, count: int, sleep_ms: int, poll: float) -> tuple[list[float], int]:
    """One waiter, one task at a time: latencies, and how many were final before the wait."""
    latencies: list[float] = []
    early = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(count):
            task_id = pgqueue.enqueue(conn, "bench.wait", {"ms": sleep_ms, "n": n}, queue=QUEUE).id
            began = time.time()
            task = pgqueue.wait(conn, task_id, timeout=60, poll_interval=poll)
            returned = time.time()
            assert task.status is pgqueue.TaskStatus.COMPLETED and task.finished_at is not None
            if task.finished_at.timestamp() < began:
                early += 1
                continue
            latencies.append(returned - task.finished_at.timestamp())
    return latencies, early


async def _get(base: str, path: str) -> tuple[float, int, dict[str, Any]]:
    """One GET on a connection of its own, read to its end: the wall clock when the answer
    was in, its status and its JSON body. Raw asyncio streams rather than httpx: on a small
    machine a thousand httpx requests cost the client seconds, which would be measured as the
    server's latency."""
    host, port = urlsplit(base).hostname, urlsplit(base).port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    returned = time.time()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" in head.lower():
        body = _unchunk(body)
    return returned, status, json.loads(body) if body else {}


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2 :]
    return out


async def _many(base: str, url: str, count: int) -> tuple[list[float], int]:
    with psycopg.connect(url, autocommit=True) as conn:
        pgqueue.pause_queue(conn, QUEUE)
        results = pgqueue.enqueue_many(
            conn,
            [{"type": "bench.wait", "queue": QUEUE, "payload": {"n": n}} for n in range(count)],
        )
        ids = [r.id for r in results]
    waiting = [asyncio.create_task(_get(base, f"/api/v1/tasks/{t}?wait=60")) for t in ids]

    def registered() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pgqueue.task_waiters").fetchone()
            return int(row[0]) if row else 0

    deadline = time.monotonic() + 120
    while await asyncio.to_thread(registered) < count:
        if time.monotonic() > deadline:
            raise SystemExit("the waiters did not all register within 120 s")
        await asyncio.sleep(0.1)
    with psycopg.connect(url, autocommit=True) as conn:
        pgqueue.resume_queue(conn, QUEUE)
    answers = await asyncio.gather(*waiting)
    latencies: list[float] = []
    refused = 0
    for returned, status, body in answers:
        if status != 200 or body.get("status") != "completed":
            refused += 1
            continue
        latencies.append(returned - datetime.fromisoformat(body["finished_at"]).timestamp())
    return latencies, refused


async def _plain(base: str, url: str, count: int) -> tuple[list[float], int]:
    """For scale: ``count`` concurrent plain GETs (no wait) of the same process, each timed
    from its send to its answer: what the process takes to answer that many at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        tasks = [{"type": "bench.wait", "queue": "nobody"} for _ in range(count)]
        ids = [r.id for r in pgqueue.enqueue_many(conn, tasks)]

    async def one(task_id: uuid.UUID) -> tuple[float, int]:
        sent = time.time()
        returned, status, _ = await _get(base, f"/api/v1/tasks/{task_id}")
        return returned - sent, status

    answers = await asyncio.gather(*(one(t) for t in ids))
    return [took for took, code in answers if code == 200], sum(c != 200 for _, c in answers)


def row(name: str, latencies: list[float], note: str) -> str:
    if not latencies:
        return f"| {name} | 0 | - | - | - | {note} |"
    p50, p99 = percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000
    top = max(latencies) * 1000
    return f"| {name} | {len(latencies)} | {p50:.1f} | {p99:.1f} | {top:.1f} | {note} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default=os.environ.get("PGQUEUE_TEST_DATABASE_URL"))
    parser.add_argument("--count", type=int, default=300, help="library waits, one at a time")
    parser.add_argument("--waiters", type=int, default=1000, help="concurrent HTTP waiters")
    parser.add_argument("--fallback-count", type=int, default=30)
    parser.add_argument("--sleep-ms", type=int, default=50)
    args = parser.parse_args(argv)
    if not args.server_url:
        parser.error("--server-url (or PGQUEUE_TEST_DATABASE_URL) is required")
    rows = []
    with (
        scratch_database(args.server_url) as url,
        tempfile.TemporaryDirectory() as tmp,
        worker(url, Path(tmp)),
    ):
        lat, early = library(url, args.count, args.sleep_ms, NO_POLL)
        rows.append(row("library, 1 waiter", lat, f"notification; {early} final before"))
        with api(url) as base:
            lat, refused = asyncio.run(_many(base, url, args.waiters))
            note = f"{args.waiters} at once on one API process; {refused} not answered 200"
            rows.append(row("HTTP ?wait=60", lat, note))
            lat, refused = asyncio.run(_plain(base, url, args.waiters))
            note = (
                f"for scale: {args.waiters} plain GETs at once, send to answer; {refused} not 200"
            )
            rows.append(row("HTTP GET, no wait", lat, note))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE OR REPLACE FUNCTION pgqueue.task_waiters_wake(ids uuid[])"
                " RETURNS integer LANGUAGE sql AS 'SELECT 0'"
            )
        lat, early = library(url, args.fallback_count, args.sleep_ms, DEFAULT_POLL_INTERVAL)
        note = f"notification off: the {DEFAULT_POLL_INTERVAL:g} s poll only"
        rows.append(row("library, fallback", lat, note))
    print("| wait | measured | p50 ms | p99 ms | max ms | how |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
