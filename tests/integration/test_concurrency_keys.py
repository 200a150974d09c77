"""The fair claim: tasks with a concurrency key take turns per key, and a per-key limit caps
how many of a key's tasks run at once, fleet-wide.

These tests hold claims (pgqueue.claim, and the claim round a worker makes, with its
rotation) to the rules the README states: strict priority first; within a queue and priority
the keys in turn, the unkeyed tasks taking one turn among them; within a key, priority then
first in first out; and the per-key count exact, whatever ends a run (completion, failure,
cancel, snooze, an expired lease once swept). Worker processes under one per-key limit
together are in tests/acceptance/test_keyed_worker_processes.py.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.key_rotation import KeyRotation
from pgqueue.queries.claiming import claim_round
from pgqueue.queries.driver import run

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def enqueue(
    conn: psycopg.Connection[Any], type_: str, key: str | None, n: int = 1, **kw: Any
) -> list[Any]:
    return [pgqueue.enqueue(conn, type_, {"i": i}, concurrency_key=key, **kw).id for i in range(n)]


def claim(conn: psycopg.Connection[Any], limit: int = 100, **kw: Any) -> list[pgqueue.ClaimedTask]:
    queues = kw.pop("queues", ["default"])
    return pgqueue.claim(conn, queues, limit=limit, worker_id=kw.pop("worker_id", "test"), **kw)


def keys(tasks: list[pgqueue.ClaimedTask]) -> list[str | None]:
    return [t.concurrency_key for t in tasks]


def running_per_key(conn: psycopg.Connection[Any]) -> Counter[str]:
    rows = conn.execute(
        "SELECT concurrency_key, count(*) FROM pgqueue.tasks"
        " WHERE status = 'running' AND concurrency_key IS NOT NULL GROUP BY 1"
    ).fetchall()
    return Counter({key: n for key, n in rows})


class Rotating:
    """Claims as a worker makes them: one claim round per call, the rotation carried over."""

    def __init__(self, conn: psycopg.Connection[Any], queues: list[str] | None = None) -> None:
        self.conn = conn
        self.queues = queues or ["default"]
        self.rotation = KeyRotation()

    def __call__(self, limit: int) -> list[pgqueue.ClaimedTask]:
        op = claim_round(
            queues=self.queues,
            limit=limit,
            owner="rotating",
            lease_seconds=30,
            rotation=self.rotation.current(),
        )
        claimed, _ = run(self.conn, op, atomic=True)
        self.rotation.claimed(claimed)
        return claimed


# --- turns ------------------------------------------------------------------------------------


def test_a_hot_keys_backlog_does_not_hold_back_the_other_keys(conn):
    """First in first out would give the hot key's 50 tasks, enqueued first, every slot."""
    enqueue(conn, "export", "hot", 50)
    cold = [enqueue(conn, "export", f"cold-{n}")[0] for n in range(5)]

    got = claim(conn, limit=6)

    assert {t.id for t in got} >= set(cold), "each cold key's task in the first batch"
    assert keys(got).count("hot") == 1, "the hot key takes one turn, as every key does"


def test_keys_take_turns_round_by_round_and_the_rotation_carries_over(conn):
    for key in ("a", "b", "c"):
        enqueue(conn, "t", key, 3)
    rotating = Rotating(conn)

    order = [keys(rotating(1))[0] for _ in range(9)]

    assert order == ["a", "b", "c"] * 3


def test_keys_fewer_than_the_batch_share_the_extra_rounds_evenly_over_claims(conn):
    """Three keys, claims of five: each claim gives two keys a second task, and the next
    claim starts after the last of the batch's fill order, so the extra turns go round."""
    for key in ("a", "b", "c"):
        enqueue(conn, "t", key, 40)
    rotating = Rotating(conn)
    served: Counter[str | None] = Counter()
    for _ in range(12):
        got = rotating(5)
        served.update(keys(got))
        for task in got:
            pgqueue.complete(conn, task.lease)

    assert served == {"a": 20, "b": 20, "c": 20}


def test_a_batch_fills_in_rounds_when_there_are_fewer_keys_than_slots(conn):
    """No slot idles while a key has ready work: with two keys and a batch of 8, each key
    gives four, not one."""
    enqueue(conn, "t", "a", 10)
    enqueue(conn, "t", "b", 2)

    got = claim(conn, limit=8)

    assert Counter(keys(got)) == {"a": 6, "b": 2}


