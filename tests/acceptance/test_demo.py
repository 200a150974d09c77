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
    assert summary["migrated"] is False  # the fixture's database comes migrated
    assert summary["embedded_server"] is False
    with psycopg.connect(database_url) as conn:
        dead = conn.execute(
            "SELECT type, attempts FROM pgqueue.dead_letters WHERE queue = 'demo'"
        ).fetchall()
        running = conn.execute(
            "SELECT count(*) FROM pgqueue.tasks WHERE status IN ('queued', 'running')"
        ).fetchone()
    assert sorted(dead) == [("demo.charge_card", 3), ("demo.charge_card", 3)]
    assert running == (0,)


@pytest.mark.slow
def test_demo_migrates_only_when_the_schema_is_behind_and_ends_with_what_to_do_next(
    database_url,
):
    """The fixture's database is already migrated: the demo must not claim to migrate it."""

    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", database_url, "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("database: ") and first.endswith("(schema up to date)"), first
    assert "migrating" not in proc.stdout
    assert "Next:" in proc.stdout and "pgqueue serve" in proc.stdout
    # A URL was given: no embedded server was started, so none is said to keep running.
    assert "embedded" not in proc.stdout.split("Next:")[0].split("Look for yourself")[1]


def test_the_demo_ending_says_the_embedded_server_keeps_running_and_how_to_stop_it(
    tmp_path, monkeypatch
):
    from pgqueue.cli.demo import ending

    monkeypatch.setenv("PGQUEUE_HOME", str(tmp_path))

    text = ending(embedded=True)

    assert "keeps running in the background" in text and str(tmp_path) in text
    assert "pgqueue embedded url" in text and "pgqueue embedded stop" in text
    assert "Next:" in text
    assert "embedded" not in ending(embedded=False)
    assert list(tmp_path.iterdir()) == []  # saying where the data is starts nothing
