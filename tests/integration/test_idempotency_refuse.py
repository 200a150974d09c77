"""Refusing a reused idempotency key that names a different task (``key_reuse="refuse"``).

By default a reused key returns the original task whatever was submitted (that stays
documented and tested here against each field). With ``refuse``, the same (type, queue,
payload) is the same request retried and gets the original back, while a reuse that differs
in any of them raises IdempotencyConflict naming the original and the differing fields, in
the library (sync, async, Client, bulk), the HTTP API (409) and the CLI (exit 1). The
comparison runs only after the insert found the key taken, so a successful insert costs what
it did; nothing is written on a refusal and the caller's transaction stays usable.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Generator
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main, snapshot
from psycopg import sql

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings
from pgqueue.models import KeyReuse
from pgqueue.queries import driver, submitting

KEY = "order-42:receipt"
ORIGINAL = {"type": "send_receipt", "queue": "default", "payload": {"order": 42, "to": "a@x"}}

# One field changed at a time, and all three at once.
DIFFERENT = {
    "type": ({**ORIGINAL, "type": "send_refund"}, ("type",)),
    "queue": ({**ORIGINAL, "queue": "emails"}, ("queue",)),
    "payload": ({**ORIGINAL, "payload": {"order": 43, "to": "a@x"}}, ("payload",)),
    "all": (
        {"type": "send_refund", "queue": "emails", "payload": {"order": 43}},
        ("type", "queue", "payload"),
    ),
}


def submit(conn: Any, fields: dict[str, Any], **options: Any) -> pgqueue.EnqueueResult:
    return pgqueue.enqueue(
        conn,
        fields["type"],
        fields["payload"],
        queue=fields["queue"],
        idempotency_key=KEY,
        **options,
    )


def count_tasks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.tasks").fetchone()
    assert row is not None
    return int(row[0])


# --- the default is unchanged ------------------------------------------------------------------


@pytest.mark.parametrize("changed", sorted(DIFFERENT))
def test_by_default_a_reuse_with_another_type_queue_or_payload_returns_the_original(conn, changed):
    original = submit(conn, ORIGINAL)
    other, _ = DIFFERENT[changed]

    for again in (submit(conn, other), submit(conn, other, key_reuse="return")):
        assert (again.created, again.id) == (False, original.id)
        assert again.task.type == "send_receipt"
        assert again.task.payload == ORIGINAL["payload"]
    assert count_tasks(conn) == 1


# --- refuse: the same request retried gets the original back -----------------------------------


def test_refuse_returns_the_original_for_the_same_type_queue_and_payload(conn):
    original = submit(conn, ORIGINAL, key_reuse="refuse")
    assert original.created

    again = submit(conn, ORIGINAL, key_reuse=KeyReuse.REFUSE)

    assert (again.created, again.id) == (False, original.id)
    assert count_tasks(conn) == 1


def test_refuse_compares_payloads_as_json_not_as_text(conn):
    original = pgqueue.enqueue(
        conn, "t", {"a": 1, "b": [1, 2], "c": {"x": 1.0, "y": None}}, idempotency_key=KEY
    )

    # Other key order, 1.0 for 1 and 1 for 1.0: the same JSON value.
    same = pgqueue.enqueue(
        conn,
        "t",
        {"c": {"y": None, "x": 1}, "b": [1, 2], "a": 1.0},
        idempotency_key=KEY,
        key_reuse="refuse",
    )
    assert (same.created, same.id) == (False, original.id)

    # Values Python's == takes for equal but JSON does not: true is not 1, and array order
    # counts.
    for payload in (
        {"a": True, "b": [1, 2], "c": {"x": 1.0, "y": None}},
        {"a": 1, "b": [2, 1], "c": {"x": 1.0, "y": None}},
        {"a": 1, "b": [1, 2], "c": {"x": 1.0}},
    ):
        with pytest.raises(pgqueue.IdempotencyConflict) as refused:
            pgqueue.enqueue(conn, "t", payload, idempotency_key=KEY, key_reuse="refuse")
        assert refused.value.differing_fields == ("payload",)
    assert count_tasks(conn) == 1


# --- refuse: a different reuse is an error naming the original ---------------------------------


@pytest.mark.parametrize("changed", sorted(DIFFERENT))
def test_refuse_raises_naming_the_original_and_each_differing_field(conn, changed):
    original = submit(conn, ORIGINAL)
    other, fields = DIFFERENT[changed]
    before = snapshot(conn)

    with pytest.raises(pgqueue.IdempotencyConflict) as refused:
        submit(conn, other, key_reuse="refuse")

    error = refused.value
    assert isinstance(error, pgqueue.PgQueueError)
    assert (error.task_id, error.idempotency_key) == (original.id, KEY)
    assert error.differing_fields == fields
    assert (error.original_type, error.original_queue) == ("send_receipt", "default")
    assert (error.index, error.original_index) == (None, None)
    message = str(error)
    assert KEY in message and str(original.id) in message
    assert f"differs from it in {', '.join(fields)};" in message
    assert "nothing was written" in message
    assert snapshot(conn) == before


def test_refuse_is_the_same_for_any_status_of_the_original(conn):
    original = submit(conn, ORIGINAL)
    [claimed] = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")
    pgqueue.complete(conn, claimed.lease, {"sent": True})
    other, _ = DIFFERENT["payload"]

    with pytest.raises(pgqueue.IdempotencyConflict) as refused:
        submit(conn, other, key_reuse="refuse")
    again = submit(conn, ORIGINAL, key_reuse="refuse")

    assert refused.value.task_id == original.id
    assert again.task.status is pgqueue.TaskStatus.COMPLETED
    assert again.task.result == {"sent": True}


def test_refuse_without_an_idempotency_key_changes_nothing(conn):
    first = pgqueue.enqueue(conn, "t", {"a": 1}, key_reuse="refuse")
    second = pgqueue.enqueue(conn, "t", {"a": 2}, key_reuse="refuse")
    assert first.created and second.created and first.id != second.id


@pytest.mark.parametrize("value", ["reject", "", None, True, 1])
def test_an_unknown_key_reuse_is_a_validation_error_before_any_write(conn, value):
    before = snapshot(conn)
    with pytest.raises(pgqueue.ValidationError) as single:
        pgqueue.enqueue(conn, "t", idempotency_key=KEY, key_reuse=value)
    with pytest.raises(pgqueue.ValidationError) as bulk:
        pgqueue.enqueue_many(conn, [{"type": "t"}], key_reuse=value)
    assert single.value.field == bulk.value.field == "key_reuse"
    assert "must be 'return' or 'refuse'" in str(single.value)
    assert snapshot(conn) == before


def test_key_reuse_is_accepted_in_any_case_as_priorities_are(conn):
    submit(conn, ORIGINAL)
    with pytest.raises(pgqueue.IdempotencyConflict):
        submit(conn, DIFFERENT["type"][0], key_reuse=" Refuse ")


# --- the fast path costs nothing more ----------------------------------------------------------


def recorded(op: driver.Op[Any], names: list[str]) -> Generator[Any, Any, Any]:
    """``op``, noting the name of each statement it runs."""
    query = next(op)
    try:
        while True:
            names.append(query.name)
            query = op.send((yield query))
    except StopIteration as stop:
        return stop.value


def test_refuse_runs_no_statement_more_than_return_does(conn):
    def statements(fields: dict[str, Any], key_reuse: KeyReuse, key: str = KEY) -> list[str]:
        spec = pgqueue.prepare(
            fields["type"], fields["payload"], queue=fields["queue"], idempotency_key=key
        )
        names: list[str] = []
        driver.run(conn, recorded(submitting.task_insert(spec, key_reuse=key_reuse), names))
        return names

    assert statements(ORIGINAL, KeyReuse.REFUSE) == ["task_insert"]  # a new key: one statement
    # A used key: the lookup that returned the original before compares it as well.
    assert statements(ORIGINAL, KeyReuse.RETURN) == ["task_insert", "task_get_by_keys"]
    assert statements(ORIGINAL, KeyReuse.REFUSE) == ["task_insert", "task_get_by_keys_compared"]

    def bulk(key_reuse: KeyReuse, keys: list[str]) -> list[str]:
        specs = [pgqueue.prepare("t", {"n": 1}, idempotency_key=k) for k in keys]
        names: list[str] = []
        op = submitting.task_insert_many(specs, key_reuse=key_reuse)
        driver.run(conn, recorded(op, names), atomic=True)
        return names

    assert bulk(KeyReuse.REFUSE, ["b1", "b2"]) == ["task_insert_many", "queue_notify"]
    assert bulk(KeyReuse.RETURN, ["b3", "b4"]) == ["task_insert_many", "queue_notify"]


# --- bulk ---------------------------------------------------------------------------------------


def test_bulk_refuse_returns_originals_for_same_items_and_creates_new_ones(conn):
    original = submit(conn, ORIGINAL)

    results = pgqueue.enqueue_many(
        conn,
        [
            {"type": "plain"},
            {**ORIGINAL, "payload": {"to": "a@x", "order": 42}, "idempotency_key": KEY},
            {"type": "fresh", "idempotency_key": "new-key"},
        ],
        key_reuse="refuse",
    )

    assert [r.created for r in results] == [True, False, True]
    assert results[1].id == original.id
    assert count_tasks(conn) == 3


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "in a transaction"])
def test_bulk_refuse_of_one_item_writes_none_of_the_batch(connect, autocommit):
    setup = connect()
    original = submit(setup, ORIGINAL)
    before = snapshot(setup)
    conn = connect(autocommit=autocommit)
    batch = [
        {"type": "plain", "payload": {"n": 1}},  # by COPY, before the keyed insert
        {"type": "fresh", "idempotency_key": "new-key"},  # inserted by the same statement
        {**DIFFERENT["queue"][0], "idempotency_key": KEY},
        {"type": "plain", "payload": {"n": 2}},
    ]

    with pytest.raises(pgqueue.IdempotencyConflict) as refused:
        pgqueue.enqueue_many(conn, batch, key_reuse="refuse")

    error = refused.value
    assert (error.task_id, error.differing_fields) == (original.id, ("queue",))
    assert (error.index, error.original_index) == (2, None)
    assert "item 2 of the batch" in str(error) and "none of the batch was written" in str(error)
    if not autocommit:
        # Nothing of the batch in the caller's own transaction either, which goes on.
        assert count_tasks(conn) == 1
        conn.commit()
    assert snapshot(setup) == before
    # The keys the refused batch held for a moment are free again.
    assert pgqueue.enqueue(setup, "fresh", idempotency_key="new-key").created


def test_bulk_two_items_with_one_key_the_first_wins(conn):
    same = {"type": "t", "payload": {"a": 1, "b": 2}, "idempotency_key": KEY}
    reordered = {"type": "t", "payload": {"b": 2, "a": 1}, "idempotency_key": KEY}

    for key_reuse in ("return", "refuse"):
        conn.execute("DELETE FROM pgqueue.tasks")
        first, second = pgqueue.enqueue_many(conn, [same, reordered], key_reuse=key_reuse)
        assert (first.created, second.created) == (True, False)
        assert second.id == first.id
        assert second.task.payload == {"a": 1, "b": 2}

    # By default the second gets the first whatever it submitted.
    conn.execute("DELETE FROM pgqueue.tasks")
    first, second = pgqueue.enqueue_many(conn, [same, {**same, "type": "other"}])
    assert (second.created, second.id, second.task.type) == (False, first.id, "t")


def test_bulk_refuse_of_a_second_item_differing_from_the_first_writes_nothing(conn):
    first = pgqueue.prepare("t", {"a": 1}, idempotency_key=KEY)
    batch = [{"type": "plain"}, first, {"type": "t", "payload": {"a": 2}, "idempotency_key": KEY}]

    with pytest.raises(pgqueue.IdempotencyConflict) as refused:
        pgqueue.enqueue_many(conn, batch, key_reuse="refuse")

    error = refused.value
    assert (error.index, error.original_index) == (2, 1)
    assert error.task_id == first.id  # the item's prepared id; it was not written
    assert error.differing_fields == ("payload",)
    assert "held by item 1 of this batch" in str(error)
    assert count_tasks(conn) == 0


def test_key_reuse_is_an_option_of_the_batch_not_of_an_item(conn):
    with pytest.raises(pgqueue.ValidationError) as refused:
        pgqueue.enqueue_many(conn, [{"type": "t", "key_reuse": "refuse"}])
    assert refused.value.field == "key_reuse"
    assert "enqueue_many(..., key_reuse=...)" in str(refused.value)
    assert count_tasks(conn) == 0


# --- the caller's transaction -------------------------------------------------------------------


def test_a_refusal_leaves_the_callers_transaction_usable(conn, connect):
    original = submit(conn, ORIGINAL)
    tx = connect(autocommit=False)
    tx.execute("CREATE TEMPORARY TABLE orders (id int)")
    tx.execute("INSERT INTO orders VALUES (1)")
    mine = pgqueue.enqueue(tx, "before", {})

    with pytest.raises(pgqueue.IdempotencyConflict):
        submit(tx, DIFFERENT["payload"][0], key_reuse="refuse")
    with pytest.raises(pgqueue.IdempotencyConflict):
        pgqueue.enqueue_many(
            tx,
            [{"type": "x"}, {**DIFFERENT["type"][0], "idempotency_key": KEY}],
            key_reuse="refuse",
        )

    # No SQL error was raised: the transaction is not aborted and what it did stands.
    assert tx.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    assert tx.execute("SELECT id FROM orders").fetchall() == [(1,)]
    after = pgqueue.enqueue(tx, "after", {})
    tx.commit()
    types = {t.type for t in pgqueue.list_tasks(conn)}
    assert types == {"send_receipt", "before", "after"}
    assert {mine.id, after.id, original.id} == {t.id for t in pgqueue.list_tasks(conn)}


def test_refuse_waits_for_a_concurrent_holder_and_compares_with_what_it_committed(conn, connect):
    holder = connect(autocommit=False)
    original = submit(holder, ORIGINAL)  # not committed yet: the key is in flight
    outcome: dict[str, Any] = {}

    def contender() -> None:
        try:
            outcome["result"] = submit(connect(), DIFFERENT["payload"][0], key_reuse="refuse")
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=contender)
    thread.start()
    deadline = time.monotonic() + 30
    while not conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = "
        "current_database()"
    ).fetchall():
        assert time.monotonic() < deadline, "the contender never waited for the key's holder"
        assert thread.is_alive(), outcome
        time.sleep(0.01)
    holder.commit()
    thread.join(30)

    assert isinstance(outcome.get("error"), pgqueue.IdempotencyConflict), outcome
    assert outcome["error"].task_id == original.id
    assert count_tasks(conn) == 1


def test_a_refused_bulk_enqueue_is_undone_with_the_application_roles_privileges(
    conn, database_url, server_url
):
    """The undo is a DELETE of the batch's own rows: ``pgqueue grant`` must allow it."""
    role = f"pgqueue_app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        assert run_main(database_url, "grant", role).code == 0
        original = submit(conn, ORIGINAL)
        app_url = psycopg.conninfo.make_conninfo(database_url, user=role)
        with psycopg.connect(app_url) as app:
            batch = [{"type": "plain"}, {**DIFFERENT["type"][0], "idempotency_key": KEY}]
            with pytest.raises(pgqueue.IdempotencyConflict) as refused:
                pgqueue.enqueue_many(app, batch, key_reuse="refuse")
            assert app.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
            assert count_tasks(app) == 1
        assert refused.value.task_id == original.id
    finally:
        with psycopg.connect(database_url, autocommit=True) as owner:
            owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# --- the async twins and the Client -------------------------------------------------------------


