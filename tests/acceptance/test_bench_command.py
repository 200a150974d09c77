"""`pgqueue bench` measures on the user's own database without leaving anything behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pgqueue


def test_bench_reports_every_figure_and_deletes_its_tasks(database_url, conn):
    real = pgqueue.enqueue(conn, "real.work", {"keep": True})

    command = [sys.executable, "-m", "pgqueue", "--database-url", database_url, "--json"]
    command += ["bench", "--tasks", "300", "--single", "30", "--latency-samples", "10"]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("bulk_enqueue_per_s", "single_enqueue_per_s", "drain_per_s"):
        assert result[key] > 0, key
    assert 0 < result["latency_ms_p50"] <= result["latency_ms_p99"] <= result["latency_ms_max"]
    assert result["ran_more_than_once"] == 0
    assert "drain by 1 worker process" in proc.stderr  # progress goes to stderr
    # Only the user's own task is left, untouched.
    assert [t.id for t in pgqueue.list_tasks(conn)] == [real.id]
    assert pgqueue.get_task(conn, real.id).status is pgqueue.TaskStatus.QUEUED
