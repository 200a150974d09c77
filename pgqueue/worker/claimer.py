"""The claim loop: as many ready tasks as there are free slots, in one statement.

It wakes on a NOTIFY from an enqueue (through the listener), on a freed slot, or on a poll,
the fallback that also finds scheduled tasks come due, which nothing announces. Each claim
walks the claim index from where this worker's claims got to (claim_starts.py), and is
marked started (one row of the worker's own, lease_starts_mark) just before the runner starts
what it claimed, so that an attempt counts from the handler's start, not from the claim.

How long it sleeps between polls (:class:`PollSchedule`):

- **With notifications** (a listener, and producers that send NOTIFY), the poll is only the
  fallback: every ``poll_interval``, jittered by ±20% so that workers started together do not
  poll together.
- **Without** (behind a transaction pooler with no ``listen_url``, or ``PGQUEUE_NOTIFY=off``),
  polls adapt to the traffic: POLL_AFTER_WORK (20 ms) after a claim that found tasks, then
  POLL_GROWTH (x1.5) longer after each claim that found none, up to ``poll_interval``, each
  jittered by ±20%. Tasks that keep coming are picked up within a fraction of the gap between
  them, since the sleep is about half the time since the last task was found: at 20 tasks/s
  arriving at random (Poisson), a simulation of this schedule gives a pickup of 19 ms median
  and 91 ms p99, for 29 polls/s (x2 from 20 ms: 23 and 158 ms; from 10 ms: 13 and 87 ms for
  43 polls/s). An idle worker is back at one poll per ``poll_interval`` after about 1.2 s (8
  empty polls), which is what every worker pays today. bench/pooler_latency.py measures both.
  Without a listener the claim cursor also has nobody to tell it of released dependants: see
  claim_starts.py (``rescan_seconds`` 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from pgqueue.key_rotation import KeyRotation
from pgqueue.log import event
from pgqueue.models import ClaimedTask
from pgqueue.queries.claiming import ClaimStarts as Starts
from pgqueue.queries.claiming import (
    LimitsProbe,
    claim_round,
    lease_starts_mark,
    limits_probe,
    task_claim,
)
from pgqueue.queries.dependencies import task_parents_many
from pgqueue.queries.driver import arun
from pgqueue.queries.leased import task_heartbeat
from pgqueue.queries.task_types import TypeDeclaration, task_types_declare
from pgqueue.worker.claim_starts import ClaimStarts
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.metrics import WorkerMetrics
from pgqueue.worker.state import Slots, StopRequest

# A worker that saw no limits and no keyed tasks takes the one-statement claim, and looks
# for them again this often (a worker that saw some looks at every claim), and after a claim
# that found fewer tasks than it asked for, no more often than SHORTFALL_RECHECK_SECONDS: a
# task with a concurrency key, which the ordinary claim leaves alone, is then picked up at
# once by a worker that has a free slot, not at the next look.
LIMITS_RECHECK_SECONDS = 1.0
SHORTFALL_RECHECK_SECONDS = 0.05
# Adaptive polling (see the module's docstring): the sleep after a claim that found tasks, and
# how much longer each sleep after a claim that found none, up to the poll interval.
POLL_AFTER_WORK = 0.02
POLL_GROWTH = 1.5
POLL_JITTER = 0.2
# The shortest sleep before a rate limit's next start (claims a little past it, never a
# busy loop on a bucket that is just about to refill).
RATE_WAIT_FLOOR = 0.002
# A claim and its start mark that took this share of the lease or more are checked: were the
# leases taken back meanwhile (see Claimer._still_held)?
LEASE_DOUBT = 0.5


class Claimer:
    """Claims and hands each task to ``start`` (the runner); ``run`` is the loop, which ends
    when a stop is requested, and ``free_slots`` and ``claim_once`` its steps."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        db: Database,
        metrics: WorkerMetrics,
        slots: Slots,
        stop: StopRequest,
        start: Callable[[ClaimedTask], None],
        declarations: Sequence[TypeDeclaration] = (),
        adaptive: bool = False,
    ) -> None:
        self._config = config
        self._db = db
        self._metrics = metrics
        self._slots = slots
        self._running = slots.running
        self._pending = slots.pending
        self._stop = stop
        self._start = start
        self._declarations = list(declarations)
        self._limits_checked = -LIMITS_RECHECK_SECONDS
        self._look_due = False  # the last ordinary claim left a look to make
        self._marked = False
        # Set once the first claim statement has returned (or failed): what can wait for it
        # waits (maintenance, the pool's growth), so that it does not compete with the first
        # claim for connections. Not the start mark after it: a mark that waits on a lock
        # would then hold back the very sweep that takes such a claim back.
        self.first_claim_tried = asyncio.Event()
        self.polls = PollSchedule(config.poll_interval, adaptive=adaptive)
        # Without notifications no release is announced either: walk from the start whenever
        # that is cheap (claim_starts.py's FULL_WALK_SPACING still bounds its cost).
        rescan = 0.0 if adaptive else config.poll_interval
        self.starts = ClaimStarts(rescan, config.lease_seconds)
        self.rotation = KeyRotation()
        self._keyed = False  # keyed tasks waited at the last look
        # Seconds until a rate limit's empty token bucket holds a start again, as the last
        # claim round saw it (None: no bucket was empty): nothing announces that moment.
        self._rate_wait: float | None = None

    async def run(self) -> None:
        cfg = self._config
        while not self._stop.stopping:
            free = self.free_slots()
            if free <= 0:
                self._slots.slot_freed.clear()
                await self._slots.slot_freed.wait()
                continue
            want = min(free, cfg.max_claim_batch)
            claimed = await self.claim_once(want)
            if claimed is None:  # database trouble: back off a little, then poll again
                await self._sleep_or_wake(min(cfg.poll_interval, 1.0))
                continue
            if self._stop.stopping:
                break
            if len(claimed) == want or (claimed and self._keyed):
                # Probably more waiting; or keys are taking turns, and a claim that visited
                # as many keys as it may can leave tasks of keys further on.
                self.polls.found()
                continue
            sleep = self.polls.after(len(claimed))
            if self._rate_wait is not None:
                sleep = min(sleep, max(self._rate_wait, RATE_WAIT_FLOOR))
            await self._sleep_or_wake(sleep)

    def free_slots(self) -> int:
        """Completions waiting to be written still hold leases: past one batch of them, they
        count against the slots, so a slow database slows claiming down instead of letting
        the worker pile up leases (and heartbeat work) without bound."""
        concurrency = self._config.concurrency
        backlog = max(0, len(self._pending) - concurrency)
        return concurrency - len(self._running) - backlog

    async def claim_once(self, want: int) -> list[ClaimedTask] | None:
        """Claim up to ``want`` tasks and start each; None after a database error (nothing
        was claimed; the next call waits out its backoff)."""
        self._slots.wake.clear()  # before the claim, so a NOTIFY during it is not missed
        claimed = await self._db.call(
            "claimer", lambda c: self._metrics.claim_timed(self._claim(c, want)), attempts=1
        )
        self.first_claim_tried.set()
        if claimed is None:
            return None
        for task in claimed:
            self._start(task)
        if self._look_due and not self._stop.stopping:
            # After the start of what the ordinary claim took, not before: the look is a
            # statement more, and an idle worker's pickup would otherwise wait for it.
            self._look_due = False
            rest = want - len(claimed)
            more = await self._db.call(
                "claimer",
                lambda c: self._metrics.claim_timed(self._claim(c, rest, looking=True)),
                attempts=1,
            )
            for task in more or ():
                self._start(task)
            claimed += more or []
        return claimed

    async def _claim(self, conn: Any, want: int, *, looking: bool = False) -> list[ClaimedTask]:
        """One claim, then the start mark of what it claimed (lease_starts_mark), so that a
        worker killed in between gives the attempts back. Where no limit existed at the last look,
        the ordinary claim alone, one statement: it leaves limited tasks alone anyway, so a
        limit set since then is never broken, only its tasks wait until the next look
        (LIMITS_RECHECK_SECONDS at most). Otherwise the claim that honours the limits, in a
        transaction of its own (it takes the limits lock). ``looking``: the look an ordinary
        claim left due, once what it claimed has started (_look), and, only when keyed or
        limited tasks wait, a claim round for the ``want`` slots still free."""
        if not self._marked:
            # The worker's row before its first claim (a mark from -infinity): without it, a
            # worker killed between its first claim and its first mark would count those
            # attempts (an owner without a row is counted, the safe side).
            await arun(conn, lease_starts_mark(self._config.worker_id, started=False))
            # The registry's task types, before the first claim: enqueue applies them from
            # now on, and this worker's claims apply them to tasks enqueued before.
            if self._declarations:
                await arun(conn, task_types_declare(self._config.worker_id, self._declarations))
            self._marked = True
        probe = None
        if looking:
            probe = await self._look(conn)
            if want <= 0 or not (probe.keyed or probe.waiting):
                return []
        starts = self.starts.next()
        began = time.monotonic()
        if probe is not None:
            args = self._claim_args(want, starts)
            claimed = await self._claim_round(conn, args, began, probed=probe)
        else:
            claimed = await self._claim_from(conn, want, starts)
        self.first_claim_tried.set()
        unkeyed = [t for t in claimed if t.concurrency_key is None]
        self.starts.claimed(unkeyed, starts=starts, seconds=time.monotonic() - began)
        if len(unkeyed) < len(claimed):
            self.rotation.claimed(claimed)
        if not claimed:
            return claimed
        with_parents = [t.id for t in claimed if t.has_parents]
        if with_parents:  # One query per claimed batch, only for tasks with parents
            parents = await arun(conn, task_parents_many(with_parents))
            claimed = [
                dataclasses.replace(t, parents=parents.get(t.id, ())) if t.has_parents else t
                for t in claimed
            ]
        # A failure here raises: nothing starts, and the leases, never marked, expire into
        # the queue without costing an attempt.
        keyed = len(unkeyed) < len(claimed)
        await arun(conn, lease_starts_mark(self._config.worker_id, durable=keyed))
        if time.monotonic() - began >= self._config.lease_seconds * LEASE_DOUBT:
            claimed = await self._still_held(conn, claimed)
        return claimed

    async def _still_held(self, conn: Any, claimed: list[ClaimedTask]) -> list[ClaimedTask]:
        """The claimed tasks whose leases this worker still holds, renewed.

        Only asked when the claim and its start mark took a good part of the lease (the
        process was stopped or starved between them): the sweep may then have taken a lease
        back as never started, giving its attempt back, and another worker may run it now.
        Starting it here as well would be an execution no attempt counts. Once the mark is
        written, a later sweep counts the attempt, so one look after the mark is enough."""
        held = await arun(
            conn, task_heartbeat([t.lease for t in claimed], self._config.lease_seconds)
        )
        for task in claimed:
            if task.id not in held.held:
                event(
                    "task.lease_lost",
                    logging.WARNING,
                    task_id=task.id,
                    type=task.type,
                    attempt=task.attempts,
                    note="lost between its claim and its start; not started here",
                )
        return [t for t in claimed if t.id in held.held]

    async def _claim_from(self, conn: Any, want: int, starts: Starts | None) -> list[ClaimedTask]:
        """The ordinary claim alone where no limit and no keyed task was seen at the last
        look; otherwise claim_round, in a transaction of its own (it probes, takes the limits
        lock where it must, and claims under the limits and in turns of the keys). An
        ordinary claim leaves a look due (claim_once makes it, once what it claimed has
        started) every LIMITS_RECHECK_SECONDS, and after a claim that found fewer tasks than
        it asked for, no more often than SHORTFALL_RECHECK_SECONDS."""
        args = self._claim_args(want, starts)
        now = time.monotonic()
        self._rate_wait = None
        if self._slots.limited:
            return await self._claim_round(conn, args, now)
        claimed = await arun(conn, task_claim(**args))
        since = now - self._limits_checked
        self._look_due = since >= LIMITS_RECHECK_SECONDS or (
            len(claimed) < want and since >= SHORTFALL_RECHECK_SECONDS
        )
        return claimed

    async def _look(self, conn: Any) -> LimitsProbe:
        """A probe for limits and keyed tasks, without the lock and outside any transaction.
        What it finds decides the next claims (with limits or keyed tasks, each is a claim
        round), and _claim makes a claim round for the slots still free if some wait."""
        probe = await arun(conn, limits_probe(self._config.queues))
        self._note(probe, time.monotonic())
        return probe

    def _claim_args(self, want: int, starts: Starts | None) -> dict[str, Any]:
        cfg = self._config
        return {
            "queues": cfg.queues,
            "limit": want,
            "owner": cfg.worker_id,
            "lease_seconds": cfg.lease_seconds,
            "starts": starts,
        }

    async def _claim_round(
        self, conn: Any, args: dict[str, Any], now: float, probed: LimitsProbe | None = None
    ) -> list[ClaimedTask]:
        round_ = claim_round(**args, rotation=self.rotation.current(), probed=probed)
        claimed, probe = await arun(conn, round_, atomic=True)
        self._note(probe, now)
        return claimed

    def _note(self, probe: LimitsProbe, now: float) -> None:
        """What the last look found: with limits or keyed tasks, every claim looks again."""
        self._slots.limited, self._limits_checked = probe.limited or probe.keyed, now
        self._keyed = probe.keyed
        self._rate_wait = probe.rate_wait

    async def _sleep_or_wake(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._slots.wake.wait()


class PollSchedule:
    """The claimer's sleeps between polls (see the module's docstring); pure bookkeeping.

    ``adaptive`` False: ``poll_interval``, jittered. True: POLL_AFTER_WORK after a claim
    that found tasks, POLL_GROWTH times the last sleep after one that found none, at most
    ``poll_interval``; jittered likewise."""

    def __init__(
        self,
        poll_interval: float,
        *,
        adaptive: bool,
        jitter: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.poll_interval = poll_interval
        self.adaptive = adaptive
        self._jitter = jitter
        self._sleep = poll_interval  # an idle start: nothing found yet

    def found(self) -> None:
        """A claim found tasks: the next sleep is the shortest."""
        self._sleep = min(POLL_AFTER_WORK, self.poll_interval)

    def after(self, found: int) -> float:
        """The sleep after a claim that found ``found`` tasks (fewer than it asked for)."""
        if not self.adaptive:
            base = self.poll_interval
        elif found:
            self.found()
            base = self._sleep
        else:
            base = self._sleep = min(self._sleep * POLL_GROWTH, self.poll_interval)
        return base * self._jitter(1 - POLL_JITTER, 1 + POLL_JITTER)
