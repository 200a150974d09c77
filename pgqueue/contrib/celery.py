"""Running Celery and pgqueue side by side while tasks move to pgqueue, one at a time.

Two pieces, for the two places a Celery task lives during a move:

- its call sites: :func:`moved` wraps a Celery task whose work is now a pgqueue function task,
  so that the code that calls ``send_welcome.delay(...)`` or ``.apply_async(...)`` keeps
  working and submits to pgqueue instead of the broker. The Celery task itself stays
  registered in the Celery app, so a Celery worker still runs the messages sent before.
- the messages already in the broker: :func:`forward` drains, from Celery's Redis queues, the
  messages of the tasks that have moved (a pgqueue registry names them) into pgqueue tasks,
  keyed by the Celery task id as the idempotency key, and leaves every other message where it
  is, for the Celery workers.

Neither imports Celery; :func:`forward` imports redis-py (``pip install 'celery[redis]'``
brings it). The forwarder reads kombu's Redis layout rather than consuming through kombu:
a kombu consumer can only take a message (and then must put back the ones not moved, at the
other end of the list, where it would take them again), while the forwarder must leave them
untouched. Each moved message is taken atomically (a Lua script: ``LREM`` from the queue,
``LPUSH`` onto a list of the forwarder's own) and removed from that list only after the
pgqueue transaction that holds its task has committed: a forwarder that dies in between
leaves it there, and the next pass forwards it again, which the idempotency key makes a
no-op. At least once into pgqueue, exactly one task per Celery id.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from pgqueue.arguments import check_arguments
from pgqueue.config import ENV_DATABASE_URL
from pgqueue.enqueue import prepare
from pgqueue.errors import DatabaseUnavailable, InvalidArgument, PgQueueError, ValidationError
from pgqueue.function_tasks import TaskFunction
from pgqueue.handle import outcome
from pgqueue.models import Priority, Task, TaskStatus
from pgqueue.operations import enqueue_many
from pgqueue.queries.specs import TaskSpec
from pgqueue.registry import TaskRegistry

log = logging.getLogger("pgqueue.contrib.celery")

# --- call sites: a moved task's .delay / .apply_async ------------------------------------------

# apply_async options that only say how Celery talks to its broker: meaningless here, so
# accepted and not used. Any other option pgqueue does not map is refused, not dropped.
TRANSPORT_OPTIONS = frozenset(
    {
        "retry",
        "retry_policy",
        "serializer",
        "compression",
        "exchange",
        "exchange_type",
        "routing_key",
        "producer",
        "connection",
        "router",
        "delivery_mode",
        "mandatory",
        "immediate",
        "ignore_result",
        "add_to_parent",
    }
)


class _Clients:
    """One ``pgqueue.Client`` per database URL and process: a Celery prefork worker (or any
    forking server) that calls a moved task must not share its parent's pooled sockets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str | None, tuple[int, Any]] = {}

    def get(self, database_url: str | None) -> Any:
        """The client for ``database_url``; None is ``PGQUEUE_DATABASE_URL`` as it is now, so
        a client made for an earlier value is not reused for another database."""
        from pgqueue.client import Client

        key = database_url or os.environ.get(ENV_DATABASE_URL, "").strip() or None
        with self._lock:
            held = self._clients.get(key)
            if held is not None and held[0] == os.getpid():
                return held[1]
            client = Client(key)
            self._clients[key] = (os.getpid(), client)
            return client

    def close(self) -> None:
        """Close this process's clients (a forked child's inherited ones are its parent's)."""
        with self._lock:
            held, self._clients = self._clients, {}
        for pid, client in held.values():
            if pid == os.getpid():
                client.close()


_clients = _Clients()


# pgqueue's statuses as Celery's states, for code that reads ``result.status``.
CELERY_STATES = {
    TaskStatus.QUEUED: "PENDING",
    TaskStatus.WAITING: "PENDING",
    TaskStatus.RUNNING: "STARTED",
    TaskStatus.COMPLETED: "SUCCESS",
    TaskStatus.FAILED: "FAILURE",
    TaskStatus.CANCELLED: "REVOKED",
}


