"""Where connections come from: the caller's, or one pgqueue opens from a URL.

pgqueue never commits a connection it was given. A psycopg 3 connection is used as it is; a
SQLAlchemy ``Session``/``Connection`` (sync or async, psycopg dialect; a ``scoped_session``
stands for its current Session) is unwrapped to the psycopg connection underneath, so the
task is written in the caller's transaction.

A connection pgqueue opens (:func:`connect`, :func:`aconnect`) for a transaction-mode pooler
(``pooler="transaction"``, or ``PGQUEUE_POOLER``) never prepares a statement
(``prepare_threshold=None``; see :mod:`pgqueue.pooling`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg

from pgqueue import pooling
from pgqueue.config import redact, validate_database_url
from pgqueue.errors import DatabaseUnavailable, UnsupportedConnection

_SUPPORTED = (
    "a psycopg 3 Connection, or a SQLAlchemy Session/Connection using the "
    "'postgresql+psycopg' dialect"
)


def _driver_connection(dbapi_conn: Any, what: str) -> Any:
    driver = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    if not isinstance(driver, psycopg.Connection | psycopg.AsyncConnection):
        raise UnsupportedConnection(
            f"{what} uses {type(driver).__module__}.{type(driver).__name__}; pgqueue needs "
            f"{_SUPPORTED}"
        )
    return driver


C = TypeVar("C", bound=psycopg.Connection[Any] | psycopg.AsyncConnection[Any])


def opened(conn: C) -> C:
    """``conn`` if it is open. A closed one was closed by its owner (the caller's mistake,
    said as such) or lost (``broken``: the server or the network ended it)."""
    if conn.closed:
        if conn.broken:
            raise DatabaseUnavailable(
                "lost the database connection (the server or the network closed it); open a new one"
            )
        raise UnsupportedConnection(
            "this connection is closed: it was closed (conn.close(), or the end of its "
            "`with` block) before it was given to pgqueue; pass an open connection"
        )
    return conn


def sync_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``conn`` (psycopg or SQLAlchemy, sync), open (a closed
    one is UnsupportedConnection)."""
    if isinstance(conn, psycopg.Connection):
        return opened(conn)
    if isinstance(conn, psycopg.AsyncConnection):
        raise UnsupportedConnection("an async connection needs pgqueue.aio, not pgqueue")
    try:
        from sqlalchemy.engine import Connection as SAConnection
        from sqlalchemy.orm import Session, scoped_session
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        SAConnection = Session = scoped_session = ()  # type: ignore[assignment,misc]
    if isinstance(conn, scoped_session):  # Flask-SQLAlchemy's db.session, for one
        conn = conn()  # the current scope's Session
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, SAConnection):
        # Begin through SQLAlchemy, as its own execute() would: otherwise it believes no
        # transaction is open and its commit()/rollback() would not reach our statements.
        if not conn.in_transaction():
            conn.begin()
        driver = _driver_connection(conn.connection, "this SQLAlchemy connection")
        if not isinstance(driver, psycopg.Connection):
            raise UnsupportedConnection("an async driver connection needs pgqueue.aio")
        return opened(driver)
    raise UnsupportedConnection(
        f"cannot use {type(conn).__name__} as a connection; pass {_SUPPORTED}"
    )


async def async_connection(conn: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection behind ``conn`` (psycopg or SQLAlchemy, async), open."""
    if isinstance(conn, psycopg.AsyncConnection):
        return opened(conn)
    if isinstance(conn, psycopg.Connection):
        raise UnsupportedConnection("a sync connection needs pgqueue, not pgqueue.aio")
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

    if isinstance(conn, async_scoped_session):
        conn = conn()  # the current scope's AsyncSession
    if isinstance(conn, AsyncSession):
        conn = await conn.connection()
    if isinstance(conn, SAAsyncConnection):
        if not conn.in_transaction():
            await conn.begin()
        raw = await conn.get_raw_connection()
        driver = _driver_connection(raw, "this SQLAlchemy connection")
        if not isinstance(driver, psycopg.AsyncConnection):
            raise UnsupportedConnection("a sync driver connection needs pgqueue, not pgqueue.aio")
        return opened(driver)
    raise UnsupportedConnection(
        f"cannot use {type(conn).__name__} as a connection; pass {_SUPPORTED}"
    )


def connect(
    url: str, *, autocommit: bool = False, pooler: str | None = None, **kwargs: Any
) -> psycopg.Connection[Any]:
    """Open a connection, turning connection failures into DatabaseUnavailable (no password).

    ``pooler``: the pooler in front of ``url`` (``"transaction"``: never prepare, and waits
    on this connection do not LISTEN through it); None: ``PGQUEUE_POOLER``'s."""
    url = validate_database_url(url)
    mode = pooling.resolve_pooler(pooler)
    try:
        conn = psycopg.connect(
            url,
            autocommit=autocommit,
            connect_timeout=10,
            **{**pooling.connection_kwargs(mode), **kwargs},
        )
    except psycopg.OperationalError as exc:
        raise _unavailable(url, exc) from None
    pooling.remember(conn, mode)
    return conn


async def aconnect(
    url: str, *, autocommit: bool = False, pooler: str | None = None, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """As :func:`connect`, async."""
    url = validate_database_url(url)
    mode = pooling.resolve_pooler(pooler)
    try:
        conn = await psycopg.AsyncConnection.connect(
            url,
            autocommit=autocommit,
            connect_timeout=10,
            **{**pooling.connection_kwargs(mode), **kwargs},
        )
    except psycopg.OperationalError as exc:
        raise _unavailable(url, exc) from None
    pooling.remember(conn, mode)
    return conn


# What the server answers when connecting cannot work however long one waits (libpq gives no
# SQLSTATE for a refused connection, only the server's message).
_PERMANENT = (
    "password authentication failed",
    "does not exist",  # the database, the role, or a certificate file
    "no pg_hba.conf entry",
    "certificate verify failed",
    "server does not support SSL",
)


def _unavailable(url: str, exc: psycopg.OperationalError) -> DatabaseUnavailable:
    line = _first_line(exc)
    return DatabaseUnavailable(
        f"cannot connect to {redact(url)}: {line}",
        transient=not any(marker in str(exc) for marker in _PERMANENT),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
