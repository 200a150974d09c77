"""Task types and their handlers, with each type's retry policy and timeout.

A task type is declared either as a function with ordinary parameters, ``@tasks.task``
(pgqueue/function_tasks.py: the worker calls it with the payload's arguments by name), or as a
handler called as ``handler(payload, context)``, ``@tasks.handler("type")``. Either is a plain
function (run in a thread) or an ``async def`` (run on the worker's event loop). The outcome
vocabulary is closed:

- return a JSON-serialisable value: the task is **completed** and the value is its result;
- raise :class:`Retry` (optionally ``after=`` seconds): a failed attempt, retried after that
  delay, or dead-lettered if it was the last attempt;
- raise :class:`Cancel`: the task is **cancelled**, never retried;
- raise :class:`Snooze` (``after=`` seconds): queued again that much later, no attempt spent
  (bounded: see Snooze);
- raise :class:`~pgqueue.Fail`: a failed attempt, and the task is dead-lettered at once;
- raise anything else: a failed attempt, retried with the type's backoff or dead-lettered
  (``retry_on``/``no_retry_on`` choose which exceptions retry: pgqueue/hooks.py).

Where a handler runs is its *executor*: ``"async"`` (on the worker's event loop: ``async
def`` handlers), ``"thread"`` (the worker's thread pool: plain functions doing blocking I/O)
or ``"process"`` (a pool of child processes: CPU-bound work, and code that may crash, hang in
C or leak memory, see pgqueue/worker/processes.py). A type that names none runs where the
worker's default puts it (``pgqueue worker --executor``): ``thread`` for plain functions and
``async`` for coroutine functions, unless the worker's default is ``process``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from pgqueue.cron import Cron, Interval, Schedule, zone
from pgqueue.enqueue import check_name
from pgqueue.errors import Fail, TaskInterrupted, ValidationError
from pgqueue.function_tasks import KeyRule, TaskFunction, declare
from pgqueue.hooks import (
    ExceptionClasses,
    ExceptionTypes,
    FailureOutcome,
    Hook,
    Middleware,
    NotRetried,
    exception_types,
    not_retried_because,
)
from pgqueue.models import Priority, RetryPolicy
from pgqueue.operations.checks import MAX_RATE
from pgqueue.queries.task_types import RateDeclaration, TypeDeclaration

# A rate limit as Celery writes it: starts per second, minute or hour ("10/m"; a bare number
# is per second).
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_FORMAT = re.compile(r"\s*([0-9]+)\s*(?:/\s*([smh]))?\s*")

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """What ``@tasks.task(...)`` with options gives: it turns a function into a task."""

    def __call__(self, fn: Callable[P, R], /) -> TaskFunction[P, R]: ...


class Retry(Exception):  # an outcome, not an error
    """Raised by a handler to retry its task, after ``after`` seconds if given."""

    def __init__(self, reason: str = "retry requested", *, after: float | None = None) -> None:
        super().__init__(reason)
        if after is not None and after < 0:
            raise ValidationError("after", f"must be >= 0 seconds, not {after}")
        self.after = after


class Cancel(Exception):  # an outcome, not an error
    """Raised by a handler to cancel its task for good (no retry)."""


# Where a handler may run (see the module's docstring).
EXECUTORS = ("async", "thread", "process")


def check_executor(
    fn: Callable[..., Any], is_async: bool, executor: str | None, hard_timeout: float | None
) -> None:
    """Refuse, at decoration time, an executor that does not exist or cannot run ``fn``, and a
    hard timeout where no process could be killed."""
    name = getattr(fn, "__qualname__", repr(fn))
    if executor is not None and executor not in EXECUTORS:
        raise ValidationError(
            "executor",
            f"unknown executor {executor!r} for {name}; expected one of "
            + ", ".join(repr(e) for e in EXECUTORS),
        )
    if executor == "async" and not is_async:
        raise ValidationError(
            "executor",
            f"'async' runs coroutine functions on the worker's event loop, and {name} is a "
            "plain function: use 'thread' or 'process' (or make it async def)",
        )
    if executor == "thread" and is_async:
        raise ValidationError(
            "executor",
            f"'thread' runs plain functions, and {name} is async def: use 'async' or 'process'",
        )
    if hard_timeout is not None:
        if (
            isinstance(hard_timeout, bool)
            or not isinstance(hard_timeout, int | float)
            or not 0 < hard_timeout < math.inf
        ):
            raise ValidationError("hard_timeout", f"must be positive seconds, not {hard_timeout!r}")
        if executor in ("async", "thread"):
            raise ValidationError(
                "hard_timeout",
                f"applies to the 'process' executor only (a {executor!r} handler cannot be "
                "killed); it is how long after its timeout a child process is killed",
            )


# The longest snooze: the longest delay an enqueue may ask for (10 years).
MAX_SNOOZE_SECONDS = 10 * 365 * 24 * 3600.0


class Snooze(Exception):  # an outcome, not an error
    """Raised by a handler to run its task again ``after`` seconds from now without spending
    an attempt: for a downstream that answers "not now" (HTTP 429, a lock held elsewhere).

    The task goes back to queued with its attempt given back and its snooze count one
    higher. A task may snooze ``PGQUEUE_MAX_SNOOZES`` times (100 by default); past that, a
    snooze counts as a failed attempt (retried after ``after`` seconds, or dead-lettered),
    its error naming the bound, so a task cannot snooze forever. ``after`` is checked here:
    a positive, finite number of seconds, at most 10 years.
    """

    def __init__(self, reason: str = "snoozed", *, after: float) -> None:
        super().__init__(reason)
        if (
            isinstance(after, bool)
            or not isinstance(after, int | float)
            or (isinstance(after, float) and not math.isfinite(after))
            or not 0 < after <= MAX_SNOOZE_SECONDS
        ):
            raise ValidationError(
                "after",
                f"must be seconds from more than 0 to {MAX_SNOOZE_SECONDS:g}, not {after!r}",
            )
        self.after = float(after)


def rate_limit_of(rate_limit: str | int | None, burst: int | None) -> RateDeclaration | None:
    """A decorator's ``rate_limit`` and ``rate_burst``, checked where the task type is
    declared, so that a typo fails at import, not in a worker."""
    if rate_limit is None:
        if burst is not None:
            raise ValidationError(
                "rate_burst", "a burst spaces the starts of a rate: give rate_limit too"
            )
        return None
    found = None if isinstance(rate_limit, bool) else _rate_parts(rate_limit)
    if found is None or not 1 <= found[0] <= MAX_RATE:
        raise ValidationError(
            "rate_limit",
            "must be starts per second, minute or hour, as 'N/s', 'N/m' or 'N/h' with N "
            f"a whole number from 1 to {MAX_RATE} (e.g. '10/m'), not {rate_limit!r}",
        )
    if burst is None:
        burst = 1
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_RATE:
        raise ValidationError(
            "rate_burst",
            f"must be an integer from 1 to {MAX_RATE} (starts at once), not {burst!r}",
        )
    return RateDeclaration(found[0], found[1], burst)


def _rate_parts(rate_limit: object) -> tuple[int, float] | None:
    if isinstance(rate_limit, int):
        return rate_limit, 1.0
    if not isinstance(rate_limit, str):
        return None
    match = _RATE_FORMAT.fullmatch(rate_limit)
    if match is None:
        return None
    return int(match[1]), RATE_UNITS[match[2] or "s"]


@dataclasses.dataclass(frozen=True)
class Handler:
    type: str
    fn: Callable[..., Any]
    is_async: bool
    retry: RetryPolicy | None
    timeout: float | None
    # Declared by @tasks.task: the type's queue and priority, and its parameters.
    queue: str | None = None
    priority: Priority | None = None
    parameters: Mapping[str, Any] | None = None
    # Where it runs ("async", "thread", "process"; None: the worker's default), and for a
    # process task, how long after its timeout its child is killed (None: the worker's).
    executor: str | None = None
    hard_timeout: float | None = None
    # Starts per period, spaced evenly (rate_limit="10/m"), declared as the type's limit.
    rate_limit: RateDeclaration | None = None
    # Which exceptions retry (None: all), which never do (pgqueue/hooks.py; ``fn`` applies
    # them where it runs), and the type's own hooks and middleware (after the registry's).
    retry_on: ExceptionClasses | None = None
    no_retry_on: ExceptionClasses | None = None
    on_failure: Hook | None = None
    on_retry: Hook | None = None
    on_dead: Hook | None = None
    middleware: tuple[Middleware, ...] = ()

    def executor_under(self, default: str) -> str:
        """Where this handler runs in a worker whose default executor is ``default``."""
        if self.executor is not None:
            return self.executor
        if default == "process":
            return "process"
        return "async" if self.is_async else "thread"


class TaskRegistry:
    """Handlers by task type; the object a worker is started with (``module:registry``)."""

    def __init__(
        self,
        *,
        on_failure: Hook | None = None,
        on_retry: Hook | None = None,
        on_dead: Hook | None = None,
    ) -> None:
        """``on_failure``, ``on_retry``, ``on_dead``: hooks for every type of the registry,
        each called with a :class:`pgqueue.TaskFailure` (see pgqueue/hooks.py), before the
        type's own."""
        self._handlers: dict[str, Handler] = {}
        self._schedules: dict[str, Schedule] = {}
        self.on_failure = _hook("on_failure", on_failure)
        self.on_retry = _hook("on_retry", on_retry)
        self.on_dead = _hook("on_dead", on_dead)
        self._middleware: list[Middleware] = []
        self._async_middleware: list[Middleware] = []
        # Where a new process imports this registry from (``module:attribute``), when it is
        # known: set by load(); the process executor needs it to spawn its children.
        self.origin: str | None = None

    def handler(
        self,
        type: str,
        *,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        executor: str | None = None,
        hard_timeout: float | None = None,
        rate_limit: str | int | None = None,
        rate_burst: int | None = None,
        max_retries: int | None = None,
        retry_on: ExceptionTypes | None = None,
        no_retry_on: ExceptionTypes | None = None,
        on_failure: Hook | None = None,
        on_retry: Hook | None = None,
        on_dead: Hook | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of ``type``.

        ``max_attempts``/``retry`` set the type's retry policy. A worker records it in the
        database at start (pgqueue.task_types), so it applies to every task of the type
        submitted without a policy of its own, however it was submitted (library, CLI or
        HTTP), and is what status, list and the logs show. ``timeout`` (seconds) fails an
        attempt that runs longer. ``executor`` is where it runs (``"async"``, ``"thread"``,
        ``"process"``; default: the worker's); in a child process the timeout raises
        :class:`~pgqueue.TimeLimitExceeded` in the handler, and ``hard_timeout`` seconds
        later (default: the worker's, 5 s) the child is killed.

        ``rate_limit`` spaces the type's starts evenly across every worker: ``"10/m"`` (also
        ``"N/s"``, ``"N/h"``, or a number per second, as Celery writes it) starts one every 6
        s, and ``rate_burst`` (default 1) lets that many start at once after a quiet spell. A
        worker writes it as the type's limit at start, unless an operator set a limit on the
        type (``pgqueue limit set``), which wins; see :func:`pgqueue.set_limit`.

        ``max_retries`` is Celery's count (retries after the first attempt): it sets
        ``max_attempts = max_retries + 1``; give one or the other. ``retry_on`` (retry only
        these exceptions) and ``no_retry_on`` (never retry these) dead-letter an exception
        that is not to be retried at once; ``on_failure``/``on_retry``/``on_dead`` and
        ``middleware`` are this type's, run after the registry's (pgqueue/hooks.py).
        """
        check_name("type", type)
        if timeout is not None and timeout <= 0:
            raise ValidationError("timeout", f"must be positive seconds, not {timeout}")
        rate = rate_limit_of(rate_limit, rate_burst)
        max_attempts = attempts_of(max_attempts, max_retries)
        rules = _Rules.of(retry_on, no_retry_on, on_failure, on_retry, on_dead, middleware)
        policy = retry
        if max_attempts is not None:
            base = retry or RetryPolicy()
            policy = RetryPolicy(max_attempts, base.base, base.factor, base.cap)

        def register(fn: F) -> F:
            if type in self._handlers:
                raise ValueError(f"task type {type!r} already has a handler")
            is_async = inspect.iscoroutinefunction(fn)
            check_executor(fn, is_async, executor, hard_timeout)
            rules.check_middleware(fn, is_async)
            self._handlers[type] = Handler(
                type=type,
                fn=self._wrap(fn, is_async, rules),
                is_async=is_async,
                retry=policy,
                timeout=timeout,
                executor=executor,
                hard_timeout=hard_timeout,
                rate_limit=rate,
                **rules.fields(),
            )
            return fn

        return register

    # --- function tasks ----------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskFunction[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: Priority | str | int | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        executor: str | None = None,
        hard_timeout: float | None = None,
        concurrency_key: KeyRule | None = None,
        rate_limit: str | int | None = None,
        rate_burst: int | None = None,
        max_retries: int | None = None,
        retry_on: ExceptionTypes | None = None,
        no_retry_on: ExceptionTypes | None = None,
        on_failure: Hook | None = None,
        on_retry: Hook | None = None,
        on_dead: Hook | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: Priority | str | int | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        executor: str | None = None,
        hard_timeout: float | None = None,
        concurrency_key: KeyRule | None = None,
        rate_limit: str | int | None = None,
        rate_burst: int | None = None,
        max_retries: int | None = None,
        retry_on: ExceptionTypes | None = None,
        no_retry_on: ExceptionTypes | None = None,
        on_failure: Hook | None = None,
        on_retry: Hook | None = None,
        on_dead: Hook | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> Any:
        """Declare a function with ordinary parameters as a task type (``@tasks.task`` or
        ``@tasks.task(...)``); see pgqueue.function_tasks.TaskFunction for what it gains.

        The type is named ``name``, else ``module.qualname`` of the function (renaming or
        moving the function renames the type: give a name for a type that must stay put).
        ``queue``, ``priority``, ``max_attempts``/``retry`` are the type's defaults wherever
        a task of it is submitted (library, CLI, HTTP) without its own: a worker records
        them in the database at start. ``timeout`` (seconds) fails an attempt that runs
        longer; ``executor`` and ``hard_timeout`` are :meth:`handler`'s.

        ``concurrency_key`` gives each task of the function its concurrency key (the tenant
        it works for, see ``pgqueue.enqueue``): the name of one of its parameters, whose
        argument is the key (``str()`` of it; None, or a parameter left at a default of None:
        no key), or a function called with the call's arguments as the task function is
        (without the context; for a workflow step, without the parameter that receives the
        parents' results: ``lambda account_id, **_: ...`` suits both), returning the key or
        None. A name that is not a parameter is refused here. ``.options(concurrency_key=...)``
        overrides it for a call. It applies where the call is bound, to ``enqueue``,
        ``bind``, ``enqueue_many`` and ``s``: a submit by type name (``pgqueue.enqueue``, the
        CLI, HTTP) gives its key itself.

        ``rate_limit`` (``"10/m"``) and ``rate_burst`` are :meth:`handler`'s: starts spaced
        evenly across every worker, declared by the workers as the type's limit.
        ``max_retries``, ``retry_on``, ``no_retry_on``, ``on_failure``, ``on_retry``,
        ``on_dead`` and ``middleware`` are :meth:`handler`'s too.
        """
        rate = rate_limit_of(rate_limit, rate_burst)
        max_attempts = attempts_of(max_attempts, max_retries)
        rules = _Rules.of(retry_on, no_retry_on, on_failure, on_retry, on_dead, middleware)

        def register(f: Callable[..., Any]) -> TaskFunction[..., Any]:
            declared = declare(
                f,
                name=name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                retry=retry,
                timeout=timeout,
                concurrency_key=concurrency_key,
            )
            if declared.type in self._handlers:
                raise ValueError(f"task type {declared.type!r} already has a handler")
            check_executor(f, declared.is_async, executor, hard_timeout)
            rules.check_middleware(f, declared.is_async)
            decl = declared.declaration()
            self._handlers[declared.type] = Handler(
                type=declared.type,
                fn=self._wrap(declared.handler(), declared.is_async, rules),
                is_async=declared.is_async,
                retry=decl.retry,
                timeout=timeout,
                queue=decl.queue,
                priority=decl.priority,
                parameters=decl.parameters,
                executor=executor,
                hard_timeout=hard_timeout,
                rate_limit=rate,
                **rules.fields(),
            )
            return declared

        return register if fn is None else register(fn)

    def get(self, type: str) -> Handler | None:
        return self._handlers.get(type)

    # --- hooks and middleware (pgqueue/hooks.py) ---------------------------------------------

    def middleware(self, fn: M) -> M:
        """Wrap every handler call of this registry with ``fn(ctx, call)`` (a decorator;
        registered first, outermost; before each type's own). A plain function wraps plain
        handlers (``return call()``), an ``async def`` coroutine handlers (``return await
        call()``). It runs where the handler runs: register it at import, with the tasks, so
        that a child process has it too."""
        if not callable(fn):
            raise ValidationError("middleware", f"must be a function (ctx, call), not {fn!r}")
        if inspect.iscoroutinefunction(fn):
            self._async_middleware.append(fn)
        else:
            self._middleware.append(fn)
        return fn

    def hooks(self, handler: Handler | None, outcome: FailureOutcome) -> list[tuple[str, Hook]]:
        """The hooks a failed attempt of ``handler``'s type calls, in order: on_failure (the
        registry's, the type's), then on_retry or on_dead likewise."""
        kinds = ["on_failure"]
        if outcome == "retrying":
            kinds.append("on_retry")
        elif outcome == "dead":
            kinds.append("on_dead")
        out: list[tuple[str, Hook]] = []
        for kind in kinds:
            for owner in (self, handler):
                hook = getattr(owner, kind, None) if owner is not None else None
                if hook is not None:
                    out.append((kind, hook))
        return out

    def _wrap(self, fn: Callable[..., Any], is_async: bool, rules: _Rules) -> Callable[..., Any]:
        """``fn(payload, ctx)`` inside the registry's middleware (read at each call: one
        registered after the task still applies) and the type's, with the type's retry rules
        applied to what comes out."""
        if is_async:

            async def call_async(payload: Any, ctx: Any) -> Any:
                chain = [*self._async_middleware, *rules.middleware]
                try:
                    if not chain:
                        return await fn(payload, ctx)
                    return await _through_async(chain, fn, payload, ctx)
                except _UNCLASSIFIED:
                    raise
                except Exception as exc:
                    rules.check(exc)
                    raise

            return call_async

        def call(payload: Any, ctx: Any) -> Any:
            chain = [*self._middleware, *rules.middleware]
            try:
                if not chain:
                    return fn(payload, ctx)
                return _through(chain, fn, payload, ctx)
            except _UNCLASSIFIED:
                raise
            except Exception as exc:
                rules.check(exc)
                raise

        return call

    @property
    def types(self) -> list[str]:
        return sorted(self._handlers)

    def declarations(self) -> list[TypeDeclaration]:
        """Each type with what it declares (retry policy, queue, priority, timeout, a function
        task's parameters, a rate limit; None: nothing): what a worker records in
        pgqueue.task_types at start, for enqueue to apply wherever a task is submitted and the
        CLI and the API to check payloads against; and the rate limits, as the types' limits
        (pgqueue.limits) where no operator set one."""
        return [
            TypeDeclaration(
                type=h.type,
                retry=h.retry,
                queue=h.queue,
                priority=h.priority,
                timeout=h.timeout,
                parameters=h.parameters,
                rate_limit=h.rate_limit,
            )
            for h in (self._handlers[t] for t in self.types)
        ]

    def enqueue_options(self, type: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """Enqueue options with the type's retry policy, queue and priority filled in where
        the caller gave none."""
        out = dict(options)
        handler = self._handlers.get(type)
        if handler and handler.retry and "retry" not in out and "max_attempts" not in out:
            out["retry"] = handler.retry
        if handler and handler.queue is not None and out.get("queue") is None:
            out["queue"] = handler.queue
        if handler and handler.priority is not None and out.get("priority") is None:
            out["priority"] = handler.priority
        return out

    def periodic(
        self,
        name: str,
        cron: str | None = None,
        *,
        every: timedelta | float | None = None,
        anchor: datetime | None = None,
        type: str | None = None,
        payload: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        queue: str = "default",
        priority: str = "normal",
        catch_up: bool = False,
    ) -> Schedule:
        """Enqueue ``type`` (default: ``name``) at every tick of ``cron`` in ``timezone``, or
        every ``every`` (a timedelta or seconds, at least 1 s) of real time.

        An interval ticks at ``anchor + n * every``: from the Unix epoch unless ``anchor``
        says otherwise (a naive one is read in ``timezone``), so ``every=timedelta(minutes=5)``
        ticks at :00, :05, ... and every worker computes the same ticks. None is before the
        anchor. Every worker running this registry also runs the scheduler, yet each tick is
        enqueued once across all of them (a row lock and the tick's idempotency key,
        ``periodic:NAME:TICK``). Ticks missed while no worker ran are not replayed in a burst:
        only the newest is enqueued, unless ``catch_up`` asks for all of them.
        """
        from pgqueue.enqueue import prepare

        check_name("schedule", name)
        if name in self._schedules:
            raise ValueError(f"schedule {name!r} is already declared")
        if cron is not None and every is not None:
            raise ValidationError(
                "every", f"schedule {name!r}: give a cron expression or every=..., not both"
            )
        if cron is None and every is None:
            raise ValidationError(
                "cron",
                f"schedule {name!r}: give a cron expression (e.g. '*/5 * * * *') or an interval "
                "(every=timedelta(seconds=30))",
            )
        if anchor is not None and every is None:
            raise ValidationError("anchor", f"schedule {name!r}: an anchor is for every=... only")
        tz = zone(timezone)
        schedule = Schedule(
            name=name,
            cron=None if cron is None else Cron.parse(cron),
            timezone=tz.key,
            type=type or name,
            payload=dict(payload or {}),
            queue=queue,
            priority=priority,
            catch_up=catch_up,
            every=None if every is None else Interval.parse(every, anchor, tz),
        )
        # Everything the task will be is checked now, at import, not at the first tick.
        prepare(schedule.type, schedule.payload, queue=queue, priority=priority)
        self._schedules[name] = schedule
        return schedule

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules.values())

    def enqueue(
        self, conn: Any, type: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Any:
        """``pgqueue.enqueue`` with this registry's policy for ``type`` as the default."""
        from pgqueue.operations import enqueue

        return enqueue(conn, type, payload, **self.enqueue_options(type, options))


M = TypeVar("M", bound=Middleware)

# What a handler raises on purpose, and what the worker raises in it: never classified.
_UNCLASSIFIED = (Retry, Cancel, Snooze, Fail, TaskInterrupted)


def attempts_of(max_attempts: int | None, max_retries: int | None) -> int | None:
    """``max_attempts``, or Celery's ``max_retries`` + 1 (the first run is not a retry)."""
    if max_retries is None:
        return max_attempts
    if max_attempts is not None:
        raise ValidationError(
            "max_retries",
            "give max_attempts or max_retries, not both (max_attempts = max_retries + 1)",
        )
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValidationError("max_retries", f"must be an integer >= 0, not {max_retries!r}")
    return max_retries + 1


def _hook(name: str, hook: Hook | None) -> Hook | None:
    if hook is not None and not callable(hook):
        raise ValidationError(name, f"must be a function taking a TaskFailure, not {hook!r}")
    return hook


@dataclasses.dataclass(frozen=True)
class _Rules:
    """A type's retry rules, hooks and middleware, checked at decoration time."""

    retry_on: tuple[type[Exception], ...] | None
    no_retry_on: tuple[type[Exception], ...] | None
    on_failure: Hook | None
    on_retry: Hook | None
    on_dead: Hook | None
    middleware: tuple[Middleware, ...]

    @classmethod
    def of(
        cls,
        retry_on: ExceptionTypes | None,
        no_retry_on: ExceptionTypes | None,
        on_failure: Hook | None,
        on_retry: Hook | None,
        on_dead: Hook | None,
        middleware: Sequence[Middleware],
    ) -> _Rules:
        for mw in middleware:
            if not callable(mw):
                raise ValidationError("middleware", f"must be functions (ctx, call), not {mw!r}")
        return cls(
            exception_types("retry_on", retry_on, _UNCLASSIFIED),
            exception_types("no_retry_on", no_retry_on, _UNCLASSIFIED),
            _hook("on_failure", on_failure),
            _hook("on_retry", on_retry),
            _hook("on_dead", on_dead),
            tuple(middleware),
        )

    def check_middleware(self, fn: Callable[..., Any], is_async: bool) -> None:
        for mw in self.middleware:
            if inspect.iscoroutinefunction(mw) != is_async:
                raise ValidationError(
                    "middleware",
                    f"{getattr(mw, '__qualname__', mw)} is "
                    + ("async def" if not is_async else "a plain function")
                    + f" and {getattr(fn, '__qualname__', fn)} is "
                    + ("async def" if is_async else "a plain function")
                    + ": a middleware wraps handlers of its own kind",
                )

    def check(self, exc: Exception) -> None:
        """Raise NotRetried for an exception these rules do not retry (its note says why)."""
        if self.retry_on is None and self.no_retry_on is None:
            return
        why = not_retried_because(exc, self.retry_on, self.no_retry_on)
        if why is not None:
            exc.add_note(why)
            raise NotRetried(exc, why) from exc

    def fields(self) -> dict[str, Any]:
        return {
            "retry_on": self.retry_on,
            "no_retry_on": self.no_retry_on,
            "on_failure": self.on_failure,
            "on_retry": self.on_retry,
            "on_dead": self.on_dead,
            "middleware": self.middleware,
        }


def _through(chain: list[Middleware], fn: Callable[..., Any], payload: Any, ctx: Any) -> Any:
    def at(i: int) -> Any:
        if i == len(chain):
            return fn(payload, ctx)
        return chain[i](ctx, lambda: at(i + 1))

    return at(0)


async def _through_async(
    chain: list[Middleware], fn: Callable[..., Any], payload: Any, ctx: Any
) -> Any:
    async def at(i: int) -> Any:
        if i == len(chain):
            return await fn(payload, ctx)
        return await chain[i](ctx, lambda: at(i + 1))

    return await at(0)


def load(spec: str) -> TaskRegistry:
    """Import ``module:attribute`` (or ``module``, looking for a TaskRegistry named tasks)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValidationError("registry", f"cannot import {module_name!r}: {exc}") from None
    if attr:
        obj = getattr(module, attr, None)
        if obj is None:
            raise ValidationError("registry", f"module {module_name!r} has no attribute {attr!r}")
    else:
        found = [v for v in vars(module).values() if isinstance(v, TaskRegistry)]
        if len(found) != 1:
            raise ValidationError(
                "registry",
                f"name the registry: {module_name}:NAME (found {len(found)} in the module)",
            )
        obj = found[0]
    if not isinstance(obj, TaskRegistry):
        raise ValidationError(
            "registry", f"{spec} is a {type(obj).__name__}, not a pgqueue.TaskRegistry"
        )
    if obj.origin is None:
        name = attr or next(k for k, v in vars(module).items() if v is obj)
        obj.origin = f"{module_name}:{name}"
    return obj
