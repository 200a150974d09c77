"""Connections for commands: each opens its own, for the one invocation, from the global
``--database-url`` (or what it falls back to)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pgqueue.cli.state import state

if TYPE_CHECKING:
    from pgqueue.client import Client


@contextlib.contextmanager
def open_client() -> Iterator[Client]:
    """A client on one pooled connection; each ``client.connection()`` block commits.

    For commands that work in several transactions (the dead-letter batches); one command
    never needs two connections at once, so a pool of one is enough. Imported here, not
    above: a command's ``--help`` and its usage errors need no driver."""
    from pgqueue.client import Client

    with Client(state.url(), max_connections=1, pooler=state.pooler) as client:
        yield client


@contextlib.contextmanager
def connection() -> Iterator[Any]:
    """One connection in one transaction, committed when the block ends."""
    with open_client() as client, client.connection() as conn:
        yield conn
