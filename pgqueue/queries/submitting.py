"""Putting tasks in: one by INSERT, many by binary COPY, those with keys by one INSERT.

An idempotency key taken returns (or, with ``key_reuse`` REFUSE, refuses against) the task
holding it; a task with parents goes through ``dependencies``. Statements: sql/submitting.sql.

Every insert wakes idle workers of the queues it made ready (NOTIFY, on commit) unless
``notify`` is false; None is ``PGQUEUE_NOTIFY``'s (pgqueue.pooling.resolve_notify).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pgqueue import pooling
from pgqueue.config import DEFAULT_QUEUE
from pgqueue.errors import ComparedField, IdempotencyConflict, UnknownParent
from pgqueue.models import KeyReuse, Priority, Task, built
from pgqueue.queries.dependencies import task_insert_dependent
from pgqueue.queries.driver import Copy, Op, Query, Row
from pgqueue.queries.specs import (
    DEFAULT_PRIORITY,
    DEFAULT_RETRY,
    TaskSpec,
    _defaults,
    _explicit,
    _in_graph,
    _inserted,
    _spec_columns,
    _trace_json,
)


def task_insert(
    spec: TaskSpec,
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    key_reuse: KeyReuse = KeyReuse.RETURN,
    notify: bool | None = None,
) -> Op[tuple[Task, bool]]:
    """Insert one task; ``trace_context``: the submitting span's W3C context (pgqueue.tracing).
    A taken key returns its task, or, with ``key_reuse`` REFUSE and another type, queue,
    payload or concurrency key, raises IdempotencyConflict (no SQL error: the transaction
    stays usable)."""
    notify = pooling.resolve_notify(notify)
    if _in_graph(spec):
        (task,) = yield from task_insert_dependent([spec], now, trace_context, notify=notify)
        return task, True
    if not trace_context and _simple(spec):
        params = _defaults()
        params.update(
            id=spec.id,
            queue=spec.queue,
            type=spec.type,
            payload=spec.payload_json,
            priority=None if spec.priority is None else int(spec.priority),
            now=now,
            notify=notify,
        )
        inserted: Any = (yield Query("task_insert_simple", params, tuples=True))[0]  # a tuple
        created_at, max_attempts, queue, priority, _ = inserted
        return _inserted(spec, created_at, created_at, max_attempts, queue, priority), True
    rows = yield Query(
        "task_insert" if spec.idempotency_key is not None else "task_insert_plain",
        {
            "id": spec.id,
            "queue": spec.queue,
            "type": spec.type,
            "payload": spec.payload_json,
            "priority": None if spec.priority is None else int(spec.priority),
            "max_attempts": spec.max_attempts,
            "backoff_base": spec.backoff_base,
            "backoff_factor": spec.backoff_factor,
            "backoff_cap": spec.backoff_cap,
            "idempotency_key": spec.idempotency_key,
            "run_at": spec.run_at,
            "delay": spec.delay_seconds,
            "explicit": _explicit(spec),
            "now": now,
            "trace_context": _trace_json(trace_context),
            "expires_at": spec.expires_at,
            "expires_in": spec.expires_in,
            "workflow_id": spec.workflow_id,  # read by task_insert only (a keyed root task)
            "concurrency_key": spec.concurrency_key,
            "notify": notify,
            **_defaults(),
        },
    )
    if rows:
        row = rows[0]
        task = _inserted(
            spec,
            row["created_at"],
            row["visible_after"],
            row["max_attempts"],
            row["queue"],
            row["priority"],
            row["expires_at"],
        )
        return task, True
    # The key was taken. ON CONFLICT waited for any concurrent inserter of the same key to
    # commit, so this statement (a fresh snapshot under READ COMMITTED) sees the winner.
    rows = yield from _holders([spec], key_reuse)
    if not rows:  # the winner rolled back between our two statements: insert again
        return (yield from task_insert(spec, now, trace_context, key_reuse, notify))
    if key_reuse is KeyReuse.REFUSE:
        _refuse_if_different(spec, rows[0])
    return Task.from_row(rows[0]), False


def _simple(spec: TaskSpec) -> bool:
    """Whether task_insert_simple inserts ``spec``: nothing given but its type, payload, queue
    and priority (no key, policy, run_at, delay, expiry or concurrency key; not in a graph,
    which the caller has ruled out)."""
    return (
        spec.idempotency_key is None
        and spec.max_attempts is None
        and spec.backoff_base is None
        and spec.backoff_factor is None
        and spec.backoff_cap is None
        and spec.run_at is None
        and not spec.delay_seconds
        and spec.expires_at is None
        and spec.expires_in is None
        and spec.concurrency_key is None
    )


def _holders(specs: Sequence[TaskSpec], key_reuse: KeyReuse) -> Op[list[Row]]:
    """The tasks holding these specs' keys: one row per key, or, to refuse a different reuse,
    one per spec, compared in SQL (jsonb equality) with what it submitted."""
    keys = [s.idempotency_key for s in specs]
    if key_reuse is KeyReuse.RETURN:
        return (yield Query("task_get_by_keys", {"keys": keys}))
    payloads = [s.payload_json for s in specs]
    return (
        yield Query(
            "task_get_by_keys_compared", {"keys": keys, "payloads": payloads}, prepare=False
        )
    )


def _refuse_if_different(
    spec: TaskSpec,
    holder: Row,
    index: int | None = None,
    batch: Mapping[uuid.UUID, int] | None = None,
) -> None:
    """Raise IdempotencyConflict when ``holder`` (a task_get_by_keys_compared row) is not what
    ``spec`` submitted: another type, queue, payload or concurrency key. ``batch`` maps the ids
    this batch inserted to their positions, to say when the holder is an earlier item of it."""
    # A submit that gave no queue asks for the type's declared one, which is what
    # placed the holder too when it gave none: only a queue given is compared. So is a
    # concurrency key: idempotency keys are global, and one reused for another tenant is
    # another request; a submit without one says nothing (a submit by type name, from the
    # CLI or HTTP, cannot compute a function task's declared key).
    compared: tuple[tuple[ComparedField, bool], ...] = (
        ("type", holder["type"] == spec.type),
        ("queue", spec.queue is None or holder["queue"] == spec.queue),
        ("payload", holder["same_payload"]),
        (
            "concurrency_key",
            spec.concurrency_key is None or holder["concurrency_key"] == spec.concurrency_key,
        ),
    )
    differing = tuple(field for field, same in compared if not same)
    if differing:
        assert spec.idempotency_key is not None
        raise IdempotencyConflict(
            spec.idempotency_key,
            holder["id"],
            differing,
            original_type=holder["type"],
            original_queue=holder["queue"],
            index=index,
            original_index=(batch or {}).get(holder["id"]),
            original_concurrency_key=holder["concurrency_key"],
        )


# The id (a uuid's 16 bytes) and the jsonb columns (payload, trace_context; see _jsonb_bytes)
# go as bytea, in the binary form of their own types: COPY streams a field's bytes as they are
# and the server reads them as the column's type. Sent so with the C bytes dumper (the cursor
# of a COPY registers it: psycopg's default for bytea, dbapi20's, and its uuid and jsonb
# dumpers are Python code called per row).
_COPY_TYPES = (
    "bytea", "text", "text", "bytea", "int2", "int4", "float4", "float4", "float4",
    "timestamptz", "timestamptz", "bytea", "bool", "timestamptz",
)  # fmt: skip
# task_copy_keyed's: the concurrency key after them.
_COPY_TYPES_KEYED = (*_COPY_TYPES, "text")


_Policy = tuple[int, float, float, float, bool | None]
_DEFAULT_POLICY: _Policy = (
    DEFAULT_RETRY.max_attempts,
    DEFAULT_RETRY.base,
    DEFAULT_RETRY.factor,
    DEFAULT_RETRY.cap,
    True,  # policy_default: nothing declared it
)


def _declared_policies(declared: Mapping[str, list[Any]]) -> dict[str, _Policy]:
    """Each declared type's policy for a task whose caller gave none (the COPY path's side of
    task_insert's precedence), the default standing in for a field the type left out."""
    out: dict[str, _Policy] = {}
    for type, fields in declared.items():
        m, b, f, c = (
            x if x is not None else y for x, y in zip(fields[:4], _DEFAULT_POLICY[:4], strict=True)
        )
        out[type] = (int(m), float(b), float(f), float(c), None)
    return out


