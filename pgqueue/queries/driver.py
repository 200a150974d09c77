"""How a sans-IO op reaches the database: the steps it yields, and the drivers that run them.

Each operation is written once, as a generator that yields steps and receives their replies
(a "sans-IO" op): :class:`Query` (a named statement: its rows come back), :class:`Copy`
(rows streamed in), and, for a wait loop, :class:`Listen` and :class:`AwaitNotify`.
:func:`drive` runs an op on a sync psycopg connection and :func:`adrive` on an async one, so
sync and async callers share every line of logic and SQL; both understand every kind of
step, and a :class:`Transaction` says which transaction the steps run in.

Also here: the statements, read by name from the room files of ``pgqueue/sql/``; psycopg's
errors turned into pgqueue's; and ``@operation``, which binds a builder of ops to both
drivers at once (``pgqueue.operations``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.string import BytesBinaryDumper

from pgqueue import db, log, pooling
from pgqueue.errors import DatabaseUnavailable, SchemaNotReady

T = TypeVar("T")
U = TypeVar("U")
Row = dict[str, Any]


# --- the steps -------------------------------------------------------------------------------


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

# A wait blocks on notifications, which a plain op cannot ask for: its loop (pgqueue.waiting)
# yields two more kinds of step besides statements, and is driven with Transaction.EACH_STEP
# on the caller's connection (the API's waiter hub drives the same loop its own way).


@dataclasses.dataclass(frozen=True)
class Listen:
    """Start (or, ``listen=False``, stop) listening on ``channel`` for the wait of
    ``task_id``, which the refusal to wait inside a transaction names.

    The driver answers True when notifications will arrive, False when nothing can deliver
    them (a transaction-mode pooler in front and no ``PGQUEUE_LISTEN_URL``): the wait then
    polls, often."""

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


# --- the statements --------------------------------------------------------------------------

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


# --- errors ----------------------------------------------------------------------------------

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


def _translated(exc: BaseException) -> BaseException:
    """What the caller sees for an error of the driver: pgqueue's own error where one says
    more (as ``raise ... from exc``), else the error itself."""
    translated = _translate(exc) if isinstance(exc, psycopg.Error) else None
    if translated is None:
        return exc
    translated.__cause__ = exc
    translated.__suppress_context__ = True
    return translated


# --- the drivers -----------------------------------------------------------------------------


class Transaction(enum.Enum):
    """Which transaction a driver runs an op's steps in."""

    # The caller's: whatever the connection is in (on an autocommit connection, each
    # statement is its own). Never commits: the caller's transaction decides.
    CALLERS = "callers"
    # Ops of several statements that must not half-happen: one transaction of their own
    # around every step on an autocommit connection; inside a transaction, the caller's.
    ATOMIC = "atomic"
    # Each statement in a transaction of its own (its own statement on an autocommit
    # connection), so that notifications reach the connection between them: a wait loop's.
    EACH_STEP = "each_step"


# The members as module globals, for the drivers: ``Transaction.ATOMIC`` is a descriptor
# lookup, some 150 ns, and the drivers ask on every op.
_CALLERS, _ATOMIC, _EACH_STEP = Transaction.CALLERS, Transaction.ATOMIC, Transaction.EACH_STEP


def drive(conn: Any, op: WaitOp[T], transaction: Transaction = _CALLERS) -> T:
    """Run ``op`` on a sync connection (psycopg or SQLAlchemy), in ``transaction``."""
    raw = db.sync_connection(conn)
    # Behind a transaction pooler nothing is prepared (pgqueue.pooling): a step's own
    # prepare=None would let psycopg prepare it on its fifth run on this connection.
    prepare = pooling.prepares(raw)
    if transaction is _ATOMIC and raw.autocommit:
        with raw.transaction():
            return _loop(raw, op, False, prepare)
    return _loop(raw, op, transaction is _EACH_STEP, prepare)


