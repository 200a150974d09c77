"""Limits per task type or queue: how many run at once, how many start per window.

A limit is a row in ``pgqueue.limits`` and every claim obeys it, so these tests hold claims
from several sessions and threads to it, with the clock controlled where windows matter.
Worker processes obeying one limit together are in tests/acceptance/test_worker_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from keyed_tasks import add_keyed

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def claim(conn: psycopg.Connection[Any], limit: int = 100, now: datetime | None = None, **kw):
    queues = kw.pop("queues", ["default"])
    return pgqueue.claim(conn, queues, limit=limit, worker_id="test", now=now, **kw)


def types(tasks: list[pgqueue.ClaimedTask]) -> list[str]:
    return [t.type for t in tasks]


def running(conn: psycopg.Connection[Any], type_: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE status = 'running' AND type = %s", (type_,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue(conn: psycopg.Connection[Any], type_: str, n: int, **kw: Any) -> list[Any]:
    return [pgqueue.enqueue(conn, type_, {"i": i}, **kw).id for i in range(n)]


# --- max_running ------------------------------------------------------------------------------


def test_a_type_limit_caps_running_tasks_of_that_type_across_sessions(conn, connect):
    enqueue(conn, "email", 10)
    pgqueue.set_limit(conn, type="email", max_running=3)

    first = claim(conn)
    second = claim(connect())

    assert types(first) == ["email"] * 3 and second == []
    pgqueue.complete(conn, first[0].lease)
    assert types(claim(connect())) == ["email"], "a finished task frees its slot"
    assert running(conn, "email") == 3


def test_other_types_are_claimed_in_order_past_a_full_limited_type(conn):
    emails = enqueue(conn, "email", 5)
    reports = enqueue(conn, "report", 5)
    pgqueue.set_limit(conn, type="email", max_running=1)

    got = claim(conn, limit=100)

    assert [t.id for t in got if t.type == "report"] == reports
    assert [t.id for t in got if t.type == "email"] == emails[:1], "first in, first out"


def test_limited_tasks_are_claimed_even_when_ordinary_work_fills_every_batch(conn):
    enqueue(conn, "report", 20, priority="low")
    (email,) = enqueue(conn, "email", 1, priority="low")
    pgqueue.set_limit(conn, type="email", max_running=5)

    got = claim(conn, limit=5)

    assert email in {t.id for t in got}
    assert len(got) == 5


def test_a_queue_limit_caps_the_queue_whatever_the_types(conn):
    enqueue(conn, "a", 4, queue="payments")
    enqueue(conn, "b", 4, queue="payments")
    enqueue(conn, "c", 4, queue="other")
    pgqueue.set_limit(conn, queue="payments", max_running=3)

    got = claim(conn, queues=["payments", "other"])

    assert sum(t.queue == "payments" for t in got) == 3
    assert sum(t.queue == "other" for t in got) == 4


def test_a_task_under_a_type_and_a_queue_limit_obeys_both(conn):
    enqueue(conn, "charge", 6, queue="payments")
    enqueue(conn, "refund", 6, queue="payments")
    pgqueue.set_limit(conn, queue="payments", max_running=4)
    pgqueue.set_limit(conn, type="charge", max_running=1)

    got = claim(conn, queues=["payments"])

    assert sorted(types(got)) == ["charge", "refund", "refund", "refund"]


def test_max_running_zero_holds_a_type_and_clearing_the_limit_releases_it(conn):
    ids = enqueue(conn, "email", 3)
    pgqueue.set_limit(conn, type="email", max_running=0)
    assert claim(conn) == []

    assert pgqueue.clear_limit(conn, type="email") is True
    assert pgqueue.clear_limit(conn, type="email") is False
    assert [t.id for t in claim(conn)] == ids


def test_expired_leases_count_against_the_limit_until_swept(conn):
    enqueue(conn, "email", 2)
    pgqueue.set_limit(conn, type="email", max_running=1)
    (held,) = pgqueue.claim(conn, ["default"], limit=5, worker_id="dead", lease_seconds=1, now=T0)

    assert claim(conn, now=T0 + timedelta(seconds=5)) == []
    pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=5))
    again = claim(conn, now=T0 + timedelta(seconds=60))
    assert len(again) == 1 and running(conn, "email") == 1, held.id


def test_a_paused_queue_stays_paused_for_limited_tasks(conn):
    enqueue(conn, "email", 2, queue="mail")
    pgqueue.set_limit(conn, type="email", max_running=5)
    pgqueue.pause_queue(conn, "mail")

    assert claim(conn, queues=["mail"]) == []
    pgqueue.resume_queue(conn, "mail")
    assert len(claim(conn, queues=["mail"])) == 2


def test_claimers_whose_transactions_overlap_never_exceed_a_type_limit_together(conn, database_url):
    """Six claimers in threads, each serving a queue of its own, one type limited across all
    of them; each claims in its own transaction, and none commits until all have claimed. So
    each one's statement counts the running tasks before the others' claims are visible and
    picks other rows than they do (its own queue's): the limit holds only because one claimer
    at a time may claim limited tasks (the limits lock). Claimers of one queue would pick the
    same first rows and skip each other's, and so prove nothing about the lock. Five rounds,
    the limited slots freed between them; the other claimers take ordinary work meanwhile
    instead of waiting."""
    claimers, rounds, batch = 6, 5, 4
    queues = [f"q{n}" for n in range(claimers)]
    for queue in queues:
        enqueue(conn, "email", 3 * rounds, queue=queue)
        enqueue(conn, "report", batch * rounds, queue=queue)
    pgqueue.set_limit(conn, type="email", max_running=3)
    # The test's thread takes part in each step too; a timeout turns a stuck thread into a
    # BrokenBarrierError instead of a hang.
    all_claimed = threading.Barrier(claimers + 1, timeout=60)
    all_committed = threading.Barrier(claimers + 1, timeout=60)
    checked = threading.Barrier(claimers + 1, timeout=60)
    steps = (all_claimed, all_committed, checked)
    got: list[list[list[pgqueue.ClaimedTask]]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as mine:
                for round_ in range(rounds):
                    with mine.transaction():
                        mine_now = pgqueue.claim(mine, [queues[n]], limit=batch, worker_id=f"t{n}")
                        with lock:
                            got[round_].append(mine_now)
                        all_claimed.wait()  # every claim made, none committed
                    all_committed.wait()
                    checked.wait()  # the test counted and freed the slots
        except threading.BrokenBarrierError:
            pass  # the test's thread gave up: it raises its own error
        except BaseException as exc:
            errors.append(exc)
            for barrier in steps:
                barrier.abort()

    threads = [threading.Thread(target=claimer, args=(n,), daemon=True) for n in range(claimers)]
    for t in threads:
        t.start()
    try:
        for round_ in range(rounds):
            all_claimed.wait()
            all_committed.wait()
            emails = [t for batch_ in got[round_] for t in batch_ if t.type == "email"]
            assert (len(emails), running(conn, "email")) == (3, 3), (
                f"round {round_}: (claimed, running) email tasks, max_running 3"
            )
            assert [len(b) for b in got[round_]] == [batch] * claimers, (
                f"round {round_}: every claimer fills its batch, with ordinary work if not limited"
            )
            for task in emails:
                pgqueue.complete(conn, task.lease)
            checked.wait()
    except threading.BrokenBarrierError:
        raise errors[0] if errors else AssertionError("a claimer got stuck") from None
    except BaseException:
        for barrier in steps:
            barrier.abort()  # the claimers stop at their next step
        raise
    finally:
        for t in threads:
            t.join(60)


def test_a_claim_in_an_open_transaction_holds_limited_claims_until_it_commits(conn, connect):
    enqueue(conn, "email", 4)
    enqueue(conn, "report", 2)
    pgqueue.set_limit(conn, type="email", max_running=2)
    tx = connect(autocommit=False)

    assert types(claim(tx, limit=1)) == ["email"]
    other = claim(conn)
    assert types(other) == ["report", "report"], "ordinary claims go on; limited ones wait"
    tx.commit()
    assert types(claim(conn)) == ["email"]


# --- rate --------------------------------------------------------------------------------------


def test_a_rate_limit_allows_n_starts_in_any_window_of_the_period(conn):
    enqueue(conn, "sms", 20)
    pgqueue.set_limit(conn, type="sms", rate=3, per=60)

    assert len(claim(conn, now=T0)) == 3
    assert claim(conn, now=T0 + timedelta(seconds=59)) == [], "still within the window"
    assert len(claim(conn, limit=2, now=T0 + timedelta(seconds=61))) == 2
    # A sliding window: at +90 the starts at +61 still count, so only one more.
    assert len(claim(conn, now=T0 + timedelta(seconds=90))) == 1
    assert claim(conn, now=T0 + timedelta(seconds=120)) == []
    # At +122 the window is (+62, +122]: the start at +90 is in it, those at +61 are not.
    assert len(claim(conn, now=T0 + timedelta(seconds=122))) == 2


def test_rate_and_max_running_together_take_the_stricter(conn):
    ids = enqueue(conn, "sms", 10)
    pgqueue.set_limit(conn, type="sms", max_running=1, rate=5, per=60)

    (first,) = claim(conn, now=T0)
    pgqueue.complete(conn, first.lease, now=T0)
    for i in range(1, 6):
        got = claim(conn, now=T0 + timedelta(seconds=i))
        if i < 5:
            assert [t.id for t in got] == [ids[i]]
            pgqueue.complete(conn, got[0].lease, now=T0 + timedelta(seconds=i))
        else:
            assert got == [], "five starts in the window"
    limit = pgqueue.list_limits(conn, now=T0 + timedelta(seconds=5))[0]
    assert (limit.running, limit.recent_starts) == (0, 5)


def test_the_starts_log_is_bounded_by_the_rate(conn):
    enqueue(conn, "sms", 50)
    pgqueue.set_limit(conn, type="sms", rate=4, per=1)
    for second in range(12):
        claim(conn, now=T0 + timedelta(seconds=second))

    row = conn.execute(
        "SELECT cardinality(recent_starts) FROM pgqueue.limits WHERE name = 'sms'"
    ).fetchone()
    assert row is not None and row[0] <= 8  # this second's and the spare second's
    assert running(conn, "sms") == 48


# --- the interfaces ------------------------------------------------------------------------------


def test_list_limits_reports_use_and_set_limit_replaces_the_whole_limit(conn):
    enqueue(conn, "email", 3)
    pgqueue.set_limit(conn, type="email", max_running=2, rate=10, per=60)
    claim(conn, now=T0)

    (limit,) = pgqueue.list_limits(conn, now=T0)
    assert (limit.kind, limit.name, limit.max_running) == (pgqueue.LimitKind.TYPE, "email", 2)
    assert (limit.rate_limit, limit.rate_period, limit.running, limit.recent_starts) == (
        10,
        60.0,
        2,
        2,
    )
    replaced = pgqueue.set_limit(conn, type="email", max_running=5)
    assert (replaced.rate_limit, replaced.rate_period) == (None, None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_running": 1}, "type"),
        ({"type": "a", "queue": "b", "max_running": 1}, "type"),
        ({"type": "a"}, "max_running"),
        ({"type": "a", "max_running": -1}, "max_running"),
        ({"type": "a", "max_running": True}, "max_running"),
        ({"type": "a", "max_running": 2.0}, "max_running"),
        ({"type": "a", "rate": 10_001}, "rate"),
        ({"type": "a", "rate": 5, "per": 0}, "per"),
        ({"type": "a", "rate": 5, "per": float("nan")}, "per"),
        ({"type": "", "max_running": 1}, "type"),
        ({"queue": "x" * 201, "max_running": 1}, "queue"),
        ({"type": "a", "per_key_max_running": -1}, "per_key_max_running"),
        ({"type": "a", "per_key_max_running": 2.0}, "per_key_max_running"),
        ({"type": "a", "per_key_max_running": "2"}, "per_key_max_running"),
        ({"type": "a", "per_key_max_running": False}, "per_key_max_running"),
        ({"type": "a", "per_key_max_running": 1_000_001}, "per_key_max_running"),
        ({"type": "a", "per_key_max_running": 10**30}, "per_key_max_running"),
        ({"queue": "a", "max_running": 5, "per_key_max_running": -2}, "per_key_max_running"),
    ],
)
def test_a_bad_limit_is_a_validation_error_naming_the_field_and_writes_nothing(conn, kwargs, field):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.set_limit(conn, **kwargs)
    assert info.value.field == field
    assert pgqueue.list_limits(conn) == []


def test_async_and_client_set_the_same_limits(database_url, conn):
    enqueue(conn, "email", 3)

    async def set_it() -> pgqueue.Limit:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            limit = await aio.set_limit(a, type="email", max_running=1)
            assert len(await aio.claim(a, ["default"], limit=5, worker_id="a")) == 1
            return limit

    assert asyncio.run(set_it()).max_running == 1
    with pgqueue.Client(database_url) as client:
        assert [x.running for x in client.list_limits()] == [1]
        assert client.clear_limit(type="email") is True
    assert len(claim(conn)) == 2


def test_cli_sets_lists_and_clears_limits_with_json_and_tables(database_url, conn):
    set_ = run_main(database_url, "limit", "set", "--type", "email", "--max-running", "2")
    assert set_.code == 0 and "at most 2 running at once" in set_.stdout, set_.stderr
    rated = run_main(
        database_url, "--json", "limit", "set", "--queue", "sms", "--rate", "100", "--per", "1m"
    )
    assert json.loads(rated.stdout) == {
        **json.loads(rated.stdout),
        "kind": "queue",
        "name": "sms",
        "rate": 100,
        "per": 60.0,
        "max_running": None,
    }
    listed = run_main(database_url, "limit", "list")
    assert "email" in listed.stdout and "100 per 1m" in listed.stdout
    machine = json.loads(run_main(database_url, "--json", "limit", "list").stdout)
    assert [(x["kind"], x["name"]) for x in machine] == [("queue", "sms"), ("type", "email")]
    cleared = run_main(database_url, "limit", "clear", "--type", "email")
    assert cleared.code == 0 and "limit removed" in cleared.stdout
    assert [x.name for x in pgqueue.list_limits(conn)] == ["sms"]


@pytest.mark.parametrize(
    "args",
    [
        ("limit", "set", "--type", "email"),
        ("limit", "set", "--type", "a", "--queue", "b", "--max-running", "1"),
        ("limit", "set", "--type", "a", "--max-running", "-1"),
        ("limit", "set", "--type", "a", "--rate", "5", "--per", "soon"),
        ("limit", "clear"),
    ],
)
def test_cli_refuses_a_bad_limit_with_one_line_and_exit_2(database_url, conn, args):
    result = run_main(database_url, *args)
    assert result.code == 2, (result.stdout, result.stderr)
    assert result.line.startswith("error:"), result.line
    assert pgqueue.list_limits(conn) == []


def test_http_sets_lists_and_clears_limits(database_url, conn):
    enqueue(conn, "email", 3)
    api = Api(ApiSettings(database_url=database_url))
    try:
        put = api.request("PUT", "/api/v1/limits/type/email", json={"max_running": 1})
        assert put.status_code == 200, put.text
        assert put.json()["max_running"] == 1 and put.json()["rate"] is None
        assert len(claim(conn)) == 1
        listed = api.request("GET", "/api/v1/limits").json()
        assert [(x["name"], x["running"]) for x in listed] == [("email", 1)]
        bad = api.request("PUT", "/api/v1/limits/type/email", json={"max_running": "1"})
        assert bad.status_code == 422
        empty = api.request("PUT", "/api/v1/limits/type/email", json={})
        assert empty.status_code == 422, empty.text
        assert empty.json()["errors"][0]["field"] == "max_running"
        other_kind = api.request("PUT", "/api/v1/limits/host/email", json={"max_running": 1})
        assert other_kind.status_code == 422
        gone = api.request("DELETE", "/api/v1/limits/type/email")
        assert gone.json() == {"kind": "type", "name": "email", "removed": True}
        again = api.request("DELETE", "/api/v1/limits/type/email")
        assert again.status_code == 200 and again.json()["removed"] is False
    finally:
        api.close()
    assert len(claim(conn)) == 2


def test_the_api_metrics_show_each_limit_and_its_use(database_url, conn):
    enqueue(conn, "email", 3)
    pgqueue.set_limit(conn, type="email", max_running=2, rate=10, per=60)
    pgqueue.set_limit(conn, queue="payments", max_running=5)
    claim(conn)
    api = Api(ApiSettings(database_url=database_url))
    try:
        text = api.request("GET", "/metrics").text
    finally:
        api.close()

    assert 'pgqueue_limit_max_running{kind="type",name="email"} 2.0' in text
    assert 'pgqueue_limit_running_tasks{kind="type",name="email"} 2.0' in text
    assert 'pgqueue_limit_rate_starts{kind="type",name="email",per_seconds="60"} 10.0' in text
    assert 'pgqueue_limit_recent_starts{kind="type",name="email"} 2.0' in text
    assert 'pgqueue_limit_max_running{kind="queue",name="payments"} 5.0' in text
    assert 'pgqueue_limit_recent_starts{kind="queue"' not in text, "no rate, no starts gauge"


# --- per concurrency key ----------------------------------------------------------------------


def keyed_running(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT concurrency_key, count(*) FROM pgqueue.tasks"
        " WHERE status = 'running' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def test_a_per_key_limit_is_set_listed_with_its_keys_at_cap_and_cleared(conn):
    add_keyed(conn, "acme", 5)
    add_keyed(conn, "zeta", 1)
    set_ = pgqueue.set_limit(conn, queue="default", per_key_max_running=2)
    assert (set_.kind, set_.name, set_.per_key_max_running) == (
        pgqueue.LimitKind.QUEUE,
        "default",
        2,
    )
    assert (set_.max_running, set_.rate_limit) == (None, None), "the other parts are no limit"

    claim(conn)

    assert keyed_running(conn) == {"acme": 2, "zeta": 1}
    (limit,) = pgqueue.list_limits(conn)
    assert (limit.per_key_max_running, limit.running) == (2, 3)
    assert (limit.keys_running, limit.keys_at_cap) == (2, 1), "acme is at its cap, zeta is not"
    assert pgqueue.clear_limit(conn, queue="default") is True
    assert pgqueue.list_limits(conn) == []
    assert keyed_running(conn) == {"acme": 2, "zeta": 1}, "clearing frees, it stops nothing"
    claim(conn)
    assert keyed_running(conn) == {"acme": 5, "zeta": 1}


def test_a_per_key_limit_on_a_type_counts_keys_of_that_type_and_is_replaced_whole(conn):
    add_keyed(conn, "acme", 3, type="email")
    add_keyed(conn, "acme", 3, type="report")
    pgqueue.set_limit(conn, type="email", max_running=10, per_key_max_running=1)

    claim(conn)

    (limit,) = pgqueue.list_limits(conn)
    assert (limit.name, limit.max_running, limit.per_key_max_running) == ("email", 10, 1)
    assert (limit.running, limit.keys_running, limit.keys_at_cap) == (1, 1, 1)
    assert running(conn, "report") == 3, "another type of the same key is not held"
    replaced = pgqueue.set_limit(conn, type="email", max_running=10)
    assert replaced.per_key_max_running is None
    (limit,) = pgqueue.list_limits(conn)
    assert (limit.per_key_max_running, limit.keys_running, limit.keys_at_cap) == (None, 1, 0)


def test_a_per_key_limit_of_zero_holds_keyed_tasks_and_not_the_others(conn):
    add_keyed(conn, "acme", 2)
    (plain,) = enqueue(conn, "job", 1)
    pgqueue.set_limit(conn, queue="default", per_key_max_running=0)

    assert [t.id for t in claim(conn)] == [plain]


def test_async_and_client_set_and_list_the_per_key_part(database_url, conn):
    add_keyed(conn, "acme", 3)

    async def set_it() -> pgqueue.Limit:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
            limit = await aio.set_limit(a, queue="default", per_key_max_running=1)
            assert len(await aio.claim(a, ["default"], limit=5, worker_id="a")) == 1
            return limit

    assert asyncio.run(set_it()).per_key_max_running == 1
    with pgqueue.Client(database_url) as client:
        (limit,) = client.list_limits()
        assert (limit.per_key_max_running, limit.keys_at_cap) == (1, 1)
        limit = client.set_limit(queue="default", per_key_max_running=3)
        assert limit.per_key_max_running == 3
        assert client.clear_limit(queue="default") is True


def test_cli_sets_lists_and_clears_a_per_key_limit(database_url, conn):
    add_keyed(conn, "acme", 3)
    set_ = run_main(
        database_url, "limit", "set", "--queue", "default", "--per-key-max-running", "2"
    )
    assert set_.code == 0, set_.stderr
    assert set_.stdout.strip() == "queue 'default': at most 2 running at once per key"
    claim(conn)

    listed = run_main(database_url, "limit", "list")
    header, row = listed.stdout.splitlines()
    assert "PER KEY" in header and "KEYS AT CAP" in header
    assert row.split()[-4:] == ["2", "1", "of", "1"], row
    (machine,) = json.loads(run_main(database_url, "--json", "limit", "list").stdout)
    assert {k: machine[k] for k in ("per_key_max_running", "running", "keys_running")} == {
        "per_key_max_running": 2,
        "running": 2,
        "keys_running": 1,
    }
    assert machine["keys_at_cap"] == 1
    both = run_main(
        database_url,
        "--json",
        "limit",
        "set",
        "--type",
        "email",
        "--max-running",
        "5",
        "--per-key-max-running",
        "1",
    )
    assert (
        json.loads(both.stdout)["max_running"],
        json.loads(both.stdout)["per_key_max_running"],
    ) == (5, 1)
    cleared = run_main(database_url, "limit", "clear", "--queue", "default")
    assert cleared.code == 0 and "limit removed" in cleared.stdout
    assert [x.name for x in pgqueue.list_limits(conn)] == ["email"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1", "per_key_max_running: must be an integer from 0 to 1000000, not -1"),
        ("1000001", "per_key_max_running: must be an integer from 0 to 1000000, not 1000001"),
        ("1" + "0" * 30, f"must be an integer from 0 to 1000000, not 1{'0' * 30}"),
        ("2.5", "'--per-key-max-running': '2.5' is not a whole number"),
        ("2.0", "'--per-key-max-running': '2.0' is not a whole number"),
        ("two", "'--per-key-max-running': 'two' is not a whole number"),
        ("", "'--per-key-max-running': '' is not a whole number"),
    ],
)
def test_cli_refuses_a_bad_per_key_limit_in_one_line_saying_why(database_url, conn, value, says):
    for flags in ([], ["--json"]):
        result = run_main(
            database_url, *flags, "limit", "set", "--type", "a", "--per-key-max-running", value
        )
        assert result.code == 2, (result.stdout, result.stderr)
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert says in result.line, result.line
    assert pgqueue.list_limits(conn) == []


def test_http_sets_lists_and_clears_a_per_key_limit(database_url, conn):
    add_keyed(conn, "acme", 3)
    api = Api(ApiSettings(database_url=database_url))
    try:
        put = api.request("PUT", "/api/v1/limits/queue/default", json={"per_key_max_running": 2})
        assert put.status_code == 200, put.text
        assert put.json()["per_key_max_running"] == 2 and put.json()["max_running"] is None
        claim(conn)
        (listed,) = api.request("GET", "/api/v1/limits").json()
        assert {k: listed[k] for k in ("per_key_max_running", "running", "keys_running")} == {
            "per_key_max_running": 2,
            "running": 2,
            "keys_running": 1,
        }
        assert listed["keys_at_cap"] == 1
        gone = api.request("DELETE", "/api/v1/limits/queue/default")
        assert gone.json() == {"kind": "queue", "name": "default", "removed": True}
    finally:
        api.close()
    assert pgqueue.list_limits(conn) == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-1, "greater than or equal to 0"),
        (1_000_001, "less than or equal to 1000000"),
        (10**30, "less than or equal to 1000000"),
        (2.5, "valid integer"),
        (2.0, "valid integer"),
        ("2", "valid integer"),
        (True, "valid integer"),
    ],
)
def test_http_refuses_a_bad_per_key_limit_with_422_naming_the_field(
    database_url, conn, value, says
):
    api = Api(ApiSettings(database_url=database_url))
    try:
        bad = api.request("PUT", "/api/v1/limits/type/email", json={"per_key_max_running": value})
    finally:
        api.close()
    assert bad.status_code == 422, bad.text
    (error,) = bad.json()["errors"]
    assert error["field"] == "per_key_max_running" and says in error["message"], error
    assert pgqueue.list_limits(conn) == []


def test_the_api_metrics_show_each_per_key_limit_and_its_keys_at_cap(database_url, conn):
    add_keyed(conn, "acme", 3)
    add_keyed(conn, "zeta", 1)
    pgqueue.set_limit(conn, queue="default", per_key_max_running=2)
    pgqueue.set_limit(conn, type="email", max_running=4)
    claim(conn)
    api = Api(ApiSettings(database_url=database_url))
    try:
        text = api.request("GET", "/metrics").text
    finally:
        api.close()

    assert 'pgqueue_limit_per_key_max_running{kind="queue",name="default"} 2.0' in text
    assert 'pgqueue_limit_keys_at_cap{kind="queue",name="default"} 1.0' in text
    assert 'pgqueue_limit_per_key_max_running{kind="type"' not in text, "no per-key part"
