"""Testing code that uses pgqueue: a real worker in the test, a task called with a context,
and an eager mode for unit tests without a database (docs/testing.md).

- :func:`worker` runs a real worker in this process against the test database, for a
  registry; ``drain()`` waits until its queues have nothing ready or running (River's
  ``rivertest``, Oban's ``drain_queue``). :func:`run_until_empty` is the one-line form.
- :func:`call` runs a task function as a worker would (its arguments through their JSON form
  and back, a real :class:`~pgqueue.TaskContext` with attempt 1, a task id, its type and
  queue) and returns its result; :func:`context` builds such a context (another attempt,
  parents, a connection whose transaction the test owns) for :func:`call_with`.
- :func:`eager` makes ``fn.enqueue(...)`` run the function at once instead of storing it, for
  tests that have no database; the handle it gives holds the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg

from pgqueue.errors import PgQueueError, ValidationError
from pgqueue.executor import TaskContext
from pgqueue.function_tasks import EAGER, TaskFunction
from pgqueue.handle import TaskHandle
from pgqueue.models import ClaimedTask, EnqueueResult, Parent, Task, TaskStatus
from pgqueue.operations import backlog
from pgqueue.queries.specs import DEFAULT_PRIORITY, DEFAULT_RETRY, TaskSpec
from pgqueue.registry import Cancel, TaskRegistry
from pgqueue.result_encoding import encode_result
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.service import Worker

__all__ = [
    "EagerHandle",
    "EagerMode",
    "TestWorker",
    "acall",
    "acall_with",
    "call",
    "call_with",
    "context",
    "eager",
    "run_until_empty",
    "worker",
]

# --- a task called with a real context ----------------------------------------------------------


class _OneConnection:
    """What TaskContext takes as its pool, handing out the test's own connection: the
    handler's writes stay in the test's transaction, for the test to read, commit or roll
    back (nothing records a completion)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def getconn(self) -> Any:
        return self.conn

    def putconn(self, conn: Any) -> None:
        return None


class _OneAsyncConnection(_OneConnection):
    async def getconn(self) -> Any:  # type: ignore[override,unused-ignore]
        return self.conn

    async def putconn(self, conn: Any) -> None:  # type: ignore[override]
        return None


def context(
    fn: TaskFunction[..., Any],
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    task_id: uuid.UUID | None = None,
    queue: str | None = None,
    parents: Sequence[Parent] = (),
    workflow_id: uuid.UUID | None = None,
    concurrency_key: str | None = None,
    connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None = None,
) -> TaskContext:
    """A worker's TaskContext for a call of ``fn``: attempt ``attempt`` of ``max_attempts``
    (default: the declared), a fresh task id unless given, the declared queue. With
    ``connection``, ``ctx.connection`` (sync) or ``await ctx.aconnection()`` (async) is that
    connection, in the test's own transaction."""
    if not isinstance(fn, TaskFunction):
        raise TypeError(f"expected a function declared with @tasks.task, not {type(fn).__name__}")
    retry = fn.declared.retry or DEFAULT_RETRY
    now = datetime.now(UTC)
    task = ClaimedTask(
        id=task_id or uuid.uuid4(),
        queue=queue or fn.declared.queue or "default",
        type=fn.type,
        payload={},
        priority=fn.declared.priority or DEFAULT_PRIORITY,
        attempts=attempt,
        max_attempts=max_attempts or retry.max_attempts,
        lease_token=uuid.uuid4(),
        lease_expires_at=now + timedelta(seconds=30),
        created_at=now,
        has_parents=bool(parents),
        workflow_id=workflow_id,
        parents=tuple(parents),
        concurrency_key=concurrency_key,
    )
    sync_pool: Callable[[], Any] | None = None
    async_pool: Callable[[], Awaitable[Any]] | None = None
    if isinstance(connection, psycopg.AsyncConnection):
        shim = _OneAsyncConnection(connection)

        async def give() -> Any:
            return shim

        async_pool = give
    elif connection is not None:
        one = _OneConnection(connection)
        sync_pool = lambda: one  # noqa: E731
    return TaskContext(
        task, worker_id="pgqueue.testing", sync_pool=sync_pool, async_pool=async_pool
    )


