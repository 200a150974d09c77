"""Rate limits that space their starts evenly (a token bucket with a burst), as an operator
sets them (library, CLI, HTTP); those declared on a decorator are in
test_declared_rate_limits.py.

The claims here run with the clock controlled (``now``), so the spacing is exact to the
microsecond; worker processes keeping to a rate together are in
tests/acceptance/test_rate_limit_processes.py.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from keyed_tasks import add_keyed

import pgqueue
from pgqueue.api import ApiSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def claimed(conn: psycopg.Connection[Any], seconds: float, limit: int = 100) -> int:
    """How many tasks one claim at T0 + ``seconds`` starts."""
    return len(pgqueue.claim(conn, ["default"], limit=limit, worker_id="test", now=at(seconds)))


def enqueue(conn: psycopg.Connection[Any], type_: str, n: int) -> None:
    pgqueue.enqueue_many(conn, [{"type": type_, "payload": {"i": i}} for i in range(n)])


# --- the bucket ----------------------------------------------------------------------------


def test_a_rate_with_burst_one_starts_one_task_per_interval_however_many_wait(conn):
    enqueue(conn, "sms", 20)
    pgqueue.set_limit(conn, type="sms", rate=10, per=1, burst=1)

    assert claimed(conn, 0) == 1, "one at once, not the ten of the window"
    assert claimed(conn, 0.099999) == 0, "the next start is due 100 ms after the first"
    assert claimed(conn, 0.1) == 1
    # A quiet spell saves up no more than the burst: one now, the next 100 ms later.
    assert claimed(conn, 5) == 1
    assert claimed(conn, 5.05) == 0
    assert claimed(conn, 5.1) == 1


def test_a_burst_lets_that_many_start_at_once_then_spaces_the_rest(conn):
    enqueue(conn, "sms", 30)
    pgqueue.set_limit(conn, type="sms", rate=6, per=60, burst=3)  # one every 10 s

    assert claimed(conn, 0) == 3
    assert claimed(conn, 9) == 0
    assert claimed(conn, 10) == 1
    assert claimed(conn, 19) == 0
    assert claimed(conn, 20) == 1
    assert claimed(conn, 35) == 1, "a start was due at 30; the one due at 40 is not yet"
    assert claimed(conn, 1000) == 3, "after a quiet spell, the burst again, not more"
    assert claimed(conn, 1000) == 0


def test_a_bucket_limits_tasks_of_its_type_that_have_a_concurrency_key(conn):
    add_keyed(conn, "acme", 5, type="sms")
    add_keyed(conn, "zeta", 5, type="sms")
    pgqueue.set_limit(conn, type="sms", rate=1, per=1, burst=2)

    assert claimed(conn, 0) == 2
    assert claimed(conn, 0.5) == 0
    assert claimed(conn, 1) == 1


def test_a_bucket_on_a_queue_spaces_the_starts_of_every_type_in_it(conn):
    enqueue(conn, "sms", 5)
    enqueue(conn, "email", 5)
    pgqueue.set_limit(conn, queue="default", rate=2, per=1, burst=1)

    assert claimed(conn, 0) == 1
    assert claimed(conn, 0.4) == 0
    assert claimed(conn, 0.5) == 1


def test_a_raised_rate_applies_within_one_of_its_intervals_not_after_the_old_ones(conn):
    enqueue(conn, "sms", 10)
    pgqueue.set_limit(conn, type="sms", rate=1, per=3600, burst=1)
    assert claimed(conn, 0) == 1
    assert claimed(conn, 1) == 0, "the next start of 1 an hour is an hour away"

    pgqueue.set_limit(conn, type="sms", rate=10, per=1, burst=1, now=at(1))
    assert claimed(conn, 1.05) == 0
    assert claimed(conn, 1.1) == 1, "due one new interval after the change"
    assert claimed(conn, 1.2) == 1

    # Lowered: the start already due at 1.3 keeps its time, the next waits a new interval.
    pgqueue.set_limit(conn, type="sms", rate=1, per=60, burst=1, now=at(1.2))
    assert claimed(conn, 1.3) == 1
    assert claimed(conn, 2) == 0
    assert claimed(conn, 61.2) == 0
    assert claimed(conn, 61.3) == 1


def test_claimers_whose_transactions_overlap_take_no_more_than_the_bucket_holds(database_url):
    """Six claimers in threads, each serving a queue of its own where tasks of one bucketed
    type wait, each claiming in its own transaction at the same instant, none committing
    until all have claimed: together they start the burst and no more, since one claimer at a
    time may take from a bucket (the limits lock); the others fill their batches with
    ordinary work instead of waiting."""
    claimers, batch = 6, 3
    queues = [f"q{n}" for n in range(claimers)]
    with psycopg.connect(database_url, autocommit=True) as setup:
        for queue in queues:
            pgqueue.enqueue_many(setup, [{"type": "sms", "queue": queue}] * batch)
            pgqueue.enqueue_many(setup, [{"type": "report", "queue": queue}] * batch)
        pgqueue.set_limit(setup, type="sms", rate=10, per=1, burst=2)
    all_claimed = threading.Barrier(claimers + 1, timeout=60)
    got: list[list[pgqueue.ClaimedTask]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as mine, mine.transaction():
                tasks = pgqueue.claim(mine, [queues[n]], limit=batch, worker_id=f"t{n}", now=T0)
                with lock:
                    got.append(tasks)
                all_claimed.wait()  # every claim made, none committed
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
            all_claimed.abort()

    threads = [threading.Thread(target=claimer, args=(n,), daemon=True) for n in range(claimers)]
    for t in threads:
        t.start()
    try:
        all_claimed.wait()
    except threading.BrokenBarrierError:
        raise errors[0] if errors else AssertionError("a claimer got stuck") from None
    finally:
        for t in threads:
            t.join(60)
    starts = [t for tasks in got for t in tasks if t.type == "sms"]
    assert len(starts) == 2, "the bucket's burst, across six overlapping claimers"
    assert [len(tasks) for tasks in got] == [batch] * claimers


def test_a_rate_of_zero_with_a_burst_stops_its_tasks(conn):
    enqueue(conn, "sms", 3)
    pgqueue.set_limit(conn, type="sms", rate=0, burst=1)
    assert claimed(conn, 0) == 0
    assert claimed(conn, 3600) == 0


def test_list_limits_shows_the_burst_and_the_starts_within_the_period(conn):
    enqueue(conn, "sms", 10)
    pgqueue.set_limit(conn, type="sms", rate=4, per=1, burst=2)
    claimed(conn, 0)
    claimed(conn, 0.25)

    (limit,) = pgqueue.list_limits(conn, now=at(0.3))
    assert (limit.rate_limit, limit.rate_period, limit.rate_burst) == (4, 1.0, 2)
    assert (limit.recent_starts, limit.declared_by) == (3, None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": "a", "rate": 5, "burst": 0}, "burst"),
        ({"type": "a", "rate": 5, "burst": 10_001}, "burst"),
        ({"type": "a", "rate": 5, "burst": True}, "burst"),
        ({"type": "a", "rate": 5, "burst": 1.5}, "burst"),
        ({"type": "a", "max_running": 5, "burst": 2}, "burst"),
    ],
)
def test_a_bad_burst_is_a_validation_error_naming_it_and_writes_nothing(conn, kwargs, field):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.set_limit(conn, **kwargs)
    assert info.value.field == field
    assert pgqueue.list_limits(conn) == []


# --- the interfaces ---------------------------------------------------------------------------


def test_cli_sets_a_burst_and_lists_it(database_url, conn):
    rated = run_main(
        database_url,
        "--json",
        "limit",
        "set",
        "--type",
        "email",
        "--rate",
        "5",
        "--per",
        "1s",
        "--burst",
        "2",
    )
    assert rated.code == 0, rated.stderr
    out = json.loads(rated.stdout)
    assert (out["rate"], out["per"], out["burst"], out["declared_by"]) == (5, 1.0, 2, None)

    listed = run_main(database_url, "limit", "list")
    assert "5 per 1s, burst 2" in listed.stdout and "operator" in listed.stdout

    refused = run_main(database_url, "limit", "set", "--type", "x", "--rate", "1", "--burst", "0")
    assert refused.code == 2 and refused.line.startswith("error:"), refused.line
    alone = run_main(database_url, "limit", "set", "--type", "x", "--burst", "2")
    assert alone.code == 2 and "burst" in alone.line, alone.line


def test_http_sets_a_burst_and_shows_who_set_the_limit(database_url, conn):
    api = Api(ApiSettings(database_url=database_url))
    try:
        put = api.request(
            "PUT", "/api/v1/limits/type/sms", json={"rate": 10, "per_seconds": 1, "burst": 1}
        )
        assert put.status_code == 200, put.text
        assert (put.json()["burst"], put.json()["declared_by"]) == (1, None)
        bad = api.request("PUT", "/api/v1/limits/type/sms", json={"rate": 10, "burst": 0})
        assert bad.status_code == 422, bad.text
        alone = api.request("PUT", "/api/v1/limits/type/sms", json={"burst": 2})
        assert alone.status_code == 422, alone.text
    finally:
        api.close()
    enqueue(conn, "sms", 3)
    assert claimed(conn, 0) == 1
