"""The only module that executes SQL.

Each operation is written once, as a generator that yields :class:`Query` objects and receives
their rows (a "sans-IO" operation). :func:`run` drives it on a sync psycopg connection and
:func:`arun` on an async one, so sync and async callers share every line of logic and SQL.
The SQL itself lives in the room files of ``sql/``, one named statement each.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import uuid
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar, cast

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg.types.string import BytesBinaryDumper

from pgqueue import db
from pgqueue.config import DEFAULT_QUEUE
from pgqueue.cron import Schedule
from pgqueue.errors import (
    ComparedField,
    DatabaseUnavailable,
    IdempotencyConflict,
    LeaseLost,
    SchemaNotReady,
    TaskNotFound,
    UnknownParent,
    WorkflowNotFound,
)
from pgqueue.models import (
    ClaimedTask,
    FailOutcome,
    FailResult,
    Failure,
    KeyReuse,
    Lease,
    Limit,
    LimitKind,
    OldestSnapshot,
    Parent,
    Priority,
    QueueBacklog,
    QueueState,
    QueueStats,
    QueueThroughput,
    RetryPolicy,
    SnoozeResult,
    SweepResult,
    Task,
    TaskStatus,
    ThroughputPoint,
    WorkflowInfo,
    WorkflowStatus,
    WorkflowTask,
    built,
)

T = TypeVar("T")
U = TypeVar("U")
Row = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Query:
    """A named statement and its parameters.

    ``prepare=False`` is for statements that join a parameter array to the table: prepared,
    PostgreSQL may switch to a generic plan that cannot see the array's length and, with stale
    statistics, loops over the array once per row (seconds, then minutes, for a few thousand
    leases). Planned each time, the array's length is known and the join stays linear.
    """

    name: str
    params: Mapping[str, Any]
    prepare: bool | None = None
    # Rows as tuples, in the statement's column order, instead of dicts: for the claim, whose
    # hundreds of rows a batch made psycopg's dict_row the worker's largest single cost.
    tuples: bool = False


@dataclasses.dataclass(frozen=True)
class Copy:
    """Rows to stream with the named ``COPY ... FROM STDIN (FORMAT BINARY)`` statement.

    Binary COPY is the fastest way into PostgreSQL: no SQL text to parse per row and no
    array literals to quote (the array INSERT spent more time quoting than inserting).
    """

    name: str
    types: Sequence[str]
    rows: Sequence[Sequence[Any]]


Op = Generator[Query | Copy, list[Row], T]


# The SQL files that hold no named statements: grants.sql is for psql (pgqueue.roles reads it).
_NOT_STATEMENTS = frozenset({"grants.sql"})


@functools.cache
def statements() -> dict[str, str]:
    """Named statements from the room files of pgqueue/sql/ (one per room of queries), read
    once, without their comment lines.

    The comments are for readers of the files; sent to the server they were most of each
    statement's bytes, and psycopg keeps its parsed form of a query (placeholders found,
    converted) only for texts of at most 4 KiB: the claim, with its comments, was re-parsed
    on every call."""
    files = sorted(resources.files("pgqueue.sql").iterdir(), key=lambda f: f.name)
    return parse_statements(
        (f.name, f.read_text(encoding="utf-8"))
        for f in files
        if f.name.endswith(".sql") and f.name not in _NOT_STATEMENTS
    )


def parse_statements(files: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The statements of (file name, text) pairs by name. A name in two places is refused:
    which text ran would depend on the order the files were read in."""
    out: dict[str, str] = {}
    home: dict[str, str] = {}
    for file_name, text in files:
        for chunk in re.split(r"^-- name: ", text, flags=re.M)[1:]:
            name, _, body = chunk.partition("\n")
            name = name.strip()
            if name in out:
                raise RuntimeError(
                    f"the statement {name!r} is named twice: in {home[name]} and {file_name}"
                )
            lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
            out[name] = "\n".join(line for line in lines if line.strip()).strip()
            home[name] = file_name
    return out


_MISSING_SCHEMA = (
    "the pgqueue schema is missing or out of date in this database ({detail}); "
    "run `pgqueue migrate` (or pgqueue.migrate.upgrade()) first"
)


def _translate(exc: psycopg.Error) -> Exception | None:
    if isinstance(
        exc,
        psycopg.errors.UndefinedTable
        | psycopg.errors.UndefinedFunction
        | psycopg.errors.InvalidSchemaName,
    ):
        return SchemaNotReady(_MISSING_SCHEMA.format(detail=db._first_line(exc)))
    if isinstance(exc, psycopg.errors.UndefinedColumn):
        return SchemaNotReady(_MISSING_SCHEMA.format(detail=db._first_line(exc)))
    # No SQLSTATE (the socket broke), 57P (the server terminated the session: an admin, a
    # shutdown, a crash) or 08 (connection exceptions): the connection is gone, not the query.
    if isinstance(exc, psycopg.OperationalError) and (
        exc.sqlstate is None or exc.sqlstate.startswith(("57P", "08"))
    ):
        return DatabaseUnavailable(f"lost the database connection: {db._first_line(exc)}")
    return None


def run(conn: Any, op: Op[T], *, atomic: bool = False) -> T:
    """Drive ``op`` on a sync connection (psycopg or SQLAlchemy). Never commits the caller's
    transaction; ``atomic`` ops of several statements get one of their own on an autocommit
    connection, so they cannot half-happen there either."""
    raw = db.sync_connection(conn)
    if atomic and raw.autocommit:
        with raw.transaction():
            return _drive(raw, op)
    return _drive(raw, op)


def _drive(raw: psycopg.Connection[Any], op: Op[T]) -> T:
    sql = statements()
    try:
        query = next(op)
        while True:
            try:
                rows = _execute(raw, sql, query)
            except BaseException as exc:
                # Thrown into the operation, so that what it holds open (a tracing span)
                # ends with the real error; it propagates from there.
                query = op.throw(_translated(exc))
            else:
                query = op.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _execute(
    raw: psycopg.Connection[Any], sql: Mapping[str, str], query: Query | Copy
) -> list[Row]:
    with raw.cursor(row_factory=_row_factory(query)) as cur:
        if isinstance(query, Copy):
            cur.adapters.register_dumper(bytes, BytesBinaryDumper)  # see _COPY_TYPES
            with cur.copy(sql[query.name]) as copy:
                copy.set_types(query.types)
                for row in query.rows:
                    copy.write_row(row)
            return []
        cur.execute(sql[query.name], query.params, prepare=query.prepare)
        return cur.fetchall() if _has_rows(cur) else []


async def arun(conn: Any, op: Op[T], *, atomic: bool = False) -> T:
    """Drive ``op`` on an async connection (psycopg or SQLAlchemy); as :func:`run`."""
    raw = await db.async_connection(conn)
    if atomic and raw.autocommit:
        async with raw.transaction():
            return await _adrive(raw, op)
    return await _adrive(raw, op)


