"""Whether a queue exists (queue_known, asked before pausing one that has no settings row) is
planned each time, never prepared. Prepared, psycopg switches it to a server-side statement
after five runs on a connection, and PostgreSQL then to a generic plan: not knowing the name,
it guesses the name as common as the one queue in the statistics and reads the finished tasks
by a sequential scan (34 ms at 300,000 finished tasks, 115 ms at 800,000), for a probe that
finds nothing."""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue.queries import driver, queues


def test_the_queue_probe_is_never_a_prepared_statement(conn: psycopg.Connection[Any]) -> None:
    for _ in range(8):  # past psycopg's prepare threshold (5)
        assert driver.run(conn, queues.queue_known("nowhere")) is False
    prepared = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%pgqueue.queues%%'"
    ).fetchone()
    assert prepared == (0,)
