"""The pooler pass's watch (tests/pooler_audit.py) sees what a transaction-mode pooler must
not carry to the server, each by the witness that can see it, and nothing else: a
transaction's advisory locks and unnamed statements are what pgqueue sends behind a pooler.

These run in the ordinary passes, on a watched server of their own: in the pooler pass
itself, a violation fails the test that made it, so it cannot be shown there on purpose.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pooler_audit import AuditedPooler, audited_pooler

from tests.pgbouncer import pgbouncer_binary


@pytest.fixture(scope="module")
def watched() -> Iterator[AuditedPooler]:
    if pgbouncer_binary() is None:
        if os.environ.get("PGQUEUE_REQUIRE_PGBOUNCER"):
            pytest.fail("PGQUEUE_REQUIRE_PGBOUNCER is set but pgbouncer is not installed")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    with audited_pooler() as watched:
        yield watched


def through_the_pooler(watched: AuditedPooler, name: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection through the pooler to a new database ``name``, its findings ``name``'s."""
    with psycopg.connect(watched.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    watched.audit.claim(name, name)
    url = watched.bouncer.pooled_url(watched.server_url.rsplit("/", 1)[0] + "/" + name)
    return psycopg.connect(url, autocommit=True, **kwargs)


def kinds_and_witnesses(watched: AuditedPooler, name: str) -> set[tuple[str, str]]:
    return {(f.kind, f.seen.split(":", 1)[0]) for f in watched.audit.settle(name)}


def test_a_statement_prepared_through_the_pooler_is_seen_in_the_log(watched):
    with through_the_pooler(watched, "prepares") as conn:  # psycopg prepares the 6th run
        for n in range(8):
            conn.execute("SELECT %s::int + 1", (n,))
    assert kinds_and_witnesses(watched, "prepares") == {("prepared statement", "log")}


def test_a_listen_through_the_pooler_is_seen_in_the_log_and_in_pg_stat_activity(watched):
    with through_the_pooler(watched, "listens", prepare_threshold=None) as conn:
        conn.execute("LISTEN anything")
        time.sleep(10 * watched.audit.interval)  # the backend sits idle after it
    assert kinds_and_witnesses(watched, "listens") == {
        ("LISTEN", "log"),
        ("LISTEN", "pg_stat_activity"),
    }


def test_a_session_advisory_lock_is_seen_in_the_log_and_in_pg_locks(watched):
    with through_the_pooler(watched, "locks", prepare_threshold=None) as conn:
        conn.execute("SELECT pg_try_advisory_lock(1)")
        time.sleep(10 * watched.audit.interval)
    assert kinds_and_witnesses(watched, "locks") == {
        ("session advisory lock", "log"),
        ("session advisory lock", "pg_locks"),
    }


def test_a_session_advisory_lock_taken_out_of_the_logs_sight_is_seen_in_pg_locks(watched):
    with through_the_pooler(watched, "hidden", prepare_threshold=None) as conn:
        conn.execute(
            "CREATE FUNCTION take(k bigint) RETURNS void LANGUAGE sql"
            " AS $$ SELECT pg_advisory_lock(k) $$"
        )
        conn.execute("SELECT take(2)")
        time.sleep(10 * watched.audit.interval)
    assert kinds_and_witnesses(watched, "hidden") == {("session advisory lock", "pg_locks")}


def test_transaction_advisory_locks_and_unnamed_statements_are_not_findings(watched):
    with through_the_pooler(watched, "clean", prepare_threshold=None) as conn:
        deadline = time.monotonic() + 40 * watched.audit.interval
        while time.monotonic() < deadline:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(3)")
            conn.execute("SELECT %s::int", (1,))
        conn.execute("NOTIFY anything")
    assert kinds_and_witnesses(watched, "clean") == set()
    assert watched.audit.samples > 0 and watched.audit.error is None
