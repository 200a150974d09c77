"""The README's first command works: `pgqueue demo` runs real tasks to their outcomes."""

import json
import subprocess
import sys

import psycopg
import pytest


@pytest.mark.slow
def test_demo_settles_every_task_with_retries_and_dead_letters(database_url):
    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", database_url, "--json", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["tasks"] == 34
    assert summary["completed"] == 32
    assert summary["completed_after_retry"] == 4  # the flaky reports
    assert summary["dead_lettered"] == 2  # the card charges
    with psycopg.connect(database_url) as conn:
        dead = conn.execute(
            "SELECT type, attempts FROM pgqueue.dead_letters WHERE queue = 'demo'"
        ).fetchall()
        running = conn.execute(
            "SELECT count(*) FROM pgqueue.tasks WHERE status IN ('queued', 'running')"
        ).fetchone()
    assert sorted(dead) == [("demo.charge_card", 3), ("demo.charge_card", 3)]
    assert running == (0,)
