"""What workers declare about the task types they run (retry policy, queue, priority,
timeout, a function task's parameters), which enqueue and the argument check read back.
Statements: sql/task_types.sql.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from pgqueue.models import Priority, RetryPolicy
from pgqueue.queries.driver import Op, Query, Row, dumps


class RateDeclaration(NamedTuple):
    """A rate limit declared on a task type's decorator (``rate_limit="10/m"``): ``rate``
    starts per ``period`` seconds, spaced evenly, at most ``burst`` at once."""

    rate: int
    period: float
    burst: int = 1


class TypeDeclaration(NamedTuple):
    """What a worker records about one task type at its start (pgqueue.task_types): its retry
    policy, queue, priority and timeout (None: not declared), and a function task's
    parameters (pgqueue.function_tasks.describe_parameters; None: a handler(payload, ctx))."""

    type: str
    retry: RetryPolicy | None = None
    queue: str | None = None
    priority: Priority | None = None
    timeout: float | None = None
    parameters: Mapping[str, Any] | None = None
    rate_limit: RateDeclaration | None = None


def task_types_declare(
    owner: str,
    declarations: Sequence[TypeDeclaration | tuple[str, RetryPolicy | None]],
    now: datetime | None = None,
) -> Op[None]:
    """Record a registry's task types and what each declares (None: nothing), as ``owner``
    (a worker's id) at its start; enqueue reads them (task_insert), and the CLI and the API
    check payloads against the parameters (task_type_parameters). A declared rate limit
    becomes the type's limit where no operator set one (task_types_declare_limits)."""
    decls = [d if isinstance(d, TypeDeclaration) else TypeDeclaration(*d) for d in declarations]
    policies = [d.retry for d in decls]
    yield Query(
        "task_types_declare",
        {
            "owner": owner,
            "types": [d.type for d in decls],
            "max_attempts": [p.max_attempts if p else None for p in policies],
            "bases": [float(p.base) if p else None for p in policies],
            "factors": [float(p.factor) if p else None for p in policies],
            "caps": [float(p.cap) if p else None for p in policies],
            "queues": [d.queue for d in decls],
            "priorities": [None if d.priority is None else int(d.priority) for d in decls],
            "timeouts": [d.timeout for d in decls],
            "parameters": [None if d.parameters is None else dumps(d.parameters) for d in decls],
            "now": now,
        },
    )
    rates = [d.rate_limit for d in decls]
    yield Query(
        "task_types_declare_limits",
        {
            "owner": owner,
            "types": [d.type for d in decls],
            "rates": [r.rate if r else None for r in rates],
            "periods": [r.period if r else None for r in rates],
            "bursts": [r.burst if r else None for r in rates],
            "now": now,
        },
    )


def task_type_parameters(type: str) -> Op[dict[str, Any] | None]:
    """The parameters a worker recorded for ``type`` (a function task), or None: not
    declared, or a handler(payload, ctx) type, which takes any payload."""
    rows = yield Query("task_type_parameters", {"type": type})
    if not rows or rows[0]["parameters"] is None:
        return None
    parameters: dict[str, Any] = rows[0]["parameters"]
    return parameters


def task_types_list() -> Op[list[Row]]:
    """The declared task types, by type."""
    return (yield Query("task_types_list", {}))
