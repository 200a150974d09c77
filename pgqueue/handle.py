"""What enqueueing a function task gives back: a handle on the task, to look at or wait for.

A small class of its own so that ``pgqueue.enqueue`` keeps returning an :class:`EnqueueResult`
while ``send_receipt.enqueue(conn, 42)`` returns something that can also wait for the result.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from pgqueue.models import EnqueueResult, Task


@dataclasses.dataclass(frozen=True)
class TaskHandle:
    """A submitted task: ``id``, ``type``, ``created`` (False: its idempotency key was used
    before and ``task`` is the original) and ``task`` as the enqueue saw it.

    ``wait(conn, timeout=...)`` (and ``await wait_async(...)``) waits for the task to finish
    and returns it, with its result; it raises ``WaitTimeout`` naming the task when
    ``timeout`` seconds pass first. The connection must not be in the transaction that
    enqueued the task: until that commits, no worker can see it.
    """

    result: EnqueueResult

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

    def wait(self, conn: Any, *, timeout: float) -> Task:
        """The task once finished (completed, failed or cancelled), via ``pgqueue.wait``."""
        from pgqueue.operations import wait  # operations builds handles: imported when used

        return wait(conn, self.id, timeout=timeout)

    async def wait_async(self, conn: Any, *, timeout: float) -> Task:
        """As :meth:`wait`, on an async connection (``pgqueue.aio.wait``)."""
        from pgqueue.operations import wait

        return await wait.aio(conn, self.id, timeout=timeout)
