"""The same small scenario on two Django Tasks backends: pgqueue's and django-tasks-db (the
reference database backend), for docs/django.md's table.

    .venv-django/bin/python -m bench.django_compare --server-url postgresql://postgres@127.0.0.1:5432/postgres

Each backend gets a fresh database on that server and the test project (tests/django/project;
``SHOP_TASKS_BACKEND=django-tasks-db`` switches its TASKS), migrated with ``manage.py migrate``,
and real worker processes started with each backend's own command and default options
(``pgqueue_worker``: 10 threads, NOTIFY plus a 0.5 s poll; ``db_worker``: one task at a time,
polling every second). The scenario: a rollback and a commit around an enqueue; the delay
from commit to start on an idle worker; a task that fails once; one that always fails; a
task running when its worker is killed with SIGKILL (a second worker is started at once);
1,000 no-op tasks enqueued in one transaction, then drained by one worker. Prints one JSON
object per backend, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

PROJECT = Path(__file__).resolve().parents[1] / "tests" / "django" / "project"
BACKENDS = {"pgqueue": ["pgqueue_worker", "--queue", "default"], "django-tasks-db": ["db_worker"]}
KILL_WAIT = 45.0  # how long the second worker gets to finish the killed worker's task


def _env(backend: str, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(
        DJANGO_DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="mysite.settings",
        SHOP_TASKS_BACKEND=backend,
    )
    return env


def _worker(backend: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "manage.py", *BACKENDS[backend]],
            cwd=PROJECT,
            env=_env(backend, url),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _until(condition: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return None


def scenario(backend: str, url: str, log: Path) -> dict[str, Any]:
    """Run in a child process with Django set up for ``backend`` (Django sets up once)."""
    import django
    from django.core.management import call_command
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist

    django.setup()
    call_command("migrate", verbosity=0)
    from shop import tasks

    out: dict[str, Any] = {"backend": backend}

    def finished(task: Any, result_id: str, timeout: float = 60.0) -> Any:
        def done() -> Any:
            result = task.get_result(result_id)
            return result if result.is_finished else None

        return _until(done, timeout) or task.get_result(result_id)

    # Transactional enqueue: a rollback leaves no task.
    try:
        with transaction.atomic():
            rolled_back = tasks.add.enqueue(1, 1).id
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    try:
        tasks.add.get_result(rolled_back)
        out["rollback_leaves_no_task"] = False
    except TaskResultDoesNotExist:
        out["rollback_leaves_no_task"] = True

    worker = _worker(backend, url, log)
    try:
        time.sleep(3)  # started and idle
        pickups = []
        for _ in range(5):  # one after another, each on an idle worker
            with transaction.atomic():
                committed = tasks.add.enqueue(2, 3)
            result = finished(tasks.add, committed.id)
            pickups.append((result.started_at - result.enqueued_at).total_seconds() * 1000)
            time.sleep(0.3)
        out["commit_runs"] = result.status == "SUCCESSFUL" and result.return_value == 5
        out["idle_pickup_ms_median_of_5"] = round(sorted(pickups)[2])

        result = finished(tasks.flaky, tasks.flaky.enqueue(uuid.uuid4().hex).id)
        out["fails_once"] = f"{result.status} after {result.attempts} attempt(s)"

        result = finished(tasks.charge, tasks.charge.enqueue("order-7").id)
        error = result.errors[-1].exception_class_path if result.errors else None
        out["always_fails"] = f"{result.status} after {result.attempts} attempt(s), {error}"

        napping = tasks.nap.enqueue(3).id
        _until(lambda: tasks.nap.get_result(napping).status == "RUNNING", 30)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = _worker(backend, url, log)
        killed_at = time.monotonic()
        result = finished(tasks.nap, napping, timeout=KILL_WAIT)
        out["after_kill_9"] = (
            f"{result.status} after {time.monotonic() - killed_at:.1f} s"
            if result.is_finished
            else f"still {result.status} after {KILL_WAIT:.0f} s"
        )
    finally:
        _stop(worker)

    started = time.monotonic()
    with transaction.atomic():
        ids = [tasks.noop.enqueue().id for _ in range(1000)]
    out["enqueue_1000_s"] = round(time.monotonic() - started, 2)
    worker = _worker(backend, url, log)
    try:
        started = time.monotonic()
        _until(lambda: _all_done(tasks.noop, ids), 300)
        out["drain_1000_s"] = round(time.monotonic() - started, 2)
    finally:
        _stop(worker)
    return out


def _all_done(task: Any, ids: list[str]) -> bool:
    # Every 50th result, then all: a drain is measured without reading 1,000 rows per poll.
    return all(task.get_result(i).is_finished for i in ids[::50]) and all(
        task.get_result(i).is_finished for i in ids
    )


def _database(server_url: str, name: str, drop: bool = False) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop:
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


def table(rows: list[dict[str, Any]]) -> str:
    keys = [k for k in rows[0] if k != "backend"]
    lines = ["| | " + " | ".join(r["backend"] for r in rows) + " |"]
    lines.append("|---" * (len(rows) + 1) + "|")
    lines += [f"| {k} | " + " | ".join(str(r.get(k)) for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-url", required=True)
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # the child's
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--log", default="django_compare.log")
    args = parser.parse_args()
    if args.backend:
        sys.path.insert(0, str(PROJECT))
        os.environ.update(_env(args.backend, args.database_url))
        print(json.dumps(scenario(args.backend, args.database_url, Path(args.log))))
        return
    rows = []
    for backend in BACKENDS:
        name = f"django_compare_{backend.replace('-', '_')}"
        url = _database(args.server_url, name)
        try:
            child = subprocess.run(
                [sys.executable, "-m", "bench.django_compare", "--server-url", args.server_url,
                 "--backend", backend, "--database-url", url, "--log", args.log],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
        finally:
            _database(args.server_url, name, drop=True)
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