class MovedResult:
    """What a moved task's ``.delay``/``.apply_async`` returns, in place of Celery's
    AsyncResult: ``id`` (the pgqueue task's), ``status`` in Celery's words, ``ready()``,
    ``successful()``, ``failed()`` and ``get(timeout=, propagate=True)``."""

    def __init__(self, client: Any, task: Task, created: bool) -> None:
        self._client = client
        self.task = task
        # False: a task with this task_id (the idempotency key) existed; this is that one.
        self.created = created

    @property
    def id(self) -> str:
        return str(self.task.id)

    task_id = id

    def _refresh(self) -> Task:
        from pgqueue.operations import get_task

        with self._client.connection() as conn:
            self.task = get_task(conn, self.task.id)
        return self.task

    @property
    def status(self) -> str:
        task = self._refresh()
        if task.status == TaskStatus.QUEUED and task.attempts > 0:
            return "RETRY"
        return CELERY_STATES.get(TaskStatus(task.status), "PENDING")

    state = status

    def ready(self) -> bool:
        return self._refresh().status in (
            TaskStatus.COMPLETED,
            TaskStatus.FAILED,
            TaskStatus.CANCELLED,
        )

    def successful(self) -> bool:
        return self._refresh().status == TaskStatus.COMPLETED

    def failed(self) -> bool:
        return self._refresh().status == TaskStatus.FAILED

    def get(self, timeout: float | None = None, propagate: bool = True) -> Any:
        """The task's result once it finished; ``pgqueue.TaskFailed`` if it failed,
        ``pgqueue.TaskWasCancelled`` if it was cancelled
        (with ``propagate=False``, the error text instead); ``pgqueue.WaitTimeout`` when
        ``timeout`` seconds pass first (None: wait as long as it takes, as Celery does)."""
        from pgqueue.errors import WaitTimeout

        while True:
            try:
                task = self._client.wait(
                    self.task.id, timeout=3600.0 if timeout is None else timeout
                )
                break
            except WaitTimeout:
                if timeout is not None:
                    raise
        self.task = task
        if task.status == TaskStatus.COMPLETED or propagate:
            return outcome(task, propagate)  # pgqueue.TaskFailed, TaskWasCancelled
        return task.last_error

    def __repr__(self) -> str:
        return f"<MovedResult {self.id} ({self.task.type})>"


