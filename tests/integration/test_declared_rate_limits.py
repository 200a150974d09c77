"""Rate limits declared on a task type's decorator (``rate_limit="10/m"``), which a worker
writes as the type's limit at start (pgqueue.limits, declared_by), and an operator's limit,
which wins over them.

The claims here run with the clock controlled (``now``); worker processes keeping to a
declared rate together are in tests/acceptance/test_rate_limit_processes.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from boundaries import run_main

import pgqueue
from pgqueue.queries.driver import run
from pgqueue.queries.task_types import task_types_declare
from pgqueue.registry import TaskRegistry

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def claimed(conn: psycopg.Connection[Any], seconds: float, limit: int = 100) -> int:
    """How many tasks one claim at T0 + ``seconds`` starts."""
    now = T0 + timedelta(seconds=seconds)
    return len(pgqueue.claim(conn, ["default"], limit=limit, worker_id="test", now=now))


def enqueue(conn: psycopg.Connection[Any], type_: str, n: int) -> None:
    pgqueue.enqueue_many(conn, [{"type": type_, "payload": {"i": i}} for i in range(n)])


def declare(conn: psycopg.Connection[Any], registry: TaskRegistry, owner: str = "w1") -> None:
    """What a worker does at its start, before its first claim."""
    run(conn, task_types_declare(owner, registry.declarations()))


def limit_of(conn: psycopg.Connection[Any], name: str) -> pgqueue.Limit | None:
    return next((x for x in pgqueue.list_limits(conn) if x.name == name), None)


def registry_with(rate_limit: str | None, burst: int | None = None) -> TaskRegistry:
    tasks = TaskRegistry()

    @tasks.handler("sms", rate_limit=rate_limit, rate_burst=burst)
    def sms(payload: dict[str, Any], ctx: Any) -> None:
        return None

    @tasks.task(name="report", rate_limit="2/h")
    def report(day: str) -> None:
        return None

    @tasks.handler("email")
    def email(payload: dict[str, Any], ctx: Any) -> None:
        return None

    return tasks


def test_a_declared_rate_limit_becomes_the_types_limit_spaced_evenly(conn):
    declare(conn, registry_with("10/m"), owner="worker-1")

    sms = limit_of(conn, "sms")
    assert sms is not None
    assert (sms.kind, sms.rate_limit, sms.rate_period, sms.rate_burst) == (
        pgqueue.LimitKind.TYPE,
        10,
        60.0,
        1,
    )
    assert (sms.max_running, sms.declared_by) == (None, "worker-1")
    report = limit_of(conn, "report")
    assert report is not None and (report.rate_limit, report.rate_period) == (2, 3600.0)
    assert limit_of(conn, "email") is None, "a type without rate_limit declares no limit"

    enqueue(conn, "sms", 5)
    assert claimed(conn, 0) == 1
    assert claimed(conn, 5.9) == 0, "one start every 6 s"
    assert claimed(conn, 6) == 1


def test_a_declaration_follows_the_code_and_keeps_the_bucket_when_unchanged(conn):
    declare(conn, registry_with("10/s"))
    enqueue(conn, "sms", 5)
    assert claimed(conn, 0) == 1
    declare(conn, registry_with("10/s"), owner="w2")  # a restart: the same declaration
    assert claimed(conn, 0.05) == 0, "the bucket's state survived the restart"
    assert limit_of(conn, "sms").declared_by == "w1", "an unchanged row is not written"

    declare(conn, registry_with("1/m", burst=3), owner="w3")
    sms = limit_of(conn, "sms")
    assert (sms.rate_limit, sms.rate_period, sms.rate_burst, sms.declared_by) == (
        1,
        60.0,
        3,
        "w3",
    )
    declare(conn, registry_with(None), owner="w4")
    assert limit_of(conn, "sms") is None, "a rate removed from the code removes its limit"
    assert limit_of(conn, "report") is not None


def test_a_declared_rate_raised_in_the_code_applies_at_the_next_worker_start(conn):
    declare(conn, registry_with("1/h"))
    enqueue(conn, "sms", 5)
    assert claimed(conn, 0) == 1
    assert claimed(conn, 1) == 0

    declare(conn, registry_with("10/s"), owner="w2")
    assert claimed(conn, 1) == 1, "not an hour after the last start"


def test_an_operators_limit_wins_over_a_declared_rate_until_it_is_cleared(conn):
    declare(conn, registry_with("10/s"))
    pgqueue.set_limit(conn, type="sms", rate=1, per=60, burst=1)
    declare(conn, registry_with("10/s"), owner="w2")

    sms = limit_of(conn, "sms")
    assert (sms.rate_limit, sms.rate_period, sms.declared_by) == (1, 60.0, None)
    enqueue(conn, "sms", 5)
    assert claimed(conn, 0) == 1
    assert claimed(conn, 1) == 0, "the operator's 1 per minute, not the declared 10/s"

    declare(conn, registry_with(None), owner="w3")
    assert limit_of(conn, "sms") is not None, "a declaration never removes the operator's"

    assert pgqueue.clear_limit(conn, type="sms") is True
    declare(conn, registry_with("10/s"), owner="w4")
    assert limit_of(conn, "sms").declared_by == "w4", "cleared: the declaration fills in"


def test_an_operators_limit_without_a_rate_is_kept_as_set(conn):
    pgqueue.set_limit(conn, type="sms", max_running=2)
    declare(conn, registry_with("10/s"))
    sms = limit_of(conn, "sms")
    assert (sms.max_running, sms.rate_limit, sms.declared_by) == (2, None, None)


def test_cli_lists_a_declared_limit_with_the_worker_that_declared_it(database_url, conn):
    declare(conn, registry_with("10/m"), owner="worker-7")
    pgqueue.set_limit(conn, type="email", max_running=1)

    listed = run_main(database_url, "limit", "list")
    rows = {line.split()[1]: line for line in listed.stdout.splitlines()[1:]}
    assert "10 per 1m, burst 1" in rows["sms"] and "worker-7" in rows["sms"]
    assert "operator" in rows["email"]
