"""Django's Tasks on pgqueue, end to end: a view enqueues in the request's transaction (the
test client), a real worker process (``python manage.py pgqueue_worker``) runs the task with
Django set up, and Django's ``get_result``/``aget_result`` report what pgqueue recorded.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from processes import clean_env, wait_until

import pgqueue

pytestmark = pytest.mark.slow

DEADLINE = 60.0  # generous: the machine is shared
PROJECT = Path(__file__).resolve().parent / "project"

pytest.importorskip(
    "pgqueue.contrib.django.compat",
    reason="Django 6 (Python 3.12+), or 5.2 with django-tasks: .ci/django runs these",
    exc_type=ImportError,
)


class DjangoWorker:
    """A worker process in the project's directory, its log in a file."""

    def __init__(self, argv: list[str], url: str, log: Path, **env: str) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                argv,
                cwd=PROJECT,
                env=clean_env(
                    DJANGO_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="mysite.settings", **env
                ),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker(
    django_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DjangoWorker]:
    """``python manage.py pgqueue_worker`` on the default queue, for the module's tests."""
    log = tmp_path_factory.mktemp("django-worker") / "worker.log"
    argv = [sys.executable, "manage.py", "pgqueue_worker", "--queue", "default"]
    started = DjangoWorker([*argv, "--poll-interval", "0.2"], django_database_url, log)
    yield started
    started.stop()


def finished(task: Any, result_id: str) -> Any:
    """The result once it is SUCCESSFUL or FAILED, polled."""

    def done() -> Any:
        result = task.get_result(result_id)
        return result if result.is_finished else None

    return wait_until(done, DEADLINE, f"task {result_id} to finish")


def pg_task(pg: psycopg.Connection[Any], task_id: str) -> pgqueue.Task:
    return pgqueue.get_task(pg, task_id)


def test_a_view_that_rolls_back_leaves_no_task(worker: DjangoWorker, pg: Any) -> None:
    from django.test import Client
    from shop.models import Order
    from shop.tasks import process_order

    from pgqueue.contrib.django.compat import TaskResultDoesNotExist

    body = Client().post("/orders/", {"item": "lamp", "fail": "1"}).json()

    assert body["rolled_back"] is True and body["task_id"]
    with pytest.raises(TaskResultDoesNotExist):
        process_order.get_result(body["task_id"])
    with pytest.raises(pgqueue.TaskNotFound):
        pg_task(pg, body["task_id"])
    assert not Order.objects.filter(item="lamp").exists()


def test_a_view_that_commits_has_its_task_run_by_the_worker(worker: DjangoWorker, pg: Any) -> None:
    from django.test import Client
    from shop.models import Order
    from shop.tasks import process_order

    body = Client().post("/orders/", {"item": "chair"}).json()

    result = finished(process_order, body["task_id"])
    assert result.status == "SUCCESSFUL", (result.errors, worker.text())
    assert result.return_value == body["order_id"]
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert Order.objects.get(id=body["order_id"]).processed  # the ORM, in the worker
    stored = pg_task(pg, body["task_id"])
    assert (stored.type, stored.queue, stored.priority) == (
        "shop.tasks.process_order",
        "default",
        pgqueue.Priority.NORMAL,
    )
    assert stored.payload["args"] == [body["order_id"]]
    # The async view reads the same result with aget_result.
    status = Client().get(f"/tasks/{body['task_id']}/").json()
    assert status == {"status": "SUCCESSFUL", "attempts": 1, "return_value": body["order_id"]}


def test_an_enqueue_outside_a_transaction_commits_at_once(worker: DjangoWorker) -> None:
    from shop.tasks import add

    result = add.enqueue(2, 3)

    assert result.status == "READY" and result.args == [2, 3]
    assert finished(add, result.id).return_value == 5


def test_an_async_task_runs_with_the_async_orm(worker: DjangoWorker) -> None:
    from shop.tasks import multiply

    result = finished(multiply, multiply.enqueue(6, 7).id)

    assert result.status == "SUCCESSFUL", (result.errors, worker.text())
    assert result.return_value["product"] == 42
    assert isinstance(result.return_value["orders"], int)


def test_aenqueue_and_aget_result(worker: DjangoWorker) -> None:
    import asyncio

    from shop.tasks import add

    async def enqueue_and_wait() -> Any:
        enqueued = await add.aenqueue(20, 22)
        deadline = time.monotonic() + DEADLINE
        result = await add.aget_result(enqueued.id)
        while not result.is_finished and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            result = await add.aget_result(enqueued.id)
        return result

    assert asyncio.run(enqueue_and_wait()).return_value == 42


