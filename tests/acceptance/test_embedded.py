"""With no database URL configured, pgqueue runs on its embedded PostgreSQL."""

import json
import os
import subprocess
import sys

import pytest


def run(home, *args):
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DATABASE_URL"}
    env["PGQUEUE_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_without_a_url_commands_use_the_embedded_server_until_it_is_stopped(tmp_path):
    try:
        migrated = run(tmp_path, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert f"host={tmp_path}" in json.loads(migrated.stdout)["database"]

        enqueued = run(tmp_path, "enqueue", "hello", "--payload", '{"n": 1}')
        assert enqueued.returncode == 0, enqueued.stderr
        task_id = json.loads(enqueued.stdout)["task_id"]
        status = run(tmp_path, "status", task_id)
        assert json.loads(status.stdout)["status"] == "queued"

        url = json.loads(run(tmp_path, "embedded", "url").stdout)["url"]
        assert url.startswith("postgresql://") and str(tmp_path) in url
    finally:
        stopped = run(tmp_path, "embedded", "stop")
    assert json.loads(stopped.stdout) == {"stopped": True}
    assert json.loads(run(tmp_path, "embedded", "stop").stdout) == {"stopped": False}
