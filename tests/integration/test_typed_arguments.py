"""Function task arguments that are not plain JSON (datetime, date, time, timedelta, Decimal,
UUID, Enum, dataclass, pydantic model): stored as readable JSON, decoded before the call by a
real worker, refused at enqueue and at submit by type name when they do not fit, and a stored
payload that cannot be decoded is dead-lettered at its first attempt."""

from __future__ import annotations

import dataclasses
import enum
import re
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from boundaries import Api
from helpers import run_worker_until

import pgqueue
from pgqueue.api import ApiSettings
from pgqueue.queries import driver, task_types
from pgqueue.registry import TaskRegistry


class Plan(enum.Enum):
    FREE = "free"
    PRO = "pro"


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal
    shipped_at: datetime | None = None


class Address(pydantic.BaseModel):
    city: str
    since: date


SEEN: dict[str, Any] = {}


def finished(conn: Any, task_id: uuid.UUID) -> bool:
    status = pgqueue.get_task(conn, task_id).status
    conn.commit()
    return status in ("completed", "failed")


def registry() -> tuple[TaskRegistry, Any]:
    tasks = TaskRegistry()

    @tasks.task(name="invoice")
    def invoice(
        due: datetime,
        day: date,
        at: time,
        grace: timedelta,
        amount: Decimal,
        customer: uuid.UUID,
        plan: Plan,
        lines: list[Line],
        address: Address,
        reminders: dict[str, date] | None = None,
        note: date | None = None,
    ) -> str:
        SEEN["call"] = {
            "due": due,
            "day": day,
            "at": at,
            "grace": grace,
            "amount": amount,
            "customer": customer,
            "plan": plan,
            "lines": lines,
            "address": address,
            "reminders": reminders,
            "note": note,
        }
        return "ok"

    return tasks, invoice


DUE = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
CUSTOMER = uuid.UUID("6f1c2a52-8a7e-4c3b-9d0f-1e2d3c4b5a69")


def arguments() -> dict[str, Any]:
    return {
        "due": DUE,
        "day": date(2026, 3, 1),
        "at": time(9, 30),
        "grace": timedelta(hours=36),
        "amount": Decimal("1234567890.123456789"),
        "customer": CUSTOMER,
        "plan": Plan.PRO,
        "lines": [Line("A-1", Decimal("0.10"), DUE)],
        "address": Address(city="Lyon", since=date(2020, 1, 2)),
        "reminders": {"first": date(2026, 3, 2)},
    }


def test_typed_arguments_are_stored_as_readable_json_and_decoded_by_a_real_worker(
    conn, database_url
):
    tasks, invoice = registry()
    SEEN.clear()
    handle = invoice.enqueue(conn, **arguments())
    conn.commit()

    stored = conn.execute(
        "SELECT payload::text FROM pgqueue.tasks WHERE id = %s", (handle.id,)
    ).fetchone()
    assert stored is not None
    text = stored[0]
    assert '"due": "2026-03-04T05:06:07.891011+00:00"' in text
    assert '"amount": "1234567890.123456789"' in text  # a string: no digit lost
    assert '"customer": "6f1c2a52-8a7e-4c3b-9d0f-1e2d3c4b5a69"' in text
    assert '"plan": "pro"' in text
    assert '"grace": 129600' in text
    assert '"address": {"city": "Lyon", "since": "2020-01-02"}' in text
    conn.commit()

    run_worker_until(database_url, tasks, lambda: finished(conn, handle.id))

    assert pgqueue.get_task(conn, handle.id).status == "completed"
    assert SEEN["call"] == {**arguments(), "note": None}
    assert type(SEEN["call"]["amount"]) is Decimal
    assert SEEN["call"]["lines"][0].shipped_at == DUE


def test_a_value_that_does_not_fit_its_annotation_is_refused_at_enqueue_naming_it(conn):
    _, invoice = registry()
    cases = [
        ({"due": datetime(2026, 3, 4, 5, 6)}, "argument 'due' has no UTC offset"),
        ({"day": DUE}, "argument 'day' must be a date, not a datetime"),
        ({"plan": "gold"}, "argument 'plan' must be one of Plan's values ('free', 'pro')"),
        ({"amount": "12,50"}, "argument 'amount' must be a decimal number"),
        ({"customer": "not-a-uuid"}, "argument 'customer' must be a UUID"),
        ({"lines": [{"sku": "A"}]}, "argument 'lines'[0] lacks Line's required field 'price'"),
        ({"address": {"city": "Lyon"}}, "argument 'address' is not a valid Address"),
        ({"reminders": {"x": "soon"}}, "argument 'reminders'['x'] must be a date"),
    ]
    for change, message in cases:
        with pytest.raises(pgqueue.InvalidArgument, match=re.escape(message)) as caught:
            invoice.enqueue(conn, **{**arguments(), **change})
        assert caught.value.argument == next(iter(change))
    count = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert count is not None and count[0] == 0


