"""A Flask app that enqueues pgqueue tasks in its requests' transactions (Flask-SQLAlchemy).

- ``POST /orders`` inserts an order and enqueues its confirmation email through
  ``db.session``, in one transaction: if anything after the enqueue fails (here, a declined
  payment), neither the order nor the task exists, and no email goes out for it.
- ``GET /orders/<id>/confirmation?wait=10`` waits (up to 10 s) for the worker's result.

Run it (see README.md beside this file)::

    export PGQUEUE_DATABASE_URL=postgresql://localhost/shop
    pgqueue migrate
    pgqueue worker examples.flask_app.tasks:tasks    # one terminal
    flask --app examples.flask_app.app run           # another
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from flask import Blueprint, Flask, abort, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import pgqueue

from .tasks import send_confirmation


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    item: Mapped[str]
    quantity: Mapped[int]
    confirmation_task: Mapped[uuid.UUID | None]


class PaymentDeclined(Exception):
    pass


def charge(payment: str, order: Order) -> None:
    """Stands in for your payment provider (its test token "tok_chargeDeclined" is declined)."""
    if payment == "tok_chargeDeclined":
        raise PaymentDeclined(f"order {order.id}: the card was declined")


bp = Blueprint("orders", __name__)


@bp.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    new = request.get_json()
    order = Order(email=new["email"], item=new["item"], quantity=new.get("quantity", 1))
    db.session.add(order)
    db.session.flush()  # the order's id, for the task
    handle = send_confirmation.enqueue(db.session, order.id, order.email)
    order.confirmation_task = handle.id
    charge(new["payment"], order)  # raising here rolls back the order and its task
    created = {"id": order.id, "task_id": str(handle.id)}
    db.session.commit()  # workers see the task now (and were woken by a NOTIFY)
    return created, 201


@bp.errorhandler(PaymentDeclined)
def declined(exc: PaymentDeclined) -> tuple[dict[str, Any], int]:
    # Flask-SQLAlchemy would roll back at the end of the request anyway; said here so that
    # nothing this handler might do runs in the failed transaction.
    db.session.rollback()
    return {"error": str(exc)}, 402


@bp.get("/orders/<int:order_id>/confirmation")
def get_confirmation(order_id: int) -> dict[str, Any]:
    wait = request.args.get("wait", 0.0, type=float)
    if not 0 <= wait <= 30:
        abort(400, "wait: from 0 to 30 seconds")
    task_id = db.get_or_404(Order, order_id).confirmation_task
    # End the read's transaction before waiting: a wait inside one could never end, since
    # PostgreSQL delivers the notification that ends it only between transactions.
    db.session.commit()
    if wait:
        try:
            task = pgqueue.wait(db.session, task_id, timeout=wait)
        except pgqueue.WaitTimeout as exc:  # not finished yet: say how it stands
            task = exc.task
    else:
        task = pgqueue.get_task(db.session, task_id)
    return {"order_id": order_id, "status": task.status.value, "result": task.result}


def create_app(database_url: str | None = None) -> Flask:
    app = Flask(__name__)
    url = database_url or os.environ["PGQUEUE_DATABASE_URL"]
    # One URL for the app and the worker; SQLAlchemy wants its driver named.
    sqlalchemy_url = make_url(url).set(drivername="postgresql+psycopg")
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url.render_as_string(hide_password=False)
    db.init_app(app)
    app.register_blueprint(bp)
    with app.app_context():
        db.create_all()  # a real app runs its migrations instead
    return app
