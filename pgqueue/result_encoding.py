"""What a task's result may be, and the one encoder that holds results to it.

A result is stored in the task's row, like its payload, and read back whole by ``pgqueue
status``, the API and the dashboard; so it is bounded like a payload
(``PGQUEUE_MAX_RESULT_BYTES``, 1 MiB) and must be JSON that jsonb accepts. The worker (a
handler's return value, :mod:`pgqueue.executor`) and ``pgqueue.complete``
(:mod:`pgqueue.operations`) both encode through :func:`encode_result`, so the rule lives here
once. It is a module of its own because both of them import it: the executor cannot be imported
by the operations without a cycle (executor -> registry -> operations).
"""

from __future__ import annotations

import uuid
from typing import Any

from pgqueue import config
from pgqueue.enqueue import MAX_JSON_DEPTH, _has_nul, json_depth_exceeds
from pgqueue.errors import InvalidResult, ResultTooLarge
from pgqueue.queries.driver import dumps


def encode_result(
    value: Any, task_id: uuid.UUID, *, subject: str | None = None, limit: int | None = None
) -> str | None:
    """The result as the JSON text to store (None stays None), or InvalidResult saying why it
    cannot be stored: not JSON, nested too deep, a NUL jsonb refuses, or more than ``limit``
    bytes of compact UTF-8 JSON (``PGQUEUE_MAX_RESULT_BYTES`` when not given). ``subject`` is
    how the message names the task (``task <id>`` when not given; the worker adds the type and
    attempt)."""
    if value is None:
        return None
    subject = subject or f"task {task_id}"
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidResult(task_id, subject, f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidResult(
            task_id, subject, f"nests deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    raw = text.encode("utf-8")  # dumps has checked that it encodes
    if json_depth_exceeds(raw):
        raise InvalidResult(task_id, subject, f"nests deeper than {MAX_JSON_DEPTH} levels")
    limit = config.max_result_bytes() if limit is None else limit
    if len(raw) > limit:
        raise ResultTooLarge(task_id, subject, len(raw), limit)
    # jsonb cannot hold \u0000: refused here rather than by the completion's statement, which
    # writes a batch of other tasks' results too. Checked precisely only when the text hints.
    if "\\u0000" in text and _has_nul(value):
        raise InvalidResult(
            task_id, subject, "contains a NUL (\\u0000) character, which PostgreSQL cannot store"
        )
    return text
