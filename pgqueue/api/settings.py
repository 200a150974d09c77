"""How the API runs: the settings, and reading them from the environment.

A module of its own because nothing here needs FastAPI: the settings are read, and a bad
value refused with a clear message, before any application is built.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pgqueue.errors import ConfigurationError

ENV_TOKENS = "PGQUEUE_API_TOKENS"
ENV_TOKENS_FILE = "PGQUEUE_API_TOKENS_FILE"
ENV_MAX_BODY = "PGQUEUE_API_MAX_BODY_BYTES"
DEFAULT_MAX_BODY = 1024 * 1024
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
    max_body_bytes: int = DEFAULT_MAX_BODY
    pool_size: int = 10
    max_waiters: int = DEFAULT_MAX_WAITERS
    wait_poll_seconds: float = DEFAULT_WAIT_POLL

    @classmethod
    def from_env(cls) -> ApiSettings:
        """Tokens from ``PGQUEUE_API_TOKENS`` (comma-separated) and/or the file named by
        ``PGQUEUE_API_TOKENS_FILE`` (one per line, # comments); the body limit from
        ``PGQUEUE_API_MAX_BODY_BYTES``."""
        tokens = {t.strip() for t in os.environ.get(ENV_TOKENS, "").split(",") if t.strip()}
        path = os.environ.get(ENV_TOKENS_FILE, "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigurationError(f"{ENV_TOKENS_FILE}: cannot read {path}: {exc}") from None
            tokens |= {t for t in (ln.strip() for ln in lines) if t and not t.startswith("#")}
        raw = os.environ.get(ENV_MAX_BODY, "").strip()
        try:
            max_body = int(raw) if raw else DEFAULT_MAX_BODY
        except ValueError:
            raise ConfigurationError(f"{ENV_MAX_BODY} must be an integer, not {raw!r}") from None
        if max_body < 1024:
            raise ConfigurationError(f"{ENV_MAX_BODY} must be at least 1024, not {max_body}")
        max_waiters, wait_poll = _wait_settings()
        return cls(
            tokens=frozenset(tokens),
            max_body_bytes=max_body,
            max_waiters=max_waiters,
            wait_poll_seconds=wait_poll,
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
