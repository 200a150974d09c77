"""The errors pgqueue raises at its boundaries.

Every error derives from :class:`PgQueueError`, so an application can catch them all at once.
Messages are written for the person who will read them: they name the bad value and say what
would be accepted instead.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pgqueue.error_text import split_error


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
        super().__init__(
            f"payload is {size} bytes as stored (the JSON text PostgreSQL gives back); "
            f"the limit is {limit} bytes"
        )
        self.size = size
        self.limit = limit


class InvalidResult(ValidationError):
    """A task's result (a handler's return value, or ``complete``'s ``result``) cannot be
    stored; nothing was written. ``task_id`` names the task; the message names its type and
    attempt too when the worker knows them."""

    def __init__(self, task_id: object, subject: str, message: str) -> None:
        super().__init__("result", f"result of {subject} {message}")
        self.task_id = task_id


class ResultTooLarge(InvalidResult):
    def __init__(self, task_id: object, subject: str, size: int, limit: int) -> None:
        super().__init__(
            task_id,
            subject,
            f"is {size:,} bytes as stored (the JSON text PostgreSQL gives back), "
            f"over the {limit:,}-byte limit PGQUEUE_MAX_RESULT_BYTES",
        )
        self.size = size
        self.limit = limit


class InvalidArgument(InvalidPayload):
    """A function task's argument is missing, unknown, not JSON or of the wrong JSON type;
    ``argument`` names it, and the message is the same at every boundary:
    ``payload: argument 'order_id' is missing``."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


class DependencyError(ValidationError):
    """A task's ``depends_on`` cannot be accepted: a cycle, the task itself, a
    duplicate, an unknown parent, too many parents. Raised before anything is written."""

    def __init__(self, message: str, *, task_id: object = None) -> None:
        super().__init__("depends_on", message)
        self.task_id = task_id


class DependencyCycle(DependencyError):
    """The tasks of one batch depend on each other in a circle (``cycle``: their ids, in
    dependency order, the first repeated at the end); such tasks could never run."""

    def __init__(self, cycle: list[Any]) -> None:
        super().__init__(
            "the tasks form a cycle: " + " -> ".join(str(t) for t in cycle), task_id=cycle[0]
        )
        self.cycle = cycle


class UnknownParent(DependencyError):
    """A parent id is neither in the same batch nor an existing task (``parent_id``)."""

    def __init__(self, parent_id: object, *, task_id: object = None) -> None:
        super().__init__(
            f"parent {parent_id} is not a task (neither in this batch nor in pgqueue.tasks)",
            task_id=task_id,
        )
        self.parent_id = parent_id


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


class WorkflowNotFound(TaskNotFound):
    """No task belongs to a workflow with this id: a typo, or a workflow whose
    tasks were all pruned. A TaskNotFound, so that whatever reports an unknown task (404 in
    HTTP, the CLI's not_found) reports this alike."""

    def __init__(self, workflow_id: object) -> None:
        super().__init__(workflow_id)
        self.args = (f"no workflow with id {str(workflow_id)!r}",)
        self.workflow_id = workflow_id


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


class TaskInterrupted(PgQueueError):
    """Raised inside a handler that runs in a child process (``executor="process"``) to make
    it stop: :class:`TimeLimitExceeded` when its timeout passes, :class:`TaskCancelled` when
    someone cancels its task. Catch it to clean up (close a file, roll back); whatever the
    handler does afterwards, the attempt is recorded as timed out, or the task as cancelled,
    and a handler still running ``hard_timeout`` seconds later is killed with its process.
    A handler stuck in C code (a blocking call that never returns to Python) never sees it:
    the kill is what stops it then.

    Async handlers in a child see ``asyncio.CancelledError`` instead (asyncio's way to stop a
    coroutine), as they would under ``asyncio.timeout``; handlers in threads or on the
    worker's loop never see either (``ctx.should_stop()`` is their signal)."""


