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


class InvalidArgument(InvalidPayload):
    """A function task's argument is missing, unknown, not JSON or of the wrong JSON type
    (issue 15); ``argument`` names it, and the message is the same at every boundary:
    ``payload: argument 'order_id' is missing``."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


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
