"""A moved Celery task without a database URL of its own submits to PGQUEUE_DATABASE_URL as it
is at the call, not as it was at the first call: a client made for an earlier value (another
test's database, a reconfigured process) is not reused for another database."""

from __future__ import annotations

import pytest

pytest.importorskip("celery")

from pgqueue.contrib import celery as contrib


def test_a_moved_tasks_default_client_follows_the_database_url_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clients = contrib._Clients()
    try:
        monkeypatch.setenv("PGQUEUE_DATABASE_URL", "postgresql://app@127.0.0.1:5432/first")
        first = clients.get(None)
        assert clients.get(None) is first  # one client per URL, reused
        monkeypatch.setenv("PGQUEUE_DATABASE_URL", "postgresql://app@127.0.0.1:5432/second")
        second = clients.get(None)
        assert second is not first
        assert first.database_url.endswith("/first") and second.database_url.endswith("/second")
        # A URL given to moved() wins over the environment.
        given = clients.get("postgresql://app@127.0.0.1:5432/given")
        assert given.database_url.endswith("/given")
    finally:
        clients.close()