class TimeLimitExceeded(TaskInterrupted):
    """The task's ``timeout`` passed (the soft limit); ``seconds`` is the timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the task's time limit of {seconds:g} s passed")
        self.seconds = seconds


class TaskCancelled(TaskInterrupted):
    """Someone asked to cancel the running task (``pgqueue cancel``, ``DELETE``)."""

    def __init__(self, reason: str = "cancellation requested") -> None:
        super().__init__(reason)


class Fail(Exception):  # an outcome, not an error of pgqueue's
    """Raised by a handler to fail its task for good: the attempt is recorded failed with
    ``reason`` and the task is dead-lettered at once, attempts left or not (a bad input, a
    declined card: a retry would fail the same way). Unlike :class:`~pgqueue.Cancel`, the task
    ends ``failed``, so it is listed, counted and replayable with the dead letters."""

    def __init__(self, reason: str = "failed by the handler") -> None:
        super().__init__(reason)
        self.reason = reason


# What a refused key reuse differs in.
ComparedField = Literal["type", "queue", "payload", "concurrency_key"]


class IdempotencyConflict(PgQueueError):
    """An idempotency key was reused for a different task, and the submit asked to be refused
    then (``key_reuse="refuse"``) rather than handed the original, as payment APIs do.

    A reuse that matches the original's type, queue and payload (JSON equality: key order and
    spacing do not matter) and concurrency key is the same request retried and returns the
    original (a queue or concurrency key left out matches any); this error means at least one
    of them differs, and ``differing_fields`` says which, in the order ``type``, ``queue``,
    ``payload``, ``concurrency_key``. ``task_id`` is the task that holds the key. In a batch,
    ``index`` is the refused item's position, and ``original_index`` the position of the
    earlier item of the same batch that holds the key, if one does (its ``task_id`` then names
    a task that was not written, since the whole batch is refused).

    Nothing was written, and no SQL error was raised: the caller's transaction is still
    usable, and whatever it did before the call stands.
    """

    def __init__(
        self,
        idempotency_key: str,
        task_id: uuid.UUID,
        differing_fields: tuple[ComparedField, ...],
        *,
        original_type: str,
        original_queue: str,
        index: int | None = None,
        original_index: int | None = None,
        original_concurrency_key: str | None = None,
    ) -> None:
        named = f"type {original_type!r}, queue {original_queue!r}"
        if original_concurrency_key is not None:
            named += f", concurrency key {original_concurrency_key!r}"
        if original_index is None:
            where = f"task {task_id} ({named})"
        else:
            where = f"item {original_index} of this batch (task {task_id}, {named})"
        refused = "this task" if index is None else f"item {index} of the batch"
        nothing = "nothing was written" if index is None else "none of the batch was written"
        super().__init__(
            f"idempotency key {idempotency_key!r} is already held by {where}, and {refused} "
            f"differs from it in {', '.join(differing_fields)}; {nothing} (key_reuse='refuse': "
            "submit the same type, queue, payload and concurrency key to get the original back, or "
            "use a new key)"
        )
        self.idempotency_key = idempotency_key
        self.task_id = task_id
        self.differing_fields = differing_fields
        self.original_type = original_type
        self.original_queue = original_queue
        self.original_concurrency_key = original_concurrency_key
        self.index = index
        self.original_index = original_index


# --- waiting for a result -----------------------------------------------------------


class WaitTimeout(PgQueueError, TimeoutError):
    """The task did not finish within the wait's timeout; it goes on as before.

    ``task`` is the task as last read (its status says where it got to: still queued, or
    running); the message names its id, type and that status.
    """

    def __init__(self, task: Any, timeout: float) -> None:
        message = (
            f"task {task.id} ({task.type}) did not finish within {timeout:g} s; "
            f"it is still {task.status.value} (attempt {task.attempts} of {task.max_attempts})"
        )
        if task.status.value == "queued" and task.attempts == 0:
            # Never claimed: the usual cause is no worker on its queue, which nothing else says
            # (a task not due yet is not a mystery: its time is in the message).
            queue = getattr(task, "queue", None)
            due = getattr(task, "visible_after", None)
            if due is not None and due > datetime.now(UTC):
                message += f"; it is not due until {due.isoformat()}"
            elif queue:
                message += (
                    f"; no worker has claimed it yet: is one running for queue {queue!r}, "
                    f"and the queue not paused? (pgqueue worker MODULE:REGISTRY --queue {queue})"
                )
        super().__init__(message)
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


# --- waiting for a workflow ---------------------------------------------------------


class WorkflowWaitTimeout(WaitTimeout):
    """The workflow did not become final within the wait's timeout; it goes on as before. A
    WaitTimeout, as for a task; ``info`` is the workflow as last read (``task`` is None)."""

    def __init__(self, info: Any, timeout: float) -> None:
        PgQueueError.__init__(
            self,
            f"workflow {info.id} did not finish within {timeout:g} s; it is still "
            f"{info.status.value} ({_counted(info.counts)})",
        )
        self.info = info
        self.task = None
        self.task_id = info.id
        self.status = info.status.value
        self.timeout = timeout


class WorkflowFailed(PgQueueError):
    """The awaited workflow ended failed: at least one of its tasks was dead-lettered.
    ``info`` is the workflow; ``task`` the first dead-lettered task in build order (its id,
    type, attempts and last error are in the message)."""

    def __init__(self, info: Any) -> None:
        failed = [t.task for t in info.tasks if t.status.value == "failed"]
        task = failed[0]
        summary = (task.last_error or "").strip().splitlines()
        error = summary[-1] if summary else "no error recorded"
        super().__init__(
            f"workflow {info.id} failed: task {task.id} ({task.type}) was dead-lettered after "
            f"attempt {task.attempts} of {task.max_attempts}: {error}"
        )
        self.info = info
        self.task = task
        self.workflow_id = info.id


class WorkflowCancelled(PgQueueError):
    """The awaited workflow ended cancelled (none of its tasks failed, at least one was
    cancelled). ``info`` is the workflow; ``task`` the first cancelled task in build order."""

    def __init__(self, info: Any) -> None:
        cancelled = [t.task for t in info.tasks if t.status.value == "cancelled"]
        task = cancelled[0]
        super().__init__(
            f"workflow {info.id} was cancelled: task {task.id} ({task.type}) and "
            f"{len(cancelled) - 1} other(s) cancelled"
        )
        self.info = info
        self.task = task
        self.workflow_id = info.id


def _counted(counts: Any) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n) or "no tasks"


# --- a task's outcome, asked for by its result (fn.delay(...).get()) ---------------------------

# The stored error's exception type, at the start of its summary: ``ValueError`` or a
# qualified ``app.errors.PaymentDeclined``, followed by ``: message`` or nothing.
_EXCEPTION_TYPE = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)(?::\s?(.*))?$", re.DOTALL)


class TaskFailed(PgQueueError):
    """The awaited task ended failed (dead-lettered: its attempts spent, or failed at once).

    ``task`` is the task as read; ``task_id``, ``type`` and ``attempts`` are its own;
    ``exception_type`` and ``exception_message`` are the handler's exception as the worker
    stored it (``ValueError`` and ``bad order``; a qualified name for an exception of the
    application, ``app.errors.Declined``); ``exception_type`` is None for an error that was
    not an exception (a timeout, a process that died), whose text is ``exception_message``.
    ``traceback`` is the stored traceback, if any.
    """

    def __init__(self, task: Any) -> None:
        text = split_error(task.last_error or "")
        summary = text.summary.strip()
        found = _EXCEPTION_TYPE.match(summary) if summary else None
        # "ValueError" alone, or "ValueError: msg"; "timed out after 5 s" has a space first.
        if found is not None and (
            found.group(2) is not None or "." in summary or summary[0].isupper()
        ):
            self.exception_type: str | None = found.group(1)
            self.exception_message = (found.group(2) or "").strip()
        else:
            self.exception_type = None
            self.exception_message = summary or "no error recorded"
        self.task = task
        self.task_id = task.id
        self.type = task.type
        self.attempts = task.attempts
        self.traceback = text.traceback
        error = (
            f"{self.exception_type}: {self.exception_message}"
            if self.exception_type and self.exception_message
            else self.exception_type or self.exception_message
        )
        super().__init__(
            f"task {task.id} ({task.type}) failed after attempt {task.attempts} of "
            f"{task.max_attempts}: {error}"
        )


class TaskWasCancelled(PgQueueError):
    """The awaited task ended cancelled: by an operator (``pgqueue cancel``, ``DELETE``), by
    its handler (``raise pgqueue.Cancel(...)``), because it expired unstarted, or because a
    parent failed. ``task`` is the task as read; its ``last_error`` says why, when known.

    Not :class:`TaskCancelled`, which is raised *inside* a running handler to stop it."""

    def __init__(self, task: Any) -> None:
        reason = (task.last_error or "").strip().splitlines()
        why = f": {reason[0]}" if reason else ""
        super().__init__(f"task {task.id} ({task.type}) was cancelled{why}")
        self.task = task
        self.task_id = task.id
        self.type = task.type
        self.reason = reason[0] if reason else None