def test_async_twins_refuse_alike(conn, database_url):
    original = submit(conn, ORIGINAL)
    other = DIFFERENT["payload"][0]

    async def main() -> tuple[Any, ...]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            same = await aio.enqueue(
                a,
                ORIGINAL["type"],
                ORIGINAL["payload"],
                idempotency_key=KEY,
                key_reuse="refuse",
            )
            try:
                await aio.enqueue(
                    a, other["type"], other["payload"], idempotency_key=KEY, key_reuse="refuse"
                )
            except pgqueue.IdempotencyConflict as exc:
                single = exc
            try:
                await aio.enqueue_many(
                    a, [{"type": "x"}, {**other, "idempotency_key": KEY}], key_reuse="refuse"
                )
            except pgqueue.IdempotencyConflict as exc:
                bulk = exc
            return same, single, bulk

    same, single, bulk = asyncio.run(main())
    assert (same.created, same.id) == (False, original.id)
    assert (single.task_id, single.differing_fields) == (original.id, ("payload",))
    assert (bulk.task_id, bulk.index) == (original.id, 1)
    assert count_tasks(conn) == 1


def test_client_refuses_alike(conn, database_url):
    original = submit(conn, ORIGINAL)
    with pgqueue.Client(database_url) as client:
        again = client.enqueue(
            "send_receipt", ORIGINAL["payload"], idempotency_key=KEY, key_reuse="refuse"
        )
        with pytest.raises(pgqueue.IdempotencyConflict) as refused:
            client.enqueue("send_refund", idempotency_key=KEY, key_reuse="refuse")
    assert again.id == original.id
    assert refused.value.differing_fields == ("type", "payload")


