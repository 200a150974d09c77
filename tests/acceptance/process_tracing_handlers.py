"""A process task under OpenTelemetry (``process_tracing_handlers:tasks``), for
test_process_executor.py: the SDK is configured at import, in the worker (and so in the
children forked from it), to append every finished span to the file named by
``PROCESS_TRACE_FILE``, one JSON line each, whichever process ends it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from pgqueue import TaskContext, TaskRegistry


class _FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(os.environ["PROCESS_TRACE_FILE"], "a") as out:  # O_APPEND: one line a write
            for span in spans:
                context = span.get_span_context()
                assert context is not None
                out.write(
                    json.dumps(
                        {
                            "name": span.name,
                            "trace_id": context.trace_id,
                            "span_id": context.span_id,
                            "parent": span.parent.span_id if span.parent else None,
                            "pid": os.getpid(),
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(_FileExporter()))
trace.set_tracer_provider(provider)

tasks = TaskRegistry()


@tasks.handler("traced", executor="process")
def traced(payload: dict[str, Any], ctx: TaskContext) -> int:
    with trace.get_tracer("handler").start_as_current_span("inside the handler"):
        return os.getpid()
