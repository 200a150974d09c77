"""The shop on Celery 5, before the move: five tasks on Redis.

- ``send_welcome``: retries with exponential backoff when the mailer is down
  (``autoretry_for``, ``retry_backoff``, ``max_retries``);
- ``charge``: called with ``countdown`` or ``eta`` (``charge.apply_async(..., countdown=60)``);
- ``resize`` and ``publish_album``: a chord, the thumbnails in parallel (a group) and then the
  album with all of them;
- ``nightly_report``: a periodic task (beat, crontab at 03:00 UTC).

Run it: ``SHOP_BROKER_URL=redis://... SHOP_DATABASE_URL=postgresql://... celery -A
examples.celery_app.celery_app worker``; ``pgqueue_app`` is the same shop on pgqueue.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from celery import Celery, chord
from celery.schedules import crontab

from examples.celery_app import shop

BROKER = os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("shop", broker=BROKER, backend=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    enable_utc=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "nightly-report": {"task": "shop.nightly_report", "schedule": crontab(hour=3, minute=0)}
    },
)


@app.task(
    name="shop.send_welcome",
    bind=True,
    autoretry_for=(shop.MailerDown,),
    retry_backoff=1,
    retry_backoff_max=60,
    retry_jitter=False,
    max_retries=4,
)
def send_welcome(self: Any, user_id: int, email: str) -> int:
    with psycopg.connect(shop.database_url()) as conn:
        return shop.send_email(
            conn,
            email,
            f"Welcome, user {user_id}",
            attempt=self.request.retries + 1,
            sent_by="celery",
            task_ref=self.request.id,
        )


@app.task(name="shop.charge")
def charge(order_id: int, amount_cents: int) -> dict[str, Any]:
    return shop.charge_card(order_id, amount_cents)


@app.task(name="shop.resize")
def resize(image_id: int, width: int) -> str:
    return shop.thumbnail(image_id, width)


@app.task(name="shop.publish_album")
def publish_album(thumbnails: list[str], album_id: int) -> dict[str, Any]:
    return {"album_id": album_id, "thumbnails": sorted(thumbnails)}


@app.task(name="shop.nightly_report")
def nightly_report() -> int:
    with psycopg.connect(shop.database_url()) as conn:
        return shop.count_outbox(conn)


def publish(album_id: int, image_ids: list[int]) -> Any:
    """The album's thumbnails in parallel, then the album: Celery's chord."""
    return chord(resize.s(i, 200) for i in image_ids)(publish_album.s(album_id=album_id))