def _loop(raw: psycopg.Connection[Any], op: WaitOp[T], each_step: bool, prepare: bool) -> T:
    sql = statements()
    wakeups: _Wakeups | None = None
    try:
        step = next(op)
        while True:
            try:
                if isinstance(step, Query) and not each_step:
                    # The hot path, every enqueue, claim and completion: _query, inline.
                    with raw.cursor(row_factory=tuple_row if step.tuples else dict_row) as cur:
                        cur.execute(
                            sql[step.name], step.params, prepare=step.prepare if prepare else False
                        )
                        reply: Any = cur.fetchall() if _has_rows(cur) else []
                else:
                    if wakeups is None:
                        wakeups = _Wakeups()
                    reply = _step(raw, sql, step, each_step, prepare, wakeups)
            except BaseException as exc:
                # Thrown into the operation, so that what it holds open (a tracing span)
                # ends with the real error; it propagates from there.
                step = op.throw(_translated(exc))
            else:
                step = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        if wakeups is not None and wakeups.side is not None:
            wakeups.side.close()


class _Wakeups:
    """Where a wait's notifications come from, decided at its Listen step: its own
    connection (``side``: None, ``poll``: False), a LISTEN connection of its own on
    ``PGQUEUE_LISTEN_URL`` (``side``) when a transaction pooler is in front of the caller's,
    or nowhere (``poll``: the wait polls; LISTEN through such a pooler would hear nothing)."""

    __slots__ = ("poll", "side")

    def __init__(self) -> None:
        self.side: Any = None
        self.poll = False

    def elsewhere(self, raw: Any) -> str | None:
        """Decide, for a Listen: the URL to LISTEN on instead of ``raw`` (None: ``raw``
        itself, or nowhere when ``poll`` is set)."""
        if pooling.connection_mode(raw) != "transaction":
            return None
        url = pooling.resolve_listen_url(None, pooler="transaction")
        self.poll = url is None
        return url

    def unavailable(self, url: str, exc: DatabaseUnavailable) -> bool:
        """The LISTEN URL cannot be reached: the wait polls instead (it still ends in
        time), and says so once."""
        self.poll = True
        log.event("wait.listen_unavailable", logging.WARNING, error=str(exc))
        return False


def _step(
    raw: psycopg.Connection[Any],
    sql: Mapping[str, str],
    step: WaitStep,
    each_step: bool,
    prepare: bool,
    wakeups: _Wakeups,
) -> Any:
    """The reply to any step but a statement in the caller's transaction (the loop runs
    those itself): the notifications received, whether listening, or a statement's rows."""
    if isinstance(step, AwaitNotify):
        seconds = max(step.seconds, 0.0)
        if wakeups.poll:
            time.sleep(seconds)
            return []
        source = raw if wakeups.side is None else wakeups.side
        return [
            n.payload
            for n in source.notifies(timeout=seconds, stop_after=1)
            if n.channel == step.channel
        ]
    if isinstance(step, Listen):
        _check_idle(raw, step)
        if step.listen:
            url = wakeups.elsewhere(raw)
            if url is not None:
                try:
                    wakeups.side = db.connect(url, autocommit=True, pooler="none")
                except DatabaseUnavailable as exc:
                    return wakeups.unavailable(url, exc)
                wakeups.side.execute(_listen_sql(step))
                return True
            if wakeups.poll:
                return False
        elif wakeups.side is not None or wakeups.poll:
            if wakeups.side is not None:
                side, wakeups.side = wakeups.side, None
                side.close()
            return False
    if each_step and not raw.autocommit:
        with raw.transaction():
            return _statement(raw, sql, step, prepare)
    return _statement(raw, sql, step, prepare)


def _statement(
    raw: psycopg.Connection[Any],
    sql: Mapping[str, str],
    step: Query | Copy | Listen,
    prepare: bool,
) -> Any:
    if isinstance(step, Query):
        return _query(raw, sql, step, prepare)
    if isinstance(step, Listen):
        raw.execute(_listen_sql(step))
        return True
    with raw.cursor() as cur:
        cur.adapters.register_dumper(bytes, BytesBinaryDumper)  # see submitting._COPY_TYPES
        with cur.copy(sql[step.name]) as copy:
            copy.set_types(step.types)
            for row in step.rows:
                copy.write_row(row)
    return []


