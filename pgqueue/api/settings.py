"""How the API runs: the settings, and reading them from the environment.

A module of its own because nothing here needs FastAPI: the settings are read, and a bad
value refused with a clear message, before any application is built.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pgqueue import config, pooling
from pgqueue.errors import ConfigurationError

ENV_TOKENS = "PGQUEUE_API_TOKENS"
ENV_TOKENS_FILE = "PGQUEUE_API_TOKENS_FILE"
ENV_MAX_BODY = "PGQUEUE_API_MAX_BODY_BYTES"
# What a request body may carry on top of the payload limit: the envelope (type, queue,
# priority, idempotency key, run_at...) and the slack of a client's JSON encoding (spaces,
# escapes) against the compact encoding the payload limit measures. Without it a payload of
# exactly PGQUEUE_MAX_PAYLOAD_BYTES could never be submitted over HTTP.
ENVELOPE_BYTES = 64 * 1024
# Waiting for a result (GET /api/v1/tasks/{id}?wait=): at most this many requests waiting at
# once per API process, and how often each reads its task in case a notification was missed.
ENV_MAX_WAITERS = "PGQUEUE_API_MAX_WAITERS"
DEFAULT_MAX_WAITERS = 10_000
ENV_WAIT_POLL = "PGQUEUE_API_WAIT_POLL_SECONDS"
DEFAULT_WAIT_POLL = 5.0


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """How the API runs. ``tokens`` empty means no authentication (loopback use only)."""

    # Out of repr: settings get printed and logged, and both may hold secrets.
    database_url: str | None = dataclasses.field(default=None, repr=False)
    tokens: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)
    # None: the payload limit (PGQUEUE_MAX_PAYLOAD_BYTES) plus ENVELOPE_BYTES; see body_limit.
    max_body_bytes: int | None = None
    pool_size: int = 10
    max_waiters: int = DEFAULT_MAX_WAITERS
    wait_poll_seconds: float = DEFAULT_WAIT_POLL
    # The pooler in front of the database (pgqueue.pooling): "transaction" for PgBouncer,
    # Supavisor or RDS Proxy in transaction mode (no prepared statements; waits hear through
    # listen_url, else poll). None: PGQUEUE_POOLER's.
    pooler: pooling.Pooler | None = None
    # A direct URL (no pooler) for the waiter hub's LISTEN only; None: PGQUEUE_LISTEN_URL's.
    listen_url: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.pooler is not None:
            pooling.resolve_pooler(self.pooler)  # ConfigurationError for a bad one, at once

    def body_limit(self) -> int:
        """The most bytes a request body may have: ``max_body_bytes`` when set, else the
        payload limit plus :data:`ENVELOPE_BYTES`, so that the largest payload the library
        accepts is accepted over HTTP too (and refused, one byte over, by the payload rule
        with its own 413, not by this one)."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return config.max_payload_bytes() + ENVELOPE_BYTES

    @classmethod
    def from_env(cls) -> ApiSettings:
        """Tokens from ``PGQUEUE_API_TOKENS`` (comma-separated) and/or the file named by
        ``PGQUEUE_API_TOKENS_FILE`` (one per line, # comments); the body limit from
        ``PGQUEUE_API_MAX_BODY_BYTES`` (unset: the payload limit plus 64 KiB)."""
        pooler = pooling.resolve_pooler()  # a bad PGQUEUE_POOLER is refused here, not later
        tokens = {t.strip() for t in os.environ.get(ENV_TOKENS, "").split(",") if t.strip()}
        path = os.environ.get(ENV_TOKENS_FILE, "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigurationError(f"{ENV_TOKENS_FILE}: cannot read {path}: {exc}") from None
            tokens |= {t for t in (ln.strip() for ln in lines) if t and not t.startswith("#")}
        raw = os.environ.get(ENV_MAX_BODY, "").strip()
        max_body: int | None = None
        if raw:
            try:
                max_body = int(raw)
            except ValueError:
                raise ConfigurationError(
                    f"{ENV_MAX_BODY} must be an integer, not {raw!r}"
                ) from None
            if max_body < 1024:
                raise ConfigurationError(f"{ENV_MAX_BODY} must be at least 1024, not {max_body}")
        max_waiters, wait_poll = _wait_settings()
        return cls(
            tokens=frozenset(tokens),
            max_body_bytes=max_body,
            max_waiters=max_waiters,
            wait_poll_seconds=wait_poll,
            pooler=pooler,
        )


def _wait_settings() -> tuple[int, float]:
    """``PGQUEUE_API_MAX_WAITERS`` (an integer, at least 1) and
    ``PGQUEUE_API_WAIT_POLL_SECONDS`` (seconds, more than 0)."""
    raw = os.environ.get(ENV_MAX_WAITERS, "").strip()
    try:
        max_waiters = int(raw) if raw else DEFAULT_MAX_WAITERS
    except ValueError:
        raise ConfigurationError(f"{ENV_MAX_WAITERS} must be an integer, not {raw!r}") from None
    if max_waiters < 1:
        raise ConfigurationError(f"{ENV_MAX_WAITERS} must be at least 1, not {max_waiters}")
    raw = os.environ.get(ENV_WAIT_POLL, "").strip()
    try:
        poll = float(raw) if raw else DEFAULT_WAIT_POLL
    except ValueError:
        raise ConfigurationError(f"{ENV_WAIT_POLL} must be seconds, not {raw!r}") from None
    if not 0 < poll < float("inf"):
        raise ConfigurationError(f"{ENV_WAIT_POLL} must be more than 0 seconds, not {raw!r}")
    return max_waiters, poll
