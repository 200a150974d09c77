"""The PgBouncer the pooler tests run behind really pools by transaction: two transactions of
one client can land on different server connections, which is what breaks session state."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg


def test_the_test_pooler_hands_one_clients_transactions_to_several_server_connections(
    pooled_database_url: str,
) -> None:
    def backend_pids(_: int) -> set[int]:
        with psycopg.connect(pooled_database_url, autocommit=True, prepare_threshold=None) as conn:
            return {conn.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(50)}

    with ThreadPoolExecutor(8) as pool:
        seen: list[set[Any]] = list(pool.map(backend_pids, range(8)))
    assert any(len(pids) > 1 for pids in seen), seen
