"""Interval schedules in the database: the ticks of ``every=`` fenced as cron's are, listed
readably, and enqueued once however many sessions run the scheduler (driven by a clock here;
worker processes in tests/acceptance/test_interval_schedule_processes.py)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg

import pgqueue
from pgqueue.cron import Cron, Interval, Schedule

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def every(seconds: float, catch_up: bool = False) -> Schedule:
    interval = Interval.parse(seconds)
    return Schedule(
        "pulse", None, "UTC", "pulse", {}, "interval", "normal", catch_up, every=interval
    )


def due_times(conn: psycopg.Connection) -> list[datetime]:
    rows = conn.execute(
        "SELECT visible_after FROM pgqueue.tasks WHERE queue = 'interval' ORDER BY visible_after"
    ).fetchall()
    return [r[0] for r in rows]


def test_an_interval_schedule_enqueues_each_tick_once_at_its_time_on_the_grid(conn):
    schedule = every(2)
    assert pgqueue.run_schedule(conn, schedule, now=T0 + timedelta(seconds=0.3)) == []
    for offset in (1.0, 2.0, 2.9, 4.5, 5.99, 6.0):
        pgqueue.run_schedule(conn, schedule, now=T0 + timedelta(seconds=offset))
    assert due_times(conn) == [T0 + timedelta(seconds=s) for s in (2, 4, 6)]
    [row] = pgqueue.list_schedules(conn)
    assert row["cron"] == "every 2s" and row["last_tick"] == T0 + timedelta(seconds=6)
    assert row["next_tick"] == T0 + timedelta(seconds=8)
    task = pgqueue.list_tasks(conn, queue="interval")[-1]  # newest first
    assert task.idempotency_key == f"periodic:pulse:{(T0 + timedelta(seconds=2)).isoformat()}"


def test_interval_schedulers_racing_in_many_sessions_enqueue_each_tick_once(database_url, conn):
    pgqueue.run_schedule(conn, every(1), now=T0)
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def scheduler() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as own:
                start.wait()
                for step in range(1, 41):
                    pgqueue.run_schedule(own, every(1), now=T0 + timedelta(seconds=step / 2))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=scheduler) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert due_times(conn) == [T0 + timedelta(seconds=s) for s in range(1, 21)]


def test_a_schedule_changed_from_cron_to_an_interval_keeps_its_fence(conn):
    """A deploy that turns ``* * * * *`` into ``every=30``: the ticks already enqueued are
    not enqueued again, and the next is the interval's first after the fence."""
    cron = Schedule("pulse", Cron.parse("* * * * *"), "UTC", "pulse", {}, "interval", "normal")
    pgqueue.run_schedule(conn, cron, now=T0)
    pgqueue.run_schedule(conn, cron, now=T0 + timedelta(seconds=61))
    assert due_times(conn) == [T0 + timedelta(minutes=1)]
    pgqueue.run_schedule(conn, every(30), now=T0 + timedelta(seconds=61))  # 60 is fenced
    pgqueue.run_schedule(conn, every(30), now=T0 + timedelta(seconds=95))
    assert due_times(conn) == [T0 + timedelta(seconds=s) for s in (60, 90)]


def test_the_cli_and_the_api_list_an_interval_schedule_readably(database_url, conn):
    from boundaries import Api, run_main

    from pgqueue.api import ApiSettings

    pgqueue.run_schedule(conn, every(90), now=T0)
    listed = run_main(database_url, "schedules")
    assert listed.code == 0 and "every 1m30s" in listed.stdout, listed.stdout
    api = Api(ApiSettings(database_url=database_url))
    try:
        [row] = api.request("GET", "/api/v1/schedules").json()
    finally:
        api.close()
    assert row["cron"] == "every 1m30s" and row["next_tick"].startswith("2030-01-01T00:01:30")
