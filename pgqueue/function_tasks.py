"""Tasks declared as Python functions: ``@tasks.task`` on a plain or async function.

The decorated function stays callable as itself (calling it runs it here, now) and gains
``enqueue``/``aenqueue``/``bind``/``enqueue_many``/``options``. Its arguments are bound to
their parameter names and stored as the task's payload, a JSON object (readable in psql and
the dashboard, and what an HTTP or CLI submit by type name gives). The worker calls the
function with them, and gives the task's context to a parameter annotated ``TaskContext``.
An argument whose parameter is annotated ``datetime``, ``Decimal``, ``UUID``, an Enum, a
dataclass, ... is stored in its JSON form and decoded back before the call
(:mod:`pgqueue.arguments`).

Arguments are checked before anything is written, by one function (:func:`check_arguments`)
used everywhere: here, for a caller holding the function; and by the CLI and the HTTP API,
which never import user code, against the description a worker recorded at its start
(pgqueue.task_types.parameters, see :func:`describe_parameters`).

What is checked is :mod:`pgqueue.arguments`' docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

import psycopg

from pgqueue import config
from pgqueue.arguments import (
    Parameters,
    UndecodableArgument,
    check_arguments,
    describe_parameters,
)
from pgqueue.enqueue import check_name, prepare
from pgqueue.error_text import split_error
from pgqueue.errors import InvalidArgument, UnsupportedConnection, ValidationError
from pgqueue.handle import TaskHandle, is_client, parse_task_id
from pgqueue.models import EnqueueResult, KeyReuse, Priority, RetryPolicy, TaskStatus
from pgqueue.operations import enqueue_many, insert_prepared
from pgqueue.operations.submitting import in_batch
from pgqueue.queries.driver import arun, run
from pgqueue.queries.specs import DEFAULT_RETRY, TaskSpec
from pgqueue.queries.task_types import TypeDeclaration
from pgqueue.workflows import MARKER_KEY, PARENT_FAILURE, PARENT_RESULT, Step, is_marker

if TYPE_CHECKING:
    from pgqueue.client import Client

P = ParamSpec("P")
R = TypeVar("R")

# --- the decorated function --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """Enqueue options: the declared ones, and per call (``.options(...)``) on top of them."""

    queue: str | None = None
    priority: Priority | None = None
    retry: RetryPolicy | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    run_at: datetime | None = None
    delay: float | None = None
    expires_in: float | None = None
    expires_at: datetime | None = None
    key_reuse: KeyReuse | None = None
    concurrency_key: str | None = None

    def merged(self, other: TaskOptions) -> TaskOptions:
        """These options with ``other``'s given ones (not None) on top."""
        given = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)}
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


# How a function task's concurrency key is declared (``@tasks.task(concurrency_key=...)``): the
# name of the parameter whose argument is the key, or a function of the call's arguments.
KeyRule = str | Callable[..., str | None]


@dataclasses.dataclass(frozen=True)
class ConcurrencyKeyRule:
    """A declared concurrency key, checked against the function at decoration time: a
    parameter's name (and that parameter's default, for a call that leaves it out), or a
    function called with the call's arguments."""

    parameter: str | None = None
    default: Any = None
    function: Callable[..., str | None] | None = None
    # The function's signature, to say which argument it cannot take (None: not readable).
    signature: inspect.Signature | None = None

    @classmethod
    def declare(
        cls, rule: object, fn: Callable[..., Any], parameters: Parameters, where: str
    ) -> ConcurrencyKeyRule:
        if callable(rule):
            try:
                signature = inspect.signature(rule)
            except (TypeError, ValueError):  # some builtins have none
                signature = None
            return cls(function=rule, signature=signature)
        if not isinstance(rule, str):
            raise ValidationError(
                "concurrency_key",
                f"{where}: must be the name of a parameter of the function or a function of "
                f"its arguments, not {type(rule).__name__}",
            )
        if rule == parameters.context:
            raise ValidationError(
                "concurrency_key", f"{where}: {rule!r} is the task's context, not an argument"
            )
        if rule not in parameters.order:
            names = ", ".join(parameters.order) or "none"
            raise ValidationError(
                "concurrency_key",
                f"{where}: {rule!r} is not a parameter of the function (its parameters: {names})",
            )
        default = inspect.signature(fn).parameters[rule].default
        return cls(parameter=rule, default=None if default is inspect.Parameter.empty else default)