async def _adrive(raw: psycopg.AsyncConnection[Any], op: Op[T]) -> T:
    sql = statements()
    try:
        query = next(op)
        while True:
            try:
                rows = await _aexecute(raw, sql, query)
            except BaseException as exc:  # cancellation too: see _drive
                query = op.throw(_translated(exc))
            else:
                query = op.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _aexecute(
    raw: psycopg.AsyncConnection[Any], sql: Mapping[str, str], query: Query | Copy
) -> list[Row]:
    async with raw.cursor(row_factory=_row_factory(query)) as cur:
        if isinstance(query, Copy):
            cur.adapters.register_dumper(bytes, BytesBinaryDumper)  # see _COPY_TYPES
            async with cur.copy(sql[query.name]) as copy:
                copy.set_types(query.types)
                for row in query.rows:
                    await copy.write_row(row)
            return []
        await cur.execute(sql[query.name], query.params, prepare=query.prepare)
        return await cur.fetchall() if _has_rows(cur) else []


def _row_factory(query: Query | Copy) -> Any:
    return tuple_row if isinstance(query, Query) and query.tuples else dict_row


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned a result set (what ``cur.description is not None``
    says), without building ``cur.description``: a Column object per column, some 5 us each
    on every statement, a cost that grew with each column a RETURNING gained."""
    res = cur.pgresult
    return res is not None and bool(res.nfields or res.status == _TUPLES_OK)


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _translated(exc: BaseException) -> BaseException:
    """What the caller sees for an error of the driver: pgqueue's own error where one says
    more (as ``raise ... from exc``), else the error itself."""
    translated = _translate(exc) if isinstance(exc, psycopg.Error) else None
    if translated is None:
        return exc
    translated.__cause__ = exc
    translated.__suppress_context__ = True
    return translated


# --- one operation, two drivers --------------------------------------------------------------

P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)


class Operation(Protocol[P, R_co]):
    """An operation bound to the sync driver, with its async twin as ``.aio``.

    Both take the caller's connection first and the builder's arguments after it; the
    builder (validation, then the sans-IO op) is the only place the operation is written.
    """

    def __call__(self, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @property
    def aio(self) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R_co]]: ...


def operation(build: Callable[P, Op[T]]) -> Operation[P, T]:
    """Bind an op builder to :func:`run` (the returned function) and :func:`arun` (its
    ``.aio``). The builder validates its arguments before returning the op, so bad input is
    refused before a connection is touched, in both forms alike."""
    return _bind(build, atomic=False)


def atomic_operation(build: Callable[P, Op[T]]) -> Operation[P, T]:
    """As :func:`operation`, for ops of several statements that must not half-happen."""
    return _bind(build, atomic=True)


def _bind(
    build: Callable[P, Any],
    *,
    atomic: bool,
    sync_driver: Callable[..., Any] | None = None,
    async_driver: Callable[..., Any] | None = None,
) -> Operation[P, T]:
    drive = sync_driver or functools.partial(run, atomic=atomic)
    adrive = async_driver or functools.partial(arun, atomic=atomic)

    def call(conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return drive(conn, build(*args, **kwargs))  # type: ignore[no-any-return]

    async def acall(conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await adrive(conn, build(*args, **kwargs))

    def call_plain(conn: Any) -> T:
        return drive(conn, build())  # type: ignore[call-arg,no-any-return]

    async def acall_plain(conn: Any) -> T:
        return await adrive(conn, build())  # type: ignore[call-arg]

    # An operation of the connection alone takes it by keyword too, as it always has.
    plain = not inspect.signature(build).parameters
    sync: Any = call_plain if plain else call
    aio: Any = acall_plain if plain else acall
    signature = _bound_signature(build, plain)
    for fn, module in ((sync, build.__module__), (aio, "pgqueue.aio")):
        functools.update_wrapper(fn, build)
        fn.__module__ = module
        fn.__signature__ = signature
        del fn.__wrapped__
    sync.aio = aio
    return cast(Operation[P, T], sync)


def _bound_signature(build: Callable[..., Any], plain: bool) -> inspect.Signature:
    """The builder's signature with the connection first and ``Op[T]`` shown as ``T``: what
    help(), IDEs and the docs show for both forms."""
    sig = inspect.signature(build)
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if plain else inspect.Parameter.POSITIONAL_ONLY
    conn = inspect.Parameter("conn", kind, annotation="Any")
    returns = sig.return_annotation
    for prefix in ("Op[", "WaitOp["):
        if isinstance(returns, str) and returns.startswith(prefix) and returns.endswith("]"):
            returns = returns[len(prefix) : -1]
    return sig.replace(parameters=[conn, *sig.parameters.values()], return_annotation=returns)


def mapped(op: Op[T], fn: Callable[[T], U]) -> Op[U]:
    """``op`` with ``fn`` applied to its result."""
    return fn((yield from op))


# --- operations ------------------------------------------------------------------------------


class TaskSpec(NamedTuple):
    """A validated task, ready to insert (built by pgqueue.enqueue.prepare).

    A named tuple rather than a frozen dataclass: just as immutable, and built in a fifth of
    the time, which counts when a bulk enqueue prepares tens of thousands a second.
    """

    id: uuid.UUID
    type: str
    payload: dict[str, Any]  # what the caller gave; payload_json is what gets stored
    payload_json: str
    # None: not given; the insert takes the type's declared priority and queue (task_types),
    # else DEFAULT_PRIORITY and DEFAULT_QUEUE, as it does for the retry policy.
    priority: Priority | None
    queue: str | None
    # The caller's retry policy, None where the caller gave none: the insert then takes the
    # type's declaration (pgqueue.task_types), else DEFAULT_RETRY, field by field.
    max_attempts: int | None
    backoff_base: float | None
    backoff_factor: float | None
    backoff_cap: float | None
    idempotency_key: str | None
    run_at: datetime | None
    delay_seconds: float
    # Issue 15: the expiry, an aware time or seconds from the server's clock at the insert
    # (at most one of the two; neither: never expires).
    expires_at: datetime | None = None
    expires_in: float | None = None
    # Issue 16: the parents (task ids, in the caller's order), whether the task runs even
    # when a parent failed or was cancelled (on_parent_failure="run"), and its workflow.
    depends_on: tuple[uuid.UUID, ...] = ()
    run_anyway: bool = False
    workflow_id: uuid.UUID | None = None


# The retry policy of a task whose caller and type declared none.
DEFAULT_RETRY = RetryPolicy()
# The priority of a task whose caller and type gave none (issue 15); the queue is
# config.DEFAULT_QUEUE.
DEFAULT_PRIORITY = Priority.NORMAL


def _defaults() -> dict[str, Any]:
    return {
        "default_queue": DEFAULT_QUEUE,
        "default_priority": int(DEFAULT_PRIORITY),
        "default_max_attempts": DEFAULT_RETRY.max_attempts,
        "default_backoff_base": DEFAULT_RETRY.base,
        "default_backoff_factor": DEFAULT_RETRY.factor,
        "default_backoff_cap": DEFAULT_RETRY.cap,
    }


def _explicit(spec: TaskSpec) -> bool:
    """Whether the caller gave any part of a retry policy (else the task may be marked
    policy_default, for its type's declaration to apply at its first claim)."""
    return spec.max_attempts is not None or spec.backoff_base is not None


def _inserted(
    spec: TaskSpec,
    created_at: datetime,
    visible_after: datetime,
    max_attempts: int,
    queue: str,
    priority: int,
    expires_at: datetime | None = None,
) -> Task:
    """The Task a fresh insert created, built from what was sent rather than read back: the
    statement returns only what the server decided (times, the resolved max_attempts, queue
    and priority), which keeps enqueue cheap."""
    return built(
        Task,
        {
            "id": spec.id,
            "queue": queue,
            "type": spec.type,
            "payload": spec.payload,
            "priority": spec.priority if spec.priority is not None else _PRIORITIES[priority],
            "status": TaskStatus.QUEUED,
            "attempts": 0,
            "max_attempts": max_attempts,
            "visible_after": visible_after,
            "idempotency_key": spec.idempotency_key,
            "result": None,
            "last_error": None,
            "cancel_requested": False,
            "lease_owner": None,
            "lease_expires_at": None,
            "created_at": created_at,
            "started_at": None,
            "finished_at": None,
            "submitted_priority": None,
            "ready_since": visible_after,
            "snoozes": 0,
            "expires_at": expires_at,
            "workflow_id": None,
            "parents_pending": None,
            "cancelled_by": None,
        },
    )


# Priority(n) by lookup (an enum's call is slow); a Priority is its own key (an IntEnum).
_PRIORITIES: dict[int, Priority] = {int(p): p for p in Priority}


def task_insert(
    spec: TaskSpec,
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    key_reuse: KeyReuse = KeyReuse.RETURN,
) -> Op[tuple[Task, bool]]:
    """Insert one task; ``trace_context``: the submitting span's W3C context (pgqueue.tracing).
    A taken key returns its task, or, with ``key_reuse`` REFUSE and another type, queue or
    payload, raises IdempotencyConflict (no SQL error: the transaction stays usable)."""
    if _in_graph(spec):
        (task,) = yield from task_insert_dependent([spec], now, trace_context)
        return task, True
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
        return (yield from task_insert(spec, now, trace_context, key_reuse))
    if key_reuse is KeyReuse.REFUSE:
        _refuse_if_different(spec, rows[0])
    return Task.from_row(rows[0]), False


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
    ``spec`` submitted: another type, queue or payload. ``batch`` maps the ids this batch
    inserted to their positions, to say when the holder is an earlier item of it."""
    # A submit that gave no queue asks for the type's declared one (issue 15), which is what
    # placed the holder too when it gave none: only a queue given is compared.
    compared: tuple[tuple[ComparedField, bool], ...] = (
        ("type", holder["type"] == spec.type),
        ("queue", spec.queue is None or holder["queue"] == spec.queue),
        ("payload", holder["same_payload"]),
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


def _trace_json(trace_context: Mapping[str, str] | None) -> Jsonb | None:
    return Jsonb(dict(trace_context)) if trace_context else None


def _spec_columns(specs: Sequence[TaskSpec]) -> dict[str, list[Any]]:
    """The array-insert statements' task columns, one array per column (task_insert_many's
    keyed part, task_insert_dependent), built in one place so both insert the same fields."""
    return {
        "ids": [s.id for s in specs],
        "queues": [s.queue for s in specs],
        "types": [s.type for s in specs],
        "payloads": [s.payload_json for s in specs],
        "priorities": [None if s.priority is None else int(s.priority) for s in specs],
        "max_attempts": [s.max_attempts for s in specs],
        "backoff_bases": [s.backoff_base for s in specs],
        "backoff_factors": [s.backoff_factor for s in specs],
        "backoff_caps": [s.backoff_cap for s in specs],
        "run_ats": [s.run_at for s in specs],
        "delays": [s.delay_seconds for s in specs],
        "explicits": [_explicit(s) for s in specs],
        "expires_ats": [s.expires_at for s in specs],
        "expires_ins": [s.expires_in for s in specs],
    }


def task_insert_many(
    specs: Sequence[TaskSpec],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    key_reuse: KeyReuse = KeyReuse.RETURN,
) -> Op[list[tuple[Task, bool]]]:
    """Insert many tasks: those without an idempotency key by binary COPY (no conflict is
    possible), those with one by a single INSERT ... ON CONFLICT over arrays. The batch shares
    one ``trace_context`` (one submit span). Of two items with one key, the first is created;
    with ``key_reuse`` REFUSE, an item whose key's holder (older, or an earlier item) differs
    raises IdempotencyConflict after the rows this batch inserted are deleted again."""
    if not specs:
        return []
    # (_in_graph, inline: a call per task saved)
    graph = [
        s
        for s in specs
        if s.depends_on or (s.workflow_id is not None and s.idempotency_key is None)
    ]
    if graph:
        from pgqueue import dependencies

        # Refused before anything is written: in the caller's transaction, a batch that is
        # refused leaves none of its tasks behind, not even those without parents.
        dependencies.check_acyclic({s.id: s.depends_on for s in graph})
        specs_all = specs
        specs = [s for s in specs if not _in_graph(s)]
        done = yield from task_insert_many(specs, now, trace_context, key_reuse)
        batch = {s.id for s in specs_all}
        try:
            created = yield from task_insert_dependent(graph, now, trace_context, batch)
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
        if ready:
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
                keyed, now, trace_context, key_reuse, inserted_ids, specs
            )
        except IdempotencyConflict:
            if inserted_ids:  # all or nothing, on the caller's connection as on autocommit
                yield Query("task_delete_created", {"ids": inserted_ids}, prepare=False)
            raise
        for s, result in zip(keyed, keyed_results, strict=True):
            results[s.id] = result
    out = [results[s.id] for s in specs]
    queues = sorted({t.queue for t, created in out if created and t.visible_after <= t.created_at})
    if queues:
        yield Query("queue_notify", {"queues": queues})
    return out


def _copy_plain(
    plain: Sequence[TaskSpec], now: datetime | None, trace_context: Mapping[str, str] | None
) -> Op[tuple[list[Task], set[str]]]:
    """Tasks without idempotency keys by binary COPY (nothing can conflict): the Tasks, in
    order, and the queues of those ready now (to notify)."""
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
        if s.expires_in is not None:  # issue 15: from the server's clock, as the INSERTs
            expires_at = clock + timedelta(seconds=s.expires_in)
        rows.append(
            (
                s.id.int.to_bytes(16), queue, s.type, b"\x01" + s.payload_json.encode(),
                int(priority), attempts, base, factor, cap, visible_after, clock, trace, mark,
                expires_at,
            )
        )  # fmt: skip
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
        tasks.append(built(Task, fields))
        if visible_after <= clock:
            ready.add(queue)
    yield Copy("task_copy", _COPY_TYPES, rows)
    return tasks, ready


def task_copy_columns(
    spec: TaskSpec,
    ids: Sequence[uuid.UUID],
    payloads: Sequence[str],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
) -> Op[None]:
    """Tasks alike but for their ids and payloads (JSON text) by binary COPY: ``spec``, a
    prepared task without a key or parents, gives the rest, resolved once for all (the type's
    declaration as in _copy_plain)."""
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
    rows = [
        (
            i.int.to_bytes(16), queue, type, b"\x01" + p.encode(), priority, attempts, base,
            factor, cap, visible_after, clock, trace, mark, expires_at,
        )
        for i, p in zip(ids, payloads, strict=True)
    ]  # fmt: skip
    yield Copy("task_copy", _COPY_TYPES, rows)
    if visible_after <= clock:
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
            result = yield from task_insert(s, now, trace_context, key_reuse)
            if result[1]:
                inserted_ids.append(result[0].id)
            out.append(result)
    return out


def _in_graph(spec: TaskSpec) -> bool:
    """Whether a task goes in by task_insert_dependent: it has parents or a workflow (and no
    idempotency key, which prepare refuses with parents)."""
    return bool(spec.depends_on) or (spec.workflow_id is not None and spec.idempotency_key is None)


def task_insert_dependent(
    specs: Sequence[TaskSpec],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    batch: set[uuid.UUID] | None = None,
) -> Op[list[Task]]:
    """Insert tasks with parents (issue 16) and their edges in one statement; UnknownParent
    (nothing written) for a parent neither in ``batch`` (the ids of the enqueue_many batch)
    nor in the table. A cycle among the batch's tasks is refused before (DependencyCycle)."""
    from pgqueue import dependencies

    inside = batch or set()
    dependencies.check_acyclic({s.id: s.depends_on for s in specs})
    edges = [
        (s.id, p, i, s.run_anyway, p in inside) for s in specs for i, p in enumerate(s.depends_on)
    ]
    rows = yield Query(
        "task_insert_dependent",
        {
            "edge_children": [e[0] for e in edges],
            "edge_parents": [e[1] for e in edges],
            "edge_positions": [e[2] for e in edges],
            "edge_run_anyway": [e[3] for e in edges],
            "edge_in_batch": [e[4] for e in edges],
            **_spec_columns(specs),
            "workflow_ids": [s.workflow_id for s in specs],
            "now": now,
            "trace_context": _trace_json(trace_context),
            **_defaults(),
        },
        prepare=False,
    )
    missing = rows[0]["missing"] if rows else None
    if missing:
        child = next((s.id for s in specs if missing[0] in s.depends_on), None)
        raise UnknownParent(missing[0], task_id=child)
    by_id = {row["id"]: row for row in rows}
    # A task inserted cancelled (a parent outside the batch had failed) cancels its children
    # inserted beside it, which could not see it final in the same statement.
    parents_here = {p for s in specs for p in s.depends_on}
    doomed = [i for i, row in by_id.items() if row["status"] == "cancelled" and i in parents_here]
    if doomed:
        yield Query("task_dependants_settle", {"ids": doomed})
        waiting = [i for i, row in by_id.items() if row["status"] == "waiting"]
        for row in (yield Query("task_outcomes", {"ids": waiting})):
            by_id[row["id"]] = {**by_id[row["id"]], **row}
    out = []
    for s in specs:
        row = by_id[s.id]
        task = _inserted(
            s,
            row["created_at"],
            row["visible_after"],
            row["max_attempts"],
            row["queue"],
            row["priority"],
            row["expires_at"],
        )
        out.append(
            dataclasses.replace(
                task,
                status=TaskStatus(row["status"]),
                workflow_id=row["workflow_id"],
                parents_pending=row["parents_pending"],
                cancelled_by=row["cancelled_by"],
                last_error=row["last_error"],
                finished_at=row["finished_at"],
            )
        )
    return out