def _resolved_policy(s: TaskSpec, policies: Mapping[str, _Policy]) -> _Policy:
    """The COPY path's retry policy for one task: the caller's, else its type's declaration,
    else the default, field by field; marked policy_default only when none applied."""
    declared = policies.get(s.type, _DEFAULT_POLICY)
    if s.max_attempts is None and s.backoff_base is None:
        return declared  # the common case: one dict lookup per task
    return (
        s.max_attempts if s.max_attempts is not None else declared[0],
        s.backoff_base if s.backoff_base is not None else declared[1],
        s.backoff_factor if s.backoff_factor is not None else declared[2],
        s.backoff_cap if s.backoff_cap is not None else declared[3],
        None,
    )


def _declared_places(declared: Mapping[str, list[Any]]) -> dict[str, tuple[str, Priority]]:
    """Each declared type's queue and priority for a task whose caller gave none (the COPY
    path's side of task_insert's precedence), the default standing in where it declared none."""
    out: dict[str, tuple[str, Priority]] = {}
    for type, fields in declared.items():
        queue, priority = [*fields[4:6], None, None][:2]
        out[type] = (
            queue if queue is not None else DEFAULT_QUEUE,
            Priority(priority) if priority is not None else DEFAULT_PRIORITY,
        )
    return out


