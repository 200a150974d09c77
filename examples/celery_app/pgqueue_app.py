"""The same shop on pgqueue: each Celery task of ``celery_app`` ported, side by side.

The types keep the Celery names (``name="shop.send_welcome"``): during the move, the
forwarder (``pgqueue celery-forward``) sends the messages still in Redis to the task of the
same name, and dashboards and logs keep one name per task.

Run it: ``pgqueue worker examples.celery_app.pgqueue_app:tasks``.
"""

from __future__ import annotations

from typing import Any

import pgqueue
from examples.celery_app import shop

tasks = pgqueue.TaskRegistry()


# autoretry_for + retry_backoff + max_retries=4: five attempts, 1 s, 2 s, 4 s ... capped at 60 s.
# The e-mail goes through ctx.connection, whose transaction commits with the task's
# completion: a worker that dies after the send and before the completion leaves no e-mail
# behind, and the retry sends it once.
@tasks.task(
    name="shop.send_welcome",
    retry=pgqueue.RetryPolicy(max_attempts=5, base=1.0, factor=2.0, cap=60.0),
)
def send_welcome(user_id: int, email: str, ctx: pgqueue.TaskContext) -> int:
    return shop.send_email(
        ctx.connection,
        email,
        f"Welcome, user {user_id}",
        attempt=ctx.attempt,
        sent_by="pgqueue",
        task_ref=str(ctx.task_id),
    )


# countdown/eta: charge.options(delay=60) or .options(run_at=...), then .enqueue(conn, ...).
@tasks.task(name="shop.charge")
def charge(order_id: int, amount_cents: int) -> dict[str, Any]:
    return shop.charge_card(order_id, amount_cents)


@tasks.task(name="shop.resize")
def resize(image_id: int, width: int) -> str:
    return shop.thumbnail(image_id, width)


@tasks.task(name="shop.publish_album")
def publish_album(thumbnails: list[str], album_id: int) -> dict[str, Any]:
    return {"album_id": album_id, "thumbnails": sorted(thumbnails)}


@tasks.task(name="shop.nightly_report")
def nightly_report(ctx: pgqueue.TaskContext) -> int:
    return shop.count_outbox(ctx.connection)


# Celery beat's crontab(hour=3, minute=0): run by every worker's scheduler, once per tick.
tasks.periodic("nightly-report", "0 3 * * *", type="shop.nightly_report")


def publish(album_id: int, image_ids: list[int]) -> pgqueue.Chord:
    """The album's thumbnails in parallel, then the album: the callback's first unbound
    parameter (``thumbnails``) receives the list of the header's results."""
    return pgqueue.chord([resize.s(i, 200) for i in image_ids], publish_album.s(album_id=album_id))
