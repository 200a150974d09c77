"""What enqueueing a function task gives back: a handle on the task, to look at or wait for;
and :class:`AsyncResult`, the same questions asked of a task known only by its id.

A small class of its own so that ``pgqueue.enqueue`` keeps returning an :class:`EnqueueResult`
while ``send_receipt.enqueue(conn, 42)`` returns something that can also wait for the result.

Where a question goes: the connection given to it (any that ``pgqueue.enqueue`` takes, or a
``pgqueue.Client``), else the client the handle came from (``fn.delay``, ``fn.enqueue(client)``),
else the default client (``pgqueue.configure``, ``PGQUEUE_DATABASE_URL``).
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from typing import TYPE_CHECKING, Any, TypeGuard

from pgqueue.errors import TaskFailed, TaskWasCancelled, ValidationError
from pgqueue.models import EnqueueResult, Task, TaskStatus

if TYPE_CHECKING:
    from pgqueue.client import Client

FINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


def is_client(conn: object) -> TypeGuard[Client]:
    """Whether ``conn`` is a pgqueue.Client. Read from the loaded modules: a call on a
    connection of the caller's does not load the pool's module to answer no."""
    module = sys.modules.get("pgqueue.client")
    return module is not None and isinstance(conn, module.Client)


def outcome(task: Task, propagate: bool) -> Any:
    """A finished task's result; its failure or cancellation raised (TaskFailed,
    TaskWasCancelled) when ``propagate``, else the task itself returned."""
    if task.status is TaskStatus.COMPLETED:
        return task.result
    if not propagate:
        return task
    if task.status is TaskStatus.FAILED:
        raise TaskFailed(task)
    raise TaskWasCancelled(task)


class ResultQuestions:
    """The questions a Celery ``AsyncResult`` answers, asked of the task ``id``: ``get``,
    ``status``, ``ready``, ``successful``, ``failed``, and ``refresh`` for the whole task."""

    @property
    def id(self) -> uuid.UUID:
        raise NotImplementedError

    def _client(self) -> Client | None:
        return None

    def _source(self, conn: Any) -> Any:
        """The connection or Client to ask: the one given, the handle's, else the default."""
        if conn is not None:
            return conn
        own = self._client()
        if own is not None:
            return own
        from pgqueue import defaults

        return defaults.client(
            f"task {self.id}'s status or result without a connection (pass conn=..., any "
            "connection pgqueue.enqueue takes or a pgqueue.Client)"
        )

    def refresh(self, conn: Any = None) -> Task:
        """The task as it is now in the database (TaskNotFound once pruned)."""
        from pgqueue.operations import get_task

        source = self._source(conn)
        if is_client(source):
            return source.get_task(self.id)
        return get_task(source, self.id)

    @property
    def status(self) -> TaskStatus:
        """The task's status now (``queued``, ``running``, ``completed``, ``failed``,
        ``cancelled``, ``waiting``), read through the handle's client or the default one;
        ``refresh(conn).status`` reads it on a connection of yours."""
        return self.refresh().status

    def ready(self, conn: Any = None) -> bool:
        """Whether the task is finished: completed, failed (dead-lettered) or cancelled."""
        return self.refresh(conn).status in FINAL

    def successful(self, conn: Any = None) -> bool:
        """Whether the task completed."""
        return self.refresh(conn).status is TaskStatus.COMPLETED

    def failed(self, conn: Any = None) -> bool:
        """Whether the task failed (dead-lettered); a cancelled task has not failed."""
        return self.refresh(conn).status is TaskStatus.FAILED

    def get(
        self,
        timeout: float,
        propagate: bool = True,
        *,
        conn: Any = None,
        poll_interval: float | None = None,
    ) -> Any:
        """Wait for the task to finish and return its result. A failed task raises
        TaskFailed (the stored exception's type and message), a cancelled one
        TaskWasCancelled; with ``propagate=False`` the finished Task is returned instead
        (tell it from a result with ``isinstance(value, pgqueue.Task)``). WaitTimeout after
        ``timeout`` seconds (the task goes on). Woken by a notification, as ``pgqueue.wait``.
        ``conn`` must not be in an open transaction (commit the enqueue first)."""
        return outcome(self._wait(conn, timeout, poll_interval), propagate)

    def _wait(self, conn: Any, timeout: float, poll_interval: float | None) -> Task:
        from pgqueue.operations import wait

        source = self._source(conn)
        options: dict[str, Any] = {"timeout": timeout}
        if poll_interval is not None:
            options["poll_interval"] = poll_interval
        if is_client(source):
            return source.wait(self.id, **options)
        return wait(source, self.id, **options)

    async def aget(
        self,
        timeout: float,
        propagate: bool = True,
        *,
        conn: Any,
        poll_interval: float | None = None,
    ) -> Any:
        """As :meth:`get`, on an async connection (psycopg or SQLAlchemy), which it needs."""
        from pgqueue.operations import wait

        options: dict[str, Any] = {"timeout": timeout}
        if poll_interval is not None:
            options["poll_interval"] = poll_interval
        task = await wait.aio(conn, self.id, **options)
        return outcome(task, propagate)


