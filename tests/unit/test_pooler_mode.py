"""The worker behind a transaction-mode pooler, without a database: the claimer's poll schedule,
the claim cursor's rescans, the poll of running tasks' cancel flags, what the worker resolves
and what its connections and children are given."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgqueue.errors import ValidationError
from pgqueue.executor import TaskContext
from pgqueue.models import ClaimedTask, Priority
from pgqueue.registry import TaskRegistry
from pgqueue.worker import Worker, WorkerConfig
from pgqueue.worker.cancels import CancelPoll, Cancels
from pgqueue.worker.claim_starts import ClaimStarts
from pgqueue.worker.claimer import POLL_AFTER_WORK, POLL_GROWTH, PollSchedule
from pgqueue.worker.state import Running, Slots

URL = "postgresql://app@pooler.invalid:6432/app"
DIRECT = "postgresql://app@primary.invalid:5432/app"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_pooler_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGQUEUE_POOLER", "PGQUEUE_LISTEN_URL", "PGQUEUE_NOTIFY"):
        monkeypatch.delenv(name, raising=False)


def exact(low: float, high: float) -> float:
    return 1.0  # no jitter


# --- the poll schedule ------------------------------------------------------------------------


def test_with_notifications_the_claimer_polls_every_poll_interval_whatever_it_found() -> None:
    polls = PollSchedule(0.5, adaptive=False, jitter=exact)
    assert [polls.after(n) for n in (3, 0, 0, 1)] == [0.5] * 4


def test_without_notifications_polls_start_short_after_work_and_back_off_to_the_interval() -> None:
    polls = PollSchedule(0.5, adaptive=True, jitter=exact)
    assert polls.after(0) == 0.5  # idle from the start
    assert polls.after(2) == POLL_AFTER_WORK
    sleeps = [polls.after(0) for _ in range(12)]
    assert sleeps[0] == pytest.approx(POLL_AFTER_WORK * POLL_GROWTH)
    assert all(b == pytest.approx(min(a * POLL_GROWTH, 0.5)) for a, b in itertools.pairwise(sleeps))
    assert sleeps[-1] == 0.5
    polls.found()  # a full batch: claimed again at once, and short after that
    assert polls.after(0) == pytest.approx(POLL_AFTER_WORK * POLL_GROWTH)


def test_a_poll_interval_shorter_than_the_first_sleep_wins() -> None:
    polls = PollSchedule(0.01, adaptive=True, jitter=exact)
    assert polls.after(1) == 0.01 and polls.after(0) == 0.01


def test_the_poll_schedule_picks_up_tasks_arriving_at_20_a_second_within_the_targets() -> None:
    """The schedule against Poisson arrivals at 20/s (a claim costs 3 ms): pickup p50 under
    50 ms and p99 under 250 ms, the targets; the figures are in claimer.py's docstring."""
    import random

    rng = random.Random(7)
    polls = PollSchedule(0.5, adaptive=True, jitter=rng.uniform)
    arrivals, t = [], 0.0
    for _ in range(5000):
        t += rng.expovariate(20)
        arrivals.append(t)
    now, i, pickups = 0.0, 0, []
    while i < len(arrivals):
        now += 0.003
        found = 0
        while i < len(arrivals) and arrivals[i] <= now:
            pickups.append(now - arrivals[i])
            i, found = i + 1, found + 1
        now += polls.after(found)
    pickups.sort()
    assert statistics.median(pickups) < 0.05
    assert pickups[int(len(pickups) * 0.99)] < 0.25


# --- the claim cursor without notifications -------------------------------------------------


def test_with_a_rescan_interval_of_zero_every_cheap_claim_walks_from_the_start() -> None:
    """Nothing announces a release without a listener: a released dependant, older than the
    cursor, is found by the next full walk, which comes as often as its cost allows."""
    clock = [100.0]
    starts = ClaimStarts(0.0, 30.0, clock=lambda: clock[0])
    claimed = ClaimedTask(
        id=uuid.uuid4(), queue="q", type="t", payload={}, priority=Priority.NORMAL,
        attempts=1, max_attempts=3, lease_token=uuid.uuid4(),
        lease_expires_at=T0 + timedelta(seconds=30), created_at=T0,
    )  # fmt: skip
    starts.claimed([claimed], starts=None, seconds=0.001)
    clock[0] += 0.019  # within 20 times the walk's cost: from the cursor
    assert starts.next() is not None
    clock[0] += 0.002
    assert starts.next() is None


# --- the cancel poll --------------------------------------------------------------------------


class FakeDatabase:
    """Stands in for worker/database.py: answers every call with ``answer``."""

    def __init__(self, answer: set[uuid.UUID]) -> None:
        self.answer = answer

    async def call(self, service: str, fn: Any, *, attempts: int | None = None) -> Any:
        op = fn(None)  # arun(None, op): a coroutine; look at the op instead
        op.close()
        return self.answer


def running(slots: Slots) -> Running:
    task = ClaimedTask(
        id=uuid.uuid4(), queue="default", type="crawl", payload={}, priority=Priority.NORMAL,
        attempts=1, max_attempts=3, lease_token=uuid.uuid4(), lease_expires_at=T0,
        created_at=T0,
    )  # fmt: skip
    r = Running(task, TaskContext(task, worker_id="w"), time.monotonic())
    slots.running[task.id] = r
    return r


def test_the_cancel_poll_stops_the_handlers_whose_cancel_was_requested_and_only_those() -> None:
    slots = Slots()
    config = WorkerConfig(worker_id="w")
    asked, other = running(slots), running(slots)
    poll = CancelPoll(Cancels(config, slots=slots), db=FakeDatabase({asked.task.id}), slots=slots)  # type: ignore[arg-type]
    assert asyncio.run(poll.poll_once()) == 1
    assert asked.ctx.should_stop() and asked.ctx.cancel_requested
    assert not other.ctx.should_stop()
    assert asyncio.run(poll.poll_once()) == 0  # told once


