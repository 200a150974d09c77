"""The errors pgqueue raises at its boundaries.

Every error derives from :class:`PgQueueError`, so an application can catch them all at once.
Messages are written for the person who will read them: they name the bad value and say what
would be accepted instead.
"""

from __future__ import annotations

from typing import Any


class PgQueueError(Exception):
    """Root of every error pgqueue raises on purpose."""


class ValidationError(PgQueueError, ValueError):
    """A value given to pgqueue is not acceptable; nothing was written.

    ``field`` names the offending argument, so HTTP and CLI layers can point at it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class InvalidPriority(ValidationError):
    def __init__(self, value: Any) -> None:
        super().__init__(
            "priority", f"unknown priority {value!r}; expected one of 'high', 'normal', 'low'"
        )


class InvalidPayload(ValidationError):
    def __init__(self, message: str) -> None:
        super().__init__("payload", message)


class PayloadTooLarge(InvalidPayload):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes encoded as JSON; the limit is {limit} bytes")
        self.size = size
        self.limit = limit


class ConfigurationError(PgQueueError):
    """A setting (argument or environment variable) is invalid."""


class InvalidDatabaseURL(ConfigurationError):
    pass


class DatabaseUnavailable(PgQueueError):
    """The database could not be reached; the message never contains the password.

    ``transient`` says whether waiting may help: a server that is down, starting up or out of
    connections comes back; a wrong password, an unknown role or a database that does not
    exist do not, and retrying would only hide the mistake.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class SchemaNotReady(PgQueueError):
    """The pgqueue schema is missing or older than this version of pgqueue expects."""


class UnsupportedConnection(PgQueueError, TypeError):
    """The object passed as a connection is not one pgqueue can share a transaction with."""


class TaskNotFound(PgQueueError, LookupError):
    def __init__(self, task_id: object) -> None:
        super().__init__(f"no task with id {str(task_id)!r}")
        self.task_id = task_id


class QueueNotFound(PgQueueError, LookupError):
    """No queue of that name: it has no tasks and no settings (most often a typo). Setting one
    up before its first task is an explicit choice, which ``hint`` says how to make."""

    def __init__(self, queue: str, hint: str) -> None:
        super().__init__(f"no queue {queue!r}: it has no tasks and no settings; {hint}")
        self.queue = queue
        self.hint = hint


class InvalidTaskState(PgQueueError):
    """The task is not in a status that allows the operation (e.g. cancelling a finished task)."""

    def __init__(self, task_id: object, status: str, message: str) -> None:
        super().__init__(f"task {task_id}: {message} (status is {status!r})")
        self.task_id = task_id
        self.status = status


class LeaseLost(PgQueueError):
    """The caller no longer holds the task's lease: it expired and was swept or re-claimed.

    The write was not applied. The task belongs to whoever holds the current lease (or is
    queued again); a worker that sees this must drop its result, not retry the write.
    """

    def __init__(self, task_id: object) -> None:
        super().__init__(f"task {task_id}: lease lost; the outcome was not recorded")
        self.task_id = task_id


# --- waiting for a result (issue 15) -----------------------------------------------------------


class WaitTimeout(PgQueueError, TimeoutError):
    """The task did not finish within the wait's timeout; it goes on as before.

    ``task`` is the task as last read (its status says where it got to: still queued, or
    running); the message names its id, type and that status.
    """

    def __init__(self, task: Any, timeout: float) -> None:
        super().__init__(
            f"task {task.id} ({task.type}) did not finish within {timeout:g} s; "
            f"it is still {task.status.value} (attempt {task.attempts} of {task.max_attempts})"
        )
        self.task = task
        self.task_id = task.id
        self.status = task.status.value
        self.timeout = timeout


class WaitInTransaction(PgQueueError):
    """``wait`` was called on a connection inside an open transaction.

    It could never succeed: a task enqueued in that transaction is invisible to workers until
    it commits, and PostgreSQL delivers the notification that wakes a waiter only between
    transactions. Commit first, or wait on another connection.
    """

    def __init__(self, task_id: object) -> None:
        super().__init__(
            f"cannot wait for task {task_id} on a connection inside an open transaction: a "
            "task enqueued in it stays invisible to workers until it commits, and the "
            "notification that ends the wait is only delivered between transactions; commit "
            "first (or wait on another connection)"
        )
        self.task_id = task_id
