"""The pooler mode, as arguments, the environment and the connections pgqueue opened decide it
(pgqueue/pooling.py), and what a wait does when nothing can wake it (pgqueue/waiting.py).
Through a real PgBouncer: tests/integration/test_transaction_pooler.py."""

from __future__ import annotations

import itertools

import pytest

from pgqueue import pooling
from pgqueue.api.settings import ApiSettings
from pgqueue.errors import ConfigurationError
from pgqueue.waiting import POLL_LONGEST, poll_intervals


class FakeConnection:
    """Stands for a psycopg connection: what pooling reads of one is its threshold."""

    prepare_threshold: int | None = 5


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (pooling.ENV_POOLER, pooling.ENV_LISTEN_URL, pooling.ENV_NOTIFY):
        monkeypatch.delenv(name, raising=False)


def test_a_wait_that_listens_reads_again_every_poll_interval() -> None:
    assert list(itertools.islice(poll_intervals(2.0, listening=True), 3)) == [2.0, 2.0, 2.0]


def test_a_wait_that_cannot_listen_polls_soon_then_less_often_up_to_half_a_second() -> None:
    intervals = list(itertools.islice(poll_intervals(2.0, listening=False), 12))
    assert intervals[0] == 0.05
    assert intervals == sorted(intervals)
    assert intervals[-1] == POLL_LONGEST == 0.5
    assert sum(intervals[:6]) < 1.1  # six reads in the first second or so


def test_a_shorter_poll_interval_than_half_a_second_is_kept_when_polling() -> None:
    assert max(itertools.islice(poll_intervals(0.2, listening=False), 20)) == 0.2
    assert list(itertools.islice(poll_intervals(0.01, listening=False), 2)) == [0.01, 0.01]


def test_a_connection_pgqueue_opened_keeps_its_mode_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened, callers = FakeConnection(), FakeConnection()
    pooling.remember(opened, "transaction")
    assert pooling.connection_mode(opened) == "transaction"
    assert pooling.connection_mode(callers) == "none"
    assert not pooling.prepares(opened) and pooling.prepares(callers)
    monkeypatch.setenv(pooling.ENV_POOLER, "transaction")
    assert pooling.connection_mode(callers) == "transaction"
    assert not pooling.prepares(callers)
    pooling.remember(opened, "none")
    assert pooling.connection_mode(opened) == "none"


def test_a_callers_connection_that_never_prepares_is_never_prepared_on() -> None:
    conn = FakeConnection()
    conn.prepare_threshold = None
    assert not pooling.prepares(conn)


def test_a_bad_pooler_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"^pooler must be one of"):
        pooling.resolve_pooler("transactional")
    with pytest.raises(ConfigurationError, match=r"^--pooler must be one of"):
        pooling.resolve_pooler("bouncer", name="--pooler")
    monkeypatch.setenv(pooling.ENV_POOLER, "Transactional")
    with pytest.raises(ConfigurationError, match=r"^PGQUEUE_POOLER must be one of"):
        pooling.resolve_pooler()
    monkeypatch.setenv(pooling.ENV_POOLER, " Transaction ")
    assert pooling.resolve_pooler() == "transaction"


def test_the_api_settings_refuse_a_bad_pooler_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="pooler must be one of"):
        ApiSettings(pooler="transactional")  # type: ignore[arg-type]
    monkeypatch.setenv(pooling.ENV_POOLER, "transactional")
    with pytest.raises(ConfigurationError, match="PGQUEUE_POOLER"):
        ApiSettings.from_env()
    monkeypatch.setenv(pooling.ENV_POOLER, "transaction")
    assert ApiSettings.from_env().pooler == "transaction"


def test_the_api_reads_its_wait_settings_without_a_body_limit_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGQUEUE_API_MAX_BODY_BYTES", raising=False)
    monkeypatch.setenv("PGQUEUE_API_MAX_WAITERS", "7")
    monkeypatch.setenv("PGQUEUE_API_WAIT_POLL_SECONDS", "0.5")
    settings = ApiSettings.from_env()
    assert (settings.max_waiters, settings.wait_poll_seconds) == (7, 0.5)
    assert settings.max_body_bytes is None
