"""The default client (``pgqueue.configure``, else ``PGQUEUE_DATABASE_URL``): made once however
many threads ask at once, replaced by a new ``configure``, never the parent's in a forked child.
No database is needed: a Client opens its first connection on first use, not when made."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

import pgqueue
from pgqueue import defaults

URL = "postgresql://app@db.example/app"


@pytest.fixture(autouse=True)
def _forgotten(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PGQUEUE_DATABASE_URL", raising=False)
    defaults.reset()
    yield
    defaults.reset()


def test_threads_asking_at_once_share_one_default_client() -> None:
    pgqueue.configure(database_url=URL)
    start = threading.Barrier(16)
    got: list[pgqueue.Client] = []

    def ask() -> None:
        start.wait()
        got.append(defaults.client())

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and len({id(c) for c in got}) == 1
    assert got[0].database_url == URL


def test_configure_again_replaces_the_default_client() -> None:
    pgqueue.configure(database_url=URL)
    first = defaults.client()
    pgqueue.configure(database_url="postgresql://app@other.example/app", max_connections=2)
    second = defaults.client()
    assert second is not first and second.database_url.startswith("postgresql://app@other")


def test_the_environment_url_is_used_until_configure_and_followed_when_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", URL)
    from_env = defaults.client()
    assert from_env.database_url == URL and defaults.client() is from_env
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", "postgresql://app@moved.example/app")
    assert defaults.client().database_url == "postgresql://app@moved.example/app"
    pgqueue.configure(database_url="postgresql://app@configured.example/app")
    assert defaults.client().database_url == "postgresql://app@configured.example/app"


def test_a_bad_environment_url_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", "mysql://db/app")
    with pytest.raises(pgqueue.InvalidDatabaseURL, match=r"^PGQUEUE_DATABASE_URL: "):
        defaults.client()


def test_neither_configure_nor_the_environment_is_a_configuration_error_naming_both() -> None:
    with pytest.raises(pgqueue.ConfigurationError) as caught:
        defaults.client("send.delay()")
    message = str(caught.value)
    assert message.startswith("no database for send.delay(): ")
    assert "pgqueue.configure(database_url=...)" in message
    assert "PGQUEUE_DATABASE_URL" in message


def test_a_forked_child_makes_its_own_default_client() -> None:
    pgqueue.configure(database_url=URL)
    parent = defaults.client()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it got a client of its own, then leave at once
        try:
            own = defaults.client()
            ok = own is not parent and own.database_url == URL
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert defaults.client() is parent
