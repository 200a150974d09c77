"""``pgqueue demo``: a real queue, a real worker and real tasks, in one command.

It migrates the database (the embedded server unless a URL is given), enqueues a mix of
priorities and task types (fast, slow, flaky, hopeless), runs a worker until every task is
settled, and ends with a summary and the SQL to look at the result yourself.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from pgqueue import log, migrate, operations
from pgqueue.client import Client
from pgqueue.config import ENV_DATABASE_URL, redact
from pgqueue.executor import TaskContext
from pgqueue.models import RetryPolicy, TaskStatus
from pgqueue.registry import TaskRegistry
from pgqueue.worker import Worker, WorkerConfig

QUEUE = "demo"

tasks = TaskRegistry()


@tasks.handler("demo.send_email")
async def send_email(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    await asyncio.sleep(0.05)
    return {"sent_to": payload["to"]}


@tasks.handler("demo.resize_image", timeout=30)
def resize_image(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A slow, sync handler: runs in the worker's thread pool."""
    time.sleep(random.uniform(0.5, 1.5))
    return {"image": payload["image"], "sizes": [64, 256, 1024]}


@tasks.handler("demo.flaky_report", retry=RetryPolicy(max_attempts=4, base=0.5, cap=2))
async def flaky_report(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Fails its first attempt (a flaky downstream), then succeeds on retry."""
    if ctx.attempt == 1:
        raise ConnectionError("report service timed out (simulated)")
    return {"report": payload["report"], "attempt": ctx.attempt}


@tasks.handler("demo.charge_card", retry=RetryPolicy(max_attempts=3, base=0.3, cap=1))
async def charge_card(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Always fails: ends in the dead-letter queue after 3 attempts."""
    raise ValueError(f"card {payload['card']} declined (simulated)")


def _plan() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(20):
        items.append(
            {
                "type": "demo.send_email",
                "payload": {"to": f"user{i}@example.com"},
                "priority": "high" if i % 4 == 0 else "normal",
            }
        )
    for i in range(8):
        items.append(
            {"type": "demo.resize_image", "payload": {"image": f"photo-{i}.jpg"}, "priority": "low"}
        )
    for i in range(4):
        items.append({"type": "demo.flaky_report", "payload": {"report": f"sales-{i}"}})
    for i in range(2):
        items.append(
            {"type": "demo.charge_card", "payload": {"card": f"4000-00{i}"}, "priority": "high"}
        )
    for item in items:
        item["queue"] = QUEUE
        handler = tasks.get(item["type"])
        if handler and handler.retry:
            item["retry"] = handler.retry
    return items


def run_demo(
    database_url: str | None, echo: Callable[[str], None], as_json: bool = False
) -> dict[str, Any]:
    started = time.monotonic()
    embedded = uses_embedded_server(database_url)
    client = Client(database_url)
    before, head = migrate.current(client.database_url), migrate.head()
    if before == head:
        echo(f"database: {redact(client.database_url)} (schema up to date)")
    else:
        echo(f"database: {redact(client.database_url)} (migrating to {head})")
        migrate.upgrade(client.database_url)
    with client:
        results = client.enqueue_many(_plan())
        ids = [r.id for r in results]
        echo(
            f"enqueued {len(ids)} tasks on queue {QUEUE!r}: 20 emails, 8 image resizes (slow), "
            "4 flaky reports (fail once), 2 card charges (always fail)"
        )
        echo(
            "running a worker (concurrency 8); retries and dead letters are logged as they happen:"
        )
        if not as_json:
            log.configure("text", "WARNING")
        worker = Worker(
            tasks,
            client.database_url,
            WorkerConfig(
                queues=[QUEUE], concurrency=8, lease_seconds=10, poll_interval=0.2, grace_period=5
            ),
        )
        summary = asyncio.run(_run(worker, client, ids, echo, as_json))
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["database"] = redact(client.database_url)
    summary["migrated"] = before != head
    summary["embedded_server"] = embedded
    return summary


def uses_embedded_server(database_url: str | None) -> bool:
    """Whether this URL (the argument, else PGQUEUE_DATABASE_URL) falls back to the embedded
    server, which the demo then leaves running: the person must hear of it."""
    return database_url is None and not os.environ.get(ENV_DATABASE_URL, "").strip()


async def _run(
    worker: Worker, client: Client, ids: list[uuid.UUID], echo: Callable[[str], None], quiet: bool
) -> dict[str, Any]:
    job = asyncio.create_task(worker.run_async())
    started = time.monotonic()
    last = ""
    try:
        while True:
            snapshot = await asyncio.to_thread(_snapshot, client, ids)
            counts = Counter(t.status for t in snapshot)
            line = "  ".join(f"{s.value}={counts.get(s, 0)}" for s in TaskStatus)
            if not quiet and line != last:
                echo(f"  {time.monotonic() - started:5.1f} s  {line}")
                last = line
            if all(t.status.is_final for t in snapshot):
                break
            if job.done():
                job.result()  # surface the worker's error
            await asyncio.sleep(0.3)
    finally:
        worker.request_stop()
        await job
    completed = [t for t in snapshot if t.status is TaskStatus.COMPLETED]
    return {
        "tasks": len(snapshot),
        "completed": len(completed),
        "completed_after_retry": sum(1 for t in completed if t.attempts > 1),
        "dead_lettered": sum(1 for t in snapshot if t.status is TaskStatus.FAILED),
        "dead_letter_errors": sorted(
            {
                (t.last_error or "").strip().splitlines()[-1]
                for t in snapshot
                if t.status is TaskStatus.FAILED
            }
        ),
        "sql": [
            "SELECT * FROM pgqueue.queue_depth WHERE queue = 'demo';",
            "SELECT id, type, attempts, last_error FROM pgqueue.dead_letters WHERE queue = 'demo';",
        ],
    }


def _snapshot(client: Client, ids: list[uuid.UUID]) -> list[Any]:
    with client.connection() as conn:
        return [operations.get_task(conn, i) for i in ids]