def _parent(row: Row) -> Parent:
    return Parent(
        task_id=row["task_id"],
        type=row["type"],
        status=None if row["status"] is None else TaskStatus(row["status"]),
        position=row["position"],
        run_anyway=row["run_anyway"],
        result=row["result"],
        error=row["error"],
    )


def task_parents(task_id: uuid.UUID) -> Op[list[Parent]]:
    """A task's parents in depends_on order (issue 16)."""
    rows = yield Query("task_parents", {"id": task_id})
    return [_parent(r) for r in rows]


def task_children(task_id: uuid.UUID) -> Op[list[Parent]]:
    """A task's dependants; ``position`` is this task's place in each one's depends_on."""
    rows = yield Query("task_children", {"id": task_id})
    return [_parent(r) for r in rows]


def task_parents_many(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, tuple[Parent, ...]]]:
    """The parents of many tasks in one query (the worker, per claimed batch)."""
    rows = yield Query("task_parents_many", {"ids": list(ids)}, prepare=False)
    out: dict[uuid.UUID, list[Parent]] = {}
    for r in rows:
        out.setdefault(r["child_id"], []).append(_parent(r))
    return {k: tuple(v) for k, v in out.items()}


def workflow_get(workflow_id: uuid.UUID) -> Op[WorkflowInfo]:
    """A workflow and its tasks with their edges (WorkflowNotFound if no task has this
    workflow id). Its status, counts and times are derived from the tasks read, by the rule
    of the pgqueue.workflows view."""
    rows = yield Query("workflow_tasks", {"id": workflow_id})
    if not rows:
        raise WorkflowNotFound(workflow_id)
    tasks = tuple(
        WorkflowTask(Task.from_row(r), tuple(r["parent_ids"]), tuple(r["child_ids"])) for r in rows
    )
    counts = {s.value: 0 for s in TaskStatus}
    for t in tasks:
        counts[t.status.value] += 1
    status = WorkflowStatus.of(t.status for t in tasks)
    finished = [t.task.finished_at for t in tasks if t.task.finished_at is not None]
    return WorkflowInfo(
        id=workflow_id,
        status=status,
        counts=counts,
        tasks=tasks,
        created_at=min(t.task.created_at for t in tasks),
        finished_at=max(finished) if status.is_final and finished else None,
    )


