"""The app's tasks, in a module of their own: the app imports it to enqueue, and the worker
(``pgqueue worker examples.flask_app.tasks:tasks``) imports it to run them, without importing
Flask or the app's settings."""

from __future__ import annotations

import logging

import pgqueue

tasks = pgqueue.TaskRegistry()
log = logging.getLogger(__name__)


# name= keeps the type stable if this function is renamed or moved: tasks already queued
# under the old name would otherwise find no handler.
@tasks.task(name="send_confirmation", max_attempts=5, timeout=30)
def send_confirmation(
    order_id: int, email: str, *, ctx: pgqueue.TaskContext | None = None
) -> dict[str, object]:
    """Stands in for your mailer. A real one would pass the task id as its idempotency key:
    a task runs at least once, and twice if its worker dies mid-send. (A plain function: the
    worker runs it in a thread.)"""
    key = str(ctx.task_id) if ctx else None
    log.info("order %s: confirmation sent to %s (idempotency key %s)", order_id, email, key)
    return {"order_id": order_id, "sent_to": email}
