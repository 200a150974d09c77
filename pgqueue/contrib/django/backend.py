"""``PgQueueBackend``: Django's Tasks framework on pgqueue.

A Django task becomes a pgqueue task whose type is the task's dotted path
(``shop.tasks.send_receipt``), queue its ``queue_name``, and payload
``{"args": [...], "kwargs": {...}, "django": {"priority": P, "run_after": ISO, "backend":
ALIAS}}``: readable in psql and the dashboard, and enough to rebuild the Django task a result
belongs to. The result id is the pgqueue task id.

Settings (``TASKS["default"]``): ``QUEUES`` as Django defines it, and ``OPTIONS``:

- ``DATABASE``: the Django database alias to enqueue on (default ``"default"``); its
  transaction is the task's;
- ``MAX_ATTEMPTS``: attempts per task (default: the type's declaration, else pgqueue's 3).

Django's priorities (-100..100, higher first, default 0) map onto pgqueue's three: 1..100 is
high, 0 is normal, -100..-1 is low (:func:`pgqueue_priority`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.conf import settings
from django.core import checks
from django.utils import timezone
from django.utils.module_loading import import_string

from pgqueue import operations
from pgqueue.contrib.django.compat import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from pgqueue.contrib.django.database import django_connection
from pgqueue.errors import TaskNotFound
from pgqueue.models import Priority, TaskStatus
from pgqueue.models import Task as PgTask

DEFAULT_DATABASE = "default"

# pgqueue's statuses as Django's: queued (to start, or to be retried) and waiting for its
# parents (a workflow's task) are READY, and both a dead letter and a cancelled task
# are FAILED, Django having no other end for a task.
STATUSES = {
    TaskStatus.WAITING: TaskResultStatus.READY,
    TaskStatus.QUEUED: TaskResultStatus.READY,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    TaskStatus.FAILED: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}

# The exception a stored error starts with: "ValueError: ..." or "shop.tasks.Declined: ...".
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def pgqueue_priority(priority: int) -> Priority:
    """Django's -100..100 (higher runs first) as pgqueue's high/normal/low: above the default
    is high, the default (0) normal, below it low, so that any priority a user sets on
    purpose changes the order against tasks left at the default."""
    if priority > 0:
        return Priority.HIGH
    if priority < 0:
        return Priority.LOW
    return Priority.NORMAL


def task_errors(task: PgTask) -> list[TaskError]:
    """The task's last error as Django's list of errors (pgqueue keeps the last attempt's
    only); a task cancelled without an error gets one naming the cancel, so that a FAILED
    result always says why."""
    error = task.error
    if error is None:
        if task.status is TaskStatus.CANCELLED:
            return [TaskError(exception_class_path="pgqueue.Cancel", traceback="cancelled")]
        return []
    match = _EXCEPTION.match(error.summary)
    name = match.group(1) if match else "Exception"
    path = name if "." in name else f"builtins.{name}"
    text = error.summary if error.traceback is None else f"{error.traceback}\n{error.summary}"
    return [TaskError(exception_class_path=path, traceback=text)]


def payload_of(task: Task, args: Any, kwargs: Any, alias: str) -> dict[str, Any]:
    run_after = task.run_after.isoformat() if task.run_after is not None else None
    return {
        "args": list(args),
        "kwargs": dict(kwargs),
        "django": {"priority": task.priority, "run_after": run_after, "backend": alias},
    }


def django_task(pg: PgTask, alias: str) -> Task:
    """The Django task a pgqueue task of it was enqueued from, with the priority and
    run_after it was enqueued with."""
    try:
        found = import_string(pg.type)
    except ImportError as exc:
        raise ValueError(
            f"task {pg.id} ({pg.type}, attempt {pg.attempts}): cannot import its Django task: {exc}"
        ) from None
    if not isinstance(found, Task):
        raise ValueError(
            f"task {pg.id} ({pg.type}, attempt {pg.attempts}): {pg.type} is a "
            f"{type(found).__name__}, not a Django task"
        )
    meta = pg.payload.get("django") or {}
    run_after = meta.get("run_after")
    return found.using(
        priority=int(meta.get("priority", found.priority)),
        queue_name=pg.queue,
        run_after=dt.datetime.fromisoformat(run_after) if run_after else None,
        backend=alias,
    )


def task_result(pg: PgTask, task: Task, alias: str) -> TaskResult:
    """A pgqueue task as Django's TaskResult. ``worker_ids`` has one entry per attempt spent
    (Django counts attempts by it); pgqueue records the last worker only, which fills it."""
    result = TaskResult(
        task=task,
        id=str(pg.id),
        status=STATUSES[pg.status],
        enqueued_at=pg.created_at,
        started_at=pg.started_at,
        finished_at=pg.finished_at,
        last_attempted_at=pg.started_at,
        args=pg.payload.get("args", []),
        kwargs=pg.payload.get("kwargs", {}),
        backend=alias,
        errors=task_errors(pg),
        worker_ids=[pg.lease_owner or "unknown"] * pg.attempts,
    )
    if pg.status is TaskStatus.COMPLETED:
        object.__setattr__(result, "_return_value", pg.result)
    return result


class PgQueueBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django's Tasks on pgqueue: transactional enqueue on Django's connection, leases,
    retries with backoff, a dead-letter queue, fleet-wide limits. Run the tasks with
    ``python manage.py pgqueue_worker``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", DEFAULT_DATABASE)
        self.max_attempts: int | None = self.options.get("MAX_ATTEMPTS")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": pgqueue_priority(task.priority),
        }
        if task.run_after is not None:
            run_after = task.run_after
            if timezone.is_naive(run_after):  # USE_TZ = False: the project's local time
                run_after = timezone.make_aware(run_after)
            options["run_at"] = run_after
        if self.max_attempts is not None:
            options["max_attempts"] = self.max_attempts
        payload = payload_of(task, args, kwargs, self.alias)
        with django_connection(self.database) as conn:
            enqueued = operations.enqueue(conn, task.module_path, payload, **options)
        result = task_result(enqueued.task, task, self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            with django_connection(self.database) as conn:
                pg = operations.get_task(conn, result_id)
        except TaskNotFound:  # also what a result id that is no task id at all gives
            raise TaskResultDoesNotExist(result_id) from None
        return task_result(pg, django_task(pg, self.alias), self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []
        databases = getattr(settings, "DATABASES", {})
        engine = databases.get(self.database, {}).get("ENGINE", "")
        if self.database not in databases:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {self.database!r}, "
                    "which is not in DATABASES",
                    id="pgqueue.E001",
                )
            )
        elif "postgresql" not in engine:
            errors.append(
                checks.Error(
                    f"pgqueue needs PostgreSQL: DATABASES[{self.database!r}] uses {engine}",
                    hint=f"Set DATABASES[{self.database!r}]['ENGINE'] to "
                    "'django.db.backends.postgresql' (Django then connects with psycopg 3, "
                    f"which pgqueue installs), or TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] "
                    "to an alias on PostgreSQL.",
                    id="pgqueue.E002",
                )
            )
        return errors