def test_a_task_that_fails_once_is_retried_and_succeeds(worker: DjangoWorker) -> None:
    from shop.tasks import flaky

    enqueued = flaky.enqueue("k1")
    result = finished(flaky, enqueued.id)

    assert result.status == "SUCCESSFUL", (result.errors, worker.text())
    # The task's context said which attempt it was, and gave the task's own id.
    assert result.return_value == {"key": "k1", "attempt": 2, "task_id": enqueued.id}
    assert result.attempts == 2


def test_a_task_that_always_fails_is_a_dead_letter_with_its_error(
    worker: DjangoWorker, pg: Any
) -> None:
    from shop.tasks import Declined, charge

    result = finished(charge, charge.enqueue("order-7").id)

    assert result.status == "FAILED"
    assert result.attempts == 2  # OPTIONS MAX_ATTEMPTS
    [error] = result.errors
    assert error.exception_class_path == "shop.tasks.Declined"
    assert error.exception_class is Declined
    assert "card declined for order-7" in error.traceback
    assert "Traceback (most recent call last)" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert pg_task(pg, result.id).status is pgqueue.TaskStatus.FAILED  # pgqueue's DLQ


def test_a_cancelled_task_never_runs_and_is_failed(worker: DjangoWorker, pg: Any) -> None:
    from django.utils import timezone
    from shop.tasks import add

    later = timezone.now() + timedelta(hours=1)
    enqueued = add.using(run_after=later).enqueue(1, 1)
    assert add.get_result(enqueued.id).status == "READY"

    pgqueue.cancel(pg, enqueued.id)

    result = add.get_result(enqueued.id)
    assert result.status == "FAILED" and result.attempts == 0
    assert result.started_at is None
    [error] = result.errors
    assert error.exception_class is pgqueue.Cancel


def test_run_after_holds_a_task_until_its_time(worker: DjangoWorker) -> None:
    from django.utils import timezone
    from shop.tasks import add

    at = timezone.now() + timedelta(seconds=2)
    enqueued = add.using(run_after=at).enqueue(4, 4)

    assert enqueued.task.run_after == at
    assert add.get_result(enqueued.id).status == "READY"
    result = finished(add, enqueued.id)
    assert result.return_value == 8
    assert result.started_at >= at
    assert result.task.run_after == at  # rebuilt from the payload


def test_priorities_order_the_queue(django_database_url: str, pg: Any, tmp_path: Path) -> None:
    """Django's priorities map onto pgqueue's: tasks enqueued before any worker of their
    queue runs start in priority order (one slot), whatever order they came in. Run by
    ``pgqueue worker --django``, the other way to start a worker."""
    from shop.tasks import record

    ids = {}
    for label, priority in (("low", -10), ("normal", 0), ("high", 100), ("also-low", -100)):
        ids[label] = record.using(priority=priority).enqueue(label).id
    assert pg_task(pg, ids["high"]).priority is pgqueue.Priority.HIGH
    assert pg_task(pg, ids["low"]).priority is pgqueue.Priority.LOW

    argv = [sys.executable, "-m", "pgqueue", "worker", "--django", "--queue", "ordered"]
    ordered = DjangoWorker([*argv, "--concurrency", "1"], django_database_url, tmp_path / "w.log")
    try:
        results = {label: finished(record, task_id) for label, task_id in ids.items()}
    finally:
        ordered.stop()
    assert all(r.status == "SUCCESSFUL" for r in results.values()), ordered.text()
    assert results["high"].task.priority == 100  # Django's own number comes back
    starts = sorted(results, key=lambda label: results[label].started_at)
    assert starts[:2] == ["high", "normal"]
    assert set(starts[2:]) == {"low", "also-low"}


def test_the_backend_says_what_it_supports(django_database_url: str) -> None:
    from pgqueue.contrib.django import PgQueueBackend
    from pgqueue.contrib.django.compat import task_backends

    backend = type(task_backends["default"])
    assert backend is PgQueueBackend
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_an_unknown_result_id_does_not_exist(django_database_url: str) -> None:
    from pgqueue.contrib.django.compat import TaskResultDoesNotExist, task_backends

    for result_id in ("not-a-task-id", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result_id)


def test_the_worker_closes_a_tasks_django_connection_after_it(
    worker: DjangoWorker, pg: Any
) -> None:
    """CONN_MAX_AGE is 0 (Django's default): a view's connection is closed when its request
    ends, and a task's when it ends, rather than kept by the worker's thread for good."""
    from shop.tasks import backend_pid

    pid = finished(backend_pid, backend_pid.enqueue().id).return_value

    def closed() -> bool:
        row = pg.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return row.fetchone()[0] == 0

    wait_until(closed, DEADLINE, f"the task's Django connection (backend {pid}) to close")