def default_type_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``: what a task type is named when ``name=`` is not given.
    Renaming or moving the function renames the type (queued tasks keep the old one)."""
    return f"{fn.__module__}.{fn.__qualname__}"


class TaskFunction(Generic[P, R]):
    """A function declared as a task type (``@tasks.task``); call it to run it directly.

    ``enqueue(conn, *args, **kwargs)`` submits it in the caller's transaction (whatever
    ``pgqueue.enqueue`` accepts) and returns a :class:`TaskHandle`; ``aenqueue`` is the async
    form; ``bind(*args, **kwargs)`` gives a prepared task for ``pgqueue.enqueue_many``;
    ``enqueue_many(conn, [arguments, ...])`` submits many at once; ``options(queue=...,
    priority=..., ...)`` gives the same task with per-call options over the declared ones
    (options are never mixed with the function's own arguments, so no name can collide).
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        type: str,
        parameters: Parameters,
        declared: TaskOptions,
        timeout: float | None,
        call_options: TaskOptions | None = None,
        concurrency_key: ConcurrencyKeyRule | None = None,
    ) -> None:
        self.fn = fn
        self.type = type
        self.parameters = parameters
        self.declared = declared
        self.timeout = timeout
        self.concurrency_key_rule = concurrency_key
        self._options = declared.merged(call_options) if call_options else declared
        self.is_async = inspect.iscoroutinefunction(fn)
        # The parameters a positional argument can bind to, in order (not keyword-only ones).
        self._positional = [
            p["name"] for p in parameters.description["parameters"] if p["kind"] != "keyword"
        ]
        self.__name__ = getattr(fn, "__name__", type)
        self.__qualname__ = getattr(fn, "__qualname__", type)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, now. A function that takes the task's context and is not
        given one gets a :class:`DirectCallContext` (attempt 1, a fresh task id, its type and
        queue), not None; ``pgqueue.testing.call`` gives a worker's own TaskContext."""
        name = self.parameters.context
        if name is None or name in kwargs:
            return self.fn(*args, **kwargs)
        signature = inspect.signature(self.fn)
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # Python's own error says it best
            return self.fn(*args, **kwargs)
        if name not in bound.arguments:
            if name not in self.parameters.positional_only:
                kwargs[name] = DirectCallContext(self)
            elif list(signature.parameters).index(name) == len(args):
                args = (*args, DirectCallContext(self))  # type: ignore[assignment]
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pgqueue task {self.type!r} ({self.__module__}.{self.__qualname__})>"

    # --- options ---------------------------------------------------------------------------

    def options(
        self,
        *,
        queue: str | None = None,
        priority: Priority | str | int | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        expires_in: float | None = None,
        expires_at: datetime | None = None,
        key_reuse: KeyReuse | str | None = None,
        concurrency_key: str | None = None,
    ) -> TaskFunction[P, R]:
        """The same task with these options for its enqueues, over the declared ones (per call
        > declared > the global default, field by field): those of ``pgqueue.enqueue``.
        ``concurrency_key`` is the key itself, over the one the declaration computes from the
        arguments. Validated when enqueued (``key_reuse`` at once)."""
        given = TaskOptions(
            queue=queue,
            priority=None if priority is None else Priority.parse(priority),
            retry=retry,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            run_at=run_at,
            delay=delay,
            expires_in=expires_in,
            expires_at=expires_at,
            key_reuse=None if key_reuse is None else KeyReuse.parse(key_reuse),
            concurrency_key=concurrency_key,
        )
        return TaskFunction(
            self.fn,
            type=self.type,
            parameters=self.parameters,
            declared=self.declared,
            timeout=self.timeout,
            call_options=self._options.merged(given),
            concurrency_key=self.concurrency_key_rule,
        )

    # --- arguments -------------------------------------------------------------------------

    def arguments(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The call's arguments by parameter name (the payload), checked; raises
        InvalidArgument naming the argument."""
        positional = self._positional
        if len(args) > len(positional):
            n = len(positional)
            raise InvalidArgument(
                "*args",
                f"{self.type} takes {n} positional argument{'' if n == 1 else 's'} but "
                f"{len(args)} were given",
            )
        out = self._with_keywords(dict(zip(positional, args, strict=False)), kwargs)
        out = self.parameters.encode(out)
        check_arguments(self.parameters.description, out)
        return out

    def _with_keywords(self, out: dict[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``out`` (the positional arguments by name) with the keyword ones, refusing the
        context parameter and a name given twice."""
        for name, value in kwargs.items():
            if name == self.parameters.context:
                raise InvalidArgument(
                    name, f"argument {name!r} is the task's context: the worker passes it"
                )
            if name in out:
                raise InvalidArgument(name, f"argument {name!r} is given twice")
            out[name] = value
        return out

    def partial_arguments(
        self, *args: Any, first: bool = False, **kwargs: Any
    ) -> tuple[dict[str, Any], str | None, bool]:
        """A workflow step's arguments (``s(...)``): the payload, the parameter that receives
        the parents' results (the first positional one left unbound, None if there is none;
        with ``first``, the first positional one, the arguments binding those after it) and
        whether it is required. Checked as :meth:`arguments` is, that one parameter allowed
        missing."""
        positional = self._positional
        if first:
            if not positional:
                raise InvalidArgument(
                    "parent_result",
                    f"{self.type} has no positional parameter to receive the parent's result "
                    "first (parent_result='first')",
                )
            receives, positional = positional[0], positional[1:]
            if receives in kwargs:
                raise InvalidArgument(
                    receives,
                    f"argument {receives!r} receives the parent's result "
                    "(parent_result='first'): leave it out",
                )
            if len(args) > len(positional):
                n = len(positional)
                raise InvalidArgument(
                    "*args",
                    f"{self.type} takes {n} positional argument{'' if n == 1 else 's'} after the "
                    f"parent's result but {len(args)} were given",
                )
            bound = dict(zip(positional, args, strict=False))
        else:
            if len(args) > len(positional):
                return self.arguments(*args, **kwargs), None, False  # raises: too many
            bound = dict(zip(positional, args, strict=False))
            receives = next((n for n in positional if n not in bound and n not in kwargs), None)
            if receives is None:
                return self.arguments(*args, **kwargs), None, False
        params = self.parameters.description["parameters"]
        rest = {
            **self.parameters.description,
            "parameters": [p for p in params if p["name"] != receives],
        }
        out = self.parameters.encode(self._with_keywords(dict(bound), kwargs))
        check_arguments(rest, out)
        required = any(p["name"] == receives and p.get("required") for p in params)
        return out, receives, required

    def receiving_types(self, name: str) -> tuple[str, ...] | None:
        """The JSON types parameter ``name`` accepts (None: its annotation is not checked)."""
        for p in self.parameters.description["parameters"]:
            if p["name"] == name and p.get("types"):
                return tuple(p["types"])
        return None

    def s(self, *args: Any, **kwargs: Any) -> Step:
        """A workflow step of this call (``pgqueue.chain``/``group``/``chord``): the first
        positional parameter these arguments leave unbound receives the parents' results.

        ``parent_result="first"`` (a keyword of ``s`` itself, unless the function has a
        parameter of that name): the first positional parameter receives, and the arguments
        given bind those after it, Celery's order (``add.s(10, parent_result="first")`` is
        ``add(result, 10)``)."""
        from pgqueue.workflows import function_step

        return function_step(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Step:
        """An immutable workflow step of this call: it runs after its parents as any step
        does but receives nothing from them, so every required argument is given here."""
        from pgqueue.workflows import function_step

        return function_step(self, args, kwargs, receives_result=False)

    def step_options(
        self, payload: Mapping[str, Any], receives: str | None = None
    ) -> dict[str, Any]:
        """The enqueue options a workflow step of this function takes, for a step of these
        arguments (``receives``: the parameter left for the parents' results); no
        idempotency key: a task with parents cannot have one."""
        o = self._options
        rule = self.concurrency_key_rule
        if o.concurrency_key is None and rule is not None and rule.parameter == receives:
            raise ValidationError(
                "concurrency_key",
                f"{self.type}: the key's parameter {receives!r} receives the parents' results, "
                "unknown when the workflow is written; give the step its key with "
                ".options(concurrency_key=...)",
            )
        return {
            "queue": o.queue,
            "priority": o.priority,
            "retry": o.retry,
            "max_attempts": o.max_attempts,
            "run_at": o.run_at,
            "delay": o.delay,
            "expires_in": o.expires_in,
            "expires_at": o.expires_at,
            "concurrency_key": self.concurrency_key_of(payload),
        }

    def concurrency_key_of(self, arguments: Mapping[str, Any]) -> str | None:
        """The concurrency key a call with these arguments (by parameter name) is submitted
        with: the one given to ``.options``, else the declared one's, else None. Checked when
        enqueued, as any key."""
        given = self._options.concurrency_key
        rule = self.concurrency_key_rule
        if given is not None or rule is None:
            return given
        if rule.parameter is not None:
            value = arguments.get(rule.parameter, rule.default)
            return None if value is None else str(value)
        assert rule.function is not None
        # The key function sees the arguments as the task function does (a datetime, not
        # its ISO string).
        args, kwargs = self._split(self.parameters.decode(arguments), None, context=False)
        name = getattr(rule.function, "__qualname__", repr(rule.function))
        if rule.signature is not None:
            try:
                rule.signature.bind(*args, **kwargs)
            except TypeError as exc:  # a workflow step's: the parents' results are not known
                raise ValidationError(
                    "concurrency_key",
                    f"{self.type}: the key function {name} cannot take these arguments ({exc})",
                ) from None
        key = rule.function(*args, **kwargs)
        if key is not None and not isinstance(key, str):
            raise ValidationError(
                "concurrency_key",
                f"{self.type}: the key function {name} returned {type(key).__name__}, "
                "not a str or None",
            )
        return key

    def _spec(self, payload: Mapping[str, Any], max_payload_bytes: int | None = None) -> TaskSpec:
        o = self._options
        return prepare(
            self.type,
            payload,
            queue=o.queue,
            priority=o.priority,
            retry=o.retry,
            max_attempts=o.max_attempts,
            idempotency_key=o.idempotency_key,
            run_at=o.run_at,
            delay=o.delay,
            expires_in=o.expires_in,
            expires_at=o.expires_at,
            max_payload_bytes=max_payload_bytes,
            concurrency_key=self.concurrency_key_of(payload),
        )

    def bind(self, *args: P.args, **kwargs: P.kwargs) -> TaskSpec:
        """A prepared task of this call (checked), for ``pgqueue.enqueue_many``."""
        return self._spec(self.arguments(*args, **kwargs))

    def _specs(self, calls: Iterable[Mapping[str, Any] | TaskSpec]) -> list[TaskSpec]:
        limit = config.max_payload_bytes()
        batch = calls if isinstance(calls, list | tuple) else list(calls)
        out: list[TaskSpec] = []
        try:
            for call in batch:
                if isinstance(call, TaskSpec):
                    out.append(call)
                elif isinstance(call, Mapping):
                    payload = self.parameters.encode(dict(call))
                    check_arguments(self.parameters.description, payload)
                    out.append(self._spec(payload, limit))
                else:
                    raise ValidationError(
                        "calls",
                        f"items must be dicts of arguments by name or {self.__name__}.bind(...), "
                        f"not {type(call).__name__}",
                    )
        except ValidationError as exc:  # one spec per call so far: the one refused is the next
            raise in_batch(exc, len(out), len(batch)) from None
        return out

    # --- enqueueing ------------------------------------------------------------------------

    @property
    def _reuse(self) -> KeyReuse:
        return self._options.key_reuse or KeyReuse.RETURN

    def enqueue(self, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Submit a call of this task in the caller's transaction; nothing is written when an
        argument is missing, unknown or not JSON. Given a ``pgqueue.Client`` instead of a
        connection, it commits on its own, as ``delay`` does. Under ``pgqueue.testing.eager``
        the call runs here instead, and ``conn`` is not used."""
        spec = self.bind(*args, **kwargs)
        if (eager := eager_runner(self)) is not None:
            return eager.run(self, spec)
        if is_client(conn):
            return self._submit(conn, spec)
        return TaskHandle(run(conn, insert_prepared(spec, None, self._reuse)))

    async def aenqueue(self, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """As :meth:`enqueue`, on an async connection."""
        spec = self.bind(*args, **kwargs)
        if (eager := eager_runner(self)) is not None:
            return await eager.arun(self, spec)
        if is_client(conn):
            raise UnsupportedConnection(
                "pgqueue.Client is synchronous: use fn.enqueue(client, ...) or fn.delay(...), "
                "or give aenqueue an async connection (psycopg.AsyncConnection, SQLAlchemy "
                "AsyncSession)"
            )
        return TaskHandle(await arun(conn, insert_prepared(spec, None, self._reuse)))

    def enqueue_many(
        self, conn: Any, calls: Iterable[Mapping[str, Any] | TaskSpec]
    ) -> list[TaskHandle]:
        """Submit many calls at once (``pgqueue.enqueue_many``): each a dict of arguments by
        parameter name (the payload), or ``bind(...)``'s prepared task. All are checked
        before anything is written."""
        specs = self._specs(calls)
        if (eager := eager_runner(self)) is not None:
            return [eager.run(self, spec) for spec in specs]
        if is_client(conn):
            with conn.connection() as c:
                done = enqueue_many(c, specs, key_reuse=self._reuse, notify=conn.notify)
            return [TaskHandle(r, conn) for r in done]
        results: list[EnqueueResult] = enqueue_many(conn, specs, key_reuse=self._reuse)
        return [TaskHandle(r) for r in results]

    async def aenqueue_many(
        self, conn: Any, calls: Iterable[Mapping[str, Any] | TaskSpec]
    ) -> list[TaskHandle]:
        """As :meth:`enqueue_many`, on an async connection."""
        specs = self._specs(calls)
        if (eager := eager_runner(self)) is not None:
            return [await eager.arun(self, spec) for spec in specs]
        results: list[EnqueueResult] = await enqueue_many.aio(conn, specs, key_reuse=self._reuse)
        return [TaskHandle(r) for r in results]

    # --- calls without a connection (Celery's names) ----------------------------------------

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Submit a call of this task through the default client (``pgqueue.configure``, else
        ``PGQUEUE_DATABASE_URL``) in a transaction of its own, committed on return: Celery's
        ``delay``. ``enqueue(conn, ...)`` is the form that joins the caller's transaction."""
        spec = self.bind(*args, **kwargs)
        if (eager := eager_runner(self)) is not None:  # pgqueue.testing.eager: run it here
            return eager.run(self, spec)
        return self._submit(_default_client(f"{self.__name__}.delay()"), spec)

    def apply_async(
        self,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        queue: str | None = None,
        priority: Priority | str | None = None,
        task_id: uuid.UUID | str | None = None,
    ) -> TaskHandle:
        """:meth:`delay` with Celery's options, over the declared ones: ``countdown`` (seconds
        from now), or ``eta`` (an aware datetime; a naive one is refused); ``expires`` (seconds,
        a timedelta or an aware datetime: not started by then, the task never runs and ends
        cancelled, reason ``expired``); ``queue``; ``priority`` ('high', 'normal', 'low': not
        Celery's numbers, whose order differs between brokers); ``task_id`` (a UUID or its
        text), the task's id and its idempotency key: the same ``task_id`` again creates no
        second task, and the handle holds the original (``created`` False)."""
        if args is not None and (
            isinstance(args, str | bytes | Mapping) or not isinstance(args, Iterable)
        ):
            raise InvalidArgument(
                "args",
                f"must be a tuple or list of positional arguments, not {type(args).__name__}",
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidArgument(
                "kwargs", f"must be a dict of keyword arguments, not {type(kwargs).__name__}"
            )
        call = self._celery_options(countdown, eta, expires, queue, priority)
        spec = call._celery_spec(tuple(args or ()), dict(kwargs or {}))
        if task_id is not None:
            spec = self._with_task_id(spec, task_id)
        if (eager := eager_runner(self)) is not None:  # pgqueue.testing.eager: run it here
            return eager.run(self, spec)
        return self._submit(_default_client(f"{self.__name__}.apply_async()"), spec)

    def _celery_options(
        self,
        countdown: float | None,
        eta: datetime | None,
        expires: float | timedelta | datetime | None,
        queue: str | None,
        priority: Priority | str | None,
    ) -> TaskFunction[P, R]:
        """This task with apply_async's options in pgqueue's names, each checked under its
        Celery name (the rest are checked under pgqueue's when the call is prepared)."""
        if countdown is not None and eta is not None:
            raise ValidationError("eta", "give either countdown or eta, not both")
        if eta is not None:
            if not isinstance(eta, datetime):
                raise ValidationError("eta", f"must be a datetime, not {type(eta).__name__}")
            if eta.tzinfo is None or eta.utcoffset() is None:
                raise ValidationError(
                    "eta",
                    "must be timezone-aware (e.g. datetime.now(UTC) + timedelta(minutes=5)); "
                    "a naive datetime is refused rather than guessed (Celery reads it in its "
                    "own timezone setting)",
                )
        # Priority is an int too: only bare numbers are refused.
        if isinstance(priority, int) and not isinstance(priority, Priority):
            raise ValidationError(
                "priority",
                f"give 'high', 'normal' or 'low', not the number {priority!r}: Celery's 0-9 "
                "run highest first at 0 on Redis and at 9 on RabbitMQ, so pgqueue does not "
                "guess which was meant",
            )
        expires_in = expires_at = None
        if isinstance(expires, datetime):
            if expires.tzinfo is None or expires.utcoffset() is None:
                raise ValidationError("expires", "a datetime must be timezone-aware")
            expires_at = expires
        elif isinstance(expires, timedelta):
            expires_in = expires.total_seconds()
        elif expires is not None:
            if isinstance(expires, bool) or not isinstance(expires, int | float):
                raise ValidationError(
                    "expires",
                    "must be seconds, a timedelta or an aware datetime, "
                    f"not {type(expires).__name__}",
                )
            expires_in = expires
        return self.options(
            queue=queue,
            priority=priority,
            run_at=eta,
            delay=countdown,
            expires_in=expires_in,
            expires_at=expires_at,
        )

    def _celery_spec(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TaskSpec:
        """``bind(*args, **kwargs)``, an option's error named as apply_async names it."""
        try:
            return self.bind(*args, **kwargs)
        except InvalidArgument:
            raise
        except ValidationError as exc:
            name = _CELERY_NAMES.get(exc.field)
            if name is None:
                raise
            raise ValidationError(name, exc.reason) from None

    def _with_task_id(self, spec: TaskSpec, task_id: uuid.UUID | str) -> TaskSpec:
        """The task with the caller's id, which is also its idempotency key (its text)."""
        chosen = parse_task_id(task_id)
        if spec.idempotency_key is not None:
            raise ValidationError(
                "task_id",
                "give either task_id or an idempotency key (.options(idempotency_key=...)), "
                "not both: task_id is the task's idempotency key",
            )
        return spec._replace(id=chosen, idempotency_key=str(chosen))

    def _submit(self, client: Client, spec: TaskSpec) -> TaskHandle:
        """Insert ``spec`` through ``client`` in a transaction of its own, committed."""
        try:
            with client.connection() as conn:
                done = run(conn, insert_prepared(spec, None, self._reuse, client.notify))
        except psycopg.errors.UniqueViolation as exc:
            if spec.idempotency_key == str(spec.id) and exc.diag.constraint_name == "tasks_pkey":
                raise ValidationError(
                    "task_id",
                    f"task {spec.id} already exists and was not submitted with this task_id "
                    "(its idempotency key differs); choose a new task_id",
                ) from None
            raise
        return TaskHandle(done, client)

    # --- what the worker needs -------------------------------------------------------------

    def declaration(self) -> TypeDeclaration:
        o = self.declared
        return TypeDeclaration(
            type=self.type,
            retry=_policy(o.retry, o.max_attempts),
            queue=o.queue,
            priority=o.priority,
            timeout=self.timeout,
            parameters=self.parameters.description,
        )

    def handler(self) -> Callable[[Mapping[str, Any], Any], Any]:
        """``handler(payload, ctx)`` calling the function with the payload's arguments (and the
        context where it asks for it): what the executor runs."""
        fn: Callable[..., Any] = self.fn
        call_args = self._call_args
        if self.is_async:

            async def run_async(payload: Mapping[str, Any], ctx: Any) -> Any:
                if not error_handler_runs(payload, ctx):
                    return None
                args, kwargs = call_args(payload, ctx)
                return await fn(*args, **kwargs)

            return run_async

        def run_sync(payload: Mapping[str, Any], ctx: Any) -> Any:
            if not error_handler_runs(payload, ctx):
                return None
            args, kwargs = call_args(payload, ctx)
            return fn(*args, **kwargs)

        return run_sync

    def _call_args(self, payload: Mapping[str, Any], ctx: Any) -> tuple[list[Any], dict[str, Any]]:
        """The call of the function for a stored payload. Converted arguments are decoded
        first: one that does not decode (a payload submitted by type name with a bad date)
        raises UndecodableArgument, which dead-letters the task at once; so does a payload
        the function cannot be called with (an argument missing or unknown: submitted by type
        name before any worker recorded the parameters), as no retry would change it."""
        payload = fill_parent_results(payload, ctx)
        decoded = self.parameters.decode(payload)
        try:
            check_arguments(self.parameters.description, payload)
        except InvalidArgument as exc:
            raise UndecodableArgument(
                exc.argument,
                f"{exc.reason}: {self.type} cannot be called with the stored payload",
            ) from None
        return self._split(decoded, ctx)

    def _split(
        self, payload: Mapping[str, Any], ctx: Any, *, context: bool = True
    ) -> tuple[list[Any], dict[str, Any]]:
        """The arguments by name as the function takes them: positional-only ones by
        position, the rest by keyword, and ``ctx`` for the context parameter (left out when
        not ``context``: a key function, at enqueue, has no task yet)."""
        p = self.parameters
        kwargs = dict(payload)
        args: list[Any] = []
        for name in p.positional_only:
            if name == p.context:
                if not context:
                    break  # nothing to pass here, so nothing after it either
                args.append(ctx)
            elif name in kwargs:
                args.append(kwargs.pop(name))
            else:
                break  # its default, and those after it
        if context and p.context is not None and p.context not in p.positional_only:
            kwargs[p.context] = ctx
        return args, kwargs


def _default_client(needed_for: str) -> Client:
    from pgqueue.defaults import client

    return client(needed_for)


# apply_async's options by the names pgqueue's checks give them.
_CELERY_NAMES = {
    "delay": "countdown",
    "run_at": "eta",
    "expires_in": "expires",
    "expires_at": "expires",
}


class DirectCallContext:
    """The context a direct call of a task function gets (``send_receipt(42)``), when it
    takes one and is given none: attempt 1 of the declared attempts, a fresh task id, the
    task's type and queue, nothing to stop for, no parents. There is no task row, so no
    ``connection``: ``pgqueue.testing.call`` gives a worker's TaskContext, with one."""

    def __init__(self, task: TaskFunction[..., Any]) -> None:
        retry = task.declared.retry or DEFAULT_RETRY
        self.task_id = uuid.uuid4()
        self.type = task.type
        self.queue = task.declared.queue or config.DEFAULT_QUEUE
        self.attempt = 1
        self.max_attempts = retry.max_attempts
        self.parents: tuple[Any, ...] = ()
        self.workflow_id: uuid.UUID | None = None
        self.concurrency_key: str | None = None
        self.cancel_requested = False
        self.lease_lost = False
        self.timed_out = False

    @property
    def parent_results(self) -> list[Any]:
        return []

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def should_stop(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{self.type} was called directly, not run by a worker: its context has no "
            f"{name!r} (run it with pgqueue.testing.call(fn, ...) for a worker's TaskContext, "
            "or enqueue it)"
        )


class EagerRunner(Protocol):
    """Runs a function task's enqueued calls here instead of storing them
    (``pgqueue.testing.eager``); ``covers`` says for which task functions."""

    def covers(self, task: TaskFunction[..., Any]) -> bool: ...

    def run(self, task: TaskFunction[..., Any], spec: TaskSpec) -> TaskHandle: ...

    async def arun(self, task: TaskFunction[..., Any], spec: TaskSpec) -> TaskHandle: ...


# The eager runners in force, innermost last: process-wide, not per thread or context, since
# the code under test may enqueue from another thread (a web framework's test client).
EAGER: list[EagerRunner] = []


def eager_runner(task: TaskFunction[..., Any]) -> EagerRunner | None:
    """The innermost eager runner in force that covers ``task``, if any."""
    for runner in reversed(EAGER):
        if runner.covers(task):
            return runner
    return None


def fill_parent_results(payload: Mapping[str, Any], ctx: Any) -> Mapping[str, Any]:
    """The payload with a workflow step's marker (pgqueue.workflows) replaced by its parents'
    results from ``ctx.parents``: the one parent's result, or the list of them in order
    (None for a parent that did not complete: a clean-up step sees why in ctx.parents); an
    error handler's by the failed parent (:func:`failed_task`)."""
    if not any(is_marker(v) for v in payload.values()):
        return payload
    parents = tuple(getattr(ctx, "parents", ()) or ())
    out = dict(payload)
    for name, value in payload.items():
        if is_marker(value):
            results = [p.result for p in parents]
            if value[MARKER_KEY] == PARENT_RESULT:
                out[name] = results[0] if results else None
            elif value[MARKER_KEY] == PARENT_FAILURE:
                failed = next((p for p in parents if p.status is TaskStatus.FAILED), None)
                out[name] = None if failed is None else failed_task(failed)
            else:
                out[name] = results
    return out


def failed_task(parent: Any) -> dict[str, Any]:
    """What an error handler receives: the failed task's id, type, its error's summary (the
    exception's type and message) and traceback."""
    error = split_error(parent.error or "")
    return {
        "task_id": str(parent.task_id),
        "type": parent.type,
        "error": error.summary or None,
        "traceback": error.traceback,
    }


def error_handler_runs(payload: Mapping[str, Any], ctx: Any) -> bool:
    """False for an error handler (``link_error``) whose step did not fail: the worker then
    completes it without calling the function. True for every other task."""
    if not any(is_marker(v) and v[MARKER_KEY] == PARENT_FAILURE for v in payload.values()):
        return True
    parents = tuple(getattr(ctx, "parents", ()) or ())
    return any(p.status is TaskStatus.FAILED for p in parents)


def _policy(retry: RetryPolicy | None, max_attempts: int | None) -> RetryPolicy | None:
    if max_attempts is None:
        return retry
    base = retry or RetryPolicy()
    return RetryPolicy(max_attempts, base.base, base.factor, base.cap)


def declare(
    fn: Callable[P, R],
    *,
    name: str | None,
    queue: str | None,
    priority: Priority | str | int | None,
    max_attempts: int | None,
    retry: RetryPolicy | None,
    timeout: float | None,
    concurrency_key: KeyRule | None = None,
) -> TaskFunction[P, R]:
    """``fn`` as a TaskFunction, every declared option checked now (at import)."""
    if not callable(fn):
        raise ValidationError("task", f"@task needs a function, not {type(fn).__name__}")
    type_name = check_name("name", name if name is not None else default_type_name(fn))
    if queue is not None:
        check_name("queue", queue)
    if timeout is not None and timeout <= 0:
        raise ValidationError("timeout", f"must be positive seconds, not {timeout}")
    declared = TaskOptions(
        queue=queue,
        priority=None if priority is None else Priority.parse(priority),
        retry=_policy(retry, max_attempts),
    )
    parameters = describe_parameters(fn, type_name)
    rule = None
    if concurrency_key is not None:
        rule = ConcurrencyKeyRule.declare(concurrency_key, fn, parameters, type_name)
    return TaskFunction(
        fn,
        type=type_name,
        parameters=parameters,
        declared=declared,
        timeout=timeout,
        concurrency_key=rule,
    )
