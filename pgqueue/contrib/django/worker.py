"""Running Django tasks in pgqueue's worker, with Django set up.

A pgqueue task enqueued by :class:`~pgqueue.contrib.django.backend.PgQueueBackend` has the
Django task's dotted path as its type. :class:`DjangoTaskRegistry` is an ordinary
``TaskRegistry`` whose handler for such a type imports the Django task by that path and calls
it with the payload's ``args`` and ``kwargs`` (and Django's ``TaskContext`` first, for a
``takes_context`` task). The Django tasks of every installed app's ``tasks`` module are
registered when the worker starts (so their types are declared, as any handler's are); a
task defined elsewhere is imported by its path the first time one is claimed.

Each task runs in the worker's thread pool, an ``async def`` task through ``async_to_sync``
as Django's own ``Task.call`` does, so the ORM works in both. Before and after each task the
thread's stale Django connections are closed (``close_old_connections``), as Django does
around each request: a connection past ``CONN_MAX_AGE`` or broken by the task is not reused.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from django.apps import apps
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from pgqueue.config import ENV_DATABASE_URL
from pgqueue.contrib.django.backend import PgQueueBackend
from pgqueue.contrib.django.compat import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from pgqueue.contrib.django.database import database_url
from pgqueue.executor import TaskContext as PgContext
from pgqueue.registry import Handler, TaskRegistry
from pgqueue.worker import Worker, WorkerConfig

logger = logging.getLogger("pgqueue.contrib.django")


def pgqueue_backends() -> dict[str, PgQueueBackend]:
    """The backends of settings.TASKS that are pgqueue's, by alias."""
    found = {}
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, PgQueueBackend):
            found[alias] = backend
    return found


def queues() -> list[str]:
    """Every queue the pgqueue backends accept (their QUEUES): what a worker works on unless
    told otherwise."""
    return sorted({q for b in pgqueue_backends().values() for q in b.queues} or {"default"})


def database_alias() -> str:
    """The Django database the pgqueue backends enqueue on (the first one's, by alias)."""
    backends = pgqueue_backends()
    return backends[min(backends)].database if backends else "default"


def _running_result(task: Task, payload: Mapping[str, Any], ctx: PgContext) -> TaskResult:
    """The TaskResult a running task sees in its TaskContext (and the signals carry)."""
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(ctx.task_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=task.backend,
        errors=[],
        worker_ids=[ctx.worker_id] * ctx.attempt,
    )


def run_django_task(task: Task, payload: Mapping[str, Any], ctx: PgContext) -> Any:
    """Run one attempt of ``task``: what a pgqueue handler of a Django task does. An exception
    is left to pgqueue (a failed attempt: retried with backoff, or dead-lettered)."""
    close_old_connections()
    result = _running_result(task, payload, ctx)
    sender = type(task.get_backend())
    task_started.send(sender, task_result=result)
    try:
        args = list(payload.get("args", []))
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        value = normalize_json(task.call(*args, **dict(payload.get("kwargs", {}))))
    except BaseException:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", timezone.now())
        task_finished.send(sender, task_result=result)
        raise
    finally:
        close_old_connections()
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender, task_result=result)
    return value


def _handler_of(task: Task) -> Callable[[Mapping[str, Any], PgContext], Any]:
    def handler(payload: Mapping[str, Any], ctx: PgContext) -> Any:
        return run_django_task(task, payload, ctx)

    handler.__name__ = handler.__qualname__ = task.name
    return handler


def _failing_handler(message: str) -> Callable[[Mapping[str, Any], PgContext], Any]:
    def handler(payload: Mapping[str, Any], ctx: PgContext) -> Any:
        raise LookupError(f"task {ctx.task_id} ({ctx.type}, attempt {ctx.attempt}): {message}")

    return handler


class DjangoTaskRegistry(TaskRegistry):
    """The handlers of Django tasks, found by their dotted paths (see the module's docstring)."""

    def add(self, task: Task) -> None:
        """Run ``task`` in this worker (its type: the task's dotted path)."""
        if super().get(task.module_path) is None:
            self.handler(task.module_path)(_handler_of(task))

    def discover(self) -> list[str]:
        """Register the pgqueue-backed tasks of every installed app's ``tasks`` module; their
        types, sorted."""
        ours = set(pgqueue_backends())
        for app in apps.get_app_configs():
            name = f"{app.name}.tasks"
            if importlib.util.find_spec(name) is None:
                continue
            module = importlib.import_module(name)
            for value in vars(module).values():
                if isinstance(value, Task) and value.backend in ours:
                    self.add(value)
        return self.types

    def get(self, type: str) -> Handler | None:
        """The handler of ``type``; a type not registered yet is imported as a Django task's
        path. One that cannot be gets a handler that fails the attempt saying why, so the
        task's error names the cause (it is retried: a deploy may be under way)."""
        found = super().get(type)
        if found is not None:
            return found
        try:
            value = import_string(type)
        except ImportError as exc:
            return self._failing(type, f"cannot import the Django task {type}: {exc}")
        if not isinstance(value, Task):
            kind = value.__class__.__name__
            return self._failing(type, f"{type} is a {kind}, not a Django task")
        if not isinstance(value.get_backend(), PgQueueBackend):
            return self._failing(
                type, f"{type} uses the task backend {value.backend!r}, not pgqueue's"
            )
        self.add(value)
        return super().get(type)

    def _failing(self, type: str, message: str) -> Handler:
        logger.warning("%s", message)
        return Handler(
            type=type, fn=_failing_handler(message), is_async=False, retry=None, timeout=None
        )


def worker_registry() -> DjangoTaskRegistry:
    """A registry of the project's Django tasks, the installed apps' ``tasks`` modules read."""
    registry = DjangoTaskRegistry()
    registry.discover()
    # Where a spawned child of the process executor gets it from: Django is set up there too.
    registry.origin = "pgqueue.contrib.django.setup:process_registry"
    return registry


def worker_database_url(explicit: str | None = None) -> str:
    """Where the worker connects: the URL given, else ``PGQUEUE_DATABASE_URL``, else the
    Django database the pgqueue backends enqueue on (the worker opens its own connections to
    it; it never shares Django's)."""
    if explicit:
        return explicit
    return os.environ.get(ENV_DATABASE_URL, "").strip() or database_url(database_alias())


def run_worker(registry: TaskRegistry, url: str, config: WorkerConfig) -> None:
    """Run the worker until SIGTERM/SIGINT, as ``pgqueue worker`` does."""
    Worker(registry, url, config).run()