def test_within_a_key_priority_then_first_in_first_out(conn):
    normal = enqueue(conn, "t", "a", 2)
    (high,) = enqueue(conn, "t", "a", priority="high")
    rotating = Rotating(conn)

    assert [t.id for t in rotating(1) + rotating(1) + rotating(1)] == [high, *normal]


def test_priority_is_strict_across_keys_before_keys_take_turns(conn):
    enqueue(conn, "t", "a", 5)
    (urgent,) = enqueue(conn, "t", "z", priority="high")

    got = claim(conn, limit=1)

    assert [t.id for t in got] == [urgent]


def test_a_prioritys_few_keys_fill_the_batch_before_many_keys_of_a_lower_one(conn):
    """Turns are one task per key only where a priority has keys enough to fill the batch:
    one key's five high tasks all go before thirty keys' normal ones."""
    for n in range(30):
        enqueue(conn, "t", f"k{n:02}")
    high = enqueue(conn, "t", "vip", 5, priority="high")

    got = claim(conn, limit=8)

    assert [t.id for t in got if t.priority == pgqueue.Priority.HIGH] == high
    assert len(got) == 8


def test_unkeyed_tasks_take_one_turn_among_the_keys(conn):
    plain = enqueue(conn, "t", None, 10)
    enqueue(conn, "t", "a", 10)
    enqueue(conn, "t", "b", 10)
    rotating = Rotating(conn)

    got = [t for _ in range(6) for t in rotating(1)]

    assert keys(got) == ["a", "b", None, "a", "b", None]
    assert [t.id for t in got if t.concurrency_key is None] == plain[:2], "first in, first out"


def test_a_paused_queue_is_skipped_for_keyed_tasks(conn):
    enqueue(conn, "t", "a", 2, queue="mail")
    pgqueue.pause_queue(conn, "mail")

    assert claim(conn, queues=["mail"]) == []
    pgqueue.resume_queue(conn, "mail")
    assert len(claim(conn, queues=["mail"])) == 2


def test_a_ready_key_behind_many_keys_with_nothing_due_is_claimed(conn):
    """Thirty keys whose only tasks are not due (retries in backoff, scheduled ones) sort
    before the one ready key: a claim that visited only them looks further."""
    later = datetime.now(UTC) + timedelta(hours=1)
    for n in range(30):
        enqueue(conn, "t", f"a{n:02}", run_at=later)
    (ready,) = enqueue(conn, "t", "z")

    assert [t.id for t in Rotating(conn)(16)] == [ready]


def test_a_ready_key_behind_many_keys_at_their_limit_is_claimed(conn):
    pgqueue.set_limit(conn, type="t", per_key_max_running=1)
    for n in range(12):
        enqueue(conn, "t", f"a{n:02}", 2)
    assert len(Rotating(conn)(12)) == 12  # every key at its limit now
    (ready,) = enqueue(conn, "t", "z")

    # A claimer whose turns start at the first key (a fresh worker) walks them all first.
    assert [t.id for t in Rotating(conn)(1)] == [ready]


def test_a_scheduled_keyed_task_waits_for_its_time(conn):
    enqueue(conn, "t", "a", run_at=datetime.now(UTC) + timedelta(hours=1))
    (now,) = enqueue(conn, "t", "b")

    assert [t.id for t in claim(conn)] == [now]


# --- per-key limits ---------------------------------------------------------------------------


def test_a_per_key_limit_on_a_type_caps_each_key_and_leaves_other_types_alone(conn):
    enqueue(conn, "export", "a", 5)
    enqueue(conn, "export", "b", 5)
    enqueue(conn, "email", "a", 5)
    pgqueue.set_limit(conn, type="export", per_key_max_running=2)

    got = claim(conn)

    by = Counter((t.type, t.concurrency_key) for t in got)
    assert by == {("export", "a"): 2, ("export", "b"): 2, ("email", "a"): 5}


def test_a_per_key_limit_alone_leaves_the_types_unkeyed_tasks_ordinary(conn):
    """Such tasks have no key to count: they are neither rationed nor claimed ahead of the
    keyed ones, and priority still decides between them."""
    pgqueue.set_limit(conn, type="export", per_key_max_running=2)
    enqueue(conn, "export", None, 20, priority="low")
    urgent = enqueue(conn, "export", "a", 2, priority="high")

    got = claim(conn, limit=3)

    assert [t.id for t in got][:2] == urgent
    assert keys(got) == ["a", "a", None]


