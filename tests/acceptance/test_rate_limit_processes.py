"""Rate limits declared on the decorator (``rate_limit="10/s"``), kept by two real worker
processes together: the starts are spaced evenly, fleet-wide, as the claims record them.

Each task's ``started_at`` is its claim's time, the time the rate limit counts, so the
spacing is read from the database, not from the handlers' clocks; every wait polls the
database with a deadline.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, all_in_status, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(120)]

REGISTRY = "rate_handlers:tasks"
# The claim's clock is microseconds; the bucket spaces starts by at least its interval.
TOLERANCE = 0.001


def enqueue(conn: psycopg.Connection[Any], type_: str, n: int) -> list[uuid.UUID]:
    specs = [{"type": type_, "payload": {"i": i}} for i in range(n)]
    return [r.task.id for r in pgqueue.enqueue_many(conn, specs)]


def start_times(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[datetime]:
    rows = conn.execute(
        "SELECT started_at FROM pgqueue.tasks WHERE id = ANY(%s) ORDER BY started_at", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def gaps(times: list[datetime]) -> list[float]:
    return [(b - a).total_seconds() for a, b in itertools.pairwise(times)]


def start_two(workers: Workers, database_url: str, concurrency: int) -> list[Any]:
    return [
        workers.start(
            database_url,
            "--concurrency",
            str(concurrency),
            "--log-format",
            "json",
            *FAST,
            name=name,
            registry=REGISTRY,
        )
        for name in ("a", "b")
    ]


def limit_of(conn: psycopg.Connection[Any], name: str) -> pgqueue.Limit:
    return next(x for x in pgqueue.list_limits(conn) if x.name == name)


def started_by(worker: Any) -> int:
    return sum(1 for e in worker.events() if e["event"] == "task.started")


def test_two_workers_space_a_declared_rate_evenly_at_close_to_the_rate(
    conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """10/s, burst 1, two workers of two slots, each task 0.3 s: one worker could start at
    most 6.7 a second, so both take part; the starts are 100 ms apart or more, never
    together, and 20 of them take about 1.9 s, not much more (3 s at most: the workers share
    the test machine's cores with the rest of the suite)."""
    ids = enqueue(conn, "paced", 20)
    started = start_two(workers, database_url, concurrency=2)

    wait_until(
        lambda: all_in_status(conn, ids, "completed"),
        timeout=60,
        what="the paced tasks to complete",
        workers=workers,
        alive=started,
    )
    times = start_times(conn, ids)
    spacing = gaps(times)
    span = (times[-1] - times[0]).total_seconds()
    print(
        f"20 starts at 10/s over {span:.3f} s; gaps min {min(spacing):.4f} max {max(spacing):.4f}"
    )
    assert min(spacing) >= 0.1 - TOLERANCE, spacing
    assert 1.9 - TOLERANCE <= span <= 3.0, f"20 starts at 10/s took {span:.3f} s"
    assert all(started_by(w) > 0 for w in started), "both workers started tasks"
    limit = limit_of(conn, "paced")
    assert (limit.rate_limit, limit.rate_burst, limit.declared_by is not None) == (10, 1, True)


def test_a_worker_claims_each_start_as_the_rate_allows_it_not_at_its_next_poll(
    conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """One worker of ten slots polling every 2 s, ten tasks of 10/s that each hold their slot
    3 s, so that no finished task wakes it: it sleeps until the bucket's next start, not its
    poll, and the ten start 100 ms apart, in about 0.9 s rather than 18."""
    ids = enqueue(conn, "held", 10)
    worker = workers.start(
        database_url,
        "--concurrency",
        "10",
        "--poll-interval",
        "2",
        "--sweep-interval",
        "0.5",
        registry=REGISTRY,
    )

    wait_until(
        lambda: (
            not conn.execute(
                "SELECT 1 FROM pgqueue.tasks WHERE id = ANY(%s) AND started_at IS NULL", (ids,)
            ).fetchone()
        ),
        timeout=30,
        what="the ten held tasks to start",
        workers=workers,
        alive=[worker],
    )
    times = start_times(conn, ids)
    span = (times[-1] - times[0]).total_seconds()
    print(f"10 starts at 10/s from one worker over {span:.3f} s")
    assert min(gaps(times)) >= 0.1 - TOLERANCE, gaps(times)
    assert span <= 1.5, f"ten starts at 10/s took {span:.3f} s"


def test_a_declared_burst_starts_that_many_at_once_then_spaces_the_rest(
    conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """2/s with a burst of 4: the first four start together (a full bucket), then one each
    half second: the k-th after them no sooner than k half seconds after the first (a start
    that came late leaves the next one its due time, as a bucket refills steadily)."""
    ids = enqueue(conn, "bursty", 8)
    started = start_two(workers, database_url, concurrency=4)

    wait_until(
        lambda: all_in_status(conn, ids, "completed"),
        timeout=60,
        what="the bursty tasks to complete",
        workers=workers,
        alive=started,
    )
    times = start_times(conn, ids)
    print(f"burst gaps: {[round(g, 4) for g in gaps(times)]}")
    assert (times[3] - times[0]).total_seconds() < 0.25, "the burst of four at once"
    after_first = [(t - times[0]).total_seconds() for t in times]
    for k in range(1, 5):
        assert after_first[3 + k] >= 0.5 * k - TOLERANCE, after_first
    assert after_first[-1] <= 2.0 + 0.6, after_first


def test_an_operators_limit_overrides_the_declared_rate(
    conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    """The operator set 2/s on the type before the workers declared 10/s: the workers keep
    the operator's, and leave the row as it was."""
    pgqueue.set_limit(conn, type="paced", rate=2, per=1, burst=1)
    ids = enqueue(conn, "paced", 5)
    started = start_two(workers, database_url, concurrency=2)

    wait_until(
        lambda: all_in_status(conn, ids, "completed"),
        timeout=60,
        what="the paced tasks to complete",
        workers=workers,
        alive=started,
    )
    assert min(gaps(start_times(conn, ids))) >= 0.5 - TOLERANCE
    limit = limit_of(conn, "paced")
    assert (limit.rate_limit, limit.rate_period, limit.declared_by) == (2, 1.0, None)
