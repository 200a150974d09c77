"""What a task's result may be, and the one encoder that holds results to it.

A result is stored in the task's row, like its payload, and read back whole by ``pgqueue
status``, the API and the dashboard; so it is bounded like a payload
(``PGQUEUE_MAX_RESULT_BYTES``, 1 MiB, measured as the text PostgreSQL gives back) and must be
JSON that jsonb accepts. The worker (a
handler's return value, :mod:`pgqueue.executor`) and ``pgqueue.complete``
(:mod:`pgqueue.operations`) both encode through :func:`encode_result`, so the rule lives here
once. It is a module of its own because both of them import it: the executor cannot be imported
by the operations without a cycle (executor -> registry -> operations).
"""

from __future__ import annotations

import uuid
from typing import Any

from pgqueue import config
from pgqueue.enqueue import _ENCODER, MAX_JSON_DEPTH, _has_nul, json_depth_exceeds, stored_size
from pgqueue.errors import InvalidResult, ResultTooLarge


def encode_result(
    value: Any, task_id: uuid.UUID, *, subject: str | None = None, limit: int | None = None
) -> str | None:
    """The result as the JSON text to store (None stays None), or InvalidResult saying why it
    cannot be stored: not JSON, nested too deep, a NUL jsonb refuses, or more than ``limit``
    bytes (``PGQUEUE_MAX_RESULT_BYTES`` when not given) of the UTF-8 text PostgreSQL gives back
    (stored_size: jsonb's spacing, and its floats printed in full). ``subject`` is
    how the message names the task (``task <id>`` when not given; the worker adds the type and
    attempt)."""
    if value is None:
        return None
    subject = subject or f"task {task_id}"
    try:
        text = _ENCODER.encode(value)
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, which PostgreSQL would reject
        raise InvalidResult(
            task_id,
            subject,
            f"is not JSON-serialisable: contains a string that is not valid Unicode ({exc.reason})",
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidResult(task_id, subject, f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidResult(
            task_id, subject, f"nests deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    if json_depth_exceeds(raw):
        raise InvalidResult(task_id, subject, f"nests deeper than {MAX_JSON_DEPTH} levels")
    limit = config.max_result_bytes() if limit is None else limit
    size = stored_size(raw)
    if size > limit:
        raise ResultTooLarge(task_id, subject, size, limit)
    # jsonb cannot hold \u0000: refused here rather than by the completion's statement, which
    # writes a batch of other tasks' results too. Checked precisely only when the text hints.
    if "\\u0000" in text and _has_nul(value):
        raise InvalidResult(
            task_id, subject, "contains a NUL (\\u0000) character, which PostgreSQL cannot store"
        )
    return text
