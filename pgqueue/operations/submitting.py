"""Submitting tasks: enqueue, enqueue_many, enqueue_columns, a function task's prepared
insert, and the check of a payload against a function task's recorded parameters.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from pgqueue import arguments, config, tracing
from pgqueue.enqueue import (
    PLAIN_KEYED_KEYS,
    PLAIN_KEYS,
    check_concurrency_key,
    check_name,
    encode_payload,
    new_task_ids,
    prepare,
    prepare_plain,
)
from pgqueue.errors import ValidationError
from pgqueue.models import EnqueueResult, KeyReuse, Priority, RetryPolicy, built
from pgqueue.operations.checks import _kind
from pgqueue.queries import submitting, task_types
from pgqueue.queries.driver import Op, atomic_operation, operation
from pgqueue.queries.specs import TaskSpec


def as_specs(items: Iterable[TaskSpec | Mapping[str, Any]]) -> list[TaskSpec]:
    """Validate a batch: prepared TaskSpecs or dicts of enqueue's keyword arguments.

    The same prepared task twice is refused (it would collide with itself). The payload
    limit is read once for the batch rather than once per task, and the batch's ids are made
    at once, in the order of its items (a prepared task keeps its own).
    """
    limit = config.max_payload_bytes()
    batch = items if isinstance(items, list | tuple) else list(items)
    ids = iter(new_task_ids(len(batch)))
    names: set[str] = set()
    out: list[TaskSpec] = []
    try:
        prepared = _prepare_items(batch, out, ids, limit, names)
    except ValidationError as exc:
        # One spec per item so far, in order: the item refused is the next.
        raise in_batch(exc, len(out), len(batch)) from None
    # Ids made here are new, so only a prepared task can appear twice.
    if prepared and len({s.id for s in out}) != len(out):
        raise ValidationError(
            "tasks", "the same prepared task appears twice; call pgqueue.prepare() once per task"
        )
    return out


def in_batch(exc: ValidationError, index: int, count: int) -> ValidationError:
    """The error of one item of a batch, saying which (``item 3 of 10: payload: ...``, the
    index counted from 0 as the list's, and ``.index``), its type and ``.field`` kept."""
    exc.args = (f"item {index} of {count}: {exc}", *exc.args[1:])
    exc.index = index  # type: ignore[attr-defined]
    return exc


def _prepare_items(
    batch: list[Any] | tuple[Any, ...],
    out: list[TaskSpec],
    ids: Iterator[uuid.UUID],
    limit: int,
    names: set[str],
) -> bool:
    """Append each item's spec to ``out``; whether any was prepared by the caller."""
    prepared = False
    for item in batch:
        if isinstance(item, TaskSpec):
            out.append(item)
            prepared = True
        elif item.__class__ is dict and "type" in item and item.keys() <= PLAIN_KEYS:
            out.append(prepare_plain(next(ids), item, limit, names))
        elif item.__class__ is dict and "type" in item and item.keys() <= PLAIN_KEYED_KEYS:
            key = item["concurrency_key"]
            out.append(prepare_plain(next(ids), item, limit, names, key))
        elif isinstance(item, Mapping):
            if "type" not in item:
                raise ValidationError("type", "is required")
            if "key_reuse" in item:
                raise ValidationError(
                    "key_reuse", "is an option of the batch: enqueue_many(..., key_reuse=...)"
                )
            if "max_payload_bytes" in item:
                spec = prepare(**item)
            else:
                spec = prepare(**item, max_payload_bytes=limit)
            # The batch's next id, for the batch's order (none of its items can name this
            # one's fresh id in depends_on: only prepared tasks are known before).
            out.append(spec._replace(id=next(ids)))
        else:
            raise ValidationError(
                "tasks", f"items must be dicts or pgqueue.prepare(...), not {type(item).__name__}"
            )
    return prepared


@operation
def enqueue(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    key_reuse: KeyReuse | str = "return",
    notify: bool | None = None,
    **options: Any,
) -> Op[EnqueueResult]:
    """Submit one task in the caller's transaction.

    Options: ``priority`` ('high', 'normal', 'low'), ``queue``, ``idempotency_key``,
    ``run_at`` (aware datetime) or ``delay`` (seconds), ``max_attempts``, ``retry`` (a
    RetryPolicy), ``expires_in`` (seconds) or ``expires_at`` (aware datetime): if no attempt
    has been spent by then, the task never runs and ends cancelled, reason ``expired``;
    ``concurrency_key``, the tenant (account, customer) it works for, 1 to 200 characters:
    workers claim the keys of a queue in turns, so one tenant's backlog does not hold up the
    others, and a limit's ``per_key_max_running`` caps how many of one key run at once. Left
    out (or None), the priority, queue and retry policy are the type's declaration (recorded
    by workers at start), else 'normal', 'default' and 3 attempts; no concurrency key is no
    key. With an idempotency key that was already used, nothing is inserted and the original
    task comes back with ``created=False``, whatever was submitted this time; with
    ``key_reuse="refuse"``, only if this submit has the original's type, queue (when given),
    payload (JSON equality) and concurrency key (when given), else IdempotencyConflict is
    raised, naming the original and the fields that differ. Nothing is written then, and the
    transaction is still usable.

    ``notify=False`` sends no NOTIFY to wake idle workers (they find the task at their next
    poll): many producers committing at once then do not queue for the lock a NOTIFY takes
    across the whole cluster. Left out, ``PGQUEUE_NOTIFY`` decides (on, unless ``off``).
    """
    now = options.pop("now", None)
    reuse = KeyReuse.parse(key_reuse)
    return _insert(prepare(type, payload, **options), now, reuse, notify)


def _insert(
    spec: TaskSpec, now: datetime | None, key_reuse: KeyReuse, notify: bool | None = None
) -> Op[EnqueueResult]:
    # A queue left out is the type's declared one, known only once inserted.
    with tracing.submit_span(spec.type, spec.queue or "(declared)") as trace_context:
        task, created = yield from submitting.task_insert(
            spec, now, trace_context, key_reuse, notify
        )
    return EnqueueResult(task, created)


@atomic_operation
def enqueue_many(
    tasks: Iterable[TaskSpec | Mapping[str, Any]],
    *,
    key_reuse: KeyReuse | str = "return",
    now: datetime | None = None,
    notify: bool | None = None,
) -> Op[list[EnqueueResult]]:
    """Submit many tasks in one statement; results come back in the order given.

    Items are ``pgqueue.prepare(...)`` results or dicts of enqueue's arguments. Every item is
    validated before anything is written, so one bad item rejects the whole batch.
    ``key_reuse`` is enqueue's, for the whole batch. Of two items with the same idempotency
    key, the first is created and the second gets it back; with ``key_reuse="refuse"``, an
    item that differs from its key's holder (an older task or an earlier item) raises
    IdempotencyConflict (``.index`` says which item) and none of the batch is written.
    ``notify`` is enqueue's (one NOTIFY per queue made ready, unless false).
    """
    reuse = KeyReuse.parse(key_reuse)
    return _insert_many(as_specs(tasks), now, reuse, notify)


def _insert_many(
    specs: list[TaskSpec], now: datetime | None, key_reuse: KeyReuse, notify: bool | None
) -> Op[list[EnqueueResult]]:
    queues = {s.queue or "(declared)" for s in specs}
    type_, queue = tracing.batch_names({s.type for s in specs}, queues)
    with tracing.submit_span(type_, queue, count=len(specs)) as trace_context:
        rows = yield from submitting.task_insert_many(specs, now, trace_context, key_reuse, notify)
    # (built: an EnqueueResult's __init__ is a fifth of a task's own)
    return [built(EnqueueResult, {"task": t, "created": c}) for t, c in rows]


@atomic_operation
def enqueue_columns(
    type: str,
    payloads: Iterable[Mapping[str, Any] | None],
    *,
    queue: str | None = None,
    priority: Priority | str | int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    expires_in: float | None = None,
    expires_at: datetime | None = None,
    concurrency_key: str | None = None,
    concurrency_keys: Iterable[str | None] | None = None,
    now: datetime | None = None,
    notify: bool | None = None,
) -> Op[list[uuid.UUID]]:
    """Submit one task of ``type`` per payload, with the same options for all; returns their
    ids, in the order of ``payloads``.

    The columnar form of enqueue_many, for large batches of one type: the options are checked
    once, each payload as enqueue checks it (a JSON object within the size limit, None for
    ``{}``), all before anything is written, and the batch goes in by one binary COPY in the
    caller's transaction (all or nothing even on an autocommit connection). No Task objects
    are made: a fraction of enqueue_many's cost per task. The options are enqueue's (left
    out, the type's declaration applies); an idempotency key or parents need enqueue_many.
    ``concurrency_key`` is one for all; ``concurrency_keys`` instead gives each task its own
    (a column as long as ``payloads``, None for a task without one), each checked as
    enqueue checks one. ``notify`` is enqueue's.
    """
    template = prepare(
        type,
        None,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        retry=retry,
        expires_in=expires_in,
        expires_at=expires_at,
        concurrency_key=concurrency_key,
    )
    if isinstance(payloads, str | bytes | Mapping) or not isinstance(payloads, Iterable):
        raise ValidationError(
            "payloads", f"must be a list of payloads (dicts), not {_kind(payloads)}"
        )
    limit = config.max_payload_bytes()
    column = list(payloads)
    encoded = []
    for index, payload in enumerate(column):
        try:
            encoded.append(encode_payload({} if payload is None else payload, limit))
        except ValidationError as exc:
            raise in_batch(exc, index, len(column)) from None
    keys = None
    if concurrency_keys is not None:
        keys = _key_column(concurrency_keys, len(encoded), concurrency_key)
    return _insert_columns(template, encoded, now, notify, keys)


def _key_column(
    keys: Iterable[str | None], count: int, one_for_all: str | None
) -> list[str | None]:
    """``concurrency_keys`` checked: a column of ``count`` keys (or None), each by
    check_concurrency_key, an error naming its position."""
    field = "concurrency_keys"
    if one_for_all is not None:
        raise ValidationError(
            field, "give concurrency_key (one for all) or concurrency_keys (one each), not both"
        )
    if isinstance(keys, str | bytes | Mapping) or not isinstance(keys, Iterable):
        raise ValidationError(field, f"must be a list of keys (str or None), not {_kind(keys)}")
    column = list(keys)
    if len(column) != count:
        raise ValidationError(field, f"has {len(column)} keys for {count} payloads")
    for i, key in enumerate(column):
        if key is not None:
            try:
                check_concurrency_key(key)
            except ValidationError as exc:
                raise ValidationError(field, f"item {i} {exc.reason}") from None
    return column


def _insert_columns(
    template: TaskSpec,
    payloads: list[str],
    now: datetime | None,
    notify: bool | None,
    concurrency_keys: list[str | None] | None = None,
) -> Op[list[uuid.UUID]]:
    if not payloads:
        return []
    ids = new_task_ids(len(payloads))
    queue = template.queue or "(declared)"
    with tracing.submit_span(template.type, queue, count=len(ids)) as trace_context:
        yield from submitting.task_copy_columns(
            template, ids, payloads, now, trace_context, notify, concurrency_keys
        )
    return ids


def insert_prepared(
    spec: TaskSpec,
    now: datetime | None = None,
    key_reuse: KeyReuse = KeyReuse.RETURN,
    notify: bool | None = None,
) -> Op[EnqueueResult]:
    """The op of one prepared task's insert (``pgqueue.enqueue`` after its ``prepare``): what a
    function task's ``enqueue`` drives, having bound and checked its arguments itself."""
    return _insert(spec, now, key_reuse, notify)


@operation
def check_arguments(type: str, payload: Mapping[str, Any] | None = None) -> Op[None]:
    """Check a payload against the parameters a worker recorded for ``type`` (a function
    task, ``@tasks.task``): raises InvalidArgument naming the argument that is missing,
    unknown, not JSON or of the wrong JSON type; does nothing for a type that recorded none
    (a ``handler(payload, ctx)`` type, or one no worker declared yet). One primary-key read.

    The CLI and the HTTP API call it before they enqueue, since they never import the user's
    code; ``pgqueue.enqueue`` by type name does not (no extra round trip on the hot path):
    a producer holding the function checks for free with ``fn.enqueue(...)``.
    """
    check_name("type", type)
    given = {} if payload is None else payload
    if not isinstance(given, Mapping):
        raise ValidationError("payload", f"must be a JSON object (a dict), not {_kind(given)}")
    return _check_arguments(type, given)


def _check_arguments(type: str, payload: Mapping[str, Any]) -> Op[None]:
    description = yield from task_types.task_type_parameters(type)
    if description is not None:
        arguments.check_arguments(description, payload)
