"""What a worker's service does with a database error (pgqueue/worker/database_errors.py):
its kind, its backoff, and how often a streak of them is logged. The worker meeting real ones
is tests/integration/test_worker_survives_database_errors.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from pgqueue.errors import DatabaseUnavailable, SchemaNotReady
from pgqueue.worker import database_errors
from pgqueue.worker.database_errors import ErrorStreak, kind_of, sqlstate_of
from pgqueue.worker.metrics import WorkerMetrics


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "pgqueue_fields", {})
        self.seen.append({"event": record.getMessage().split()[0], **fields})


@pytest.fixture
def events() -> Iterator[Events]:
    logger = logging.getLogger("pgqueue")
    handler, level = Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


class Counted(WorkerMetrics):
    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def database_error(self, service: str, kind: str) -> None:
        self.errors.append((service, kind))


def translated(exc: Exception, cause: Exception) -> Exception:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "kind", "sqlstate"),
    [
        (psycopg.errors.DuplicatePreparedStatement("x"), "statement", "42P05"),
        (psycopg.errors.InvalidSqlStatementName("x"), "statement", "26000"),
        (psycopg.errors.DivisionByZero("x"), "statement", "22012"),
        (psycopg.errors.SerializationFailure("x"), "conflict", "40001"),
        (psycopg.errors.DeadlockDetected("x"), "conflict", "40P01"),
        (psycopg.errors.LockNotAvailable("x"), "conflict", "55P03"),
        (psycopg.errors.QueryCanceled("x"), "conflict", "57014"),
        (psycopg.errors.AdminShutdown("x"), "connection", "57P01"),
        (psycopg.OperationalError("the socket broke"), "connection", None),
        (psycopg.InterfaceError("the connection is closed"), "connection", None),
        (PoolTimeout("no connection in 10 s"), "connection", None),
        (
            translated(DatabaseUnavailable("lost"), psycopg.errors.AdminShutdown("x")),
            "connection",
            "57P01",
        ),
        (
            translated(SchemaNotReady("missing"), psycopg.errors.UndefinedTable("x")),
            "statement",
            "42P01",
        ),
        (json.JSONDecodeError("Expecting value", "{", 1), "client", None),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "client", None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_each_error_has_a_kind_and_its_sqlstate(
    exc: Exception, kind: str, sqlstate: str | None
) -> None:
    assert (kind_of(exc), sqlstate_of(exc)) == (kind, sqlstate)


def test_a_streak_backs_off_doubling_to_the_cap_and_counts_every_error(events: Events) -> None:
    metrics = Counted()
    streak = ErrorStreak("heartbeat", worker="w1", metrics=metrics)
    delays = [streak.failed(psycopg.errors.DivisionByZero("division by zero")) for _ in range(9)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert metrics.errors == [("heartbeat", "statement")] * 9
    assert 4.5 < streak.remaining() <= 5.0


def test_a_streak_is_logged_first_then_as_it_doubles_then_its_end(events: Events) -> None:
    streak = ErrorStreak("claimer", worker="w1", subject={"schedule": "nightly"})
    for _ in range(9):
        streak.failed(psycopg.errors.DivisionByZero("division by zero\nLINE 1: SELECT 1/0"))
    streak.recovered()
    logged = [e for e in events.seen if e["event"] == "worker.database_error"]
    assert [e["failures"] for e in logged] == [1, 2, 4, 8]
    first = logged[0]
    assert first == {
        "event": "worker.database_error",
        "worker": "w1",
        "service": "claimer",
        "schedule": "nightly",
        "kind": "statement",
        "error_class": "DivisionByZero",
        "sqlstate": "22012",
        "error": "division by zero",
        "failures": 1,
        "retry_in_s": 0.1,
    }
    assert "since_s" in logged[1]
    [end] = [e for e in events.seen if e["event"] == "worker.database_recovered"]
    assert (end["service"], end["failures"], end["schedule"]) == ("claimer", 9, "nightly")
    assert streak.failures == 0 and streak.remaining() == 0


def test_a_long_streak_is_summarised_at_least_once_a_minute(
    events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(database_errors.time, "monotonic", lambda: now[0])
    streak = ErrorStreak("completer", worker="w1")
    for _ in range(40):  # an error every 5 s
        streak.failed(psycopg.OperationalError("server closed the connection unexpectedly"))
        now[0] += 5.0
    logged = [e["failures"] for e in events.seen if e["event"] == "worker.database_error"]
    assert logged == [1, 2, 4, 8, 16, 28, 32]  # 28: a minute (12 errors 5 s apart) after 16


def test_no_connection_in_time_keeps_its_own_event_name(events: Events) -> None:
    ErrorStreak("claimer", worker="w1").failed(PoolTimeout("couldn't get a connection"))
    ErrorStreak("listener", worker="w1", event_name="worker.listen_lost").failed(
        PoolTimeout("couldn't get a connection")
    )
    assert [e["event"] for e in events.seen] == [
        "worker.database_unreachable",
        "worker.listen_lost",
    ]
    assert events.seen[0]["kind"] == "connection"
