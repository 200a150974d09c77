"""Function tasks called as a Celery team calls them (``fn.delay``, ``fn.apply_async``), for
test_celery_style_calls.py: a worker process runs ``celery_style_handlers:tasks``."""

from __future__ import annotations

import time
from pathlib import Path

from pgqueue import TaskRegistry

tasks = TaskRegistry()

QUEUE = "celery_style"


class PaymentDeclined(Exception):
    """An exception of the application's own: stored under its qualified name."""


@tasks.task(name="celery_style.add", queue=QUEUE)
def add(x: int, y: int) -> int:
    return x + y


@tasks.task(name="celery_style.declined", queue=QUEUE, max_attempts=1)
def declined(order_id: int) -> None:
    raise ValueError(f"card declined for order {order_id}")


@tasks.task(name="celery_style.payment", queue=QUEUE, max_attempts=1)
def payment(order_id: int) -> None:
    raise PaymentDeclined(f"insufficient funds: order {order_id}")


@tasks.task(name="celery_style.gated", queue=QUEUE)
def gated(gate: str) -> str:
    """Runs until the file ``gate`` exists (the test creates it), so that the test can see
    the task running; gives up after 60 s."""
    deadline = time.monotonic() + 60
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.02)
    return "opened"


@tasks.task(name="celery_style.fan_out", queue=QUEUE)
def fan_out(count: int) -> list[str]:
    """Submits ``count`` add tasks with ``delay``, as a Celery task calls another: through the
    worker process's default client (its PGQUEUE_DATABASE_URL)."""
    return [str(add.delay(i, i).id) for i in range(count)]
