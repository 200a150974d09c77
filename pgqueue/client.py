"""The convenience form: a Client that opens its own pooled connections from a URL.

Use it where there is no transaction to join (scripts, the CLI, services that only submit).
Each call runs in its own transaction and commits. To enqueue atomically with your own
writes, call ``pgqueue.enqueue(your_connection, ...)`` instead.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from pgqueue import migrate, operations, pooling
from pgqueue.config import redact, resolve_database_url
from pgqueue.errors import DatabaseUnavailable
from pgqueue.models import Task
from pgqueue.waiting import DEFAULT_POLL_INTERVAL

P = ParamSpec("P")
R = TypeVar("R")


def _in_transaction(fn: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Client, P], R]:
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.connection() as conn:
            return fn(conn, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


def _enqueuing(fn: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Client, P], R]:
    """As :func:`_in_transaction`, for an enqueue: the Client's ``notify`` unless the call
    gives one."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        kwargs.setdefault("notify", self.notify)
        with self.connection() as conn:
            return fn(conn, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


class Client:
    """pgqueue on its own connection pool.

    ``database_url`` defaults to ``PGQUEUE_DATABASE_URL``, else the embedded server. The schema
    is checked on first use (SchemaNotReady says to run ``pgqueue migrate``).

    ``pooler="transaction"`` (default: ``PGQUEUE_POOLER``) for a URL that goes through
    PgBouncer, Supavisor or RDS Proxy in transaction mode: the pool's connections prepare no
    statement, and :meth:`wait` listens on ``PGQUEUE_LISTEN_URL`` (a direct URL) or, without
    one, polls (it returns within about half a second of the task's end). ``notify=False``
    (default: ``PGQUEUE_NOTIFY``) enqueues without waking idle workers by NOTIFY: they find
    the tasks when they poll.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        max_connections: int = 4,
        pooler: pooling.Pooler | None = None,
        notify: bool | None = None,
    ) -> None:
        # The settings first: resolving the URL may start the embedded server.
        self.pooler = pooling.resolve_pooler(pooler)
        self.notify = pooling.resolve_notify(notify)
        self.database_url = resolve_database_url(database_url)
        self._max = max_connections
        self._pool: ConnectionPool[Any] | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                migrate.check(self.database_url)
                pool: ConnectionPool[Any] = ConnectionPool(
                    self.database_url,
                    min_size=1,
                    max_size=self._max,
                    open=False,
                    kwargs={"connect_timeout": 10, **pooling.connection_kwargs(self.pooler)},
                    # What the connections were opened for, for what runs on them (a wait).
                    configure=self._remember,
                    # A connection the server dropped while idle would fail one call.
                    check=ConnectionPool.check_connection,
                )
                try:
                    pool.open(wait=True, timeout=15)
                except psycopg.pool.PoolTimeout as exc:  # type: ignore[attr-defined]
                    pool.close()
                    raise DatabaseUnavailable(
                        f"cannot connect to {redact(self.database_url)}: {exc}"
                    ) from None
                self._pool = pool
            return self._pool

    def _remember(self, conn: psycopg.Connection[Any]) -> None:
        pooling.remember(conn, self.pooler)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction that commits on success, rolls back on error."""
        with self._get_pool().connection() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    enqueue = _enqueuing(operations.enqueue)
    enqueue_many = _enqueuing(operations.enqueue_many)
    enqueue_columns = _enqueuing(operations.enqueue_columns)
    get_task = _in_transaction(operations.get_task)
    list_tasks = _in_transaction(operations.list_tasks)
    cancel = _in_transaction(operations.cancel)
    replay = _in_transaction(operations.replay)
    discard = _in_transaction(operations.discard)
    queue_stats = _in_transaction(operations.queue_stats)
    backlog = _in_transaction(operations.backlog)
    busiest_keys = _in_transaction(operations.busiest_keys)
    oldest_snapshot = _in_transaction(operations.oldest_snapshot)
    overview = _in_transaction(operations.overview)
    throughput_series = _in_transaction(operations.throughput_series)
    recent_failures = _in_transaction(operations.recent_failures)
    pause_queue = _in_transaction(operations.pause_queue)
    resume_queue = _in_transaction(operations.resume_queue)
    remove_queue = _in_transaction(operations.remove_queue)
    list_queues = _in_transaction(operations.list_queues)
    set_queue_retention = _in_transaction(operations.set_queue_retention)
    set_limit = _in_transaction(operations.set_limit)
    clear_limit = _in_transaction(operations.clear_limit)
    list_limits = _in_transaction(operations.list_limits)
    throughput = _in_transaction(operations.throughput)
    sweep_expired = _in_transaction(operations.sweep_expired)
    prune = _in_transaction(operations.prune)

    # Waiting for a result.
    def wait(
        self,
        task_id: uuid.UUID | str,
        *,
        timeout: float,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> Task:
        """:func:`pgqueue.wait` on a pooled connection, held for the whole wait (a pool of
        ``max_connections`` holds as many waits at once): the finished task, or WaitTimeout.

        Not through ``connection()``, whose block is one transaction: a wait must run
        between transactions, each of its reads in its own."""
        with self._get_pool().connection() as conn:
            return operations.wait(conn, task_id, timeout=timeout, poll_interval=poll_interval)

    def wait_workflow(
        self,
        workflow_id: uuid.UUID | str,
        *,
        timeout: float,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> Any:
        """:func:`pgqueue.wait_workflow` on a pooled connection held for the whole wait, as
        :meth:`wait`: the workflow's final result, or WorkflowFailed / WorkflowCancelled /
        WorkflowWaitTimeout."""
        with self._get_pool().connection() as conn:
            return operations.wait_workflow(
                conn, workflow_id, timeout=timeout, poll_interval=poll_interval
            )