def _as_utc(value: datetime) -> datetime:
    """Celery reads a naive eta or expires in its timezone, UTC unless configured: so here."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _when(name: str, value: object) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(name, f"not an ISO 8601 time: {value!r}") from None
    if not isinstance(value, datetime):
        raise ValidationError(name, f"must be a datetime, not {type(value).__name__}")
    return _as_utc(value)


class MovedTask:
    """A Celery task whose calls go to pgqueue (see :func:`moved`). Everything but the calls
    (``name``, ``run``, calling it directly) is the Celery task's."""

    def __init__(
        self, celery_task: Any, pgqueue_task: TaskFunction[..., Any], database_url: str | None
    ) -> None:
        self.celery_task = celery_task
        self.pgqueue_task = pgqueue_task
        self.database_url = database_url

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.celery_task(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "celery_task":  # not set yet (a copy being made): not the Celery task's
            raise AttributeError(name)
        return getattr(self.celery_task, name)

    def __repr__(self) -> str:
        return f"<moved to pgqueue: {self.pgqueue_task.type!r} (Celery {self.celery_task.name!r})>"

    def delay(self, *args: Any, **kwargs: Any) -> MovedResult:
        """Submit to pgqueue now, in a transaction of its own (committed on return)."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | str | None = None,
        expires: float | datetime | str | None = None,
        queue: str | None = None,
        priority: Priority | str | int | None = None,
        **options: Any,
    ) -> MovedResult:
        """Submit to pgqueue in a transaction of its own, committed on return: ``countdown``
        is pgqueue's ``delay``, ``eta`` its ``run_at``, ``expires`` (seconds or a time) its
        expiry, ``queue`` and ``priority`` (pgqueue's: high, normal, low or 0-2) its own, and
        ``task_id`` the idempotency key (a second call with it returns the first task).
        Options pgqueue cannot honour (``link``, ``link_error``, ``shadow``, time limits, ...)
        raise ValidationError rather than being dropped."""
        unknown = sorted(set(options) - TRANSPORT_OPTIONS)
        if unknown:
            raise ValidationError(
                unknown[0],
                f"{self.celery_task.name} moved to pgqueue, which has no apply_async option "
                f"{unknown[0]!r}; drop it, or keep this task on Celery until it is ported "
                "(for callbacks, build a pgqueue.chain of the port's .s())",
            )
        if countdown is not None and eta is not None:
            raise ValidationError("countdown", "give countdown or eta, not both")
        expires_in: float | None = None
        expires_at: datetime | None = None
        if isinstance(expires, int | float) and not isinstance(expires, bool):
            expires_in = float(expires)
        elif expires is not None:
            expires_at = _when("expires", expires)
        task = self.pgqueue_task.options(
            queue=queue,
            priority=priority,
            idempotency_key=task_id,
            delay=countdown,
            run_at=None if eta is None else _when("eta", eta),
            expires_in=expires_in,
            expires_at=expires_at,
        )
        client = _clients.get(self.database_url)
        with client.connection() as conn:
            handle = task.enqueue(conn, *(args or ()), **dict(kwargs or {}))
        return MovedResult(client, handle.task, handle.created)

    def _no_canvas(self, *args: Any, **kwargs: Any) -> Any:
        raise ValidationError(
            "signature",
            f"{self.celery_task.name} moved to pgqueue: a Celery signature of it would still "
            "be sent through the broker; build the workflow with pgqueue.chain/group/chord "
            "of the port's .s()",
        )

    s = si = signature = map = starmap = chunks = _no_canvas


def moved(
    pgqueue_task: TaskFunction[..., Any], *, database_url: str | None = None
) -> Callable[[Any], MovedTask]:
    """Mark a Celery task as moved to ``pgqueue_task``: its ``.delay``/``.apply_async``
    submit to pgqueue (through a ``pgqueue.Client`` on ``database_url``, default
    ``PGQUEUE_DATABASE_URL``), with the same arguments, mapped by the function's parameters.

    Put it above ``@app.task``, so that the module's name is the moved task::

        @moved(port.send_welcome)
        @app.task(name="shop.send_welcome")
        def send_welcome(user_id, email): ...

    The Celery app keeps the task registered: a Celery worker still runs the messages sent
    before the move (or drain them with :func:`forward`). Each call commits on its own; to
    submit in your own transaction, call the port's ``enqueue(conn, ...)``.
    """
    if not isinstance(pgqueue_task, TaskFunction):
        raise ValidationError(
            "pgqueue_task",
            f"must be a function declared with @tasks.task, not {type(pgqueue_task).__name__}",
        )

    def mark(celery_task: Any) -> MovedTask:
        if not hasattr(celery_task, "apply_async") or not hasattr(celery_task, "name"):
            raise ValidationError(
                "celery_task",
                f"@moved goes above @app.task (got {type(celery_task).__name__}, "
                "not a Celery task)",
            )
        return MovedTask(celery_task, pgqueue_task, database_url)

    return mark


# --- the broker's leftovers: forward ---------------------------------------------------------

# kombu's Redis transport: a queue is a list (LPUSH to publish, BRPOP to consume), one per
# priority step, named queue + SEP + step for the steps above 0.
PRIORITY_STEPS = (0, 3, 6, 9)
SEP = "\x06\x16"
# A taken message waits here until its pgqueue task is committed.
FORWARDING = "pgqueue:celery-forwarding:{queue}"

# Takes each message given (ARGV[2:]) out of the queue's list (KEYS[1]) onto the
# forwarder's (KEYS[2]), atomically: a Celery worker gets it or the forwarder does, never
# both. ARGV[1] is LREM's count, 1 or -1: searched from the end nearer the messages, since
# Redis runs nothing else meanwhile and a search is as long as the elements it passes.
_TAKE = """
local taken = {}
local from = tonumber(ARGV[1])
for i = 2, #ARGV do
  if redis.call('LREM', KEYS[1], from, ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i])
    taken[#taken + 1] = i - 1
  end
end
return taken
"""

# Puts a taken message back at the consuming end of its queue, where a Celery worker takes it.
_GIVE_BACK = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
return 0
"""

# Messages that are part of a Celery canvas: forwarding only this task would lose the rest.
CANVAS_KEYS = ("callbacks", "errbacks", "chain", "chord")


class Unforwardable(PgQueueError):
    """A moved task's message that cannot become a pgqueue task as it is; left in Redis.
    ``task`` and ``id`` are the message's where its headers could be read ("" if not)."""

    def __init__(self, reason: str, *, task: str = "", id: str = "") -> None:
        super().__init__(reason)
        self.task = task
        self.id = id


@dataclasses.dataclass(frozen=True)
class CeleryMessage:
    """A Celery task message as the forwarder reads it (protocol 1 or 2, JSON)."""

    raw: bytes
    id: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    eta: datetime | None
    expires: datetime | None
    embed: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: bytes) -> CeleryMessage:
        """Read kombu's envelope and Celery's body; Unforwardable for a body that is not JSON
        (pickle would run code of the broker's choosing here; msgpack and yaml are not read)."""
        try:
            envelope = json.loads(raw)
            headers = envelope.get("headers") or {}
            properties = envelope.get("properties") or {}
            body: Any = envelope["body"]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise Unforwardable(f"not a kombu message: {exc}") from None
        # Protocol 2 names the task in the headers: known before the body is read.
        named = {"task": str(headers.get("task") or ""), "id": str(headers.get("id") or "")}
        content_type = envelope.get("content-type")
        if content_type != "application/json":
            raise Unforwardable(
                f"its body is {content_type}, not application/json: the forwarder reads only "
                "JSON (Celery's default task_serializer)",
                **named,
            )
        try:
            if properties.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            decoded = json.loads(body)
        except (ValueError, TypeError) as exc:
            raise Unforwardable(f"its body is not JSON: {exc}", **named) from None
        if "task" in headers:  # protocol 2: [args, kwargs, embed]
            try:
                args, kwargs, embed = decoded
            except (TypeError, ValueError):
                raise Unforwardable("its body is not [args, kwargs, embed]", **named) from None
            meta: Mapping[str, Any] = headers
        elif isinstance(decoded, dict) and "task" in decoded:  # protocol 1
            args, kwargs, meta = decoded.get("args") or [], decoded.get("kwargs") or {}, decoded
            embed = {k: decoded.get(k) for k in ("callbacks", "errbacks", "chord")}
        else:
            raise Unforwardable("it names no task (neither protocol 1 nor 2)")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise Unforwardable("its args are not a list or its kwargs not an object")
        try:
            eta = None if not meta.get("eta") else _as_utc(datetime.fromisoformat(meta["eta"]))
            expires = (
                None
                if not meta.get("expires")
                else _as_utc(datetime.fromisoformat(meta["expires"]))
            )
        except (TypeError, ValueError) as exc:
            raise Unforwardable(f"its eta or expires is not ISO 8601: {exc}") from None
        return cls(
            raw=raw,
            id=str(meta.get("id") or ""),
            task=str(meta["task"]),
            args=args,
            kwargs=kwargs,
            eta=eta,
            expires=expires,
            embed=embed if isinstance(embed, Mapping) else {},
        )


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where a moved Celery task goes: its pgqueue type and that type's parameters, and the
    function task itself where the caller gave it (its declared concurrency key is then
    computed from the arguments, as at any of its call sites)."""

    type: str
    parameters: Mapping[str, Any] | None
    function: TaskFunction[..., Any] | None = None

    def spec(self, message: CeleryMessage, registry: TaskRegistry) -> TaskSpec:
        """The pgqueue task of this message, validated as any submit (arguments, size,
        options), keyed by its Celery id; Unforwardable with pgqueue's reason if it cannot be."""
        options: dict[str, Any] = {
            "idempotency_key": message.id,
            "run_at": message.eta,
            "expires_at": message.expires,
        }
        try:
            if self.function is not None:
                return self.function.options(**options).bind(*message.args, **message.kwargs)
            payload = self.payload(message)
            return prepare(self.type, payload, **registry.enqueue_options(self.type, options))
        except PgQueueError as exc:
            raise Unforwardable(str(exc), task=message.task, id=message.id) from None

    def payload(self, message: CeleryMessage) -> dict[str, Any]:
        """Celery's args and kwargs by the function's parameter names, checked as any call of
        it; a handler's (no parameters) payload is the kwargs, and positional args refused."""
        if self.parameters is None:
            if message.args:
                raise Unforwardable(
                    f"{self.type} is a handler, whose payload is an object: positional "
                    "arguments have no names to go under"
                )
            return dict(message.kwargs)
        positional = [p["name"] for p in self.parameters["parameters"] if p["kind"] != "keyword"]
        if len(message.args) > len(positional):
            raise Unforwardable(
                f"{len(message.args)} positional arguments for {self.type}, which takes "
                f"{len(positional)}"
            )
        payload = dict(zip(positional, message.args, strict=False))
        for name, value in message.kwargs.items():
            if name in payload:
                raise Unforwardable(f"argument {name!r} is given twice")
            payload[name] = value
        try:
            check_arguments(self.parameters, payload)
        except InvalidArgument as exc:
            raise Unforwardable(str(exc)) from None
        return payload


@dataclasses.dataclass
class ForwardReport:
    """What a :func:`forward` run did. ``forwarded``: pgqueue tasks created; ``duplicates``:
    messages whose Celery id already had a task (a redelivery, or a pass after a crash);
    ``expired``: moved messages past their ``expires``, removed as a Celery worker would;
    ``refused``: moved messages that cannot be forwarded as they are (left in Redis), by
    Celery id, with the reason; ``left``: messages of tasks not moved, seen and left."""

    forwarded: int = 0
    duplicates: int = 0
    expired: int = 0
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    left: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def destinations(
    registry: TaskRegistry,
    names: Mapping[str, str] | None = None,
    only: Iterable[str | TaskFunction[..., Any]] | None = None,
) -> dict[str, Destination]:
    """The moved tasks by Celery name: every type in ``registry`` under its own name (name
    the port's tasks as Celery did, ``@tasks.task(name="shop.send_welcome")``), or only the
    types ``only`` names or holds (a port may be ahead of the move), and the Celery names
    ``names`` maps to a type of it."""
    given = list(registry.types if only is None else only)
    functions = {f.type: f for f in given if isinstance(f, TaskFunction)}
    chosen = [f.type if isinstance(f, TaskFunction) else f for f in given]
    unknown = [t for t in chosen if registry.get(t) is None]
    if unknown:
        raise ValidationError(
            "only",
            f"{unknown[0]!r} is not a type of the registry "
            f"(its types: {', '.join(registry.types) or 'none'})",
        )
    out: dict[str, Destination] = {}
    for type_ in chosen:
        handler = registry.get(type_)
        assert handler is not None  # one of its types
        out[type_] = Destination(type_, handler.parameters, functions.get(type_))
    for celery_name, type_ in (names or {}).items():
        handler = registry.get(type_)
        if handler is None:
            raise ValidationError(
                "names",
                f"{celery_name!r} maps to {type_!r}, which the registry does not declare "
                f"(its types: {', '.join(registry.types) or 'none'})",
            )
        out[celery_name] = Destination(type_, handler.parameters)
    return out


# A message to take: with its task, or None when it expired (taken, and dropped).
Taken = tuple[CeleryMessage, TaskSpec | None]


class _Forwarder:
    """One forwarder's passes over the queues: take, commit, then drop (see the module)."""

    def __init__(
        self,
        redis: Any,
        client: Any,
        registry: TaskRegistry,
        moved_tasks: Mapping[str, Destination],
        queues: Sequence[str],
        batch_size: int,
    ) -> None:
        self.redis = redis
        self.client = client
        self.registry = registry
        self.moved = moved_tasks
        self.queues = queues
        self.batch_size = batch_size
        self.take = redis.register_script(_TAKE)
        self.give_back = redis.register_script(_GIVE_BACK)
        self.report = ForwardReport()
        self._told: set[bytes] = set()  # refused messages already logged

    def run_pass(self) -> int:
        """Forward what each queue holds for moved tasks; the number of messages taken."""
        taken = 0
        self.report.left = 0  # what this pass saw, not a sum over a follower's passes
        for queue in self.queues:
            held = FORWARDING.format(queue=queue)
            # First what an earlier pass (this forwarder's or a dead one's) took and did not
            # get to commit: forwarded again, a no-op where it was committed.
            for chunk in _chunks(self.redis.lrange(held, 0, -1), self.batch_size):
                self._commit(held, [r for r in (self._recover(raw, queue) for raw in chunk) if r])
            for step in PRIORITY_STEPS:
                key = queue if step == 0 else f"{queue}{SEP}{step}"
                taken += self._drain(key, held)
        return taken

    def _recover(self, raw: bytes, queue: str) -> Taken | None:
        """A message an earlier pass took: forwarded again, or, when it is no longer a moved
        task's (the registry changed in between), given back to the queue for Celery."""
        try:
            return self._ready(raw)
        except (Unforwardable, KeyError) as exc:
            log.warning("celery.forward.given_back: %s", exc)
            self.give_back(keys=[FORWARDING.format(queue=queue), queue], args=[raw])
            return None

    def _ready(self, raw: bytes) -> Taken:
        message = CeleryMessage.parse(raw)
        destination = self.moved[message.task]
        if message.expires is not None and message.expires <= datetime.now(UTC):
            return message, None
        return message, destination.spec(message, self.registry)

    def _drain(self, key: str, held: str) -> int:
        taken = 0
        start = 0
        while True:
            page: list[bytes] = self.redis.lrange(key, start, start + self.batch_size - 1)
            if not page:
                return taken
            start += len(page)
            ready = [r for r in (self._check(raw) for raw in page) if r is not None]
            if not ready:
                continue
            # In the list's back half, the messages are nearer its tail: search from there.
            back = start > self.redis.llen(key) // 2
            args = ["-1" if back else "1", *(m.raw for m, _ in ready)]
            flags = self.take(keys=[key, held], args=args)
            mine = [ready[int(i) - 1] for i in flags]
            start -= len(mine)  # the list got shorter in front of the next page
            taken += len(mine)
            self._commit(held, mine)

    def _check(self, raw: bytes) -> Taken | None:
        """A message to take (with its destination and payload), or None: not a moved task's
        (left), or a moved task's that cannot be forwarded (left, and logged once)."""
        try:
            message = CeleryMessage.parse(raw)
        except Unforwardable as exc:
            if exc.task and exc.task not in self.moved:
                self.report.left += 1  # Celery's to read, whatever its serializer
            else:
                self._refuse(raw, exc.id, exc)
            return None
        if message.task not in self.moved:
            self.report.left += 1
            return None
        try:
            canvas = [k for k in CANVAS_KEYS if message.embed.get(k)]
            if canvas:
                raise Unforwardable(
                    f"it carries Celery {' and '.join(canvas)}: forwarding this task alone "
                    "would drop them; let a Celery worker run it"
                )
            if not message.id:
                raise Unforwardable("it has no task id to key the pgqueue task by")
            return self._ready(raw)
        except Unforwardable as exc:
            self._refuse(raw, message.id, exc)
            return None

    def _refuse(self, raw: bytes, celery_id: str, exc: Exception) -> None:
        key = celery_id or f"unreadable:{hashlib.sha256(raw).hexdigest()[:16]}"
        self.report.refused[key] = str(exc)
        if raw not in self._told:
            self._told.add(raw)
            log.error("celery.forward.refused id=%s: %s (left in Redis)", celery_id or "?", exc)

    def _commit(
        self,
        held: str,
        ready: Iterable[Taken],
    ) -> None:
        """Enqueue the taken messages in one transaction; only once it committed are they
        dropped from the forwarder's list."""
        ready = list(ready)
        if not ready:
            return
        specs = [spec for _, spec in ready if spec is not None]
        for message, spec in ready:
            if spec is None:
                log.info("celery.forward.expired id=%s task=%s", message.id, message.task)
        # One statement; a Celery id twice in the batch (a redelivery) is created once.
        with self.client.connection() as conn:
            results = enqueue_many(conn, specs) if specs else []
        created = sum(1 for r in results if r.created)
        duplicates, expired = len(results) - created, len(ready) - len(specs)
        # Committed: now, and only now, the messages may go.
        with self.redis.pipeline() as pipe:
            for message, _ in ready:
                pipe.lrem(held, 1, message.raw)
            pipe.execute()
        self.report.forwarded += created
        self.report.duplicates += duplicates
        self.report.expired += expired
        log.info(
            "celery.forward.batch forwarded=%d duplicates=%d expired=%d",
            created,
            duplicates,
            expired,
        )


def _chunks(items: Sequence[bytes], size: int) -> Iterable[Sequence[bytes]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def forward(
    broker_url: str,
    registry: TaskRegistry,
    *,
    queues: Sequence[str] = ("celery",),
    names: Mapping[str, str] | None = None,
    only: Iterable[str | TaskFunction[..., Any]] | None = None,
    database_url: str | None = None,
    follow: bool = False,
    poll_interval: float = 1.0,
    batch_size: int = 100,
    stop: threading.Event | None = None,
) -> ForwardReport:
    """Move the messages of moved tasks from Celery's Redis queues into pgqueue tasks.

    A message is moved when its Celery task name is a type of ``registry`` (or ``names``
    maps it to one); ``only`` narrows the registry's types to those it names or holds (a
    function task given is bound as at its call sites, its concurrency key included). Its
    args and kwargs become the function's arguments by parameter name, its eta the task's
    ``run_at`` (a countdown is an eta in the message), its expires the task's expiry, and
    its Celery id the idempotency key: a message delivered twice, or forwarded again after
    a crash, gives one task. Every other message is left in place.

    Without ``follow``, returns once a pass takes nothing; with it, passes every
    ``poll_interval`` seconds until ``stop`` is set, riding out an unreachable broker or
    database (logged, and tried again). ``database_url`` defaults to
    ``PGQUEUE_DATABASE_URL``.
    """
    try:
        import redis
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ValidationError(
            "broker_url", "the forwarder needs redis-py: pip install 'celery[redis]'"
        ) from None
    if not broker_url.startswith(("redis://", "rediss://", "unix://")):
        raise ValidationError(
            "broker_url",
            f"must be a Redis URL (redis://, rediss:// or unix://), not {broker_url.split(':')[0]}:"
            " the forwarder reads only Celery's Redis transport",
        )
    if batch_size < 1 or poll_interval <= 0:
        raise ValidationError("batch_size", "batch_size must be 1 or more, poll_interval above 0")
    moved_tasks = destinations(registry, names, only)
    from pgqueue.client import Client

    conn = redis.Redis.from_url(broker_url)
    with Client(database_url) as client:
        forwarder = _Forwarder(conn, client, registry, moved_tasks, queues, batch_size)
        if not follow:
            try:
                while forwarder.run_pass():
                    pass
                return forwarder.report
            finally:
                conn.close()
        outage = (redis.RedisError, DatabaseUnavailable, psycopg.OperationalError)
        streak = 0
        try:
            while True:
                try:
                    forwarder.run_pass()
                    streak = 0
                except outage as exc:  # what was taken stays on the forwarder's list
                    streak += 1
                    log.warning("celery.forward.unavailable streak=%d error=%s", streak, exc)
                # Backs off to 30 s while the broker or the database is away.
                pause = min(30.0, poll_interval * 2 ** min(streak, 10))
                if stop is not None and stop.wait(pause):
                    return forwarder.report
                if stop is None:
                    time.sleep(pause)
        finally:
            conn.close()