def _query(
    raw: psycopg.Connection[Any], sql: Mapping[str, str], step: Query, prepare: bool
) -> list[Row]:
    with raw.cursor(row_factory=tuple_row if step.tuples else dict_row) as cur:
        cur.execute(sql[step.name], step.params, prepare=step.prepare if prepare else False)
        return cur.fetchall() if _has_rows(cur) else []  # type: ignore[return-value]


async def adrive(conn: Any, op: WaitOp[T], transaction: Transaction = _CALLERS) -> T:
    """Run ``op`` on an async connection (psycopg or SQLAlchemy); as :func:`drive`."""
    raw = await db.async_connection(conn)
    prepare = pooling.prepares(raw)
    if transaction is _ATOMIC and raw.autocommit:
        async with raw.transaction():
            return await _aloop(raw, op, False, prepare)
    return await _aloop(raw, op, transaction is _EACH_STEP, prepare)


async def _aloop(
    raw: psycopg.AsyncConnection[Any], op: WaitOp[T], each_step: bool, prepare: bool
) -> T:
    sql = statements()
    wakeups: _Wakeups | None = None
    try:
        step = next(op)
        while True:
            try:
                if isinstance(step, Query) and not each_step:
                    # The hot path: _aquery, inline (a coroutine fewer per statement).
                    async with raw.cursor(
                        row_factory=tuple_row if step.tuples else dict_row
                    ) as cur:
                        await cur.execute(
                            sql[step.name], step.params, prepare=step.prepare if prepare else False
                        )
                        reply: Any = await cur.fetchall() if _has_rows(cur) else []
                else:
                    if wakeups is None:
                        wakeups = _Wakeups()
                    reply = await _astep(raw, sql, step, each_step, prepare, wakeups)
            except BaseException as exc:  # cancellation too: see _loop
                step = op.throw(_translated(exc))
            else:
                step = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        if wakeups is not None and wakeups.side is not None:
            await wakeups.side.close()


async def _astep(
    raw: psycopg.AsyncConnection[Any],
    sql: Mapping[str, str],
    step: WaitStep,
    each_step: bool,
    prepare: bool,
    wakeups: _Wakeups,
) -> Any:
    """As :func:`_step`."""
    if isinstance(step, AwaitNotify):
        seconds = max(step.seconds, 0.0)
        if wakeups.poll:
            await asyncio.sleep(seconds)
            return []
        source = raw if wakeups.side is None else wakeups.side
        notifies = source.notifies(timeout=seconds, stop_after=1)
        return [n.payload async for n in notifies if n.channel == step.channel]
    if isinstance(step, Listen):
        _check_idle(raw, step)
        if step.listen:
            url = wakeups.elsewhere(raw)
            if url is not None:
                try:
                    wakeups.side = await db.aconnect(url, autocommit=True, pooler="none")
                except DatabaseUnavailable as exc:
                    return wakeups.unavailable(url, exc)
                await wakeups.side.execute(_listen_sql(step))
                return True
            if wakeups.poll:
                return False
        elif wakeups.side is not None or wakeups.poll:
            if wakeups.side is not None:
                side, wakeups.side = wakeups.side, None
                await side.close()
            return False
    if each_step and not raw.autocommit:
        async with raw.transaction():
            return await _astatement(raw, sql, step, prepare)
    return await _astatement(raw, sql, step, prepare)


