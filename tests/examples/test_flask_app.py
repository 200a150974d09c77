"""examples/flask_app against real PostgreSQL: an order and its task commit or roll back
together through Flask-SQLAlchemy's ``db.session``, and a real worker process completes the
task while the app's wait returns its result."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from acceptance.test_worker_processes import Workers, wait_until
from flask.testing import FlaskClient

import pgqueue
from examples.flask_app import app as example
from examples.flask_app.tasks import send_confirmation

ORDER = {"email": "ada@example.com", "item": "teapot", "quantity": 2, "payment": "tok_visa"}


@pytest.fixture
def client(database_url: str) -> Iterator[FlaskClient]:
    app = example.create_app(database_url)
    yield app.test_client()
    with app.app_context():
        example.db.engine.dispose()


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_order_commits_with_its_task_and_the_wait_returns_the_workers_result(
    client: FlaskClient, conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    worker = workers.start(
        database_url, "--poll-interval", "0.2", registry="examples.flask_app.tasks:tasks"
    )
    made = client.post("/orders", json=ORDER)
    assert made.status_code == 201, made.text
    order_id, task_id = made.json["id"], uuid.UUID(made.json["task_id"])
    stored = conn.execute(
        "SELECT email, item, quantity, confirmation_task FROM orders WHERE id = %s", (order_id,)
    ).fetchone()
    assert stored == ("ada@example.com", "teapot", 2, task_id)
    task = pgqueue.get_task(conn, task_id)
    assert (task.type, task.payload) == (
        "send_confirmation",
        {"order_id": order_id, "email": "ada@example.com"},
    )

    def confirmed() -> dict[str, Any] | None:
        answer = client.get(f"/orders/{order_id}/confirmation?wait=30")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json
        return body if body["status"] == "completed" else None  # still queued: ask again

    # The worker may still be starting on a busy machine: each ask waits up to 30 s.
    body = wait_until(confirmed, timeout=120, what="the confirmation", alive=[worker])
    assert body == {
        "order_id": order_id,
        "status": "completed",
        "result": {"order_id": order_id, "sent_to": "ada@example.com"},
    }
    assert pgqueue.get_task(conn, task_id).attempts == 1


def test_a_declined_payment_after_the_enqueue_leaves_neither_the_order_nor_its_task(
    client: FlaskClient, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueued: list[uuid.UUID] = []
    enqueue = send_confirmation.enqueue

    def recording(session: Any, *args: Any, **kwargs: Any) -> pgqueue.TaskHandle:
        handle = enqueue(session, *args, **kwargs)
        enqueued.append(handle.id)
        return handle

    monkeypatch.setattr(send_confirmation, "enqueue", recording)

    declined = client.post("/orders", json={**ORDER, "payment": "tok_chargeDeclined"})

    assert declined.status_code == 402
    assert "declined" in declined.json["error"]
    assert len(enqueued) == 1  # the task was enqueued in the request, then rolled back
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, enqueued[0])
    assert (count(conn, "orders"), count(conn, "pgqueue.tasks")) == (0, 0)

    assert client.post("/orders", json=ORDER).status_code == 201  # the next one commits
    assert (count(conn, "orders"), count(conn, "pgqueue.tasks")) == (1, 1)


def test_the_confirmation_of_a_queued_task_says_queued_without_waiting_and_after_a_wait(
    client: FlaskClient, conn: psycopg.Connection[Any]
) -> None:
    """No worker runs: the answer is the task as it stands, at once or after the wait."""
    order_id = client.post("/orders", json=ORDER).json["id"]

    now = client.get(f"/orders/{order_id}/confirmation")
    later = client.get(f"/orders/{order_id}/confirmation?wait=0.5")

    for answer in (now, later):
        assert answer.status_code == 200
        assert answer.json == {"order_id": order_id, "status": "queued", "result": None}
    assert client.get(f"/orders/{order_id}/confirmation?wait=31").status_code == 400
    assert client.get(f"/orders/{order_id + 1}/confirmation").status_code == 404
