"""Which exceptions retry, and what a task type tells the application about its failures.

Three parts, each declared on the registry (``TaskRegistry(on_failure=...)``,
``@tasks.middleware``) and per task (``@tasks.task(retry_on=..., on_dead=...)``):

- **Retry control.** ``retry_on=(ExcType, ...)`` retries only those exceptions (and their
  subclasses); ``no_retry_on=`` never retries those. An exception that is not to be retried
  dead-letters the task at once, its error stored as usual (type, message, traceback) with a
  line saying why it was not retried. It is decided where the handler runs (a thread, the
  event loop, a child process), on the exception itself. The outcomes a handler raises on
  purpose (``Retry``, ``Cancel``, ``Snooze``, ``Fail``) and the worker's own interruptions (a
  child's ``TimeLimitExceeded``, ``TaskCancelled``) are never classified.
- **Hooks**: ``on_failure`` (every failed attempt), then ``on_retry`` (it will run again) or
  ``on_dead`` (it was dead-lettered), each called with a :class:`TaskFailure` once the
  outcome is written, in the worker process: the outcome is decided before any hook runs,
  so a hook cannot change it, and one that raises (or takes longer than 30 s) is logged as
  ``task.hook_failed`` and the next hook still runs. A plain function runs in a thread, an
  ``async def`` on the worker's loop. For a task run in a child process the exception is a
  :class:`ChildException` (its type's qualified name and its message: an exception object
  does not cross the process boundary; JSON does).
- **Middleware**: ``mw(ctx, call)`` wraps each call of a handler where it runs (in the child,
  for the process executor), ``return call()`` running the rest; what it raises or returns
  is the call's. A plain function wraps plain handlers, an ``async def`` (``return await
  call()``) wraps coroutine handlers: register one of each to wrap both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal

from pgqueue.errors import Fail, ValidationError
from pgqueue.log import event

# How long a hook may take before the worker stops waiting for it (and logs it).
HOOK_TIMEOUT_SECONDS = 30.0

FailureOutcome = Literal["retrying", "dead", "cancelled"]


@dataclasses.dataclass(frozen=True)
class TaskFailure:
    """A failed attempt, as the hooks see it once it is written.

    ``exception`` is what the handler raised (a :class:`ChildException` standing for it when
    the handler ran in a child process), or None when the attempt failed without one: a
    timeout, a child that died, a result that could not be stored, no handler. ``error`` is
    the text stored as the task's last error. ``outcome`` is what the database made of it:
    ``retrying`` (at ``retry_at``), ``dead``, or ``cancelled`` (a cancel asked meanwhile).
    """

    task_id: uuid.UUID
    type: str
    queue: str
    attempt: int
    max_attempts: int
    exception: BaseException | None
    error: str
    outcome: FailureOutcome
    retry_at: datetime | None = None

    @property
    def retries(self) -> int:
        """The retries before this attempt (``attempt - 1``), as Celery counts them."""
        return self.attempt - 1


Hook = Callable[[TaskFailure], Any]
Middleware = Callable[[Any, Callable[[], Any]], Any]


class ChildException(Exception):
    """An exception raised by a handler in a child process, as the worker knows it: the
    qualified name of its type (``module.Qualname``) and its message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message


class NotRetried(Fail):
    """What ``retry_on``/``no_retry_on`` make of an exception that is not to be retried:
    ``error`` is the handler's exception, with a note saying why (stored with it)."""

    def __init__(self, error: Exception, why: str) -> None:
        super().__init__(why)
        self.error = error


ExceptionTypes = type[Exception] | tuple[type[Exception], ...]  # what a decorator is given
ExceptionClasses = tuple[type[Exception], ...]  # what a Handler keeps


def exception_types(
    name: str, value: ExceptionTypes | None, outcomes: tuple[type[BaseException], ...]
) -> tuple[type[Exception], ...] | None:
    """``retry_on``/``no_retry_on`` as a tuple of exception classes, refused at decoration
    time when it is not one (or names one of the outcomes, which are never classified)."""
    if value is None:
        return None
    types = value if isinstance(value, tuple) else (value,)
    if not types:
        raise ValidationError(
            name, "must name at least one exception class (to never retry: max_attempts=1)"
        )
    for t in types:
        if not (isinstance(t, type) and issubclass(t, Exception)):
            raise ValidationError(
                name, f"must be exception classes (ValueError, or a tuple of them), not {t!r}"
            )
        if issubclass(t, outcomes):
            raise ValidationError(
                name,
                f"{t.__name__} is an outcome a handler raises on purpose, never retried or "
                "not by these rules: name the exceptions of the handler's own work",
            )
    return types


def not_retried_because(
    exc: Exception,
    retry_on: tuple[type[Exception], ...] | None,
    no_retry_on: tuple[type[Exception], ...] | None,
) -> str | None:
    """Why ``exc`` is not to be retried under these rules, or None when it is."""
    name = type(exc).__qualname__
    if no_retry_on is not None:
        for t in no_retry_on:
            if isinstance(exc, t):
                which = "" if type(exc) is t else f" (a {t.__qualname__})"
                return f"not retried: {name}{which} is in no_retry_on"
    if retry_on is not None and not isinstance(exc, retry_on):
        names = ", ".join(t.__qualname__ for t in retry_on)
        return f"not retried: {name} is not in retry_on ({names})"
    return None


def qualified_name(cls: type) -> str:
    """A class's ``module.Qualname`` (builtins by their bare name, as tracebacks show them)."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


async def run_hooks(hooks: Sequence[tuple[str, Hook]], failure: TaskFailure) -> None:
    """Call each ``(kind, hook)`` in order with ``failure``; one that raises or overruns is
    logged and the rest still run (the outcome is written already: nothing here changes it)."""
    for kind, hook in hooks:
        try:
            if inspect.iscoroutinefunction(hook):
                await asyncio.wait_for(hook(failure), HOOK_TIMEOUT_SECONDS)
            else:
                await asyncio.wait_for(asyncio.to_thread(hook, failure), HOOK_TIMEOUT_SECONDS)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and not str(exc):
                text = f"did not return within {HOOK_TIMEOUT_SECONDS:g} s"
            else:
                text = f"{type(exc).__name__}: {exc}"
            event(
                "task.hook_failed",
                logging.ERROR,
                task_id=failure.task_id,
                type=failure.type,
                attempt=failure.attempt,
                hook=kind,
                function=getattr(hook, "__qualname__", repr(hook)),
                error=text,
            )
