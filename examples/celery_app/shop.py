"""The shop's own code, which neither queue owns: the outbox that e-mails are written to, a
mailer that is down on a first try, and the report. The Celery tasks (``celery_app``) and
their port (``pgqueue_app``) both call it, as a real app's tasks call its services."""

from __future__ import annotations

import os
from typing import Any

import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS shop_outbox (
    id bigserial PRIMARY KEY,
    recipient text NOT NULL,
    subject text NOT NULL,
    sent_by text NOT NULL,  -- 'celery' or 'pgqueue': who ran the task
    task_ref text NOT NULL  -- the task's id in the queue that ran it
);
"""


class MailerDown(ConnectionError):
    """The mail provider did not answer: worth retrying later."""


def database_url() -> str:
    return os.environ.get("SHOP_DATABASE_URL") or os.environ["PGQUEUE_DATABASE_URL"]


def create_schema(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SCHEMA)


def send_email(
    conn: psycopg.Connection[Any],
    recipient: str,
    subject: str,
    *,
    attempt: int,
    sent_by: str,
    task_ref: str,
) -> int:
    """Write the e-mail to the outbox (a relay sends it); an address at ``flaky.example``
    finds the mailer down on the first attempt."""
    if recipient.endswith("@flaky.example") and attempt == 1:
        raise MailerDown(f"mailer down while sending to {recipient}")
    row = conn.execute(
        "INSERT INTO shop_outbox (recipient, subject, sent_by, task_ref)"
        " VALUES (%s, %s, %s, %s) RETURNING id",
        (recipient, subject, sent_by, task_ref),
    ).fetchone()
    assert row is not None
    return int(row[0])


def charge_card(order_id: int, amount_cents: int) -> dict[str, Any]:
    """Stands in for the payment provider."""
    return {"order_id": order_id, "charged": amount_cents}


def thumbnail(image_id: int, width: int) -> str:
    return f"thumbs/{image_id}-{width}.jpg"


def count_outbox(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM shop_outbox").fetchone()
    assert row is not None
    return int(row[0])
