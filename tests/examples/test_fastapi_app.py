"""examples/fastapi_app against real PostgreSQL: an order and its task commit or roll back
together through the request's AsyncSession, a real worker process completes the task and
the app's wait returns its result, and pgqueue's API and dashboard under /queue answer only
to the app's own login."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from acceptance.test_worker_processes import Workers, wait_until
from fastapi.testclient import TestClient

import pgqueue
from examples.fastapi_app import app as example
from examples.fastapi_app.tasks import send_confirmation

PASSWORD = "s3cret"
STAFF = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
ORDER = {"email": "ada@example.com", "item": "teapot", "quantity": 2, "payment": "tok_visa"}


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    with TestClient(example.create_app(database_url, PASSWORD)) as client:
        yield client


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_order_commits_with_its_task_and_the_wait_returns_the_workers_result(
    client: TestClient, conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    worker = workers.start(
        database_url, "--poll-interval", "0.2", registry="examples.fastapi_app.tasks:tasks"
    )
    made = client.post("/orders", json=ORDER)
    assert made.status_code == 201, made.text
    order_id, task_id = made.json()["id"], uuid.UUID(made.json()["task_id"])
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
        answer = client.get(f"/orders/{order_id}/confirmation", params={"wait": 30})
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body if body["status"] == "completed" else None  # still queued: ask again

    # The worker may still be starting on a busy machine: each ask waits up to 30 s.
    body = wait_until(confirmed, timeout=120, what="the confirmation", alive=[worker])
    assert body == {
        "order_id": order_id,
        "status": "completed",
        "result": {"order_id": order_id, "sent_to": "ada@example.com"},
    }
    assert pgqueue.get_task(conn, task_id).attempts == 1

    # The mounted API's own wait says the same, under the prefix and the app's login.
    via_api = client.get(f"/queue/api/v1/tasks/{task_id}", params={"wait": 5}, headers=STAFF)
    assert via_api.status_code == 200
    assert via_api.json()["status"] == "completed"
    assert via_api.json()["result"] == body["result"]


def test_a_declined_payment_after_the_enqueue_leaves_neither_the_order_nor_its_task(
    client: TestClient, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueued: list[uuid.UUID] = []
    aenqueue = send_confirmation.aenqueue

    async def recording(session: Any, *args: Any, **kwargs: Any) -> pgqueue.TaskHandle:
        handle = await aenqueue(session, *args, **kwargs)
        enqueued.append(handle.id)
        return handle

    monkeypatch.setattr(send_confirmation, "aenqueue", recording)

    declined = client.post("/orders", json={**ORDER, "payment": "tok_chargeDeclined"})

    assert declined.status_code == 402
    assert "declined" in declined.json()["detail"]
    assert len(enqueued) == 1  # the task was enqueued in the request, then rolled back
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, enqueued[0])
    assert (count(conn, "orders"), count(conn, "pgqueue.tasks")) == (0, 0)

    assert client.post("/orders", json=ORDER).status_code == 201  # the next one commits
    assert (count(conn, "orders"), count(conn, "pgqueue.tasks")) == (1, 1)


def test_the_queue_api_and_dashboard_under_the_prefix_want_the_apps_login(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:guess").decode()}
    for headers in ({}, wrong, {"Authorization": "Bearer " + PASSWORD}):
        for path in ("/queue/api/v1/stats", "/queue/dashboard/", "/queue/openapi.json"):
            refused = client.get(path, headers=headers)
            assert refused.status_code == 401, (path, headers)
            assert refused.headers["www-authenticate"] == 'Basic realm="queue"'
        submit = client.post("/queue/api/v1/tasks", json={"type": "t"}, headers=headers)
        assert submit.status_code == 401
    assert count(conn, "pgqueue.tasks") == 0

    made = client.post(
        "/queue/api/v1/tasks",
        json={"type": "send_confirmation", "payload": {"order_id": 7, "email": "b@example.com"}},
        headers=STAFF,
    )
    assert made.status_code == 202, made.text
    location = made.headers["location"]
    assert location == f"/queue/api/v1/tasks/{made.json()['task_id']}"
    assert client.get(location, headers=STAFF).json()["payload"]["order_id"] == 7
    assert client.get("/queue/api/v1/stats", headers=STAFF).status_code == 200
    page = client.get("/queue/dashboard/", headers=STAFF)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script src="app.js" defer>' in page.text
    assert client.get("/queue/dashboard/app.js", headers=STAFF).status_code == 200
    # The app's own routes are not behind the queue's login.
    assert client.get("/orders/1/confirmation").status_code == 404