def test_a_task_waiting_for_its_parents_is_ready_to_django(worker: DjangoWorker, pg: Any) -> None:
    """A task of a pgqueue workflow, looked up through Django: still READY while
    its parent has not run (a status Django has no name for), not an error."""
    from django.utils import timezone
    from shop.tasks import add

    from pgqueue.contrib.django.backend import STATUSES

    assert set(STATUSES) == set(pgqueue.TaskStatus)
    later = timezone.now() + timedelta(hours=1)
    parent = add.using(run_after=later).enqueue(1, 1)
    child = pgqueue.enqueue(pg, pg_task(pg, parent.id).type, {}, depends_on=[parent.id])
    pg.commit()
    assert pg_task(pg, str(child.id)).status is pgqueue.TaskStatus.WAITING
    assert add.get_result(str(child.id)).status == "READY"
    pgqueue.cancel(pg, parent.id)
    pg.commit()
    assert add.get_result(str(child.id)).status == "FAILED"


def test_pgqueue_worker_django_processes_runs_tasks_with_the_orm_in_forked_children(
    django_database_url: str, tmp_path: Path
) -> None:
    """``--processes 2``: the supervisor set Django up and imported the tasks once; each
    child, forked from it (Linux), runs tasks through the ORM on connections of its own."""
    import json

    from shop.models import Order
    from shop.tasks import process_order

    orders = [Order.objects.create() for _ in range(6)]
    # On a queue the module's own worker (default) does not take.
    ids = [process_order.using(queue_name="ordered").enqueue(o.id).id for o in orders]
    argv = [sys.executable, "-m", "pgqueue", "worker", "--django", "--processes", "2"]
    argv += ["--queue", "ordered"]
    argv += ["--log-format", "json", "--poll-interval", "0.2"]
    fleet = DjangoWorker(argv, django_database_url, tmp_path / "fleet.log")
    try:
        results = [finished(process_order, task_id) for task_id in ids]
    finally:
        fleet.stop()
    assert all(r.status == "SUCCESSFUL" for r in results), fleet.text()
    assert fleet.proc.returncode == 0, fleet.text()
    events = [json.loads(line) for line in fleet.text().splitlines() if line.startswith("{")]
    started = [e for e in events if e["event"] == "worker.process_started"]
    expected = "fork" if sys.platform == "linux" else "spawn"
    assert [e["start"] for e in started] == [expected, expected], fleet.text()
    assert not [e for e in events if e["event"] == "worker.fork_unsafe"], fleet.text()
    assert Order.objects.filter(id__in=[o.id for o in orders], processed=True).count() == 6


@pytest.mark.parametrize("fork_server", ["fork", "spawn"])
def test_django_tasks_run_with_the_orm_in_the_process_executor_s_children(
    django_database_url: str, tmp_path: Path, fork_server: str
) -> None:
    """``--executor process``: each task runs in a child process, through the ORM on the
    child's own connection; Django is set up there by inheritance (a fork server forked from
    the worker) or by the child's fork server itself (spawned: process_registry)."""
    import json

    from shop.models import Order
    from shop.tasks import process_order

    orders = [Order.objects.create() for _ in range(4)]
    # On a queue the module's own worker (default) does not take.
    ids = [process_order.using(queue_name="ordered").enqueue(o.id).id for o in orders]
    argv = [sys.executable, "-m", "pgqueue", "worker", "--django", "--executor", "process"]
    argv += ["--process-pool-size", "2", "--queue", "ordered"]
    argv += ["--log-format", "json", "--poll-interval", "0.2"]
    env = {"PGQUEUE_WORKER_START_METHOD": fork_server}
    fleet = DjangoWorker(argv, django_database_url, tmp_path / "children.log", **env)
    try:
        results = [finished(process_order, task_id) for task_id in ids]
    finally:
        fleet.stop()
    assert all(r.status == "SUCCESSFUL" for r in results), fleet.text()
    assert fleet.proc.returncode == 0, fleet.text()
    events = [json.loads(line) for line in fleet.text().splitlines() if line.startswith("{")]
    [pool] = [e for e in events if e["event"] == "worker.process_pool_started"]
    assert pool["fork_server"] == fork_server, fleet.text()
    assert Order.objects.filter(id__in=[o.id for o in orders], processed=True).count() == 4