_DEFAULT_PLACE = (DEFAULT_QUEUE, DEFAULT_PRIORITY)


def task_insert_many(
    specs: Sequence[TaskSpec],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    key_reuse: KeyReuse = KeyReuse.RETURN,
    notify: bool | None = None,
) -> Op[list[tuple[Task, bool]]]:
    """Insert many tasks: those without an idempotency key by binary COPY (no conflict is
    possible), those with one by a single INSERT ... ON CONFLICT over arrays. The batch shares
    one ``trace_context`` (one submit span). Of two items with one key, the first is created;
    with ``key_reuse`` REFUSE, an item whose key's holder (older, or an earlier item) differs
    raises IdempotencyConflict after the rows this batch inserted are deleted again."""
    if not specs:
        return []
    notify = pooling.resolve_notify(notify)
    # (_in_graph, inline: a call per task saved)
    graph = [
        s
        for s in specs
        if s.depends_on or (s.workflow_id is not None and s.idempotency_key is None)
    ]
    if graph:
        from pgqueue.dependencies import check_acyclic

        # Refused before anything is written: in the caller's transaction, a batch that is
        # refused leaves none of its tasks behind, not even those without parents.
        check_acyclic({s.id: s.depends_on for s in graph})
        specs_all = specs
        specs = [s for s in specs if not _in_graph(s)]
        done = yield from task_insert_many(specs, now, trace_context, key_reuse, notify)
        batch = {s.id for s in specs_all}
        try:
            created = yield from task_insert_dependent(graph, now, trace_context, batch, notify)
        except UnknownParent:
            ours = [t.id for t, was_created in done if was_created]
            if ours:
                yield Query("task_delete_created", {"ids": ours})
            raise
        by_id = {t.id: (t, c) for t, c in done} | {t.id: (t, True) for t in created}
        return [by_id[s.id] for s in specs_all]
    plain = [s for s in specs if s.idempotency_key is None]
    if len(plain) == len(specs):  # the common case: all by COPY, in the caller's order
        tasks, ready = yield from _copy_plain(plain, now, trace_context)
        if ready and notify:
            yield Query("queue_notify", {"queues": sorted(ready)})
        return [(t, True) for t in tasks]
    results: dict[uuid.UUID, tuple[Task, bool]] = {}
    inserted_ids: list[uuid.UUID] = []  # all a refusal has to undo
    if plain:
        tasks, _ = yield from _copy_plain(plain, now, trace_context)
        for t in tasks:
            results[t.id] = (t, True)
        inserted_ids.extend(s.id for s in plain)
    keyed = [s for s in specs if s.idempotency_key is not None]
    if keyed:
        try:
            keyed_results = yield from _insert_keyed(
                keyed, now, trace_context, key_reuse, inserted_ids, specs, notify
            )
        except IdempotencyConflict:
            if inserted_ids:  # all or nothing, on the caller's connection as on autocommit
                yield Query("task_delete_created", {"ids": inserted_ids}, prepare=False)
            raise
        for s, result in zip(keyed, keyed_results, strict=True):
            results[s.id] = result
    out = [results[s.id] for s in specs]
    if not notify:
        return out
    queues = sorted({t.queue for t, created in out if created and t.visible_after <= t.created_at})
    if queues:
        yield Query("queue_notify", {"queues": queues})
    return out


