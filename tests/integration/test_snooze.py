"""A handler's Snooze: queued again later without spending an attempt, bounded.

The library's ``pgqueue.snooze`` (what the worker writes) with a controlled clock, then a real
worker running handlers that raise ``Snooze``, and what `pgqueue status` and the API show.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from boundaries import Api, run_main
from helpers import run_worker_until

import pgqueue
from pgqueue.api import ApiSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def claim_one(conn: psycopg.Connection[Any], now: datetime) -> pgqueue.ClaimedTask:
    (task,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=now)
    return task


def test_snooze_requeues_later_without_spending_an_attempt(conn: psycopg.Connection[Any]):
    task_id = pgqueue.enqueue(conn, "call_api", {}, now=T0).id
    first = claim_one(conn, T0 + timedelta(seconds=5))
    assert first.attempts == 1

    result = pgqueue.snooze(conn, first.lease, 30, now=T0 + timedelta(seconds=6))
    assert result.snoozed and result.snoozes == 1 and not result.cancelled
    assert result.run_at == T0 + timedelta(seconds=36)
    task = pgqueue.get_task(conn, task_id)
    assert task.status is pgqueue.TaskStatus.QUEUED
    assert (task.attempts, task.snoozes) == (0, 1)
    assert task.visible_after == T0 + timedelta(seconds=36)
    # Its wait keeps counting from when it first became ready, as a retry's does.
    assert task.ready_since == T0
    assert task.lease_owner is None

    # Not claimable before its time, claimable after; the attempt count starts again at 1.
    assert (
        pgqueue.claim(conn, ["default"], limit=1, worker_id="w", now=T0 + timedelta(seconds=35))
        == []
    )
    again = claim_one(conn, T0 + timedelta(seconds=36))
    assert again.attempts == 1
    pgqueue.complete(conn, again.lease, {"ok": True})
    done = pgqueue.get_task(conn, task_id)
    assert (done.status, done.attempts, done.snoozes) == (pgqueue.TaskStatus.COMPLETED, 1, 1)


def test_a_snooze_past_the_bound_is_a_failed_attempt_naming_the_bound(
    conn: psycopg.Connection[Any],
):
    task_id = pgqueue.enqueue(conn, "call_api", {}, max_attempts=2, now=T0).id
    now = T0
    for n in (1, 2):
        now += timedelta(seconds=10)
        result = pgqueue.snooze(conn, claim_one(conn, now).lease, 1, max_snoozes=2, now=now)
        assert result.snoozed and result.snoozes == n

    now += timedelta(seconds=10)
    result = pgqueue.snooze(conn, claim_one(conn, now).lease, 1, max_snoozes=2, now=now)
    assert not result.snoozed and result.failed is not None
    assert result.failed.outcome is pgqueue.FailOutcome.RETRYING
    task = pgqueue.get_task(conn, task_id)
    assert (task.status, task.attempts, task.snoozes) == (pgqueue.TaskStatus.QUEUED, 1, 2)
    assert task.last_error is not None and "max_snoozes=2" in task.last_error

    # The last attempt: a snooze past the bound dead-letters it.
    now += timedelta(seconds=10)
    result = pgqueue.snooze(conn, claim_one(conn, now).lease, 1, max_snoozes=2, now=now)
    assert result.failed is not None and result.failed.outcome is pgqueue.FailOutcome.DEAD
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.FAILED


def test_a_snooze_of_a_task_whose_cancellation_was_requested_cancels_it(
    conn: psycopg.Connection[Any],
):
    task_id = pgqueue.enqueue(conn, "call_api", {}, now=T0).id
    claimed = claim_one(conn, T0)
    pgqueue.cancel(conn, task_id, now=T0)
    result = pgqueue.snooze(conn, claimed.lease, 60, now=T0)
    assert result.cancelled and result.run_at is None
    assert pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.CANCELLED


def test_a_snooze_with_a_lost_lease_writes_nothing(conn: psycopg.Connection[Any]):
    task_id = pgqueue.enqueue(conn, "call_api", {}, now=T0).id
    stale = claim_one(conn, T0)
    pgqueue.sweep_expired(conn, now=T0 + timedelta(hours=1))  # the lease is gone
    with pytest.raises(pgqueue.LeaseLost):
        pgqueue.snooze(conn, stale.lease, 60, now=T0 + timedelta(hours=1))
    assert pgqueue.get_task(conn, task_id).snoozes == 0


@pytest.mark.parametrize("after", [0, -1, math.inf, math.nan, True, "5", None, 1e12])
def test_snooze_after_must_be_positive_finite_seconds(after: Any):
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.Snooze(after=after)
    assert caught.value.field == "after"


def test_the_snooze_operation_checks_after_and_the_bound(conn: psycopg.Connection[Any]):
    pgqueue.enqueue(conn, "call_api", {}, now=T0)
    lease = claim_one(conn, T0).lease
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.snooze(conn, lease, 0)
    assert caught.value.field == "after"
    with pytest.raises(pgqueue.ValidationError) as caught:
        pgqueue.snooze(conn, lease, 1, max_snoozes=-1)
    assert caught.value.field == "max_snoozes"


def test_max_snoozes_from_the_environment_is_checked(monkeypatch: pytest.MonkeyPatch):
    from pgqueue import config

    monkeypatch.setenv("PGQUEUE_MAX_SNOOZES", "7")
    assert config.max_snoozes() == 7
    monkeypatch.setenv("PGQUEUE_MAX_SNOOZES", "many")
    with pytest.raises(pgqueue.ConfigurationError, match="PGQUEUE_MAX_SNOOZES"):
        config.max_snoozes()


# --- through a real worker -------------------------------------------------------------------


def test_a_worker_runs_a_snoozed_task_again_without_spending_attempts(
    database_url: str, conn: psycopg.Connection[Any]
):
    registry = pgqueue.TaskRegistry()
    calls: list[int] = []

    @registry.handler("rate_limited", max_attempts=1)
    def rate_limited(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) <= 2:
            raise pgqueue.Snooze("downstream said 429", after=0.2)
        return "done"

    task_id = pgqueue.enqueue(conn, "rate_limited", {}).id

    def finished() -> bool:
        return pgqueue.get_task(conn, task_id).status.is_final

    run_worker_until(database_url, registry, finished)
    task = pgqueue.get_task(conn, task_id)
    # One attempt allowed, yet it ran three times: the two snoozes spent none.
    assert (task.status, task.result) == (pgqueue.TaskStatus.COMPLETED, "done")
    assert (task.attempts, task.snoozes) == (1, 2)
    assert calls == [1, 1, 1]

    out = run_main(database_url, "status", str(task_id))
    assert out.code == 0 and "snoozes" in out.stdout and "2" in out.stdout
    shown = run_main(database_url, "--json", "status", str(task_id))
    assert json.loads(shown.stdout)["snoozes"] == 2
    api = Api(ApiSettings(database_url=database_url))
    try:
        body = api.request("GET", f"/api/v1/tasks/{task_id}").json()
    finally:
        api.close()
    assert body["snoozes"] == 2


def test_a_worker_stops_a_task_snoozing_past_the_bound(
    database_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PGQUEUE_MAX_SNOOZES", "2")
    registry = pgqueue.TaskRegistry()

    @registry.handler("always_busy", max_attempts=1)
    def always_busy(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        raise pgqueue.Snooze(after=0.1)

    task_id: uuid.UUID = pgqueue.enqueue(conn, "always_busy", {}).id
    run_worker_until(
        database_url, registry, lambda: pgqueue.get_task(conn, task_id).status.is_final
    )
    task = pgqueue.get_task(conn, task_id)
    assert (task.status, task.attempts, task.snoozes) == (pgqueue.TaskStatus.FAILED, 1, 2)
    assert task.last_error is not None and "max_snoozes=2" in task.last_error
