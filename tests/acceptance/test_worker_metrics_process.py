"""Worker metrics from real processes: `pgqueue worker --metrics-port PORT --processes 2`.

The supervisor gives child i the port PORT+i; the test scrapes both over HTTP while they run
``handlers.py``'s ``noop`` and ``fail`` tasks (see test_worker_processes.py, whose process
helpers it reuses), and checks the counters by type summed over the two processes, the
handler histogram's count, and /healthz. Every wait polls with a deadline.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_worker_processes import FAST, SIDE_TABLES, Workers, wait_until

import pgqueue

pytestmark = [pytest.mark.timeout(120)]


def two_free_ports() -> int:
    """A port P such that P and P+1 are both free now."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    pytest.fail("found no two consecutive free ports")


def get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body), or None while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def totals(ports: list[int]) -> dict[tuple[str, str], float] | None:
    """Each (sample name, type) summed over the processes' /metrics; None if one is not up."""
    out: dict[tuple[str, str], float] = {}
    for port in ports:
        reply = get(port, "/metrics")
        if reply is None or reply[0] != 200:
            return None
        for family in text_string_to_metric_families(reply[1]):
            for s in family.samples:
                if "type" in s.labels and "le" not in s.labels:
                    key = (s.name, s.labels["type"])
                    out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.mark.slow
def test_worker_processes_serve_metrics_by_type_and_healthz_on_port_plus_i(
    conn: psycopg.Connection[Any], database_url: str, workers: Workers
) -> None:
    conn.execute(SIDE_TABLES)
    noops = [r.task.id for r in pgqueue.enqueue_many(conn, [{"type": "noop"}] * 5)]
    dead = pgqueue.enqueue(conn, "fail", {}, max_attempts=2).task.id
    port = two_free_ports()
    ports = [port, port + 1]
    supervisor = workers.start(
        database_url,
        *("--processes", "2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
        *FAST,
    )

    expected = {
        ("pgqueue_worker_tasks_started_total", "noop"): 5,
        ("pgqueue_worker_tasks_completed_total", "noop"): 5,
        ("pgqueue_worker_tasks_failed_total", "noop"): 0,
        ("pgqueue_worker_task_duration_seconds_count", "noop"): 5,
        ("pgqueue_worker_tasks_started_total", "fail"): 2,
        ("pgqueue_worker_tasks_failed_total", "fail"): 2,
        ("pgqueue_worker_tasks_retried_total", "fail"): 1,
        ("pgqueue_worker_tasks_dead_total", "fail"): 1,
        ("pgqueue_worker_tasks_completed_total", "fail"): 0,
        ("pgqueue_worker_task_duration_seconds_count", "fail"): 2,
    }

    def settled() -> dict[tuple[str, str], float] | None:
        seen = totals(ports)
        if seen is None or any(seen.get(k) != v for k, v in expected.items()):
            return None
        return seen

    seen = wait_until(
        settled,
        timeout=60,
        what=f"both processes' /metrics to add up to {expected}",
        workers=workers,
        alive=[supervisor],
        interval=0.2,
    )
    assert {k: seen[k] for k in expected} == expected
    statuses = {t.id: t.status for t in pgqueue.list_tasks(conn)}
    assert all(statuses[i] == pgqueue.TaskStatus.COMPLETED for i in noops), statuses
    assert statuses[dead] == pgqueue.TaskStatus.FAILED
    for p in ports:
        assert get(p, "/healthz") == (200, "ok\n"), f"/healthz on port {p}"
