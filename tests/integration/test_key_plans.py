"""Query plans with tasks that have a concurrency key: the statements that read every waiting
task must read the keyed ones through their own index, and stay cheap however the keys and
their backlogs are shaped; the busiest keys (asked every few seconds) must cost the number of
keys, not the length of one tenant's backlog.

The table (built once for the module, then VACUUM ANALYZE'd, as test_query_plans.py builds
its own): one tenant with a backlog of 100,000 tasks, 20,000 tasks over 10,000 other keys,
a queue whose tasks all have keys ('tenants': 2,000 over 1,000 keys), 50,000 tasks without
a key, 1,000 running tasks (half with a key) and 50,000 finished ones. A keyed task waits
only in tasks_claim_key_idx (queue, priority, key, created_at, id) and an unkeyed one only in
tasks_claim_idx, so a statement that names neither predicate reads the table. The helpers
that load the library's statements and read plans are test_query_plans.py's.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from test_query_plans import (
    MAINTENANCE_BATCH,
    assert_index_only_access,
    entries_read,
    explain,
    first_query,
    index_scans,
    nodes,
    outline,
    partial_index,
    plans,
    report,
    rows_read,
    sorts_over_the_table,
)

from pgqueue.queries import driver, queues, stats

BIG_KEY = 100_000  # one tenant's backlog
KEYS = 10_000  # other tenants, two tasks each
KEYED_ONLY = 1_000  # keys of the queue whose tasks all have one, two tasks each
UNKEYED = 50_000
RUNNING = 1_000
FINISHED = 50_000

# Created over the last two hours, so that promotion (after 300 s) finds most of them aged;
# 1 in 19 scheduled an hour ahead. Finished rows first, the backlogs last, as a table grows.
FILL_SQL = f"""
INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, visible_after, created_at,
                           started_at, finished_at, result)
SELECT (ARRAY['default', 'email', 'tenants'])[1 + i % 3], 'report.build', '{{"n": 1}}',
       'completed', 1, f.at, f.at, f.at, f.at, '{{"ok": true}}'
  FROM generate_series(1, {FINISHED}) AS i,
       LATERAL (SELECT now() - interval '20 hours' * (i::double precision / {FINISHED}) AS at)
       AS f;

INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, lease_owner, lease_token,
                           lease_expires_at, created_at, started_at, concurrency_key)
SELECT CASE WHEN i % 3 = 0 THEN 'email' ELSE 'default' END, 'email.send', '{{"n": 1}}',
       'running', 1, 'host:1234', gen_random_uuid(), now() + interval '25 seconds',
       now() - interval '1 minute', now() - interval '5 seconds',
       CASE WHEN i % 2 = 0 THEN NULL WHEN i <= 40 THEN 'tenant-big'
            ELSE 'tenant-' || lpad((i % 250)::text, 5, '0') END
  FROM generate_series(1, {RUNNING}) AS i;

INSERT INTO pgqueue.tasks (queue, type, payload, priority, visible_after, created_at,
                           concurrency_key)
SELECT 'default', 'email.send', '{{"n": 1}}', 1,
       CASE WHEN i % 19 = 3 THEN now() + interval '1 hour' ELSE c.at END, c.at, 'tenant-big'
  FROM generate_series(1, {BIG_KEY}) AS i,
       LATERAL (SELECT now() - interval '2 hours' * (1 - i::double precision / {BIG_KEY}) AS at)
       AS c;

INSERT INTO pgqueue.tasks (queue, type, payload, priority, visible_after, created_at,
                           concurrency_key)
SELECT CASE WHEN i % 4 = 0 THEN 'email' ELSE 'default' END, 'email.send', '{{"n": 1}}',
       CASE WHEN i % 7 = 0 THEN 0 WHEN i % 7 < 6 THEN 1 ELSE 2 END,
       CASE WHEN i % 19 = 3 THEN now() + interval '1 hour' ELSE c.at END, c.at,
       'tenant-' || lpad((i % {KEYS})::text, 5, '0')
  FROM generate_series(1, {2 * KEYS}) AS i,
       LATERAL (SELECT now() - interval '1 hour' * (1 - i::double precision / {2 * KEYS}) AS at)
       AS c;

INSERT INTO pgqueue.tasks (queue, type, payload, created_at, concurrency_key)
SELECT 'tenants', 'sync', '{{"n": 1}}', now() - interval '10 minutes',
       'account-' || lpad((i % {KEYED_ONLY})::text, 5, '0')
  FROM generate_series(1, {2 * KEYED_ONLY}) AS i;
