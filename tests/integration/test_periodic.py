"""Periodic tasks in the database: each tick is enqueued once, whoever runs the scheduler.

``run_schedule`` is what every worker's scheduler calls. These tests drive it with a clock and
from several sessions at once; worker processes doing it every second are in tests/acceptance.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.cron import Cron, Schedule

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def every_second(catch_up: bool = False) -> Schedule:
    return Schedule(
        "tick", Cron.parse("* * * * * *"), "UTC", "beat", {"n": 1}, "periodic", "high", catch_up
    )


def ticks(conn: psycopg.Connection) -> list[tuple[str, datetime, int]]:
    return [
        (r[0], r[1], r[2])
        for r in conn.execute(
            "SELECT idempotency_key, visible_after, priority FROM pgqueue.tasks"
            " WHERE queue = 'periodic' ORDER BY visible_after"
        ).fetchall()
    ]


def test_the_first_run_records_the_schedule_and_enqueues_nothing_from_the_past(conn):
    assert pgqueue.run_schedule(conn, every_second(), now=T0) == []
    [row] = pgqueue.list_schedules(conn)
    assert row["name"] == "tick" and row["cron"] == "* * * * * *" and row["last_tick"] == T0
    assert row["next_tick"] == T0 + timedelta(seconds=1)


def test_each_tick_is_enqueued_once_at_its_time_as_the_schedule_says(conn):
    schedule = every_second()
    pgqueue.run_schedule(conn, schedule, now=T0)
    for offset in (1.2, 1.7, 2.0, 3.5):
        pgqueue.run_schedule(conn, schedule, now=T0 + timedelta(seconds=offset))

    got = ticks(conn)
    assert [t for _, t, _ in got] == [T0 + timedelta(seconds=s) for s in (1, 2, 3)]
    assert got[0][0] == f"periodic:tick:{(T0 + timedelta(seconds=1)).isoformat()}"
    assert {p for *_, p in got} == {0}  # high
    task = pgqueue.get_task(conn, pgqueue.list_tasks(conn, queue="periodic")[0].id)
    assert task.type == "beat" and task.payload == {"n": 1}


def test_ticks_missed_while_nothing_ran_become_one_task_or_all_with_catch_up(conn):
    pgqueue.run_schedule(conn, every_second(), now=T0)
    later = T0 + timedelta(seconds=90.5)
    assert len(pgqueue.run_schedule(conn, every_second(), now=later)) == 1
    assert [t for _, t, _ in ticks(conn)] == [T0 + timedelta(seconds=90)]

    caught = pgqueue.run_schedule(
        conn, every_second(catch_up=True), now=later + timedelta(seconds=5)
    )
    assert len(caught) == 5


def test_schedulers_racing_in_many_sessions_enqueue_each_tick_once(database_url, conn):
    """Eight sessions, each running the scheduler for the same 20 seconds of clock, started
    together: every tick is enqueued exactly once."""
    pgqueue.run_schedule(conn, every_second(), now=T0)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def scheduler() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as own:
                start.wait()
                for step in range(1, 41):
                    pgqueue.run_schedule(own, every_second(), now=T0 + timedelta(seconds=step / 2))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=scheduler) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert [t for _, t, _ in ticks(conn)] == [T0 + timedelta(seconds=s) for s in range(1, 21)]


def test_the_cli_and_the_api_list_schedules(database_url, conn):
    from boundaries import Api, run_main

    from pgqueue.api import ApiSettings

    pgqueue.run_schedule(conn, every_second(), now=T0)
    listed = run_main(database_url, "schedules")
    assert listed.code == 0 and "tick" in listed.stdout and "* * * * * *" in listed.stdout
    api = Api(ApiSettings(database_url=database_url))
    try:
        [row] = api.request("GET", "/api/v1/schedules").json()
    finally:
        api.close()
    assert row["name"] == "tick" and row["queue"] == "periodic"


@pytest.mark.timeout(60)  # a registry that loads would start a worker that runs until stopped
def test_a_worker_whose_registry_declares_a_bad_expression_refuses_to_start_naming_it(
    database_url, tmp_path, monkeypatch
):
    from boundaries import run_main

    (tmp_path / "bad_cron_registry.py").write_text(
        "import pgqueue\n"
        "tasks = pgqueue.TaskRegistry()\n"
        "tasks.periodic('month-end', '0 18 L * fri#6')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run_main(database_url, "worker", "bad_cron_registry:tasks")
    assert result.code == 2 and result.stdout == ""
    assert result.line == (
        "error: cron: '0 18 L * fri#6': the day-of-week field 'fri#6' is not valid; it takes *,"
        " 0-7 or sun-sat (0 and 7 are Sunday), 5L (last Friday), mon#2, a-b ranges, /steps and"
        " comma lists"
    )