def _copy_plain(
    plain: Sequence[TaskSpec], now: datetime | None, trace_context: Mapping[str, str] | None
) -> Op[tuple[list[Task], set[str]]]:
    """Tasks without idempotency keys by binary COPY (nothing can conflict): the Tasks, in
    order, and the queues of those ready now (to notify). The concurrency key column is sent
    only when some task of the batch has one (task_copy_keyed)."""
    keyed = any(s.concurrency_key is not None for s in plain)
    types = sorted({s.type for s in plain})
    (head,) = yield Query("task_copy_clock", {"now": now, "types": types})
    clock: datetime = head["now"]
    policies = _declared_policies(head["declared"])
    places = _declared_places(head["declared"])
    trace = _jsonb_bytes(_TRACE_ENCODER.encode(dict(trace_context))) if trace_context else None
    rows = []
    tasks = []
    ready: set[str] = set()
    common = vars(_inserted(plain[0], clock, clock, 0, "", DEFAULT_PRIORITY))
    for s in plain:
        visible_after = s.run_at or (
            clock + timedelta(seconds=s.delay_seconds) if s.delay_seconds else clock
        )
        if s.max_attempts is None and s.backoff_base is None:  # (_resolved_policy's test)
            attempts, base, factor, cap, mark = policies.get(s.type, _DEFAULT_POLICY)
        else:
            attempts, base, factor, cap, mark = _resolved_policy(s, policies)
        queue, priority = s.queue, s.priority
        if queue is None or priority is None:
            declared_queue, declared_priority = places.get(s.type, _DEFAULT_PLACE)
            queue = declared_queue if queue is None else queue
            priority = declared_priority if priority is None else priority
        expires_at = s.expires_at
        if s.expires_in is not None:  # from the server's clock, as the INSERTs
            expires_at = clock + timedelta(seconds=s.expires_in)
        row = (
            s.id.int.to_bytes(16), queue, s.type, b"\x01" + s.payload_json.encode(),
            int(priority), attempts, base, factor, cap, visible_after, clock, trace, mark,
            expires_at,
        )  # fmt: skip
        rows.append((*row, s.concurrency_key) if keyed else row)
        # (_inserted, inline, from a copy of the batch's common fields: a third of its cost)
        fields = common.copy()
        fields["id"] = s.id
        fields["queue"] = queue
        fields["type"] = s.type
        fields["payload"] = s.payload
        fields["priority"] = priority
        fields["max_attempts"] = attempts
        fields["visible_after"] = fields["ready_since"] = visible_after
        fields["expires_at"] = expires_at
        if keyed:
            fields["concurrency_key"] = s.concurrency_key
        tasks.append(built(Task, fields))
        if visible_after <= clock:
            ready.add(queue)
    if keyed:
        yield Copy("task_copy_keyed", _COPY_TYPES_KEYED, rows)
    else:
        yield Copy("task_copy", _COPY_TYPES, rows)
    return tasks, ready


