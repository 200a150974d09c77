"""Property: under any sequence of public operations, every task's row is what a simple model
of its life says it is, and no task is ever lost.

Why: each operation has its own example-based tests, but a queue's bugs live in sequences:
a sweep between a claim and a complete, a release of a task whose cancellation was asked,
a replay of a dead letter whose key is reused, a stale worker's write after its task was
re-claimed. A Hypothesis ``RuleBasedStateMachine`` drives the real API against real
PostgreSQL (enqueue and enqueue_many with and without idempotency keys, priorities and
delays; claim, also from two connections at once; complete, complete_many, fail with retries
and to the dead-letter queue, heartbeat, release, cancel of queued and running tasks,
cancel_leased, sweep_expired after the clock passed the leases, replay, discard, prune, and
writes with stale or forged lease tokens), keeps a model of each task (status, attempts,
lease, times, result), and after every step compares the whole table with it:

- every task enqueued is in the table unless a discard or prune that should have removed it
  did: none lost, none extra;
- each row's status is one of the five and the model's; a running row holds a complete lease,
  any other row holds none; a final row has finished_at, a live one has not;
- attempts stay within 0..max_attempts and only go down by replay (to 0) or release (which
  gives back the attempt its claim counted);
- a claim returns exactly the due tasks of its queues in (priority, created_at, id) order up
  to its limit, never a task that is not due, never one task twice, and two claimers at once
  never share a task; every claim issues a token never seen before;
- an illegal transition raises the documented error (``LeaseLost`` for a stale or forged
  lease, ``InvalidTaskState`` to cancel a finished task, ``TaskNotFound`` for an unknown id)
  and leaves the row exactly as it was.

The clock is injected with ``now=``: nothing sleeps. One database per test function (the
``database_url`` fixture); each run of the machine starts from an empty table.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row

import pgqueue

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
DAY = 24 * 3600.0
QUEUES = ("default", "other")
KEYS = ("k1", "k2", "k3")
STATUSES = {"queued", "running", "completed", "failed", "cancelled"}
FINAL = {"completed", "failed", "cancelled"}
MICROSECOND = timedelta(microseconds=1)
# The default retry policy (README): 1 s, doubling, capped at 300 s, up to half taken off.
BACKOFF_BASE, BACKOFF_FACTOR, BACKOFF_CAP = 1.0, 2.0, 300.0
LEASE_WRITES = ("complete", "fail", "cancel_leased", "heartbeat", "release", "complete_many")
UNKNOWN_ID = uuid.UUID("00000000-0000-7000-8000-000000000000")

# No shrink phase: shrinking a 30-step run against a database takes minutes (Hypothesis
# stops after 5), past pytest's 300 s timeout, while finding a failure takes seconds. A failure
# prints its whole run, step by step, and derandomize replays the very same run every time.
# To get a minimal one while debugging, add Phase.shrink here.
MACHINE_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


@dataclasses.dataclass
class Model:
    """What one task's row must hold."""

    id: uuid.UUID
    queue: str
    priority: int
    payload: dict[str, Any]
    key: str | None
    max_attempts: int
    created_at: datetime
    visible_after: datetime
    status: str = "queued"
    attempts: int = 0
    token: uuid.UUID | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    last_error: str | None = None
    last_error_is_prefix: bool = False  # the sweep's message: only its start is fixed

    @property
    def lease(self) -> pgqueue.Lease:
        assert self.token is not None
        return pgqueue.Lease(self.id, self.token)

    @property
    def claim_order(self) -> tuple[int, datetime, uuid.UUID]:
        return (self.priority, self.created_at, self.id)