# --- HTTP ---------------------------------------------------------------------------------------


@pytest.fixture
def api(database_url: str) -> Generator[Api, None, None]:
    api = Api(ApiSettings(database_url=database_url))
    yield api
    api.close()


def post(api: Api, body: dict[str, Any], **kwargs: Any) -> Any:
    return api.request("POST", "/api/v1/tasks", json=body, **kwargs)


def test_http_refuse_answers_409_with_the_original_and_the_differing_fields(conn, api):
    original = submit(conn, ORIGINAL)
    before = snapshot(conn)
    other = DIFFERENT["all"][0]

    refused = post(api, {**other, "idempotency_key": KEY, "key_reuse": "refuse"})

    assert refused.status_code == 409
    body = refused.json()
    assert body.pop("message").startswith(f"idempotency key {KEY!r} is already held by task")
    assert body == {
        "error": "idempotency_conflict",
        "idempotency_key": KEY,
        "task_id": str(original.id),
        "differing_fields": ["type", "queue", "payload"],
    }
    # The key from the header is refused alike.
    header = post(api, {**other, "key_reuse": "refuse"}, headers={"Idempotency-Key": KEY}).json()
    assert (header["task_id"], header["differing_fields"]) == (
        str(original.id),
        ["type", "queue", "payload"],
    )
    assert snapshot(conn) == before
    assert 'outcome="refused"' in api.request("GET", "/metrics").text