def task_copy_columns(
    spec: TaskSpec,
    ids: Sequence[uuid.UUID],
    payloads: Sequence[str],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    notify: bool | None = None,
    concurrency_keys: Sequence[str | None] | None = None,
) -> Op[None]:
    """Tasks alike but for their ids and payloads (JSON text) by binary COPY: ``spec``, a
    prepared task without an idempotency key or parents, gives the rest, resolved once for
    all (the type's declaration as in _copy_plain). ``concurrency_keys``: each task's, in the
    order of ``ids``, instead of ``spec``'s one for all."""
    notify = pooling.resolve_notify(notify)
    (head,) = yield Query("task_copy_clock", {"now": now, "types": [spec.type]})
    clock: datetime = head["now"]
    attempts, base, factor, cap, mark = _resolved_policy(spec, _declared_policies(head["declared"]))
    declared_queue, declared_priority = _declared_places(head["declared"]).get(
        spec.type, _DEFAULT_PLACE
    )
    queue = declared_queue if spec.queue is None else spec.queue
    priority = int(declared_priority if spec.priority is None else spec.priority)
    visible_after = spec.run_at or (
        clock + timedelta(seconds=spec.delay_seconds) if spec.delay_seconds else clock
    )
    expires_at = spec.expires_at
    if spec.expires_in is not None:
        expires_at = clock + timedelta(seconds=spec.expires_in)
    trace = _jsonb_bytes(_TRACE_ENCODER.encode(dict(trace_context))) if trace_context else None
    type = spec.type
    if concurrency_keys is None and spec.concurrency_key is None:
        rows = [
            (
                i.int.to_bytes(16), queue, type, b"\x01" + p.encode(), priority, attempts, base,
                factor, cap, visible_after, clock, trace, mark, expires_at,
            )
            for i, p in zip(ids, payloads, strict=True)
        ]  # fmt: skip
        yield Copy("task_copy", _COPY_TYPES, rows)
    else:
        keys = [spec.concurrency_key] * len(ids) if concurrency_keys is None else concurrency_keys
        keyed_rows = [
            (
                i.int.to_bytes(16), queue, type, b"\x01" + p.encode(), priority, attempts, base,
                factor, cap, visible_after, clock, trace, mark, expires_at, k,
            )
            for i, p, k in zip(ids, payloads, keys, strict=True)
        ]  # fmt: skip
        yield Copy("task_copy_keyed", _COPY_TYPES_KEYED, keyed_rows)
    if notify and visible_after <= clock:
        yield Query("queue_notify", {"queues": [queue]})


def _jsonb_bytes(text: str) -> bytes:
    """A jsonb value in PostgreSQL's binary form: a version byte, 1, then the JSON text."""
    return b"\x01" + text.encode()


_TRACE_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _insert_keyed(
    specs: Sequence[TaskSpec],
    now: datetime | None,
    trace_context: Mapping[str, str] | None,
    key_reuse: KeyReuse,
    inserted_ids: list[uuid.UUID],
    batch: Sequence[TaskSpec],
    notify: bool,
) -> Op[list[tuple[Task, bool]]]:
    """The keyed part of a bulk insert; appends the ids it inserts to ``inserted_ids``.
    ``batch``, the whole batch in the caller's order, is what a refusal's positions refer to."""
    rows = yield Query(
        "task_insert_many",
        {
            **_spec_columns(specs),
            "idempotency_keys": [s.idempotency_key for s in specs],
            "workflow_ids": [s.workflow_id for s in specs],
            "now": now,
            "trace_context": _trace_json(trace_context),
            **_defaults(),
        },
        prepare=False,
    )
    inserted = {row["id"]: row for row in rows}
    inserted_ids.extend(inserted)
    existing: dict[str, Task] = {}
    missing = [s for s in specs if s.id not in inserted]
    if missing:
        holders = yield from _holders(missing, key_reuse)
        if key_reuse is KeyReuse.REFUSE:
            # Checked before anything more is written; in the caller's order, so the first
            # refused item is the one reported.
            positions = {s.id: i for i, s in enumerate(batch)}
            earlier = {i: positions[i] for i in inserted_ids if i in positions}
            for row in holders:
                s = missing[row["n"] - 1]
                _refuse_if_different(s, row, positions[s.id], earlier)
        for row in holders:
            existing[row["idempotency_key"]] = Task.from_row(row)
    out: list[tuple[Task, bool]] = []
    for s in specs:
        if s.id in inserted:
            row = inserted[s.id]
            created = _inserted(
                s,
                row["created_at"],
                row["visible_after"],
                row["max_attempts"],
                row["queue"],
                row["priority"],
                row["expires_at"],
            )
            out.append((created, True))
        elif s.idempotency_key in existing:
            # Either an older task, or an earlier spec of this same batch with the same key.
            out.append((existing[s.idempotency_key], False))
        else:  # the key's holder vanished (rolled back) between statements: insert it alone
            result = yield from task_insert(s, now, trace_context, key_reuse, notify)
            if result[1]:
                inserted_ids.append(result[0].id)
            out.append(result)
    return out