def workflow_cancel(workflow_id: uuid.UUID, now: datetime | None = None) -> Op[int]:
    """Cancel the workflow's unfinished tasks; how many it cancelled or flagged."""
    rows = yield Query("workflow_cancel", {"id": workflow_id, "now": now})
    return len(rows)


def task_get(task_id: uuid.UUID) -> Op[Task]:
    rows = yield Query("task_get", {"id": task_id})
    if not rows:
        raise TaskNotFound(task_id)
    return Task.from_row(rows[0])


def task_list(
    *,
    status: TaskStatus | None,
    type: str | None,
    queue: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> Op[list[Task]]:
    rows = yield Query(
        "task_list",
        {
            "status": status.value if status else None,
            "type": type,
            "queue": queue,
            "limit": limit,
            "before_created": before[0] if before else None,
            "before_id": before[1] if before else None,
        },
    )
    return [Task.from_row(r) for r in rows]


# Where a walk of the claim index starts when it starts at the beginning.
FROM_THE_START = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
ClaimStarts = Mapping[tuple[str, int], tuple[datetime, uuid.UUID]]


def task_claim(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    starts: ClaimStarts | None = None,
) -> Op[list[ClaimedTask]]:
    """The ordinary claim: tasks no limit covers (see claim_round for the rest).

    One walk of the claim index per queue and priority, each from the start of its range or,
    for the pairs in ``starts``, after the (created_at, id) given there. Should the lease be
    lost, the attempt counts only once the owner has marked its claims started
    (:func:`lease_starts_mark`)."""
    starts = starts or {}
    params: dict[str, Any] = {"queues": list(queues)}
    for level in Priority:
        after = [starts.get((q, level), FROM_THE_START) for q in queues]
        name = level.name.lower()
        params[f"{name}_after"] = [created for created, _ in after]
        params[f"{name}_after_id"] = [task_id for _, task_id in after]
    rows = yield Query(
        "task_claim",
        {
            **params,
            "limit": limit,
            "owner": owner,
            "lease_seconds": lease_seconds,
            "now": now,
        },
        tuples=True,
    )
    return _claimed(rows)


class LimitsProbe(NamedTuple):
    limited: bool  # some limit exists
    waiting: bool  # a task under one may be waiting in the probed queues


def limits_probe(queues: Sequence[str]) -> Op[LimitsProbe]:
    rows = yield Query("limits_probe", {"queues": list(queues)})
    return LimitsProbe(rows[0]["limited"], rows[0]["waiting"])


def claim_round(
    *,
    queues: Sequence[str],
    limit: int,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
    probed: LimitsProbe | None = None,
    starts: ClaimStarts | None = None,
) -> Op[tuple[list[ClaimedTask], bool]]:
    """Claim up to ``limit`` tasks, those under a limit (pgqueue.limits) included, and say
    whether any limit exists. Run it atomic: the limits lock lasts until commit. ``probed``:
    the caller already ran limits_probe for these queues.

    Limited tasks go first: they are rationed, so they take few of the slots, and claiming
    them after the ordinary ones would starve them whenever ordinary work fills every batch.
    A caller that starts what it claims at once (pgqueue.claim) writes no start mark, so a
    lost lease of its always counts; a worker marks its claims itself, just before its
    handlers (lease_starts_mark).
    """
    params = {"queues": list(queues), "owner": owner, "lease_seconds": lease_seconds, "now": now}
    probe = probed or (yield from limits_probe(queues))
    limited: list[Any] = []
    if probe.waiting:
        lock = yield Query("limits_try_lock", {})
        if lock[0]["locked"]:
            limited = yield Query("task_claim_limited", {**params, "limit": limit}, tuples=True)
    claimed = _claimed(limited)
    if len(limited) < limit:
        claimed += yield from task_claim(
            queues=queues,
            limit=limit - len(limited),
            owner=owner,
            lease_seconds=lease_seconds,
            now=now,
            starts=starts,
        )
    return claimed, probe.limited


_PRIORITIES = {int(p): p for p in Priority}  # Priority(n), without the enum call's cost


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    """Tuples of task_claim's and task_claim_limited's RETURNING, in its column order."""
    priorities = _PRIORITIES
    tasks = [
        ClaimedTask(
            id=id,
            queue=queue,
            type=type,
            payload=payload,
            priority=priorities[priority] if priority in priorities else Priority(priority),
            attempts=attempts,
            max_attempts=max_attempts,
            lease_token=lease_token,
            lease_expires_at=lease_expires_at,
            created_at=created_at,
            trace_context=trace_context,
            has_parents=bool(has_parents),
            workflow_id=workflow_id,
        )
        for (
            id, queue, type, payload, priority, attempts, max_attempts, lease_token,
            lease_expires_at, created_at, trace_context, has_parents, workflow_id,
        ) in rows
    ]  # fmt: skip
    # UPDATE ... RETURNING does not keep the CTE's order; restore it for the caller.
    tasks.sort(key=lambda t: (t.priority, t.created_at))
    return tasks


def lease_starts_mark(owner: str, *, started: bool = True, now: datetime | None = None) -> Op[None]:
    """Mark everything ``owner`` has claimed so far as started (its handlers run next), or,
    with ``started=False`` (a worker's start-up), give the owner a mark before its first
    claim, so that those claims are refundable too."""
    yield Query("lease_starts_mark", {"owner": owner, "started": started, "now": now})


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


def task_types_declare(
    owner: str,
    declarations: Sequence[TypeDeclaration | tuple[str, RetryPolicy | None]],
    now: datetime | None = None,
) -> Op[None]:
    """Record a registry's task types and what each declares (None: nothing), as ``owner``
    (a worker's id) at its start; enqueue reads them (task_insert), and the CLI and the API
    check payloads against the parameters (task_type_parameters)."""
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


def lease_starts_prune(now: datetime | None = None) -> Op[int]:
    """Forget the start marks of owners gone for an hour; how many."""
    rows = yield Query("lease_starts_prune", {"now": now})
    return len(rows)


def task_complete_many(
    results: Sequence[tuple[Lease, str | None]], now: datetime | None = None
) -> Op[set[uuid.UUID]]:
    """Complete many tasks; returns the ids whose lease was still held (the others are lost)."""
    if not results:
        return set()
    rows = yield Query(
        "task_complete",
        {
            "ids": [lease.task_id for lease, _ in results],
            "tokens": [lease.token for lease, _ in results],
            "results": [result for _, result in results],
            "now": now,
        },
        prepare=False,
    )
    return {r["id"] for r in rows}


def task_complete(lease: Lease, result_json: str | None, now: datetime | None = None) -> Op[None]:
    done = yield from task_complete_many([(lease, result_json)], now)
    if lease.task_id not in done:
        raise LeaseLost(lease.task_id)


def task_fail(
    lease: Lease,
    error: str,
    delay: float | None = None,
    now: datetime | None = None,
    policy: RetryPolicy | None = None,
    *,
    dead: bool = False,
) -> Op[FailResult]:
    """A failed attempt: retried after backoff, or dead-lettered when attempts are spent
    (``dead``: at once, attempts left or not)."""
    rows = yield Query(
        "task_fail",
        {
            "id": lease.task_id,
            "token": lease.token,
            "error": error,
            "dead": dead,
            "delay": delay,
            "now": now,
            "max_attempts": policy.max_attempts if policy else None,
            "backoff_base": policy.base if policy else None,
            "backoff_factor": policy.factor if policy else None,
            "backoff_cap": policy.cap if policy else None,
        },
    )
    if not rows:
        raise LeaseLost(lease.task_id)
    row = rows[0]
    outcome = {
        TaskStatus.FAILED: FailOutcome.DEAD,
        TaskStatus.CANCELLED: FailOutcome.CANCELLED,
    }.get(TaskStatus(row["status"]), FailOutcome.RETRYING)
    return FailResult(
        task_id=row["id"],
        outcome=outcome,
        attempts=row["attempts"],
        retry_at=row["visible_after"] if outcome is FailOutcome.RETRYING else None,
    )


def task_cancel_leased(lease: Lease, reason: str, now: datetime | None = None) -> Op[None]:
    rows = yield Query(
        "task_cancel_leased",
        {"id": lease.task_id, "token": lease.token, "reason": reason, "now": now},
    )
    if not rows:
        raise LeaseLost(lease.task_id)


# --- issue 15: snooze and expiry ------------------------------------------------------------


def task_snooze(
    lease: Lease,
    after: float,
    *,
    max_snoozes: int,
    reason: str = "snoozed",
    now: datetime | None = None,
) -> Op[SnoozeResult]:
    """Put a running task back to queued for ``after`` seconds without spending its attempt;
    at ``max_snoozes`` snoozes already, a failed attempt instead, whose error names the bound.
    Raises LeaseLost if the lease is no longer held."""
    rows = yield Query(
        "task_snooze",
        {
            "id": lease.task_id,
            "token": lease.token,
            "after": after,
            "max_snoozes": max_snoozes,
            "now": now,
        },
    )
    if rows:
        row = rows[0]
        cancelled = row["status"] == TaskStatus.CANCELLED
        return SnoozeResult(
            task_id=row["id"],
            snoozed=True,
            snoozes=row["snoozes"],
            run_at=None if cancelled else row["visible_after"],
            cancelled=cancelled,
        )
    error = (
        f"Snooze: snoozed {max_snoozes} times already, the bound (max_snoozes={max_snoozes}, "
        f"PGQUEUE_MAX_SNOOZES); this snooze ({reason}) counts as a failed attempt"
    )
    failed = yield from task_fail(lease, error, delay=after, now=now)  # raises LeaseLost
    return SnoozeResult(lease.task_id, False, max_snoozes, failed.retry_at, failed=failed)


def task_expire(limit: int, now: datetime | None = None) -> Op[list[Row]]:
    """Cancel (reason 'expired') up to ``limit`` waiting tasks whose expiry has passed with
    no attempt spent; their id, type, queue, attempts and expiry."""
    return (yield Query("task_expire", {"limit": limit, "now": now}))


@dataclasses.dataclass(frozen=True)
class HeartbeatResult:
    """Leases still held (with their new expiry) and tasks whose cancellation was requested."""

    held: dict[uuid.UUID, datetime]
    cancel_requested: set[uuid.UUID]


def task_heartbeat(
    leases: Sequence[Lease], lease_seconds: float, now: datetime | None = None
) -> Op[HeartbeatResult]:
    if not leases:
        return HeartbeatResult({}, set())
    rows = yield Query(
        "task_heartbeat",
        {
            "ids": [lease.task_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "lease_seconds": lease_seconds,
            "now": now,
        },
        prepare=False,
    )
    return HeartbeatResult(
        held={r["id"]: r["lease_expires_at"] for r in rows},
        cancel_requested={r["id"] for r in rows if r["cancel_requested"]},
    )


def task_release(leases: Sequence[Lease], now: datetime | None = None) -> Op[set[uuid.UUID]]:
    if not leases:
        return set()
    rows = yield Query(
        "task_release",
        {
            "ids": [lease.task_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "now": now,
        },
        prepare=False,
    )
    queues = sorted({r["queue"] for r in rows if r["status"] == TaskStatus.QUEUED})
    if queues:
        yield Query("queue_notify", {"queues": queues})
    return {r["id"] for r in rows}


def task_sweep_expired(limit: int, now: datetime | None = None) -> Op[SweepResult]:
    rows = yield Query("task_sweep_expired", {"limit": limit, "now": now})
    return SweepResult(
        requeued=[r["id"] for r in rows if r["status"] == TaskStatus.QUEUED],
        dead=[r["id"] for r in rows if r["status"] == TaskStatus.FAILED],
        cancelled=[r["id"] for r in rows if r["status"] == TaskStatus.CANCELLED],
        details={r["id"]: (r["type"], r["attempts"]) for r in rows},
    )


def task_cancel(task_id: uuid.UUID, now: datetime | None = None) -> Op[Task]:
    rows = yield Query("task_cancel", {"id": task_id, "now": now})
    if rows:
        return Task.from_row(rows[0])
    task = yield from task_get(task_id)  # raises TaskNotFound
    from pgqueue.errors import InvalidTaskState

    raise InvalidTaskState(task_id, task.status.value, "cannot cancel a finished task")


def _dead_letter_filter(
    ids: Sequence[uuid.UUID] | None, type: str | None, queue: str | None, limit: int
) -> dict[str, Any]:
    return {
        "ids": list(ids) if ids is not None else None,
        "type": type,
        "queue": queue,
        "limit": limit,
    }


def task_replay(
    ids: Sequence[uuid.UUID] | None,
    type: str | None,
    queue: str | None,
    limit: int,
    now: datetime | None = None,
) -> Op[list[uuid.UUID]]:
    rows = yield Query("task_replay", {**_dead_letter_filter(ids, type, queue, limit), "now": now})
    queues = sorted({r["queue"] for r in rows})
    if queues:
        yield Query("queue_notify_released", {"queues": queues})
    return [r["id"] for r in rows]


def task_dead_count(type: str | None, queue: str | None) -> Op[int]:
    rows = yield Query("task_dead_count", {"type": type, "queue": queue})
    return int(rows[0]["count"])


def task_discard(
    ids: Sequence[uuid.UUID] | None, type: str | None, queue: str | None, limit: int
) -> Op[list[uuid.UUID]]:
    rows = yield Query("task_discard", _dead_letter_filter(ids, type, queue, limit))
    return [r["id"] for r in rows]


def task_promote(
    after_seconds: float, limit: int, now: datetime | None = None
) -> Op[list[tuple[uuid.UUID, str, str, Priority]]]:
    """Move tasks ready for ``after_seconds`` up one priority: (id, queue, type, new priority)."""
    rows = yield Query("task_promote", {"after_seconds": after_seconds, "limit": limit, "now": now})
    return [(r["id"], r["queue"], r["type"], Priority(r["priority"])) for r in rows]


def task_prune(
    statuses: Sequence[TaskStatus],
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> Op[int]:
    """Delete up to ``limit`` finished tasks of these statuses; how many went."""
    pruned = 0
    for status in statuses:
        rows = yield Query(
            "task_prune",
            {
                "status": status.value,
                "older_than_seconds": older_than_seconds,
                "limit": limit - pruned,
                "now": now,
            },
        )
        pruned += len(rows)
        if pruned >= limit:
            break
    return pruned


def queue_backlog(queues: Sequence[str] | None = None) -> Op[list[QueueBacklog]]:
    rows = yield Query("queue_backlog", {"queues": list(queues) if queues is not None else None})
    return [QueueBacklog(**r) for r in rows]


def oldest_snapshot() -> Op[OldestSnapshot | None]:
    rows = yield Query("oldest_snapshot", {})
    return OldestSnapshot(**rows[0]) if rows else None


def queue_overview() -> Op[list[QueueStats]]:
    rows = yield Query("queue_overview", {})
    return [QueueStats(**r) for r in rows]


def queue_depth() -> Op[list[QueueStats]]:
    rows = yield Query("queue_depth", {})
    return [QueueStats(**r) for r in rows]


def schedule_run(
    schedule: Schedule, make_spec: Callable[[datetime], TaskSpec], now: datetime
) -> Op[list[tuple[Task, bool]]]:
    """Enqueue a schedule's due ticks exactly once, however many schedulers run: the row lock
    taken by the upsert queues them up, and each enqueues only the ticks after the last one
    recorded. Run it in a transaction (atomic), so the ticks and the fence commit together."""
    rows = yield Query(
        "schedule_lock",
        {
            "name": schedule.name,
            "cron": schedule.cron.text,
            "timezone": schedule.timezone,
            "type": schedule.type,
            "queue": schedule.queue,
        },
    )
    last_tick = rows[0]["last_tick"]
    ticks = schedule.due(last_tick, now)
    enqueued = []
    for tick in ticks:
        enqueued.append((yield from task_insert(make_spec(tick))))
    fence = ticks[-1] if ticks else (last_tick or now)
    yield Query(
        "schedule_advance",
        {
            "name": schedule.name,
            "last_tick": fence,
            "next_tick": schedule.next_after(max(fence, now)),
        },
    )
    return enqueued


def schedule_list() -> Op[list[dict[str, Any]]]:
    rows = yield Query("schedule_list", {})
    return [dict(r) for r in rows]


def queue_pause(name: str, now: datetime | None = None) -> Op[QueueState]:
    rows = yield Query("queue_pause", {"name": name, "now": now})
    return QueueState(**rows[0])


def queue_resume(name: str, now: datetime | None = None) -> Op[QueueState]:
    rows = yield Query("queue_resume", {"name": name, "now": now})
    if not rows:  # no settings row: it was not paused, and stays without a row
        return QueueState(name=name, paused=False, paused_at=None, updated_at=None)
    row = dict(rows[0])
    row.pop("notified")
    return QueueState(**row)


def queue_remove(name: str) -> Op[bool]:
    rows = yield Query("queue_remove", {"name": name})
    return bool(rows)


def queue_known(name: str) -> Op[bool]:
    # Planned each time: its generic plan reads the finished tasks by a sequential scan.
    rows = yield Query("queue_known", {"name": name}, prepare=False)
    return bool(rows[0]["known"])


def queue_list() -> Op[list[QueueState]]:
    rows = yield Query("queue_list", {})
    return [QueueState(**r) for r in rows]


def queue_set_retention(
    name: str,
    completed_retention: float | None,
    dead_retention: float | None,
    now: datetime | None = None,
) -> Op[QueueState]:
    rows = yield Query(
        "queue_set_retention",
        {
            "name": name,
            "completed_retention": completed_retention,
            "dead_retention": dead_retention,
            "now": now,
        },
    )
    return QueueState(**rows[0])


def _limit(row: Row) -> Limit:
    row = dict(row)
    row.pop("notified", None)
    return Limit(**{**row, "kind": LimitKind(row["kind"])})


def limit_set(
    kind: LimitKind,
    name: str,
    max_running: int | None,
    rate_limit: int | None,
    rate_period: float | None,
    now: datetime | None = None,
) -> Op[Limit]:
    rows = yield Query(
        "limit_set",
        {
            "kind": kind.value,
            "name": name,
            "max_running": max_running,
            "rate_limit": rate_limit,
            "rate_period": rate_period,
            "now": now,
        },
    )
    return _limit(rows[0])


def limit_clear(kind: LimitKind, name: str) -> Op[bool]:
    """Remove a limit; whether there was one."""
    rows = yield Query("limit_clear", {"kind": kind.value, "name": name})
    return bool(rows)


def limit_list(now: datetime | None = None) -> Op[list[Limit]]:
    rows = yield Query("limit_list", {"now": now})
    return [_limit(r) for r in rows]


def queue_throughput(
    window_seconds: float, now: datetime | None = None
) -> Op[list[QueueThroughput]]:
    rows = yield Query("queue_throughput", {"window_seconds": window_seconds, "now": now})
    return [QueueThroughput(**r) for r in rows]


def dumps(value: Any) -> str:
    """JSON for jsonb columns: compact UTF-8 (so size limits count real bytes), strict about
    NaN and about lone surrogates, both of which PostgreSQL would reject."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a string that is not valid Unicode ({exc.reason})") from None
    return text


def analyze_if_stale(min_changes: int = 1000, fraction: float = 0.2) -> Op[int]:
    """ANALYZE pgqueue.tasks when at least ``min_changes`` rows and ``fraction`` of the rows the
    planner believes in changed since the last time; the changes counted, or 0 if none ran."""
    rows = yield Query("stats_staleness", {})
    if not rows:
        return 0
    changed = int(rows[0]["changed"] or 0)
    if changed < max(min_changes, fraction * float(rows[0]["estimated_rows"])):
        return 0
    yield Query("tasks_analyze", {})
    return changed


def maintenance_try_lock() -> Op[bool]:
    rows = yield Query("maintenance_try_lock", {})
    return bool(rows[0]["locked"])


def schema_version() -> Op[str | None]:
    rows = yield Query("schema_version", {})
    return str(rows[0]["version_num"]) if rows else None


def schema_revision() -> Op[str | None]:
    """The revision pgqueue's migrations recorded, or None when they never ran here (no
    version table: looked for first, so that asking never fails the caller's transaction)."""
    rows = yield Query("schema_version_table", {})
    if rows[0]["version_table"] is None:
        return None
    return (yield from schema_version())


# --- the dashboard's reads -------------------------------------------------------------------


def throughput_series(
    minutes: int, queue: str | None = None, now: datetime | None = None
) -> Op[list[ThroughputPoint]]:
    """Per minute, oldest first, every minute present: completed and dead-lettered tasks of
    ``queue`` (or of every queue) in the last ``minutes`` minutes, the current one included."""
    rows = yield Query("throughput_series", {"minutes": minutes, "queue": queue, "now": now})
    return [ThroughputPoint(r["minute"], int(r["completed"]), int(r["failed"])) for r in rows]


def task_failures(limit: int) -> Op[list[Failure]]:
    """Up to ``limit`` tasks waiting for a retry (latest next attempt first), then up to
    ``limit`` dead letters (newest first)."""
    rows = yield Query("task_failures", {"limit": limit})
    return [
        Failure(
            task_id=r["id"],
            dead=r["kind"] == "dead",
            type=r["type"],
            queue=r["queue"],
            priority=Priority(r["priority"]),
            attempts=r["attempts"],
            max_attempts=r["max_attempts"],
            last_error=r["last_error"],
            started_at=r["started_at"],
            retry_at=None if r["kind"] == "dead" else r["visible_after"],
            finished_at=r["finished_at"] if r["kind"] == "dead" else None,
        )
        for r in rows
    ]


# --- waiting for a result (issue 15) ---------------------------------------------------------
#
# A wait blocks on notifications, which a plain op cannot ask for: its loop (pgqueue.waiting)
# yields two more kinds of step besides queries, and run_waiting / arun_waiting drive it on
# the caller's connection (the API's waiter hub drives the same loop on its own way).

DONE_CHANNEL = "pgqueue_done"
# Tasks became ready that are older than where a worker's claims got to (a released dependant,
# a replayed dead letter): the payload is the queue; see worker/claim_starts.py.
RELEASED_CHANNEL = "pgqueue_released"


@dataclasses.dataclass(frozen=True)
class Listen:
    """Start (or, ``listen=False``, stop) listening on ``channel`` for the wait of
    ``task_id``, which the refusal to wait inside a transaction names."""

    channel: str
    task_id: uuid.UUID
    listen: bool = True


@dataclasses.dataclass(frozen=True)
class AwaitNotify:
    """Sleep until a notification on ``channel`` arrives or ``seconds`` pass. The driver
    sends back the payloads received: empty when the time ran out."""

    channel: str
    seconds: float


WaitStep = Query | Copy | Listen | AwaitNotify
WaitOp = Generator[WaitStep, Any, T]


def waiting_operation(build: Callable[P, WaitOp[T]]) -> Operation[P, T]:
    """As :func:`operation`, for a wait loop: bound to :func:`run_waiting` and
    :func:`arun_waiting` instead."""
    return _bind(build, atomic=False, sync_driver=run_waiting, async_driver=arun_waiting)


def _listen_sql(step: Listen) -> psycopg.sql.Composed:
    verb = "LISTEN" if step.listen else "UNLISTEN"
    return psycopg.sql.SQL(verb + " {}").format(psycopg.sql.Identifier(step.channel))


def _check_idle(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], step: Listen) -> None:
    # Inside a transaction a wait cannot end: what it enqueued there is invisible to workers,
    # and notifications are only delivered between transactions.
    if step.listen and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        from pgqueue.errors import WaitInTransaction

        raise WaitInTransaction(step.task_id)


def run_waiting(conn: Any, op: WaitOp[T]) -> T:
    """Drive a wait loop on a sync connection that is not inside a transaction. Each query
    runs in a transaction of its own (its own statement on an autocommit connection), so
    notifications reach the connection between them; the caller's transaction is not
    touched, as there is none."""
    raw = db.sync_connection(conn)
    sql = statements()
    try:
        step = next(op)
        while True:
            try:
                reply = _wait_step(raw, sql, step)
            except BaseException as exc:  # see _drive
                step = op.throw(_translated(exc))
            else:
                step = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _wait_step(raw: psycopg.Connection[Any], sql: Mapping[str, str], step: WaitStep) -> Any:
    if isinstance(step, AwaitNotify):
        return [
            n.payload
            for n in raw.notifies(timeout=max(step.seconds, 0.0), stop_after=1)
            if n.channel == step.channel
        ]
    if isinstance(step, Listen):
        _check_idle(raw, step)
    if raw.autocommit:
        return _wait_query(raw, sql, step)
    with raw.transaction():
        return _wait_query(raw, sql, step)


def _wait_query(
    raw: psycopg.Connection[Any], sql: Mapping[str, str], step: Query | Copy | Listen
) -> list[Row]:
    if isinstance(step, Listen):
        raw.execute(_listen_sql(step))
        return []
    return _execute(raw, sql, step)


async def arun_waiting(conn: Any, op: WaitOp[T]) -> T:
    """Drive a wait loop on an async connection; as :func:`run_waiting`."""
    raw = await db.async_connection(conn)
    sql = statements()
    try:
        step = next(op)
        while True:
            try:
                reply = await _await_step(raw, sql, step)
            except BaseException as exc:  # cancellation too: see _drive
                step = op.throw(_translated(exc))
            else:
                step = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _await_step(
    raw: psycopg.AsyncConnection[Any], sql: Mapping[str, str], step: WaitStep
) -> Any:
    if isinstance(step, AwaitNotify):
        notifies = raw.notifies(timeout=max(step.seconds, 0.0), stop_after=1)
        return [n.payload async for n in notifies if n.channel == step.channel]
    if isinstance(step, Listen):
        _check_idle(raw, step)
    if raw.autocommit:
        return await _await_query(raw, sql, step)
    async with raw.transaction():
        return await _await_query(raw, sql, step)


async def _await_query(
    raw: psycopg.AsyncConnection[Any], sql: Mapping[str, str], step: Query | Copy | Listen
) -> list[Row]:
    if isinstance(step, Listen):
        await raw.execute(_listen_sql(step))
        return []
    return await _aexecute(raw, sql, step)


def task_waiter_add(task_id: uuid.UUID, waiter: uuid.UUID, seconds: float) -> Op[Task]:
    """Register ``waiter`` for ``seconds`` and read the task (TaskNotFound if there is none)."""
    rows = yield Query("task_waiter_add", {"id": task_id, "waiter": waiter, "seconds": seconds})
    if not rows:
        raise TaskNotFound(task_id)
    return Task.from_row(rows[0])


def task_waiter_remove(task_id: uuid.UUID, waiter: uuid.UUID) -> Op[None]:
    yield Query("task_waiter_remove", {"id": task_id, "waiter": waiter})


# The API's waiter hub runs many waits' reads as one statement each (api/waiters.py): the
# rows of each task, by id (a task missing has none).


def task_waiter_add_many(
    waits: Sequence[tuple[uuid.UUID, uuid.UUID, float]],
) -> Op[dict[uuid.UUID, list[Row]]]:
    """Register (task id, waiter, seconds) each and read their tasks."""
    ids, waiters, seconds = (list(column) for column in zip(*waits, strict=True))
    rows = yield Query("task_waiter_add_many", {"ids": ids, "waiters": waiters, "seconds": seconds})
    return {row["id"]: [row] for row in rows}


def task_get_many(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, list[Row]]]:
    rows = yield Query("task_get_many", {"ids": list(ids)})
    return {row["id"]: [row] for row in rows}


def task_waiter_remove_many(waits: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Op[None]:
    ids, waiters = (list(column) for column in zip(*waits, strict=True))
    yield Query("task_waiter_remove_many", {"ids": ids, "waiters": waiters})