def test_a_per_key_limit_on_a_queue_counts_every_type_of_the_key_in_that_queue(conn):
    enqueue(conn, "x", "a", 3, queue="partner")
    enqueue(conn, "y", "a", 3, queue="partner")
    enqueue(conn, "x", "a", 3, queue="other")
    pgqueue.set_limit(conn, queue="partner", per_key_max_running=2)

    got = claim(conn, queues=["partner", "other"])

    assert sum(t.queue == "partner" for t in got) == 2
    assert sum(t.queue == "other" for t in got) == 3


def test_a_per_key_limit_spans_claims_and_priorities(conn):
    enqueue(conn, "export", "a", 3, priority="high")
    enqueue(conn, "export", "a", 3)
    pgqueue.set_limit(conn, type="export", per_key_max_running=2)

    first = claim(conn, limit=1)
    second = claim(conn)

    assert len(first) == 1 and len(second) == 1
    assert {int(t.priority) for t in first + second} == {int(pgqueue.Priority.HIGH)}
    assert claim(conn) == []


@pytest.mark.parametrize("ending", ["complete", "fail", "cancel", "snooze"])
def test_every_way_a_run_ends_frees_the_keys_slot(conn, ending):
    enqueue(conn, "export", "a", 3, max_attempts=5)
    pgqueue.set_limit(conn, type="export", per_key_max_running=1)
    (held,) = claim(conn)
    assert claim(conn) == []

    if ending == "complete":
        pgqueue.complete(conn, held.lease)
    elif ending == "fail":
        pgqueue.fail(conn, held.lease, "boom")
    elif ending == "cancel":
        pgqueue.cancel_leased(conn, held.lease, "not needed")
    else:
        pgqueue.snooze(conn, held.lease, 3600)

    assert keys(claim(conn)) == ["a"]
    assert running_per_key(conn) == {"a": 1}


def test_an_expired_lease_counts_against_its_key_until_swept(conn):
    enqueue(conn, "export", "a", 2)
    pgqueue.set_limit(conn, type="export", per_key_max_running=1)
    claim(conn, worker_id="dead", lease_seconds=1, now=T0)

    assert claim(conn, now=T0 + timedelta(seconds=5)) == []
    pgqueue.sweep_expired(conn, now=T0 + timedelta(seconds=5))
    assert len(claim(conn, now=T0 + timedelta(seconds=60))) == 1
    assert running_per_key(conn) == {"a": 1}


def test_per_key_limit_zero_holds_a_keys_tasks_and_clearing_it_releases_them(conn):
    enqueue(conn, "export", "a", 2)
    pgqueue.set_limit(conn, type="export", per_key_max_running=0)
    assert claim(conn) == []

    pgqueue.clear_limit(conn, type="export")
    assert keys(claim(conn)) == ["a", "a"]


def test_per_key_and_fleet_limits_on_one_type_take_the_stricter(conn):
    for key in ("a", "b", "c"):
        enqueue(conn, "export", key, 3)
    pgqueue.set_limit(conn, type="export", max_running=4, per_key_max_running=2)

    got = claim(conn)

    assert len(got) == 4
    assert max(Counter(keys(got)).values()) <= 2


def test_claimers_whose_claims_overlap_never_exceed_a_per_key_limit(conn, database_url):
    """Six claimers in threads, released together, all after one key's tasks, each claim
    slowed by a trigger on the claiming UPDATE (0.2 s a task) so that they would overlap: each
    would count no running task of the key and take two rows the others skip. Only the limits
    lock, which each claim of keyed tasks waits for, keeps them to two together: the first
    takes the key's two slots, the others, counting after it commits, find the key full."""
    claimers = 6
    enqueue(conn, "export", "a", 20)
    pgqueue.set_limit(conn, type="export", per_key_max_running=2)
    conn.execute(
        """
        CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
        CREATE TRIGGER slow_claim AFTER UPDATE OF status ON pgqueue.tasks FOR EACH ROW
         WHEN (OLD.status = 'queued' AND NEW.status = 'running')
         EXECUTE FUNCTION slow_claim();
        """
    )
    got: list[list[pgqueue.ClaimedTask]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(claimers, timeout=60)

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as mine:
                start.wait()
                mine_now = pgqueue.claim(mine, ["default"], limit=5, worker_id=f"t{n}")
                with lock:
                    got.append(mine_now)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,), daemon=True) for n in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert not errors, errors
    assert sorted(len(batch) for batch in got) == [0] * (claimers - 1) + [2]
    assert running_per_key(conn) == {"a": 2}