def test_http_same_request_with_refuse_and_any_reuse_by_default_answer_200(conn, api):
    original = submit(conn, ORIGINAL)
    reordered = {"to": "a@x", "order": 42}

    same = post(
        api, {**ORIGINAL, "payload": reordered, "idempotency_key": KEY, "key_reuse": "refuse"}
    )
    default = post(api, {**DIFFERENT["all"][0], "idempotency_key": KEY})

    for response in (same, default):
        assert response.status_code == 200
        assert response.headers["Idempotent-Replayed"] == "true"
        assert response.json()["task_id"] == str(original.id)
    assert (
        post(api, {"type": "new", "idempotency_key": "k2", "key_reuse": "refuse"}).status_code
        == 202
    )


def test_http_an_unknown_key_reuse_is_422_naming_the_field(conn, api):
    response = post(api, {"type": "t", "idempotency_key": KEY, "key_reuse": "reject"})
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["key_reuse"]
    assert count_tasks(conn) == 0


def test_openapi_documents_key_reuse_and_the_409(api):
    document = api.request("GET", "/openapi.json").json()
    submit_op = document["paths"]["/api/v1/tasks"]["post"]
    assert submit_op["responses"]["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/IdempotencyConflictOut"
    }
    field = document["components"]["schemas"]["SubmitTask"]["properties"]["key_reuse"]
    assert field["enum"] == ["return", "refuse"] and "409" in field["description"]


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_refuse_exits_1_with_one_line_naming_the_key_and_the_original(conn, database_url):
    original = submit(conn, ORIGINAL)
    args = ["enqueue", "send_refund", "--idempotency-key", KEY, "--key-reuse", "refuse"]

    human = run_main(database_url, *args)
    machine = run_main(database_url, "--json", *args)

    assert (human.code, human.stdout) == (1, "")
    assert human.line.startswith(f"error: idempotency key {KEY!r} is already held by task")
    assert str(original.id) in human.line and "type, payload" in human.line
    assert machine.code == 1
    body = json.loads(machine.stderr)
    assert body["error"] == "idempotency_conflict"
    assert (body["task_id"], body["idempotency_key"]) == (str(original.id), KEY)
    assert (body["differing_fields"], body["exit_code"]) == (["type", "payload"], 1)
    assert count_tasks(conn) == 1


def test_cli_refuse_returns_the_original_for_the_same_request_and_default_for_any(
    conn, database_url
):
    original = submit(conn, ORIGINAL)
    payload = json.dumps({"to": "a@x", "order": 42})
    same = run_main(
        database_url, "--json", "enqueue", "send_receipt", "--payload", payload,
        "--idempotency-key", KEY, "--key-reuse", "refuse",
    )  # fmt: skip
    default = run_main(database_url, "--json", "enqueue", "other", "--idempotency-key", KEY)

    for result in (same, default):
        assert result.code == 0, result.stderr
        out = json.loads(result.stdout)
        assert (out["task_id"], out["created"]) == (str(original.id), False)


def test_cli_an_unknown_key_reuse_is_a_usage_error(conn, database_url):
    result = run_main(database_url, "enqueue", "t", "--key-reuse", "reject")
    assert result.code == 2
    assert "--key-reuse" in result.line and "must be 'return' or 'refuse'" in result.line
    assert count_tasks(conn) == 0