@dataclasses.dataclass(frozen=True)
class TaskHandle(ResultQuestions):
    """A submitted task: ``id``, ``type``, ``created`` (False: its idempotency key, or its
    caller-chosen ``task_id``, was used before and ``task`` is the original) and ``task`` as
    the enqueue saw it; ``client``, the Client it was submitted through (None for a
    connection of the caller's).

    ``get(timeout=..., propagate=True)`` waits and returns the result (raising TaskFailed or
    TaskWasCancelled); ``status``, ``ready()``, ``successful()``, ``failed()`` read the task
    now. A handle from ``fn.delay`` or ``fn.enqueue(client)`` asks its client; one from
    ``fn.enqueue(conn)`` needs ``conn=...`` or the default client.

    ``wait(conn, timeout=...)`` (and ``await wait_async(...)``) waits for the task to finish
    and returns it, with its result, whatever its outcome; it raises ``WaitTimeout`` naming
    the task when ``timeout`` seconds pass first. The connection must not be in the
    transaction that enqueued the task: until that commits, no worker can see it.
    """

    result: EnqueueResult
    client: Client | None = dataclasses.field(default=None, compare=False, repr=False)

    def _client(self) -> Client | None:
        return self.client

    @property
    def id(self) -> uuid.UUID:
        return self.result.task.id

    @property
    def type(self) -> str:
        return self.result.task.type

    @property
    def created(self) -> bool:
        return self.result.created

    @property
    def task(self) -> Task:
        return self.result.task

    def wait(self, conn: Any = None, *, timeout: float) -> Task:
        """The task once finished (completed, failed or cancelled), via ``pgqueue.wait``; on
        ``conn`` (a connection or a Client), else as :meth:`get` asks."""
        return self._wait(conn, timeout, None)

    async def wait_async(self, conn: Any, *, timeout: float) -> Task:
        """As :meth:`wait`, on an async connection (``pgqueue.aio.wait``)."""
        from pgqueue.operations import wait

        return await wait.aio(conn, self.id, timeout=timeout)


class AsyncResult(ResultQuestions):
    """A task known by its id (a UUID or its text), as Celery's ``AsyncResult(task_id)``:
    ``get``, ``status``, ``ready()``, ``successful()``, ``failed()``, ``refresh()``, asked
    through ``client`` if given, else a connection passed to each call, else the default
    client. An unknown id is TaskNotFound when asked (not a pending task forever)."""

    def __init__(self, task_id: uuid.UUID | str, *, client: Client | None = None) -> None:
        self._id = parse_task_id(task_id)
        self.client = client

    @property
    def id(self) -> uuid.UUID:
        return self._id

    def _client(self) -> Client | None:
        return self.client

    def __repr__(self) -> str:
        return f"<AsyncResult {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


def parse_task_id(task_id: object) -> uuid.UUID:
    """A caller-given task id: a UUID, or its text; anything else is a ValidationError."""
    if isinstance(task_id, uuid.UUID):
        return task_id
    if isinstance(task_id, str):
        try:
            return uuid.UUID(task_id.strip())
        except ValueError:
            pass
    raise ValidationError(
        "task_id", f"must be a UUID or its text (e.g. str(uuid.uuid4())), not {task_id!r}"
    )
