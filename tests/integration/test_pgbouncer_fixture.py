"""The PgBouncer the pooler tests run behind really pools by transaction: two transactions of
one client can land on different server connections, which is what breaks session state."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

POOL_SIZE = 20  # tests/pgbouncer.py's default_pool_size


def test_the_test_pooler_hands_one_clients_transactions_to_several_server_connections(
    pooled_database_url: str,
) -> None:
    """Made certain rather than likely: once other clients' open transactions hold the server
    connection this client's first transaction used, its next transaction must get another.
    Concurrent loops would prove it only when a busy machine lets them overlap."""
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(psycopg.connect(pooled_database_url, **kwargs))
        (first,) = client.execute("SELECT pg_backend_pid()").fetchone()
        held: list[int] = []
        for _ in range(POOL_SIZE - 1):
            other = stack.enter_context(psycopg.connect(pooled_database_url, **kwargs))
            stack.enter_context(other.transaction())
            held.append(other.execute("SELECT pg_backend_pid()").fetchone()[0])
            if held[-1] == first:
                break
        assert first in held, (first, held)
        (second,) = client.execute("SELECT pg_backend_pid()").fetchone()
        assert second != first, (first, second)