def _payload(fn: TaskFunction[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's payload as a worker reads it back: bound, checked, encoded (a datetime to
    its ISO string), through JSON and the payload size limit, as an enqueue stores it."""
    if not isinstance(fn, TaskFunction):
        raise TypeError(f"expected a function declared with @tasks.task, not {type(fn).__name__}")
    return json.loads(fn.bind(*args, **kwargs).payload_json)


def _storable(ctx: TaskContext, value: Any) -> Any:
    """``value`` if a worker could store it as the result (else InvalidResult, which would
    dead-letter the task)."""
    encode_result(value, ctx.task_id, subject=f"task {ctx.task_id} ({ctx.type})")
    return value


def call_with(ctx: TaskContext, fn: TaskFunction[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` with these arguments as a worker runs it, with ``ctx`` (:func:`context`);
    return its result. Its exceptions (``Retry``, ``Cancel`` included) are raised."""
    payload = _payload(fn, args, kwargs)
    handler = fn.handler()
    if not fn.is_async:
        return _storable(ctx, handler(payload, ctx))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _storable(ctx, asyncio.run(cast(Any, handler(payload, ctx))))
    raise RuntimeError(
        f"{fn.type} is async and an event loop is running: await pgqueue.testing.acall(...)"
    )


def call(fn: TaskFunction[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` as a worker would, with a real TaskContext (attempt 1, a fresh task id, its
    type and queue): ``pgqueue.testing.call(send_receipt, 42)``. The arguments go through
    their stored JSON form and back, so what could not be enqueued cannot be called either."""
    return call_with(context(fn), fn, *args, **kwargs)


async def acall_with(
    ctx: TaskContext, fn: TaskFunction[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """As :func:`call_with`, from async code (a sync function runs in a thread)."""
    payload = _payload(fn, args, kwargs)
    handler = fn.handler()
    if fn.is_async:
        return _storable(ctx, await handler(payload, ctx))
    return _storable(ctx, await asyncio.to_thread(handler, payload, ctx))


async def acall(fn: TaskFunction[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """As :func:`call`, from async code."""
    return await acall_with(context(fn), fn, *args, **kwargs)


# --- eager mode -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EagerHandle(TaskHandle):
    """What ``enqueue`` gives under :func:`eager`: the task as if a worker had run it once
    (``task.status`` completed, failed or cancelled; ``task.result`` the result's JSON form),
    ``value`` (the function's own return value) and ``error`` (what it raised, if anything).
    ``wait`` returns the task at once; ``get()`` returns ``value`` or raises ``error``."""

    value: Any = None
    error: BaseException | None = None

    @property
    def status(self) -> TaskStatus:
        return self.task.status

    def ready(self, conn: Any = None) -> bool:
        return True

    def successful(self, conn: Any = None) -> bool:
        return self.task.status is TaskStatus.COMPLETED

    def failed(self, conn: Any = None) -> bool:
        return self.task.status is TaskStatus.FAILED

    def get(  # timeout optional: nothing to wait for
        self,
        timeout: float | None = None,
        propagate: bool = True,
        *,
        conn: Any = None,
        poll_interval: float | None = None,
    ) -> Any:
        """The function's return value, or (``propagate``) its exception raised again."""
        if self.error is not None and propagate:
            raise self.error
        return self.value

    def wait(self, conn: Any = None, *, timeout: float | None = None) -> Task:
        return self.task

    async def wait_async(self, conn: Any = None, *, timeout: float | None = None) -> Task:
        return self.task


class EagerMode(contextlib.ContextDecorator):
    """Within it, ``enqueue``/``aenqueue``/``enqueue_many`` of the function tasks of
    ``registry`` (None: of every registry) run the function at once, in the caller's thread,
    instead of writing a task; the connection given is not used, so a unit test needs no
    database. Each call still binds, checks and encodes its arguments as an enqueue does, and
    the function gets them back from JSON, with a real TaskContext (attempt 1, no
    connection). One attempt, no retry, no delay: ``run_at``, ``delay`` and the queue do not
    hold it back. With ``propagate`` (the default) the function's exception is raised from
    ``enqueue``; without, the handle records it (``handle.task.status`` failed, ``get()``
    raises it). A task the function enqueues runs eagerly too.

    It is process-wide while it lasts (code under test may enqueue from another thread, as a
    web framework's test client does): do not run eager tests in parallel threads. Workflows
    (``chain``, ``group``) and submits by type name (``pgqueue.enqueue``) are not run eagerly.
    """

    def __init__(self, registry: TaskRegistry | None = None, *, propagate: bool = True) -> None:
        self.registry = registry
        self.propagate = propagate
        self.handles: list[EagerHandle] = []  # every call run, in order

    def __enter__(self) -> EagerMode:
        EAGER.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        EAGER.remove(self)

    def covers(self, task: TaskFunction[..., Any]) -> bool:
        if self.registry is None:
            return True
        handler = self.registry.get(task.type)
        return handler is not None

    def _handle(
        self, fn: TaskFunction[..., Any], spec: TaskSpec, ctx: TaskContext, outcome: Any
    ) -> EagerHandle:
        value, error = outcome
        now = datetime.now(UTC)
        status, result, last_error = TaskStatus.COMPLETED, None, None
        if isinstance(error, Cancel):
            status, last_error = TaskStatus.CANCELLED, str(error) or "cancelled by handler"
        elif error is not None:
            status, last_error = TaskStatus.FAILED, f"{type(error).__name__}: {error}"
        else:
            try:
                encoded = encode_result(
                    value, ctx.task_id, subject=f"task {ctx.task_id} ({fn.type})"
                )
            except PgQueueError as exc:  # a result a worker could not store: dead-lettered
                status, last_error, error = TaskStatus.FAILED, f"{type(exc).__name__}: {exc}", exc
            else:
                result = None if encoded is None else json.loads(encoded)
        task = Task(
            id=ctx.task_id,
            queue=ctx.queue,
            type=fn.type,
            payload=json.loads(spec.payload_json),
            priority=spec.priority or fn.declared.priority or DEFAULT_PRIORITY,
            status=status,
            attempts=1,
            max_attempts=ctx.max_attempts,
            visible_after=now,
            idempotency_key=spec.idempotency_key,
            result=result,
            last_error=last_error,
            cancel_requested=False,
            lease_owner=None,
            lease_expires_at=None,
            created_at=now,
            started_at=now,
            finished_at=now,
            concurrency_key=spec.concurrency_key,
        )
        handle = EagerHandle(EnqueueResult(task=task, created=True), value=value, error=error)
        self.handles.append(handle)
        if error is not None and self.propagate:
            raise error
        return handle

    def _context(self, fn: TaskFunction[..., Any], spec: TaskSpec) -> TaskContext:
        if spec.type != fn.type:  # fn.enqueue_many(conn, [other.bind(...)])
            raise ValidationError(
                "calls",
                f"eager mode runs {fn.type}'s calls with {fn.type}: a prepared task of type "
                f"{spec.type!r} is enqueued through its own function",
            )
        return context(
            fn,
            task_id=spec.id,
            queue=spec.queue,
            max_attempts=spec.max_attempts,
            concurrency_key=spec.concurrency_key,
        )

    def run(self, fn: TaskFunction[..., Any], spec: TaskSpec) -> EagerHandle:
        ctx = self._context(fn, spec)
        payload = json.loads(spec.payload_json)
        try:
            if fn.is_async:
                value = _run_coroutine(fn.handler(), payload, ctx)
            else:
                value = fn.handler()(payload, ctx)
            outcome: tuple[Any, BaseException | None] = (value, None)
        except Exception as exc:
            outcome = (None, exc)
        return self._handle(fn, spec, ctx, outcome)

    async def arun(self, fn: TaskFunction[..., Any], spec: TaskSpec) -> EagerHandle:
        ctx = self._context(fn, spec)
        payload = json.loads(spec.payload_json)
        handler = fn.handler()
        try:
            if fn.is_async:
                value = await handler(payload, ctx)
            else:
                value = await asyncio.to_thread(handler, payload, ctx)
            outcome: tuple[Any, BaseException | None] = (value, None)
        except Exception as exc:
            outcome = (None, exc)
        return self._handle(fn, spec, ctx, outcome)


def eager(registry: TaskRegistry | None = None, *, propagate: bool = True) -> EagerMode:
    """:class:`EagerMode` for ``registry``'s function tasks (None: every registry's):
    ``with pgqueue.testing.eager(tasks): ...``, or as a decorator of a test."""
    return EagerMode(registry, propagate=propagate)


def _run_coroutine(handler: Callable[..., Any], payload: Any, ctx: TaskContext) -> Any:
    """An async function's call from sync code: on a new loop, in a thread of its own when
    this thread already runs one (a sync ``enqueue`` inside an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(handler(payload, ctx))
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(handler(payload, ctx))
        except BaseException as exc:  # delivered to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="pgqueue-eager")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- a real worker in the test --------------------------------------------------------------------


class TestWorker:
    """A real worker running ``registry``'s handlers for ``queues`` in a thread of this
    process (its own event loop), against ``database_url``: what :func:`worker` yields."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(
        self,
        registry: TaskRegistry,
        database_url: str,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 4,
        poll_interval: float = 0.1,
    ) -> None:
        self.database_url = database_url
        self.queues = list(queues) if queues is not None else _registry_queues(registry)
        config = WorkerConfig(
            queues=self.queues, concurrency=concurrency, poll_interval=poll_interval
        )
        self.worker = Worker(registry, database_url, config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="pgqueue-testing-worker", daemon=True
        )
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self.worker.run_async())
        except BaseException as exc:  # raised again by drain() and stop()
            self._error = exc

    def start(self) -> TestWorker:
        self._thread.start()
        return self

    def _check_running(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the test worker stopped: {self._error!r}") from self._error
        if not self._thread.is_alive():
            raise RuntimeError(f"the test worker stopped (exit code {self.worker.exit_code})")

    def pending(self) -> int:
        """Tasks of the worker's queues that are ready or running now (scheduled ones, such
        as a retry's after its backoff, are not counted)."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = backlog(conn, self.queues)
        return sum(r.ready + r.running for r in rows)

    def drain(self, timeout: float = 30.0, *, interval: float = 0.05) -> None:
        """Wait until the worker's queues have no task ready or running (a task the
        finished ones enqueued included), read from the database; raises TimeoutError
        naming what is left after ``timeout`` seconds. Tasks scheduled for later
        (``delay``, a retry's backoff) are left for later. What became of the tasks is read
        from the database too (``pgqueue.get_task``, ``pgqueue.list_tasks``): the worker's
        own counters trail its writes."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_running()
            left = self.pending()
            if left == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{left} task(s) of queues {', '.join(self.queues)} still ready or running "
                    f"after {timeout} s"
                )
            time.sleep(interval)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully (the running tasks finish) and wait for the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.request_stop)
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the test worker did not stop within {timeout} s")
        self._loop.close()
        if self._error is not None:
            raise RuntimeError(f"the test worker stopped: {self._error!r}") from self._error


def _registry_queues(registry: TaskRegistry) -> list[str]:
    """The queues the registry's types declare, and ``default``."""
    queues = {"default"}
    for declaration in registry.declarations():
        if declaration.queue:
            queues.add(declaration.queue)
    for schedule in registry.schedules:
        queues.add(schedule.queue)
    return sorted(queues)


@contextlib.contextmanager
def worker(
    registry: TaskRegistry,
    database_url: str,
    *,
    queues: Sequence[str] | None = None,
    concurrency: int = 4,
) -> Iterator[TestWorker]:
    """A real worker for ``registry`` in this process while the block runs (queues: those
    its types declare, and ``default``), stopped gracefully at its end::

        with pgqueue.testing.worker(tasks, database_url) as w:
            send_receipt.enqueue(conn, 42)
            conn.commit()
            w.drain()
    """
    test_worker = TestWorker(registry, database_url, queues=queues, concurrency=concurrency)
    test_worker.start()
    try:
        yield test_worker
    finally:
        test_worker.stop()


def run_until_empty(
    registry: TaskRegistry,
    database_url: str,
    *,
    queues: Sequence[str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Run a worker until the queues have nothing ready or running, then stop it."""
    with worker(registry, database_url, queues=queues) as w:
        w.drain(timeout)