async def _astatement(
    raw: psycopg.AsyncConnection[Any],
    sql: Mapping[str, str],
    step: Query | Copy | Listen,
    prepare: bool,
) -> Any:
    if isinstance(step, Query):
        return await _aquery(raw, sql, step, prepare)
    if isinstance(step, Listen):
        await raw.execute(_listen_sql(step))
        return True
    async with raw.cursor() as cur:
        cur.adapters.register_dumper(bytes, BytesBinaryDumper)  # see submitting._COPY_TYPES
        async with cur.copy(sql[step.name]) as copy:
            copy.set_types(step.types)
            for row in step.rows:
                await copy.write_row(row)
    return []


async def _aquery(
    raw: psycopg.AsyncConnection[Any], sql: Mapping[str, str], step: Query, prepare: bool
) -> list[Row]:
    async with raw.cursor(row_factory=tuple_row if step.tuples else dict_row) as cur:
        await cur.execute(sql[step.name], step.params, prepare=step.prepare if prepare else False)
        return await cur.fetchall() if _has_rows(cur) else []  # type: ignore[return-value]


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned a result set (what ``cur.description is not None``
    says), without building ``cur.description``: a Column object per column, some 5 us each
    on every statement, a cost that grew with each column a RETURNING gained."""
    res = cur.pgresult
    return res is not None and bool(res.nfields or res.status == _TUPLES_OK)


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _listen_sql(step: Listen) -> psycopg.sql.Composed:
    verb = "LISTEN" if step.listen else "UNLISTEN"
    return psycopg.sql.SQL(verb + " {}").format(psycopg.sql.Identifier(step.channel))


def _check_idle(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], step: Listen) -> None:
    # Inside a transaction a wait cannot end: what it enqueued there is invisible to workers,
    # and notifications are only delivered between transactions. A closed connection is not
    # idle either, but it is in no transaction: it gets its own error (db.opened).
    if step.listen and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        from pgqueue.errors import WaitInTransaction

        db.opened(raw)
        raise WaitInTransaction(step.task_id)


def run(conn: Any, op: Op[T], *, atomic: bool = False) -> T:
    """Drive ``op`` on a sync connection (psycopg or SQLAlchemy). Never commits the caller's
    transaction; ``atomic`` ops of several statements get one of their own on an autocommit
    connection, so they cannot half-happen there either."""
    return drive(conn, op, _ATOMIC if atomic else _CALLERS)


async def arun(conn: Any, op: Op[T], *, atomic: bool = False) -> T:
    """Drive ``op`` on an async connection (psycopg or SQLAlchemy); as :func:`run`."""
    return await adrive(conn, op, _ATOMIC if atomic else _CALLERS)


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
    """Bind an op builder to :func:`drive` (the returned function) and :func:`adrive` (its
    ``.aio``), in the caller's transaction. The builder validates its arguments before
    returning the op, so bad input is refused before a connection is touched, in both forms
    alike."""
    return _bind(build, _CALLERS)


def atomic_operation(build: Callable[P, Op[T]]) -> Operation[P, T]:
    """As :func:`operation`, for ops of several statements that must not half-happen."""
    return _bind(build, _ATOMIC)


def waiting_operation(build: Callable[P, WaitOp[T]]) -> Operation[P, T]:
    """As :func:`operation`, for a wait loop: each of its statements in a transaction of its
    own, so that notifications arrive between them."""
    return _bind(build, _EACH_STEP)


def _bind(build: Callable[P, Any], transaction: Transaction) -> Operation[P, T]:
    def call(conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return drive(conn, build(*args, **kwargs), transaction)  # type: ignore[no-any-return]

    async def acall(conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await adrive(conn, build(*args, **kwargs), transaction)

    def call_plain(conn: Any) -> T:
        return drive(conn, build(), transaction)  # type: ignore[call-arg,no-any-return]

    async def acall_plain(conn: Any) -> T:
        return await adrive(conn, build(), transaction)  # type: ignore[call-arg]

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


def dumps(value: Any) -> str:
    """JSON for jsonb columns: compact UTF-8 (so size limits count real bytes), strict about
    NaN and about lone surrogates, both of which PostgreSQL would reject."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a string that is not valid Unicode ({exc.reason})") from None
    return text
