"""The fair claim reads what its batch needs, whatever the backlog and however many keys.

A claim of 16 from a queue where one key has 50,000 ready tasks and thousands of other keys
have a few each must read a few hundred index entries and rows at most: one probe per key it
visits (the batch and a few more), each key's next tasks, and the running tasks it counts.
Reading a key's whole backlog, or every key, would make a claim cost grow with the tenants.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_query_plans import explain, nodes, outline, rows_read, table_scans

from pgqueue.queries import claiming, driver

BATCH = 16


def fill(conn: psycopg.Connection[Any], keys: int) -> None:
    conn.execute(
        "INSERT INTO pgqueue.tasks (type, payload, concurrency_key)"
        " SELECT 'export', '{}', 'hot' FROM generate_series(1, 50000)"
    )
    conn.execute(
        "INSERT INTO pgqueue.tasks (type, payload, concurrency_key)"
        " SELECT 'export', '{}', 'k' || (g %% %s) FROM generate_series(1, %s) AS g",
        (keys, max(20000, 2 * keys)),
    )
    conn.execute(
        "INSERT INTO pgqueue.limits (kind, name, per_key_max_running) VALUES ('type', 'export', 4)"
    )
    # The hot key at its limit, as under load: the walk steps over it.
    conn.execute(
        "UPDATE pgqueue.tasks SET status = 'running', lease_token = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 minute'"
        " WHERE id IN (SELECT id FROM pgqueue.tasks WHERE concurrency_key = 'hot' LIMIT 4)"
    )
    conn.execute("ANALYZE pgqueue.tasks")
    conn.commit()


def keyed_claim() -> driver.Query:
    op = claiming.task_claim_keyed(
        queues=["default"], limit=BATCH, owner="plan", lease_seconds=30, rotation={}
    )
    query = next(op)
    assert isinstance(query, driver.Query)
    return query


@pytest.mark.parametrize("keys", [100, 10000])
def test_a_fair_claim_reads_a_bounded_number_of_rows_whatever_the_keys_and_backlog(
    database_url: str, keys: int
) -> None:
    with psycopg.connect(database_url) as conn:
        fill(conn, keys)
        plan = explain(conn, keyed_claim(), analyze=True)

    scans = table_scans(plan["Plan"])
    assert all(n["Node Type"] != "Seq Scan" for n in scans), outline(plan["Plan"])
    read = rows_read(plan["Plan"])
    print(f"[fair claim plan] {keys} keys: {read} rows read, {plan['Execution Time']:.2f} ms")
    assert read < 40 * BATCH, f"{read} rows read for a claim of {BATCH}\n{outline(plan['Plan'])}"
    claimed = next(n for n in nodes(plan["Plan"]) if n.get("Node Type") == "ModifyTable")
    assert claimed.get("Actual Rows") == BATCH, "the batch is filled from the other keys"