"""

UNKEYED_SQL = f"""
INSERT INTO pgqueue.tasks (queue, type, payload, priority, visible_after, created_at)
SELECT CASE WHEN i % 10 < 6 THEN 'default' ELSE 'email' END, 'email.send', '{{"n": 1}}',
       CASE WHEN i % 7 = 0 THEN 0 WHEN i % 7 < 6 THEN 1 ELSE 2 END,
       CASE WHEN i % 19 = 3 THEN now() + interval '1 hour' ELSE c.at END, c.at
  FROM generate_series(1, {UNKEYED}) AS i,
       LATERAL (SELECT now() - interval '2 hours' * (1 - i::double precision / {UNKEYED}) AS at)
       AS c;
"""


@contextlib.contextmanager
def database(server_url: str, template_db: str, *fills: str) -> Iterator[str]:
    """A migrated database filled by ``fills``, then VACUUM ANALYZE'd; dropped afterwards."""
    name = f"pgqueue_key_plans_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for fill in fills:
                conn.execute(fill)
            conn.execute("VACUUM ANALYZE pgqueue.tasks")
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def keyed_database_url(server_url: str, template_db: str) -> Iterator[str]:
    with database(server_url, template_db, FILL_SQL, UNKEYED_SQL) as url:
        yield url


@pytest.fixture
def keyed(keyed_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the keyed table; whatever a test does in it is rolled back."""
    with psycopg.connect(keyed_database_url) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


# The queued tasks without a key done (gone), the tenants' backlogs left.
DRAINED_SQL = "DELETE FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NULL"


@pytest.fixture(scope="module")
def keyed_only(server_url: str, template_db: str) -> Iterator[psycopg.Connection[Any]]:
    """The same table once every task without a key has been done, vacuumed and analyzed:
    most of what waits is then aged keyed tasks. Only read (and rolled back)."""
    with (
        database(server_url, template_db, FILL_SQL, UNKEYED_SQL, DRAINED_SQL) as url,
        psycopg.connect(url) as conn,
    ):
        yield conn


def test_promotion_reads_both_claim_indexes_and_a_batch_of_the_table(
    keyed: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every sweep round: the aged tasks of each queue and level, without a key by a range of
    tasks_claim_idx, with one by the level's range of tasks_claim_key_idx whose entries are
    compared with the cutoff in the index, so the table is read for a batch, not for the
    tenant's 100,000 tasks. (That keyed tasks are promoted: test_starvation.py.)"""
    claim_index = partial_index(keyed, "queued", "queue")
    key_index = partial_index(keyed, "queued", "queue", keyed=True)
    query = first_query(queues.task_promote(300, MAINTENANCE_BATCH))
    for label, plan in plans(keyed, query).items():
        assert_index_only_access(plan, f"promote ({label})")
        used = {n.get("Index Name") for n in nodes(plan["Plan"])} - {None}
        assert {claim_index, key_index} <= used <= {claim_index, key_index, "tasks_pkey"}, (
            label,
            used,
        )
    analyzed = explain(keyed, query, analyze=True)
    read = rows_read(analyzed["Plan"])
    keyed_entries = entries_read(analyzed["Plan"], key_index)
    report(
        capsys,
        f"promotion of a batch of {MAINTENANCE_BATCH:,} with {BIG_KEY:,} keyed tasks of one key "
        f"and {2 * KEYS:,} over {KEYS:,} keys waiting: {analyzed['Execution Time']:.2f} ms, "
        f"{read:,} rows read from pgqueue.tasks, {keyed_entries:,} entries of {key_index}",
    )
    # The batch, the scheduled rows passed over on the way, the UPDATE's lookups by id.
    assert read <= 4 * MAINTENANCE_BATCH, outline(analyzed["Plan"])
    promoted = driver.run(keyed, queues.task_promote(300, MAINTENANCE_BATCH))
    keyed.rollback()
    assert len(promoted) == MAINTENANCE_BATCH


def test_promotion_of_keyed_tasks_reads_an_ordered_range_for_a_batch(
    keyed_only: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """With no task without a key waiting, the whole batch comes from tasks_claim_key_idx,
    read in its order, the cutoff compared in the index, and the table is read for the batch
    alone. Most of the table is aged keyed tasks here, where a plan may bet on a sequential
    scan finding a batch early: without its ORDER BY the statement got one on a table of this
    shape (the same tasks, differently laid out), and read 205,904 rows for 1,000. Refused
    in both plans."""
    conn = keyed_only
    key_index = partial_index(conn, "queued", "queue", keyed=True)
    query = first_query(queues.task_promote(300, MAINTENANCE_BATCH))
    for label, plan in plans(conn, query).items():
        assert_index_only_access(plan, f"keyed promotion ({label})")
        assert not sorts_over_the_table(plan["Plan"]), f"{label}\n{outline(plan['Plan'])}"
        assert index_scans(plan["Plan"], key_index), f"{label}\n{outline(plan['Plan'])}"
    analyzed = explain(conn, query, analyze=True)
    read = rows_read(analyzed["Plan"])
    report(
        capsys,
        f"promotion of a batch of {MAINTENANCE_BATCH:,} keyed tasks ({BIG_KEY:,} of one key, "
        f"{2 * KEYS:,} over {KEYS:,} keys, none without a key): "
        f"{analyzed['Execution Time']:.2f} ms, {read:,} rows read from pgqueue.tasks, "
        f"{entries_read(analyzed['Plan'], key_index):,} entries of {key_index}",
    )
    assert read <= 4 * MAINTENANCE_BATCH, outline(analyzed["Plan"])


def test_listing_queues_finds_a_queue_of_keyed_tasks_by_a_probe_per_queue(
    keyed: psycopg.Connection[Any],
) -> None:
    """'tenants' has only keyed tasks waiting (and finished ones): the list finds every queue
    with keyed tasks by a loose walk of tasks_claim_key_idx, a probe per queue, not by its
    entries (122,000 here)."""
    key_index = partial_index(keyed, "queued", "queue", keyed=True)
    query = first_query(queues.queue_list())
    analyzed = explain(keyed, query, analyze=True)
    tree = analyzed["Plan"]
    assert_index_only_access(analyzed, "queue list")
    assert index_scans(tree, key_index), outline(tree)
    # 'default', 'email', 'tenants', then the probe that finds no further queue.
    assert entries_read(tree, key_index) <= 4, outline(tree)
    assert rows_read(tree) <= RUNNING + 10, outline(tree)
    listed = driver.run(keyed, queues.queue_list())
    keyed.rollback()
    assert [q.name for q in listed] == ["default", "email", "tenants"]


@pytest.mark.parametrize(
    ("queue", "known"), [("tenants", True), ("default", True), ("nowhere", False)]
)
def test_the_queue_probe_reads_an_entry_of_an_index_per_kind_of_task(
    keyed: psycopg.Connection[Any], queue: str, known: bool
) -> None:
    """Before a pause without --create: a queue of keyed tasks only, a queue with tasks of
    every kind (where a sequential scan could look like a good bet to find one early), and a
    queue with none (every probe runs). Each probe reads its index in both plans, an entry
    at most, but the running probe, which filters the running tasks by queue."""
    query = first_query(queues.queue_known(queue))
    for label, plan in plans(keyed, query).items():
        assert_index_only_access(plan, f"queue probe {queue} ({label})")
    analyzed = explain(keyed, query, analyze=True)
    # An entry per probe, and the running tasks, which the running probe filters by queue.
    assert rows_read(analyzed["Plan"]) <= RUNNING + 8, outline(analyzed["Plan"])
    assert driver.run(keyed, queues.queue_known(queue)) is known
    keyed.rollback()


def test_the_busiest_keys_cost_the_keys_not_the_backlog_of_one(
    keyed: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every `pgqueue stats`, /api/v1/stats, /metrics scrape and dashboard refresh: the
    running tasks from their index, the queued ones by chunks of tasks_claim_key_idx, a
    tenant's 100,000 read for two chunks at most, never the table."""
    key_index = partial_index(keyed, "queued", "queue", keyed=True)
    query = first_query(stats.key_busiest(10))
    for label, plan in plans(keyed, query).items():
        assert_index_only_access(plan, f"busiest keys ({label})")
    analyzed = explain(keyed, query, analyze=True)
    tree = analyzed["Plan"]
    entries = entries_read(tree, key_index)
    read = rows_read(tree)
    waiting = 2 * KEYS + 2 * KEYED_ONLY  # the other keys' tasks, each read once
    report(
        capsys,
        f"busiest keys with {BIG_KEY:,} keyed tasks of one key, {2 * KEYS:,} over {KEYS:,} keys "
        f"and {2 * KEYED_ONLY:,} over {KEYED_ONLY:,} more: {analyzed['Execution Time']:.2f} ms, "
        f"{entries:,} entries of {key_index} of {BIG_KEY + waiting:,}, {read:,} rows read",
    )
    # Those tasks, a chunk's last group read again per chunk, two chunks of the big key.
    assert entries <= waiting + 2 * 1000 + 2 * waiting // 100, outline(tree)
    assert read <= entries + RUNNING, outline(tree)
    busiest = driver.run(keyed, stats.key_busiest(10))
    keyed.rollback()
    assert (busiest[0].queue, busiest[0].key, busiest[0].ready_capped) == (
        "default",
        "tenant-big",
        True,
    )
    assert len(busiest) == 10