def test_the_cancel_poll_sends_nothing_while_no_task_runs() -> None:
    slots = Slots()

    class Refusing:
        async def call(self, service: str, fn: Any, *, attempts: int | None = None) -> Any:
            raise AssertionError("no statement while nothing runs")

    poll = CancelPoll(Cancels(WorkerConfig(), slots=slots), db=Refusing(), slots=slots)  # type: ignore[arg-type]
    assert asyncio.run(poll.poll_once()) == 0


# --- what the worker resolves ---------------------------------------------------------------


def test_a_bad_pooler_is_refused_when_the_config_is_built() -> None:
    with pytest.raises(ValidationError, match="pooler"):
        WorkerConfig(pooler="bouncy")


def test_behind_a_transaction_pooler_the_workers_connections_prepare_nothing() -> None:
    assert WorkerConfig().connection_kwargs == {}
    assert WorkerConfig(pooler="transaction").connection_kwargs == {"prepare_threshold": None}


def _worker(**kwargs: Any) -> Worker:
    return Worker(TaskRegistry(), URL, **kwargs)


def test_behind_a_transaction_pooler_without_a_listen_url_the_worker_polls() -> None:
    worker = _worker(pooler="transaction")
    assert worker.config.pooler == "transaction"
    assert worker.listen_url is None and worker._listener is None
    assert worker._claimer.polls.adaptive and worker._cancel_poll is not None
    assert worker._claimer.starts.rescan_seconds == 0


def test_with_a_listen_url_the_worker_listens_there_and_polls_as_usual() -> None:
    worker = _worker(pooler="transaction", listen_url=DIRECT)
    assert worker._listener is not None and worker._listener.database_url == DIRECT
    assert not worker._claimer.polls.adaptive and worker._cancel_poll is None


def test_the_environment_gives_the_mode_and_the_listen_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_POOLER", "transaction")
    assert _worker().listen_url is None
    monkeypatch.setenv("PGQUEUE_LISTEN_URL", DIRECT)
    worker = _worker()
    assert (worker.config.pooler, worker.listen_url) == ("transaction", DIRECT)
    # An argument beats the environment.
    assert _worker(pooler="none").config.pooler == "none"


def test_with_notify_off_a_listening_worker_polls_adaptively_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_NOTIFY", "off")
    worker = _worker()
    assert worker._listener is not None  # cancels and releases are still heard
    assert worker._claimer.polls.adaptive and worker._cancel_poll is None


def test_without_a_pooler_nothing_changes() -> None:
    worker = _worker()
    assert worker.config.pooler == "none" and worker.listen_url == URL
    assert not worker._claimer.polls.adaptive and worker._claimer.starts.rescan_seconds == 0.5


def test_the_workers_config_is_its_own_copy() -> None:
    config = WorkerConfig()
    worker = Worker(TaskRegistry(), URL, config, pooler="transaction")
    assert config.pooler is None and worker.config.pooler == "transaction"
    assert worker.config.worker_id == config.worker_id


def test_a_spawned_supervised_child_gets_the_mode_but_not_the_listen_url_on_its_command_line():
    from pgqueue.cli.workers import WorkerOptions, _child_argv

    options = WorkerOptions(
        queues=["default"], concurrency=1, lease_seconds=30, grace_period=1, poll_interval=0.5,
        maintenance=True, sweep_interval=5, prune_interval=60, startup_timeout=60,
        completed_retention=60, dead_retention=60, promote_after=0, scheduler=True,
        log_format="text", log_level="INFO", metrics_port=None, metrics_host="127.0.0.1",
        pooler="transaction", listen_url="postgresql://app:secret@primary.invalid/app",
    )  # fmt: skip
    argv = _child_argv("app:tasks", options)
    assert argv[argv.index("--pooler") + 1] == "transaction"
    assert not any("secret" in a for a in argv)


def test_the_process_executors_children_are_told_the_mode() -> None:
    from pgqueue.worker.process_child import ChildSettings

    settings = ChildSettings(
        database_url=URL, worker_id="w", max_result_bytes=None, log=None, sys_path=[],
        registry=None, parent_pid=1, pooler="transaction",
    )  # fmt: skip
    assert ChildSettings.from_message(settings.message()).pooler == "transaction"


class _Context:
    """What ``_pooler`` asks of typer's context: where the command's --pooler came from."""

    def __init__(self, source: str | None) -> None:
        self.source = source

    def get_parameter_source(self, name: str) -> Any:
        return None if self.source is None else type("Source", (), {"name": self.source})()


@pytest.mark.parametrize(
    ("given", "source", "root", "expected"),
    [
        (None, None, "none", "none"),  # nothing anywhere (the root resolved none)
        (None, None, "transaction", "transaction"),  # the root's (its option or the env)
        ("transaction", "COMMANDLINE", "none", "transaction"),  # the command's own wins
        ("none", "ENVIRONMENT", "transaction", "transaction"),  # an explicit root beats env
        ("transaction", "ENVIRONMENT", None, "transaction"),  # no root option: the env
    ],
)
def test_the_worker_commands_pooler_comes_from_itself_then_the_global_option_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, given: str | None, source: str | None, root: str | None,
    expected: str,
) -> None:  # fmt: skip
    from pgqueue.cli import workers
    from pgqueue.cli.state import state

    monkeypatch.setattr(state, "pooler", root, raising=False)
    assert workers._pooler(_Context(source), given) == expected  # type: ignore[arg-type]