class TaskLifecycle(RuleBasedStateMachine):
    """The model and the rules; a subclass per test function supplies the connections."""

    conn: ClassVar[psycopg.Connection[Any]]
    other: ClassVar[psycopg.Connection[Any]]  # a second session, for concurrent claims
    events: ClassVar[Counter[str]]  # what the runs exercised, checked after them

    def __init__(self) -> None:
        super().__init__()
        self.conn.execute("DELETE FROM pgqueue.tasks")
        self.now = T0
        self.tasks: dict[uuid.UUID, Model] = {}
        self.stale: list[pgqueue.Lease] = []  # leases their holder no longer holds
        self.tokens_issued: set[uuid.UUID] = set()
        self.serial = 0
        self.attempts_seen: dict[uuid.UUID, int] = {}
        self.may_decrease: set[uuid.UUID] = set()

    # --- helpers -----------------------------------------------------------------------------

    def row(self, task_id: uuid.UUID) -> dict[str, Any] | None:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pgqueue.tasks WHERE id = %s", (task_id,))
            return cur.fetchone()

    def running(self) -> list[Model]:
        return sorted((m for m in self.tasks.values() if m.status == "running"), key=by_id)

    def leases_to_come(self) -> list[datetime]:
        """Expiry instants of running tasks' leases not yet past."""
        return [
            m.lease_expires_at
            for m in self.running()
            if m.lease_expires_at is not None and m.lease_expires_at >= self.now
        ]

    def finished(self) -> list[Model]:
        return [m for m in self.tasks.values() if m.status in FINAL]

    def with_status(self, status: str) -> list[Model]:
        return [m for m in self.tasks.values() if m.status == status]

    def due(self, queues: Sequence[str]) -> list[Model]:
        ready = [
            m
            for m in self.tasks.values()
            if m.status == "queued" and m.queue in queues and m.visible_after <= self.now
        ]
        return sorted(ready, key=lambda m: m.claim_order)

    def holder_of(self, key: str | None) -> Model | None:
        if key is None:
            return None
        return next((m for m in self.tasks.values() if m.key == key), None)

    def holds_another_lease(self, lease: pgqueue.Lease) -> bool:
        m = self.tasks.get(lease.task_id)
        return m is not None and m.status == "running" and m.token != lease.token

    def end_lease(self, m: Model) -> None:
        """The holder's token is spent: from now on it is a stale lease."""
        self.stale.append(m.lease)
        m.token = m.owner = m.lease_expires_at = None

    def finish(self, m: Model, status: str) -> None:
        m.status = status
        m.finished_at = self.now

    def check_backoff(self, at: datetime, attempts: int) -> None:
        """A retry waits min(cap, base * factor^(n-1)) seconds, minus up to half of it."""
        longest = min(BACKOFF_CAP, BACKOFF_BASE * BACKOFF_FACTOR ** (attempts - 1))
        earliest = self.now + seconds(longest / 2) - MICROSECOND
        latest = self.now + seconds(longest) + MICROSECOND
        assert earliest <= at <= latest, (at, attempts, self.now)

    def draw_leases(self, data: st.DataObject) -> tuple[list[Model], list[pgqueue.Lease]]:
        """Some held leases and some stale ones, for the operations that take many."""
        running = self.running()
        held = (
            data.draw(st.lists(st.sampled_from(running), unique_by=by_id, max_size=3))
            if running
            else []
        )
        stale = (
            data.draw(st.lists(st.sampled_from(self.stale), unique=True, max_size=2))
            if self.stale
            else []
        )
        return held, stale

    def take(
        self,
        claimed: list[pgqueue.ClaimedTask],
        expected: list[Model] | None,
        queues: Sequence[str],
        worker: str,
        lease_seconds: float,
    ) -> None:
        """Check a claim's answer against the model (exactly ``expected`` when given, else
        any due tasks), then record the new leases."""
        ids = [c.id for c in claimed]
        assert len(set(ids)) == len(ids), f"one task handed out twice: {ids}"
        for c in claimed:
            m = self.tasks.get(c.id)
            assert m is not None, f"claimed a task nobody enqueued: {c.id}"
            assert m.status == "queued", f"claimed a {m.status} task"
            assert m.queue in queues, f"claimed from queue {m.queue!r}, asked for {queues}"
            assert m.visible_after <= self.now, "claimed a task before it was due"
        if expected is not None:
            wanted = {m.id for m in expected}
            assert set(ids) == wanted, "claim skipped a due task or overtook one"
        order = [(int(c.priority), c.created_at) for c in claimed]
        assert order == sorted(order), "claim answer not in (priority, created_at) order"
        for c in claimed:
            m = self.tasks[c.id]
            assert c.lease_token not in self.tokens_issued, "a lease token was issued twice"
            assert c.attempts == m.attempts + 1 <= m.max_attempts
            assert c.lease_expires_at == self.now + seconds(lease_seconds)
            assert (c.queue, int(c.priority), c.payload, c.max_attempts, c.created_at) == (
                m.queue,
                m.priority,
                m.payload,
                m.max_attempts,
                m.created_at,
            )
            self.tokens_issued.add(c.lease_token)
            m.status, m.attempts, m.started_at = "running", c.attempts, self.now
            m.token, m.owner, m.lease_expires_at = c.lease_token, worker, c.lease_expires_at
            self.events["claimed"] += 1
            if c.attempts > 1:
                self.events["claimed again"] += 1

    def do_claim(
        self, queues: Sequence[str], limit: int, worker: str, lease_seconds: float
    ) -> None:
        expected = self.due(queues)[:limit]
        claimed = pgqueue.claim(
            self.conn,
            list(queues),
            limit=limit,
            worker_id=worker,
            lease_seconds=lease_seconds,
            now=self.now,
        )
        self.take(claimed, expected, queues, worker, lease_seconds)

    def do_sweep(self) -> None:
        expired = [
            m for m in self.running() if m.lease_expires_at and m.lease_expires_at < self.now
        ]
        swept = pgqueue.sweep_expired(self.conn, now=self.now)
        cancelled = {m.id for m in expired if m.cancel_requested}
        dead = {m.id for m in expired if not m.cancel_requested and m.attempts >= m.max_attempts}
        requeued = {m.id for m in expired} - cancelled - dead
        assert (set(swept.requeued), set(swept.dead), set(swept.cancelled)) == (
            requeued,
            dead,
            cancelled,
        )
        assert swept.total == len(expired)
        for m in expired:
            self.end_lease(m)
            m.last_error = f"lease expired on attempt {m.attempts} of {m.max_attempts}"
            m.last_error_is_prefix = True
            if m.id in cancelled:
                self.finish(m, "cancelled")
            elif m.id in dead:
                self.finish(m, "failed")
                self.events["dead by sweep"] += 1
            else:
                m.status, m.finished_at = "queued", None
                stored = self.row(m.id)
                assert stored is not None
                self.check_backoff(stored["visible_after"], m.attempts)
                m.visible_after = stored["visible_after"]
                self.events["requeued by sweep"] += 1

    def new_model(self, result: pgqueue.EnqueueResult, args: dict[str, Any]) -> Model:
        delay = args.get("delay") or 0
        return Model(
            id=result.id,
            queue=args["queue"],
            priority=args["priority"],
            payload=args["payload"],
            key=args.get("idempotency_key"),
            max_attempts=args["max_attempts"],
            created_at=self.now,
            visible_after=self.now + seconds(delay),
        )

    # --- producing ---------------------------------------------------------------------------

    task_arguments = st.fixed_dictionaries(
        {
            "priority": st.sampled_from([0, 1, 2]),
            "queue": st.sampled_from(QUEUES),
            "idempotency_key": st.sampled_from([None, None, *KEYS]),
            "delay": st.sampled_from([None, 0, 5, 60]),
            "max_attempts": st.sampled_from([1, 2, 3]),
        }
    )

    @rule(args=task_arguments, one_by_one=st.booleans())
    def enqueue(self, args: dict[str, Any], one_by_one: bool) -> None:
        self.serial += 1
        args = {"type": "job", "payload": {"n": self.serial}, **args}
        holder = self.holder_of(args["idempotency_key"])
        if one_by_one:
            result = pgqueue.enqueue(self.conn, **args, now=self.now)
        else:
            [result] = pgqueue.enqueue_many(self.conn, [args], now=self.now)
        if holder is not None:
            assert not result.created, "a used idempotency key created a second task"
            assert result.id == holder.id
            assert result.task.status == holder.status
            assert result.task.payload == holder.payload
            self.events["idempotent repeat"] += 1
            return
        assert result.created
        assert result.id not in self.tasks
        self.tasks[result.id] = self.new_model(result, args)

    @initialize(batch=st.lists(task_arguments, min_size=2, max_size=6))
    def start_with_some_tasks(self, batch: list[dict[str, Any]]) -> None:
        self.enqueue_many(batch)

    @rule(batch=st.lists(task_arguments, min_size=1, max_size=4))
    def enqueue_many(self, batch: list[dict[str, Any]]) -> None:
        items = []
        for args in batch:
            self.serial += 1
            items.append({"type": "job", "payload": {"n": self.serial}, **args})
        results = pgqueue.enqueue_many(self.conn, items, now=self.now)
        assert len(results) == len(items)
        for args, result in zip(items, results, strict=True):
            holder = self.holder_of(args["idempotency_key"])
            if holder is not None:
                assert not result.created and result.id == holder.id
                continue
            assert result.created and result.id not in self.tasks
            self.tasks[result.id] = self.new_model(result, args)

    # --- working -----------------------------------------------------------------------------

    @rule(
        queues=st.sampled_from([("default",), ("other",), QUEUES]),
        limit=st.integers(1, 3),
        worker=st.sampled_from(["w1", "w2"]),
        lease_seconds=st.sampled_from([10.0, 30.0]),
    )
    def claim(self, queues: tuple[str, ...], limit: int, worker: str, lease_seconds: float) -> None:
        self.do_claim(queues, limit, worker, lease_seconds)

    @rule(limit_a=st.integers(1, 2), limit_b=st.integers(1, 2))
    def claim_from_two_sessions_at_once(self, limit_a: int, limit_b: int) -> None:
        """B claims while A's claim is uncommitted: they never share a task.

        A, uncontended, gets exactly the first due tasks. B gets due tasks A did not take,
        but not necessarily the next ones in order: A's walk of each queue locks the first
        ``limit_a`` due rows of that queue until it commits, taken or not, and SKIP LOCKED
        passes them (ordering is best effort, README)."""
        due = self.due(QUEUES)
        with self.conn.transaction():
            a = pgqueue.claim(self.conn, list(QUEUES), limit=limit_a, worker_id="a", now=self.now)
            with self.other.transaction():
                b = pgqueue.claim(
                    self.other, list(QUEUES), limit=limit_b, worker_id="b", now=self.now
                )
        assert not {t.id for t in a} & {t.id for t in b}, "two holders for one task"
        self.take(a, due[:limit_a], QUEUES, "a", 30.0)
        assert len(b) <= limit_b
        self.take(b, None, QUEUES, "b", 30.0)

    @precondition(lambda self: self.running())
    @rule(
        data=st.data(),
        result=st.one_of(
            st.none(), st.integers(), st.dictionaries(st.sampled_from("ab"), st.integers())
        ),
    )
    def complete(self, data: st.DataObject, result: Any) -> None:
        m = data.draw(st.sampled_from(self.running()), label="task")
        pgqueue.complete(self.conn, m.lease, result, now=self.now)
        self.end_lease(m)
        self.finish(m, "completed")
        m.result = result
        self.events["completed"] += 1

    @precondition(lambda self: self.running() or self.stale)
    @rule(data=st.data())
    def complete_many(self, data: st.DataObject) -> None:
        held, stale = self.draw_leases(data)
        leases = data.draw(st.permutations([m.lease for m in held] + stale))
        done = pgqueue.complete_many(self.conn, [(lease, "ok") for lease in leases], now=self.now)
        assert done == {m.id for m in held}, "complete_many and the held leases disagree"
        for m in held:
            self.end_lease(m)
            self.finish(m, "completed")
            m.result = "ok"

    @precondition(lambda self: self.running())
    @rule(data=st.data(), retry_after=st.sampled_from([None, None, 0.0, 7.5]))
    def fail(self, data: st.DataObject, retry_after: float | None) -> None:
        m = data.draw(st.sampled_from(self.running()), label="task")
        outcome = pgqueue.fail(self.conn, m.lease, "boom", retry_after=retry_after, now=self.now)
        assert (outcome.task_id, outcome.attempts) == (m.id, m.attempts)
        self.end_lease(m)
        m.last_error, m.last_error_is_prefix = "boom", False
        if m.cancel_requested:
            assert (outcome.outcome, outcome.retry_at) == (pgqueue.FailOutcome.CANCELLED, None)
            self.finish(m, "cancelled")
        elif m.attempts >= m.max_attempts:
            assert (outcome.outcome, outcome.retry_at) == (pgqueue.FailOutcome.DEAD, None)
            self.finish(m, "failed")
            self.events["dead by fail"] += 1
        else:
            assert outcome.outcome is pgqueue.FailOutcome.RETRYING
            assert outcome.retry_at is not None
            if retry_after is None:
                self.check_backoff(outcome.retry_at, m.attempts)
            else:
                assert outcome.retry_at == self.now + seconds(retry_after)
            m.status, m.finished_at, m.visible_after = "queued", None, outcome.retry_at
            self.events["retrying"] += 1

    @precondition(lambda self: self.running() or self.stale)
    @rule(data=st.data(), lease_seconds=st.sampled_from([10.0, 60.0]))
    def heartbeat(self, data: st.DataObject, lease_seconds: float) -> None:
        held, stale = self.draw_leases(data)
        leases = data.draw(st.permutations([m.lease for m in held] + stale))
        beat = pgqueue.heartbeat(self.conn, leases, lease_seconds=lease_seconds, now=self.now)
        assert beat.held == {m.id: self.now + seconds(lease_seconds) for m in held}
        assert beat.cancel_requested == {m.id for m in held if m.cancel_requested}
        for m in held:
            m.lease_expires_at = self.now + seconds(lease_seconds)

    @precondition(lambda self: self.running() or self.stale)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held, stale = self.draw_leases(data)
        leases = data.draw(st.permutations([m.lease for m in held] + stale))
        released = pgqueue.release(self.conn, leases, now=self.now)
        assert released == {m.id for m in held}
        for m in held:
            self.end_lease(m)
            m.attempts = max(m.attempts - 1, 0)  # the claim's attempt is given back
            self.may_decrease.add(m.id)
            m.started_at, m.visible_after = None, self.now
            if m.cancel_requested:
                self.finish(m, "cancelled")
            else:
                m.status, m.finished_at = "queued", None
            self.events["released"] += 1

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def cancel_leased(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.running()), label="task")
        pgqueue.cancel_leased(self.conn, m.lease, "stopped", now=self.now)
        self.end_lease(m)
        self.finish(m, "cancelled")
        m.last_error, m.last_error_is_prefix = "stopped", False

    # --- time and maintenance ----------------------------------------------------------------

    @rule(step=st.sampled_from([1, 5, 11, 31, 61, 301, 3600, 2 * DAY, 15 * DAY]))
    def advance_clock(self, step: float) -> None:
        self.now += seconds(step)

    @precondition(lambda self: self.running())
    @rule()
    def sweep_expired(self) -> None:
        self.do_sweep()

    @precondition(lambda self: self.leases_to_come())
    @rule()
    def sweep_at_the_instant_a_lease_expires(self) -> None:
        """A lease holds until its expiry instant inclusive: the sweep takes it after."""
        self.now = min(self.leases_to_come())
        self.do_sweep()
        self.events["swept at an expiry instant"] += 1

    @precondition(lambda self: self.running())
    @rule(limit=st.integers(1, 3), operation=st.sampled_from(LEASE_WRITES))
    def lose_leases_to_the_sweep_then_reclaim(self, limit: int, operation: str) -> None:
        """Workers stop renewing: past every lease the sweep takes the tasks back, after the
        longest backoff other workers claim them, and a first holder, waking up, writes
        with its old token."""
        old = [m.lease for m in self.running()]
        latest = max(m.lease_expires_at for m in self.running() if m.lease_expires_at)
        self.now = max(self.now, latest) + seconds(1)
        self.do_sweep()
        self.now += seconds(BACKOFF_CAP + 1)
        self.do_claim(QUEUES, limit, "w3", 30.0)
        for lease in old:
            if self.holds_another_lease(lease):
                self.refused_without_a_trace(lease, operation)
                self.events["stale lease refused on a re-claimed task"] += 1

    @precondition(lambda self: self.finished())
    @rule(data=st.data(), by_id=st.booleans())
    def replay(self, data: st.DataObject, by_id: bool) -> None:
        dead = {m.id for m in self.with_status("failed")}
        ids: list[uuid.UUID] | None = None
        expected = dead
        if by_id:
            candidates = [*sorted(self.tasks), UNKNOWN_ID]
            ids = data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3))
            expected = dead & set(ids)
        replayed = pgqueue.replay(self.conn, ids, now=self.now)
        assert len(replayed) == len(set(replayed))
        assert set(replayed) == expected, "replay and the dead letters disagree"
        for task_id in replayed:
            m = self.tasks[task_id]
            m.status, m.attempts, m.visible_after = "queued", 0, self.now
            m.finished_at = m.started_at = m.result = None
            m.cancel_requested = False
            self.may_decrease.add(task_id)
            self.events["replayed"] += 1

    @precondition(lambda self: self.finished())
    @rule(data=st.data(), by_id=st.booleans())
    def discard(self, data: st.DataObject, by_id: bool) -> None:
        dead = {m.id for m in self.with_status("failed")}
        ids: list[uuid.UUID] | None = None
        expected = dead
        if by_id:
            candidates = [*sorted(self.tasks), UNKNOWN_ID]
            ids = data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3))
            expected = dead & set(ids)
        discarded = pgqueue.discard(self.conn, ids)
        assert len(discarded) == len(set(discarded))
        assert set(discarded) == expected, "discard and the dead letters disagree"
        for task_id in discarded:
            del self.tasks[task_id]
            self.events["discarded"] += 1

    @precondition(lambda self: self.finished())
    @rule(
        data=st.data(),
        completed_after=st.sampled_from([0.0, 60.0, DAY]),
        dead_after=st.sampled_from([0.0, 60.0, 14 * DAY]),
        on_the_boundary=st.booleans(),
    )
    def prune(
        self, data: st.DataObject, completed_after: float, dead_after: float, on_the_boundary: bool
    ) -> None:
        """Finished tasks older than their retention go, the others stay. On the boundary,
        the retention is exactly one task's age: it is not older, so it stays."""
        if on_the_boundary:
            m = data.draw(st.sampled_from(sorted(self.finished(), key=by_id)), label="task")
            assert m.finished_at is not None
            age = (self.now - m.finished_at).total_seconds()
            if m.status == "failed":
                dead_after = age
            else:
                completed_after = age
        doomed = {
            m.id
            for m in self.tasks.values()
            if m.finished_at is not None
            and (
                (
                    m.status in ("completed", "cancelled")
                    and m.finished_at < self.now - seconds(completed_after)
                )
                or (m.status == "failed" and m.finished_at < self.now - seconds(dead_after))
            )
        }
        pruned = pgqueue.prune(
            self.conn, completed_after=completed_after, dead_after=dead_after, now=self.now
        )
        assert pruned == len(doomed)
        for task_id in doomed:  # which ones went is checked by the invariant
            del self.tasks[task_id]
            self.events["pruned"] += 1

    # --- illegal transitions -----------------------------------------------------------------

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        groups = {
            "queued": sorted(m.id for m in self.with_status("queued")),
            "running": [m.id for m in self.running()],
            "finished": sorted(m.id for m in self.finished()),
            "unknown": [UNKNOWN_ID],
        }
        group = data.draw(st.sampled_from([g for g, ids in groups.items() if ids]))
        self.cancel_one(data.draw(st.sampled_from(groups[group]), label="task"))

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def cancel_while_running(self, data: st.DataObject) -> None:
        """A cancel of a running task, a rule of its own: the draw among all the groups
        above reaches it or not depending on the generator's version."""
        self.cancel_one(data.draw(st.sampled_from([m.id for m in self.running()]), label="task"))

    def cancel_one(self, target: uuid.UUID) -> None:
        if target == UNKNOWN_ID:
            with pytest.raises(pgqueue.TaskNotFound):
                pgqueue.cancel(self.conn, target, now=self.now)
            with pytest.raises(pgqueue.TaskNotFound):
                pgqueue.get_task(self.conn, target)
            return
        m = self.tasks[target]
        if m.status in FINAL:
            before = self.row(target)
            with pytest.raises(pgqueue.InvalidTaskState) as info:
                pgqueue.cancel(self.conn, target, now=self.now)
            assert (info.value.task_id, info.value.status) == (target, m.status)
            assert self.row(target) == before, "a refused cancel changed the row"
            self.events["cancel refused"] += 1
            return
        task = pgqueue.cancel(self.conn, target, now=self.now)
        m.cancel_requested = True
        if m.status == "queued":
            self.finish(m, "cancelled")
        else:
            self.events["cancel requested while running"] += 1
        assert (task.id, task.status, task.cancel_requested) == (target, m.status, True)

    @precondition(lambda self: self.tasks)
    @rule(
        data=st.data(),
        operation=st.sampled_from(LEASE_WRITES),
    )
    def write_with_a_lease_not_held(self, data: st.DataObject, operation: str) -> None:
        """A stale token (the holder's lease was swept, or its task finished) or a forged
        one: the write is refused, and the row stays exactly as it was."""
        self.serial += 1
        reclaimed = [lease for lease in self.stale if self.holds_another_lease(lease)]
        groups = {
            "stale, task re-claimed": reclaimed,
            "stale": self.stale,
            "forged": [pgqueue.Lease(i, uuid.UUID(int=self.serial)) for i in sorted(self.tasks)],
        }
        group = data.draw(st.sampled_from([g for g, leases in groups.items() if leases]))
        lease = data.draw(st.sampled_from(groups[group]), label="lease")
        self.refused_without_a_trace(lease, operation)
        if group == "stale, task re-claimed":
            self.events["stale lease refused on a re-claimed task"] += 1

    def refused_without_a_trace(self, lease: pgqueue.Lease, operation: str) -> None:
        """``operation`` with a lease not held: LeaseLost (or nothing held, for the batch
        operations), and the row exactly as it was."""
        before = self.row(lease.task_id)
        note(f"{operation} with {lease}, row status {before and before['status']}")
        if operation in ("complete", "fail", "cancel_leased"):
            with pytest.raises(pgqueue.LeaseLost) as info:
                if operation == "complete":
                    pgqueue.complete(self.conn, lease, {"stale": True}, now=self.now)
                elif operation == "fail":
                    pgqueue.fail(self.conn, lease, "stale", now=self.now)
                else:
                    pgqueue.cancel_leased(self.conn, lease, "stale", now=self.now)
            assert info.value.task_id == lease.task_id
        elif operation == "heartbeat":
            beat = pgqueue.heartbeat(self.conn, [lease], lease_seconds=3600, now=self.now)
            assert (beat.held, beat.cancel_requested) == ({}, set())
        elif operation == "release":
            assert pgqueue.release(self.conn, [lease], now=self.now) == set()
        else:
            assert pgqueue.complete_many(self.conn, [(lease, "stale")], now=self.now) == set()
        assert self.row(lease.task_id) == before, f"a {operation} with a lost lease wrote"
        self.events["lease not held refused"] += 1

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def table_matches_the_model(self) -> None:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pgqueue.tasks")
            rows = {r["id"]: r for r in cur.fetchall()}
        lost = set(self.tasks) - set(rows)
        assert not lost, f"tasks lost: {[self.tasks[i] for i in lost]}"
        extra = set(rows) - set(self.tasks)
        assert not extra, f"rows nobody enqueued (or that should be gone): {extra}"

        tokens = [r["lease_token"] for r in rows.values() if r["lease_token"] is not None]
        assert len(tokens) == len(set(tokens)), "one lease token on two tasks"
        keys = [r["idempotency_key"] for r in rows.values() if r["idempotency_key"] is not None]
        assert len(keys) == len(set(keys))

        for task_id, r in rows.items():
            m = self.tasks[task_id]
            assert r["status"] in STATUSES
            assert r["status"] == m.status, (m, r)
            if r["status"] == "running":
                assert None not in (r["lease_token"], r["lease_expires_at"], r["lease_owner"])
            else:
                assert (r["lease_token"], r["lease_expires_at"], r["lease_owner"]) == (
                    None,
                    None,
                    None,
                ), f"a {r['status']} task holds a lease"
            assert (r["finished_at"] is not None) == (r["status"] in FINAL)
            assert 0 <= r["attempts"] <= r["max_attempts"], r
            stored = {
                "attempts": r["attempts"],
                "max_attempts": r["max_attempts"],
                "token": r["lease_token"],
                "owner": r["lease_owner"],
                "lease_expires_at": r["lease_expires_at"],
                "cancel_requested": r["cancel_requested"],
                "visible_after": r["visible_after"],
                "started_at": r["started_at"],
                "finished_at": r["finished_at"],
                "result": r["result"],
                "queue": r["queue"],
                "priority": r["priority"],
                "payload": r["payload"],
                "key": r["idempotency_key"],
                "created_at": r["created_at"],
            }
            wanted = {name: getattr(m, name) for name in stored}
            assert stored == wanted, f"row and model differ for {task_id}"
            if m.last_error_is_prefix:
                assert m.last_error is not None and r["last_error"].startswith(m.last_error)
            else:
                assert r["last_error"] == m.last_error
            previous = self.attempts_seen.get(task_id)
            if previous is not None and r["attempts"] < previous:
                assert task_id in self.may_decrease, "attempts went down without replay/release"
        self.attempts_seen = {task_id: r["attempts"] for task_id, r in rows.items()}
        self.may_decrease.clear()


def by_id(m: Model) -> uuid.UUID:
    return m.id


def test_task_rows_follow_the_model_under_any_sequence_of_operations(database_url: str) -> None:
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as other,
    ):
        for session in (conn, other):
            # Durability is not under test; commits are, and they stay atomic and visible.
            session.execute("SET synchronous_commit = off")

        class OnThisDatabase(TaskLifecycle):
            pass

        OnThisDatabase.conn, OnThisDatabase.other = conn, other
        OnThisDatabase.events = Counter()
        run_state_machine_as_test(OnThisDatabase, settings=MACHINE_SETTINGS)

    # Guard against a vacuous run: the interesting paths were all taken.
    events = OnThisDatabase.events
    for what in (
        "claimed again",
        "completed",
        "retrying",
        "dead by fail",
        "dead by sweep",
        "requeued by sweep",
        "released",
        "replayed",
        "discarded",
        "pruned",
        "idempotent repeat",
        "cancel requested while running",
        "cancel refused",
        "stale lease refused on a re-claimed task",
        "swept at an expiry instant",
    ):
        assert events[what] > 0, f"no run exercised {what!r}: {events}"