def test_a_submit_by_type_name_is_checked_against_the_recorded_types(conn):
    tasks, invoice = registry()
    driver.run(conn, task_types.task_types_declare("w1", tasks.declarations()))
    good = invoice.arguments(**arguments())

    pgqueue.check_arguments(conn, "invoice", good)  # what the CLI and the HTTP API call
    for name, bad, message in [
        ("due", "2026-02-30T00:00:00+00:00", "argument 'due' must be a date-time"),
        ("due", "2026-03-04T05:06:07", "argument 'due' has no UTC offset"),
        ("plan", "gold", "argument 'plan' must be one of Plan's values"),
        ("lines", [{"sku": "A", "price": "x"}], "argument 'lines'[0].price must be a decimal"),
    ]:
        with pytest.raises(pgqueue.InvalidArgument, match=re.escape(message)):
            pgqueue.check_arguments(conn, "invoice", {**good, name: bad})


def test_a_stored_argument_that_cannot_be_decoded_dead_letters_at_its_first_attempt(
    conn, database_url
):
    tasks, invoice = registry()
    payload = {**invoice.arguments(**arguments()), "day": "2026-02-30"}
    # By type name, unchecked (pgqueue.enqueue does not read the recorded parameters).
    task = pgqueue.enqueue(conn, "invoice", payload, max_attempts=5).task
    conn.commit()

    run_worker_until(database_url, tasks, lambda: finished(conn, task.id))

    dead = pgqueue.get_task(conn, task.id)
    assert (dead.status, dead.attempts) == ("failed", 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith(
        "UndecodableArgument: payload: argument 'day' must be a date (ISO 8601, such as "
        "2026-01-02), not '2026-02-30'"
    )


def test_the_http_api_refuses_a_malformed_date_at_submit_and_stores_a_good_one(conn, database_url):
    tasks, invoice = registry()
    driver.run(conn, task_types.task_types_declare("w1", tasks.declarations()))
    conn.commit()
    good = invoice.arguments(**arguments())
    api = Api(ApiSettings(database_url=database_url))
    try:
        bad = api.request(
            "POST",
            "/api/v1/tasks",
            json={"type": "invoice", "payload": {**good, "day": "2026-02-30"}},
        )
        assert bad.status_code == 422, bad.text
        assert "argument 'day' must be a date (ISO 8601, such as 2026-01-02)" in bad.text
        count = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
        assert count is not None and count[0] == 0
        conn.commit()

        accepted = api.request("POST", "/api/v1/tasks", json={"type": "invoice", "payload": good})
        assert accepted.status_code == 202, accepted.text
    finally:
        api.close()
    task_id = uuid.UUID(accepted.json()["task_id"])
    SEEN.clear()
    run_worker_until(database_url, tasks, lambda: finished(conn, task_id))
    assert pgqueue.get_task(conn, task_id).status == "completed"
    assert SEEN["call"]["day"] == date(2026, 3, 1)


PROCESS_TASKS = TaskRegistry()


@PROCESS_TASKS.task(name="typed_in_a_child", executor="process")
def typed_in_a_child(day: date, amount: Decimal) -> str:
    assert type(day) is date and type(amount) is Decimal
    return f"{day:%d/%m/%Y} {amount + Decimal('0.01')}"


def test_a_child_process_decodes_the_arguments_and_dead_letters_one_that_does_not_decode(
    conn, database_url
):
    good = typed_in_a_child.enqueue(conn, date(2026, 3, 1), Decimal("9.99")).id
    bad = pgqueue.enqueue(
        conn, "typed_in_a_child", {"day": "yesterday", "amount": "1"}, max_attempts=5
    ).task.id
    conn.commit()

    run_worker_until(
        database_url,
        PROCESS_TASKS,
        lambda: finished(conn, good) and finished(conn, bad),
    )

    assert pgqueue.get_task(conn, good).result == "01/03/2026 10.00"
    dead = pgqueue.get_task(conn, bad)
    assert (dead.status, dead.attempts) == ("failed", 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith("UndecodableArgument: payload: argument 'day' must be a date")


def test_a_workflow_step_gets_its_parents_result_and_its_own_arguments_decoded(conn, database_url):
    tasks = TaskRegistry()

    @tasks.task(name="price")
    def price(sku: str) -> str:
        return str(Decimal("19.99"))

    @tasks.task(name="bill")
    def bill(total: Decimal, due: date) -> str:
        assert type(total) is Decimal and type(due) is date
        return f"{total * 2} by {due:%d %b}"

    handle = pgqueue.chain(price.s("A-1"), bill.s(due=date(2026, 4, 1))).enqueue(conn)
    conn.commit()
    last = handle.tasks[-1].id

    run_worker_until(database_url, tasks, lambda: finished(conn, last))

    assert pgqueue.get_task(conn, last).result == "39.98 by 01 Apr"
