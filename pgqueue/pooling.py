"""Transaction-mode connection poolers (PgBouncer, Supavisor, RDS Proxy), and the wake-ups that
work through them.

A transaction-mode pooler hands each transaction to whichever server connection is free, so
nothing that outlives a transaction may be left on a connection: no server-side prepared
statement (the next statement may reach a server that never saw it, or one that already has
it), no LISTEN (its notifications go to a server connection nobody reads), no session
advisory lock, no session-level SET, no temporary table. pgqueue's statements hold only
transaction-scoped state (``pg_try_advisory_xact_lock``, ``set_config(..., true)``); what
this module decides is the rest:

- **the pooler mode** (``pooler="transaction"``, ``--pooler transaction``,
  ``PGQUEUE_POOLER=transaction``): connections pgqueue opens never prepare a statement, and
  the statements it sends on a caller's connection are never prepared either;
- **where LISTEN goes** (``PGQUEUE_LISTEN_URL``): a direct URL that bypasses the pooler, used
  for LISTEN only. Without one, LISTEN is used only when there is no pooler; behind one,
  workers and waits poll instead;
- **whether an enqueue sends NOTIFY** (``PGQUEUE_NOTIFY=off``): a NOTIFY takes a lock held
  across the whole cluster while its transaction commits, so many concurrent producers
  serialise on it. Poll-only (off) trades a worker's pickup latency for producers' commits.

An argument wins over the environment, as for the database URL. A connection pgqueue opens
for a pooler mode (``db.connect(url, pooler=...)``, a ``Client``'s pool) is remembered with
it (:func:`remember`), so that what runs on it later (a wait) knows, whatever the
environment says; any other connection has the environment's mode.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Literal, get_args

from pgqueue.errors import ConfigurationError

ENV_POOLER = "PGQUEUE_POOLER"
ENV_LISTEN_URL = "PGQUEUE_LISTEN_URL"
ENV_NOTIFY = "PGQUEUE_NOTIFY"

Pooler = Literal["none", "session", "transaction"]
POOLERS: tuple[str, ...] = get_args(Pooler)

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def resolve_pooler(value: str | None = None, *, name: str = "pooler") -> Pooler:
    """The pooler mode: ``value``, else ``PGQUEUE_POOLER``, else ``none`` (direct).

    ``session`` (a pooler in session mode) behaves as a direct connection does: a session
    keeps its server connection, so nothing needs to change. ``name`` is what an error
    calls ``value`` (the CLI's ``--pooler``)."""
    source = name
    if value is None:
        raw = os.environ.get(ENV_POOLER)
        if raw is None:  # the usual case, on every statement's path: one lookup
            return "none"
        value, source = raw or "none", ENV_POOLER
    mode = value.strip().lower()
    if mode not in POOLERS:
        raise ConfigurationError(
            f"{source} must be one of {', '.join(POOLERS)} (got {value!r}); 'transaction' is "
            "for PgBouncer, Supavisor or RDS Proxy in transaction mode"
        )
    return mode  # type: ignore[return-value]


def in_transaction_mode(pooler: str | None = None) -> bool:
    """True when connections pass through a transaction-mode pooler."""
    return resolve_pooler(pooler) == "transaction"


def connection_kwargs(pooler: str | None = None) -> dict[str, Any]:
    """What to pass to ``psycopg.connect`` (or a pool's ``kwargs``) for a connection pgqueue
    opens: behind a transaction pooler, never prepare (psycopg prepares a statement it has run
    five times, by default)."""
    return {"prepare_threshold": None} if in_transaction_mode(pooler) else {}


def resolve_listen_url(
    database_url: str | None, *, listen_url: str | None = None, pooler: str | None = None
) -> str | None:
    """The URL to LISTEN on, or None to poll instead: ``listen_url``, else
    ``PGQUEUE_LISTEN_URL``, else the database URL itself unless a transaction pooler is in
    front of it (LISTEN through one hears nothing)."""
    url = listen_url or os.environ.get(ENV_LISTEN_URL) or None
    if url is not None:
        return url
    return None if in_transaction_mode(pooler) else database_url


def resolve_notify(value: bool | None = None) -> bool:
    """Whether an enqueue sends NOTIFY: ``value``, else ``PGQUEUE_NOTIFY`` (on/off), else on."""
    if value is not None:
        return value
    raw = os.environ.get(ENV_NOTIFY)
    if raw is None or not raw.strip():
        return True
    word = raw.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ConfigurationError(f"{ENV_NOTIFY} must be on or off (got {raw!r})")


def prepares(conn: Any, pooler: str | None = None) -> bool:
    """May pgqueue let psycopg prepare its statements on ``conn``? Not behind a transaction
    pooler, and not on a connection whose owner turned preparing off
    (``prepare_threshold=None``: a caller's connection set up for a pooler says so itself).
    ``pooler`` None: the connection's mode (:func:`connection_mode`)."""
    if getattr(conn, "prepare_threshold", 5) is None:
        return False
    mode = connection_mode(conn) if pooler is None else resolve_pooler(pooler)
    return mode != "transaction"


# The pooler mode each connection pgqueue opened was opened for. Weak: a connection closed
# and dropped by its owner leaves nothing behind.
_OPENED_FOR: weakref.WeakKeyDictionary[Any, Pooler] = weakref.WeakKeyDictionary()


def remember(conn: Any, pooler: str | None) -> None:
    """Record that pgqueue opened ``conn`` for ``pooler`` (resolved: the environment's when
    None), so that :func:`connection_mode` answers for it whatever the environment says later."""
    _OPENED_FOR[conn] = resolve_pooler(pooler)


def connection_mode(conn: Any) -> Pooler:
    """The pooler mode of ``conn``: the one pgqueue opened it for (:func:`remember`), else
    the environment's (``PGQUEUE_POOLER``): a caller's own connection says nothing itself."""
    mode = _OPENED_FOR.get(conn)
    return resolve_pooler() if mode is None else mode
