"""OpenTelemetry tracing: one trace from the submit (or the HTTP request) to the execution.

The OpenTelemetry SDK with an in-memory exporter records the spans; a real worker runs in this
process (on a thread with its own event loop) against the real database, so the trace context
goes through the ``trace_context`` column as it does between hosts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from boundaries import Api
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgqueue
from pgqueue import tracing
from pgqueue.api import ApiSettings

EXPORTER = InMemorySpanExporter()
_provider_installed = False


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, spans recorded in memory (the global provider can be set once a process)."""
    global _provider_installed
    if not _provider_installed:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        _provider_installed = True
    EXPORTER.clear()
    tracing.enable(True)
    yield EXPORTER
    tracing.enable(False)
    EXPORTER.clear()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def run_worker_until(
    database_url: str, registry: pgqueue.TaskRegistry, done: Callable[[], bool]
) -> None:
    """A real worker in this process until ``done()``, then a graceful stop."""
    config = pgqueue.WorkerConfig(concurrency=2, poll_interval=0.1)
    worker = pgqueue.Worker(registry, database_url, config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run_async(),))
    thread.start()
    try:
        wait_for(done, "the worker to finish the tasks")
    finally:
        loop.call_soon_threadsafe(worker.request_stop)
        thread.join(30)
        loop.close()
    assert not thread.is_alive()


def status(conn: psycopg.Connection[Any], task_id: Any) -> str:
    return pgqueue.get_task(conn, task_id).status.value


def test_tracing_is_off_by_default_and_stores_no_context(conn, monkeypatch):
    monkeypatch.delenv(tracing.ENV_TRACING, raising=False)
    tracing.enable(False)
    assert not tracing.enabled()
    task_id = pgqueue.enqueue(conn, "t").id
    row = conn.execute(
        "SELECT trace_context FROM pgqueue.tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row == (None,)


def test_the_environment_variable_turns_it_on(monkeypatch):
    tracing.enable(False)
    tracing._forced = None  # back to the environment's say
    monkeypatch.setenv(tracing.ENV_TRACING, "1")
    assert tracing.enabled()
    monkeypatch.setenv(tracing.ENV_TRACING, "0")
    assert not tracing.enabled()


def test_a_submit_span_is_a_child_of_the_callers_span_and_its_context_is_stored(conn, spans):
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("app.checkout") as app_span:
        task_id = pgqueue.enqueue(conn, "email.send", {"to": "a"}, queue="mail").id

    (submit,) = named(spans, "pgqueue.submit")
    assert submit.name == "pgqueue.submit email.send"
    assert submit.kind is trace.SpanKind.PRODUCER
    assert submit.parent is not None
    assert submit.parent.span_id == app_span.get_span_context().span_id
    assert submit.attributes is not None
    assert submit.attributes["messaging.destination.name"] == "mail"
    row = conn.execute(
        "SELECT trace_context FROM pgqueue.tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None
    traceparent = row[0]["traceparent"]
    assert f"{submit.context.trace_id:032x}-{submit.context.span_id:016x}" in traceparent


def test_a_batch_is_one_span_and_its_tasks_share_its_context(conn, spans):
    results = pgqueue.enqueue_many(
        conn,
        [{"type": "a"}, {"type": "b", "idempotency_key": "k1"}, {"type": "a"}],
    )

    (submit,) = named(spans, "pgqueue.submit")
    assert submit.name == "pgqueue.submit (mixed)"
    assert submit.attributes is not None
    assert submit.attributes["messaging.batch.message_count"] == 3
    contexts = {
        r[0]["traceparent"]
        for r in conn.execute(
            "SELECT trace_context FROM pgqueue.tasks WHERE id = ANY(%s)",
            ([r.id for r in results],),
        )
    }
    assert len(contexts) == 1, "COPY and the keyed INSERT both store the batch's context"


def test_the_execution_span_continues_the_submitters_trace_in_a_worker(database_url, conn, spans):
    registry = pgqueue.TaskRegistry()
    inner_parents: list[int] = []

    @registry.handler("report.build")
    def build(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> str:
        # A sync handler runs on a thread: its own spans must land under the execution span.
        with trace.get_tracer("app").start_as_current_span("app.render") as inner:
            inner_parents.append(inner.parent.span_id if inner.parent else 0)
        return "ok"

    @registry.handler("report.broken")
    def broken(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
        raise ValueError("no such report")

    with trace.get_tracer("app").start_as_current_span("app.request"):
        ok = pgqueue.enqueue(conn, "report.build").id
        bad = pgqueue.enqueue(conn, "report.broken", max_attempts=1).id
    run_worker_until(
        database_url,
        registry,
        lambda: status(conn, ok) == "completed" and status(conn, bad) == "failed",
    )

    submits = {s.attributes["pgqueue.task.type"]: s for s in named(spans, "pgqueue.submit")}  # type: ignore[index]
    executions = {s.name: s for s in named(spans, "pgqueue.execute")}
    execute = executions["pgqueue.execute report.build"]
    submit = submits["report.build"]
    assert execute.kind is trace.SpanKind.CONSUMER
    assert execute.context.trace_id == submit.context.trace_id, "one trace, submit to execution"
    assert execute.parent is not None and execute.parent.span_id == submit.context.span_id
    assert [link.context.span_id for link in execute.links] == [submit.context.span_id]
    assert execute.attributes is not None
    assert execute.attributes["messaging.message.id"] == str(ok)
    assert execute.attributes["pgqueue.task.attempt"] == 1
    assert inner_parents == [execute.context.span_id]
    failed = executions["pgqueue.execute report.broken"]
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert failed.attributes is not None
    assert "no such report" in str(failed.attributes["pgqueue.error"])


def test_an_http_submit_joins_the_callers_trace_from_its_traceparent_header(
    database_url, conn, spans
):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    api = Api(ApiSettings(database_url=database_url))
    try:
        response = api.request(
            "POST",
            "/api/v1/tasks",
            json={"type": "email.send", "payload": {"to": "a"}},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
        )
    finally:
        api.close()
    assert response.status_code == 202, response.text

    (submit,) = named(spans, "pgqueue.submit")
    assert f"{submit.context.trace_id:032x}" == trace_id
    # Up the chain of parents (the server's request span, when FastAPI records one) to the
    # caller's span, which is remote.
    by_id = {s.context.span_id: s for s in spans.get_finished_spans()}
    parent = submit.parent
    while parent is not None and parent.span_id in by_id:
        parent = by_id[parent.span_id].parent
    assert parent is not None and parent.is_remote
    assert f"{parent.span_id:016x}" == parent_id


def test_remote_parent_makes_an_incoming_context_the_parent_when_no_span_is_current(conn, spans):
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with tracing.remote_parent({"traceparent": f"00-{trace_id}-{parent_id}-01"}):
        pgqueue.enqueue(conn, "t")

    (submit,) = named(spans, "pgqueue.submit")
    assert submit.parent is not None and submit.parent.is_remote
    assert (f"{submit.parent.trace_id:032x}", f"{submit.parent.span_id:016x}") == (
        trace_id,
        parent_id,
    )
