"""The default client: what ``fn.delay(...)``, ``fn.apply_async(...)`` and a result's
``.get()`` use when they are given no connection.

Its database is the one given to :func:`configure`, else ``PGQUEUE_DATABASE_URL``; with
neither, a ConfigurationError names both. Never the embedded server: a producer that silently
submitted to a private database on its own machine would lose every task it sent.

The :class:`~pgqueue.client.Client` is made on first use (once, under a lock, however many
threads ask at once) and closed at exit. ``configure`` again replaces it; the replaced one is
closed, and a handle that still holds it reopens its pool on its next call (its task is in
that database) until exit. A forked child (a pre-fork web server's worker) never uses the
parent's client: it makes its own on first use, since two processes on one connection would
mix their conversations with the server.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import Any

from pgqueue import pooling
from pgqueue.client import Client
from pgqueue.config import ENV_DATABASE_URL, validate_database_url
from pgqueue.errors import ConfigurationError, InvalidDatabaseURL

_lock = threading.Lock()
# What configure() was given (None: not called, or reset), and the client made from it or
# from the environment (None: not made yet).
_configured: dict[str, Any] | None = None
_client: Client | None = None
# Where the current client's URL came from: "configure" or the environment's value.
_source: str | None = None
# Every client made here, closed at exit (a handle may hold a replaced one).
_made: list[Client] = []


def configure(
    database_url: str,
    *,
    max_connections: int = 4,
    pooler: pooling.Pooler | None = None,
    notify: bool | None = None,
) -> None:
    """Set the database of the default client (``fn.delay``, ``fn.apply_async``, a result's
    ``.get()`` without a connection), over ``PGQUEUE_DATABASE_URL``; the other options are
    :class:`pgqueue.Client`'s. The URL is checked now; the first connection is opened on
    first use. Called again, it replaces the default client (the old one is closed)."""
    if not isinstance(database_url, str):
        raise InvalidDatabaseURL(
            f"database_url must be a PostgreSQL URL (str), not {type(database_url).__name__}"
        )
    settings = {
        "database_url": validate_database_url(database_url),
        "max_connections": max_connections,
        "pooler": pooling.resolve_pooler(pooler),
        "notify": notify,
    }
    global _configured, _client, _source
    with _lock:
        old = _client
        _configured, _client, _source = settings, None, None
    if old is not None:
        old.close()


def reset() -> None:
    """Forget :func:`configure`'s settings and close the default client: the next use reads
    ``PGQUEUE_DATABASE_URL`` again (for tests, and for code that must let go of a database)."""
    global _configured, _client, _source
    with _lock:
        old = _client
        _configured, _client, _source = None, None, None
    if old is not None:
        old.close()


def client(needed_for: str = "fn.delay() and fn.apply_async()") -> Client:
    """The default client, made on first use; ``needed_for`` names the call that needs it in
    the ConfigurationError raised when no database is configured."""
    global _client, _source
    env = os.environ.get(ENV_DATABASE_URL, "").strip()
    with _lock:
        if _configured is not None:
            if _client is None:
                _client = _made_client(**_configured)
                _source = "configure"
            return _client
        if not env:
            raise ConfigurationError(
                f"no database for {needed_for}: call pgqueue.configure(database_url=...) at "
                f"start-up, or set {ENV_DATABASE_URL} (the default client never uses the "
                "embedded server)"
            )
        if _client is not None and _source == env:
            return _client
        old = _client
        try:
            url = validate_database_url(env)
        except InvalidDatabaseURL as exc:
            raise InvalidDatabaseURL(f"{ENV_DATABASE_URL}: {exc}") from None
        _client, _source = _made_client(database_url=url), env
    if old is not None:  # the environment's URL changed since it was made
        old.close()
    return _client


def _made_client(**settings: Any) -> Client:
    made = Client(**settings)
    _made.append(made)
    return made


def _close_all() -> None:
    with _lock:
        made = list(_made)
        _made.clear()
    for c in made:  # at exit, one client's error must not keep the others open
        with contextlib.suppress(Exception):
            c.close()


def _forget_in_child() -> None:
    """In a forked child: drop the parent's clients without closing them (closing would end
    the parent's connections, whose sockets the child shares), and a fresh lock."""
    global _client, _source, _lock
    _lock = threading.Lock()
    _client, _source = None, None
    _made.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_in_child)
