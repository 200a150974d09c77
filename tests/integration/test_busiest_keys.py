"""The busiest concurrency keys: per queue and key, the tasks running and the tasks ready
(queued and due), busiest (running + ready) first, in the library, `pgqueue stats`,
GET /api/v1/stats, /metrics and the dashboard's data.

A key is a tenant, so there may be thousands and one of them may have a backlog of its own
the size of everyone else's: the statement counts each key's queued tasks up to a cap
(1,000; ``ready_capped`` past it) by chunks of the keyed claim index, and these tests check
its counts against a plain count of every row, with caps small enough to put chunk edges
everywhere. Its plan at 10,000 keys is in test_key_plans.py. Keyed tasks are written
straight into the table (tests/keyed_tasks.py).
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from keyed_tasks import add_keyed

import pgqueue
from pgqueue import aio
from pgqueue.api import ApiSettings
from pgqueue.queries import driver, stats

# In the past, so that the CLI and the API, which read the real clock, see these tasks due.
T0 = datetime(2020, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(seconds=1)  # tasks created at T0 are due
LATER = T0 + timedelta(hours=1)


def claim_key(conn: psycopg.Connection[Any], queue: str, n: int) -> None:
    """Claim ``n`` tasks of ``queue``: the keys take turns, so a claim may take fewer than it
    asks for (one key's tasks a turn); claim again until there are ``n``."""
    claimed = 0
    for _ in range(n):
        claimed += len(pgqueue.claim(conn, [queue], limit=n - claimed, worker_id="w", now=NOW))
        if claimed == n:
            return
    raise AssertionError(f"claimed {claimed} of {n}")


def rows(keys: list[pgqueue.KeyStats]) -> list[tuple[str, str, int, int, bool]]:
    return [(k.queue, k.key, k.running, k.ready, k.ready_capped) for k in keys]


@pytest.fixture
def tenants(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """acme: 2 running, 3 ready. beta: 4 ready. gamma: 1 ready, 2 scheduled. In 'email':
    acme again, 1 ready. And tasks without a key, which no key counts."""
    add_keyed(conn, "acme", 2, at=T0 - timedelta(minutes=1))
    claim_key(conn, "default", 2)
    add_keyed(conn, "acme", 3, at=T0)
    add_keyed(conn, "beta", 4, at=T0)
    add_keyed(conn, "gamma", 1, at=T0)
    add_keyed(conn, "gamma", 2, at=T0, visible_after=LATER)
    add_keyed(conn, "acme", 1, queue="email", at=T0)
    pgqueue.enqueue_many(conn, [{"type": "plain"} for _ in range(20)], now=T0)
    return conn


def test_the_busiest_keys_are_ranked_by_running_plus_ready_per_queue_and_key(tenants):
    busiest = pgqueue.busiest_keys(tenants, now=NOW)

    assert rows(busiest) == [
        ("default", "acme", 2, 3, False),
        ("default", "beta", 0, 4, False),
        ("default", "gamma", 0, 1, False),
        ("email", "acme", 0, 1, False),
    ]
    # Ties go to the key with more running, then by queue and key.
    assert rows(pgqueue.busiest_keys(tenants, limit=2, now=NOW)) == rows(busiest[:2])
    # Once the scheduled ones are due, gamma has 3 ready.
    later = {(k.queue, k.key): k.ready for k in pgqueue.busiest_keys(tenants, now=LATER)}
    assert later[("default", "gamma")] == 3


def test_a_key_with_only_running_tasks_is_counted(conn):
    add_keyed(conn, "solo", 2, at=T0)
    claim_key(conn, "default", 2)

    assert rows(pgqueue.busiest_keys(conn, now=NOW)) == [("default", "solo", 2, 0, False)]


def test_no_keyed_task_no_row(conn):
    pgqueue.enqueue(conn, "plain", now=T0)
    assert pgqueue.busiest_keys(conn, now=NOW) == []


def test_a_key_with_a_thousand_queued_tasks_or_more_is_counted_to_a_thousand(conn):
    """One tenant's backlog costs no more to look at than a thousand of its tasks."""
    add_keyed(conn, "whale", 1_500, at=T0)
    add_keyed(conn, "minnow", 999, at=T0)

    assert rows(pgqueue.busiest_keys(conn, now=NOW)) == [
        ("default", "whale", 0, 1_000, True),
        ("default", "minnow", 0, 999, False),
    ]


# The statement against a plain count of every row, with chunk edges everywhere.
EXACT = """
WITH r AS (SELECT queue, concurrency_key AS key, count(*) AS n FROM pgqueue.tasks
            WHERE status = 'running' AND concurrency_key IS NOT NULL GROUP BY 1, 2),
     q AS (SELECT queue, concurrency_key AS key, count(*) AS queued,
                  count(*) FILTER (WHERE visible_after <= %(now)s) AS ready
             FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NOT NULL
            GROUP BY 1, 2)
SELECT coalesce(q.queue, r.queue), coalesce(q.key, r.key), coalesce(r.n, 0),
       coalesce(q.ready, 0), coalesce(q.queued, 0)
  FROM q FULL JOIN r ON q.queue = r.queue AND q.key = r.key
"""


def test_the_chunked_count_agrees_with_counting_every_row_whatever_the_cap(conn):
    """Keys of 1 to 40 tasks over three priorities and two queues, some scheduled, some
    running: every cap from 1 (a chunk per entry) to past the largest key. A key below the
    cap is counted exactly; one at or above it is counted to it, flagged, and its ready
    count is no more than the truth."""
    rng = random.Random(7)
    for n in range(60):
        key = f"k{n:02d}" if n % 9 else f"K-{n}"
        queue = "default" if n % 5 else "email"
        for priority in rng.sample([0, 1, 2], rng.randint(1, 3)):
            count = rng.choice([1, 1, 2, 3, 5, 8, 13, 40])
            due = None if rng.random() < 0.7 else LATER
            add_keyed(conn, key, count, queue=queue, priority=priority, at=T0, visible_after=due)
    claim_key(conn, "default", 30)
    exact = {
        (q, k): (n, ready, queued)
        for q, k, n, ready, queued in conn.execute(EXACT, {"now": NOW}).fetchall()
    }

    for cap in (1, 2, 3, 5, 7, 13, 40, 41, 1_000):
        got = driver.run(conn, stats.key_busiest(10_000, now=NOW, cap=cap))
        assert {(k.queue, k.key) for k in got} == set(exact), cap
        for k in got:
            running, ready, queued = exact[(k.queue, k.key)]
            assert k.running == running, (cap, k)
            if queued < cap or (queued == cap and not k.ready_capped):
                assert (k.ready, k.ready_capped) == (ready, False), (
                    cap,
                    k,
                    exact[(k.queue, k.key)],
                )
            else:
                assert k.ready_capped and k.ready <= min(ready, cap), (cap, k)
        scores = [(k.running + k.ready, k.running) for k in got]
        assert scores == sorted(scores, reverse=True), cap


@pytest.mark.parametrize("limit", [0, -1, 101, 2.0, True, "10", None])
def test_a_bad_number_of_keys_is_a_validation_error(conn, limit):
    with pytest.raises(pgqueue.ValidationError) as info:
        pgqueue.busiest_keys(conn, limit=limit)
    assert info.value.field == "limit"


def test_async_and_the_client_give_the_same_keys(database_url, tenants):
    async def read() -> list[pgqueue.KeyStats]:
        async with await psycopg.AsyncConnection.connect(database_url) as a:
            return await aio.busiest_keys(a, now=NOW)

    expected = pgqueue.busiest_keys(tenants, now=NOW)
    assert asyncio.run(read()) == expected
    with pgqueue.Client(database_url) as client:
        assert client.busiest_keys(now=NOW) == expected


# --- the interfaces ------------------------------------------------------------------------------


def test_cli_stats_shows_the_busiest_keys_as_a_table_and_in_json(database_url, tenants):
    add_keyed(tenants, "whale", 1_200, queue="email", at=T0)

    human = run_main(database_url, "stats", "--keys", "3")
    assert human.code == 0, human.stderr
    lines = human.stdout.splitlines()
    start = lines.index("busiest concurrency keys (running + ready):")
    assert [line.split() for line in lines[start + 1 : start + 5]] == [
        ["QUEUE", "KEY", "RUNNING", "READY"],
        ["email", "whale", "0", "1000+"],
        ["default", "acme", "2", "3"],
        ["default", "beta", "0", "4"],
    ]
    machine = json.loads(run_main(database_url, "--json", "stats").stdout)
    assert machine["busiest_keys"][:2] == [
        {"queue": "email", "key": "whale", "running": 0, "ready": 1000, "ready_capped": True},
        {"queue": "default", "key": "acme", "running": 2, "ready": 3, "ready_capped": False},
    ]
    assert len(machine["busiest_keys"]) == 5


def test_cli_stats_says_nothing_of_keys_where_no_task_has_one(database_url, conn):
    pgqueue.enqueue(conn, "plain")
    human = run_main(database_url, "stats")
    assert human.code == 0 and "concurrency keys" not in human.stdout, human.stdout
    assert json.loads(run_main(database_url, "--json", "stats").stdout)["busiest_keys"] == []


@pytest.mark.parametrize("value", ["0", "101", "ten", "2.5"])
def test_cli_stats_refuses_a_bad_number_of_keys(database_url, conn, value):
    result = run_main(database_url, "stats", "--keys", value)
    assert result.code == 2 and result.stdout == "", result
    assert "--keys" in result.line and len(result.stderr.splitlines()) == 1, result.stderr


def test_the_api_stats_give_the_busiest_keys_bounded_by_keys(database_url, tenants):
    api = Api(ApiSettings(database_url=database_url))
    try:
        body = api.request("GET", "/api/v1/stats").json()
        two = api.request("GET", "/api/v1/stats", params={"keys": 2}).json()
        bad = [api.request("GET", "/api/v1/stats", params={"keys": v}) for v in (0, 101, "x")]
    finally:
        api.close()

    assert [(k["queue"], k["key"], k["running"]) for k in body["busiest_keys"]] == [
        ("default", "acme", 2),
        ("default", "beta", 0),
        ("default", "gamma", 0),
        ("email", "acme", 0),
    ]
    assert body["busiest_keys"][0] == {
        "queue": "default",
        "key": "acme",
        "running": 2,
        "ready": 3,
        "ready_capped": False,
    }
    assert two["busiest_keys"] == body["busiest_keys"][:2]
    for response in bad:
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == "keys"


def key_series(text: str) -> dict[tuple[str, str], float]:
    """The pgqueue_key_tasks samples of an exposition: (key, state) -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith("pgqueue_key_tasks{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(p.split("=", 1) for p in labels[len("pgqueue_key_tasks{") : -1].split(","))
            found[(parts["key"].strip('"'), parts["state"].strip('"'))] = float(value)
    return found


def test_metrics_show_the_ten_busiest_keys_only_and_drop_those_that_leave(database_url, conn):
    """Bounded cardinality: a label per tenant would grow the series for ever. Twelve keys,
    the ten busiest shown; when one of them finishes its work and another grows, the first
    one's series go at the next scrape."""
    for n in range(12):
        add_keyed(conn, f"tenant-{n:02d}", n + 1, at=T0)
    api = Api(ApiSettings(database_url=database_url))
    try:
        first = key_series(api.request("GET", "/metrics").text)
        conn.execute("DELETE FROM pgqueue.tasks WHERE concurrency_key = 'tenant-11'")
        add_keyed(conn, "tenant-00", 30, at=T0)
        second = key_series(api.request("GET", "/metrics").text)
    finally:
        api.close()

    assert {k for k, _ in first} == {f"tenant-{n:02d}" for n in range(2, 12)}
    assert len(first) == 20 and first[("tenant-11", "ready")] == 12.0
    assert first[("tenant-11", "running")] == 0.0
    assert {k for k, _ in second} == {"tenant-00", *(f"tenant-{n:02d}" for n in range(2, 11))}
    assert second[("tenant-00", "ready")] == 31.0
    assert ("tenant-11", "ready") not in second and ("tenant-01", "ready") not in second
