"""Optional OpenTelemetry tracing: a span for each submit and one for each execution.

Off by default, and then free: nothing is imported and each hook is one boolean test. It is
on when ``PGQUEUE_TRACING`` is ``1`` (or after :func:`enable`) and ``opentelemetry-api`` is
installed (``pip install 'pgqueue-jobs[tracing]'``); the application configures the SDK and its
exporter as usual, pgqueue only creates spans on the global tracer provider.

How a trace follows a task: the submit span (``pgqueue.submit TYPE``, kind PRODUCER) injects
its W3C context into the task row (``trace_context``, written in the same INSERT or COPY), and
the worker starts the execution span (``pgqueue.execute TYPE``, kind CONSUMER) as its child,
with a link to it as well, so the execution lands in the submitter's trace: under the HTTP
request's span when ``pgqueue serve`` received a ``traceparent`` header, or under whatever
span the application had open when it called ``pgqueue.enqueue``. One batch submit
(``enqueue_many``, ``COPY``) is one span, and its tasks share its context.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from pgqueue.error_text import split_error

ENV_TRACING = "PGQUEUE_TRACING"
INSTRUMENTATION = "pgqueue"

_forced: bool | None = None
_tracer: Any = None


def enable(on: bool = True) -> None:
    """Turn tracing on (or off) in this process, whatever ``PGQUEUE_TRACING`` says."""
    global _forced, _tracer
    _forced, _tracer = on, None


def enabled() -> bool:
    if _forced is not None:
        wanted = _forced
    else:
        wanted = os.environ.get(ENV_TRACING, "").strip().lower() in {"1", "true", "yes", "on"}
    return wanted and _api() is not None


_MISSING = object()
_trace_api: Any = _MISSING


def _api() -> Any:
    """opentelemetry.trace, or None when it is not installed (looked up once: a failed
    import is not cheap, and this is asked at every submit)."""
    global _trace_api
    if _trace_api is _MISSING:
        try:
            from opentelemetry import trace
        except ImportError:
            trace = None  # type: ignore[assignment]
        _trace_api = trace
    return _trace_api


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        from pgqueue.version import __version__

        _tracer = _api().get_tracer(INSTRUMENTATION, __version__)
    return _tracer


@contextlib.contextmanager
def remote_parent(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the trace context of an incoming request (its ``traceparent`` header) current, so
    that the submit spans opened inside are its children (``pgqueue serve`` does this). When a
    span is already current (FastAPI records the request's own span when OpenTelemetry is
    installed, as a child of the header's), that one is kept."""
    if not enabled():
        yield
        return
    from opentelemetry import context, propagate, trace

    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


# What the spans' context managers are when tracing is off: one shared do-nothing manager
# that yields None, not a generator made and run per submit and per execution.
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def submit_span(
    type: str, queue: str, *, count: int = 1
) -> contextlib.AbstractContextManager[dict[str, str] | None]:
    """Around a submit: yields the W3C carrier to store with the task(s), or None when off.
    The span's parent is whatever span is current (the application's, or the request's)."""
    if not enabled():
        return _OFF
    return _submit_span(type, queue, count)


@contextlib.contextmanager
def _submit_span(type: str, queue: str, count: int) -> Iterator[dict[str, str] | None]:
    from opentelemetry import propagate, trace

    attributes = {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "pgqueue.task.type": type,
        "messaging.batch.message_count": count,
    }
    with _get_tracer().start_as_current_span(
        f"pgqueue.submit {type}",
        kind=trace.SpanKind.PRODUCER,
        attributes=attributes,
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier


def execution_span(
    *,
    task_id: Any,
    type: str,
    queue: str,
    attempt: int,
    trace_context: Mapping[str, str] | None,
) -> contextlib.AbstractContextManager[Any]:
    """Around one execution of a task by a worker; yields the span (None when off). An
    exception escaping the block is recorded on the span and marks it as an error."""
    if not enabled():
        return _OFF
    return _execution_span(task_id, type, queue, attempt, trace_context)


@contextlib.contextmanager
def _execution_span(
    task_id: Any, type: str, queue: str, attempt: int, trace_context: Mapping[str, str] | None
) -> Iterator[Any]:
    from opentelemetry import propagate, trace

    parent = propagate.extract(dict(trace_context)) if trace_context else None
    links = []
    if parent is not None:
        producer = trace.get_current_span(parent).get_span_context()
        if producer.is_valid:
            links.append(trace.Link(producer))
    attributes = {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(task_id),
        "pgqueue.task.type": type,
        "pgqueue.task.attempt": attempt,
    }
    with _get_tracer().start_as_current_span(
        f"pgqueue.execute {type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    ) as span:
        yield span


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C context (None when off): what a child process is given to run a
    task in, so that the handler's own spans there are children of the execution span."""
    if not enabled():
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make ``carrier`` (:func:`current_carrier` of another process) the current context."""
    if not carrier or _api() is None:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        context.detach(token)


def batch_names(types: set[str], queues: set[str]) -> tuple[str, str]:
    """The type and queue a batch's span is named by: the one there is, or "(mixed)"."""

    def one(names: set[str]) -> str:
        return next(iter(names)) if len(names) == 1 else "(mixed)"

    return one(types), one(queues)


def record_failure(span: Any, error: str) -> None:
    """Mark an execution span as failed (the handler raised, timed out or lost its lease)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, split_error(error).headline[:200] if error else ""))
    span.set_attribute("pgqueue.error", error[:2000])  # the summary first, then the traceback
