"""How the API runs: the settings, and reading them from the environment.

A module of its own because nothing here needs FastAPI: the settings are read, and a bad
value refused with a clear message, before any application is built.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping, Set
from pathlib import Path

from pgqueue import config, pooling
from pgqueue.api import scopes
from pgqueue.errors import ConfigurationError

ENV_TOKENS = "PGQUEUE_API_TOKENS"
ENV_TOKENS_FILE = "PGQUEUE_API_TOKENS_FILE"
ENV_ALLOWED_HOSTS = "PGQUEUE_API_ALLOWED_HOSTS"
ENV_ALLOW_UNAUTHENTICATED = "PGQUEUE_API_ALLOW_UNAUTHENTICATED"
ENV_MAX_BODY = "PGQUEUE_API_MAX_BODY_BYTES"
# A client's JSON may spell the payload in up to three times the bytes of the compact UTF-8
# encoding the payload limit measures: with ensure_ascii (Python's json.dumps default, and
# many other encoders'), a 2-byte character becomes \u00e9 (6 bytes) and a 4-byte one a
# surrogate pair \ud83d\ude00 (12 bytes). Spaces after separators add less (", " against
# ","). So the default body limit is three payloads, plus ENVELOPE_BYTES for the rest of the
# request (type, queue, priority, idempotency key, run_at...): the largest payload the
# library accepts is accepted over HTTP however the client escapes it, and one byte more is
# refused by the payload rule, with its own 413, rather than by the body limit.
ESCAPING_RATIO = 3
ENVELOPE_BYTES = 64 * 1024
# Waiting for a result (GET /api/v1/tasks/{id}?wait=): at most this many requests waiting at
# once per API process, and how often each reads its task in case a notification was missed.
ENV_MAX_WAITERS = "PGQUEUE_API_MAX_WAITERS"
DEFAULT_MAX_WAITERS = 10_000
ENV_WAIT_POLL = "PGQUEUE_API_WAIT_POLL_SECONDS"
DEFAULT_WAIT_POLL = 5.0
# How long a request's body may take to arrive once its head has: a client that sends its
# head and then dribbles the body would otherwise hold its connection for as long as it likes.
ENV_BODY_TIMEOUT = "PGQUEUE_API_BODY_TIMEOUT"
DEFAULT_BODY_TIMEOUT = 60.0


# Tokens as given: a mapping of token -> scopes, or a set of entries in the syntax of
# PGQUEUE_API_TOKENS (``TOKEN`` for admin, ``SCOPE[+SCOPE]:TOKEN``).
Tokens = Mapping[str, Iterable[str]] | Set[str]


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """How the API runs. ``tokens`` empty means no authentication: the API then answers only
    requests from its own machine (unless ``allow_unauthenticated``) sent to a loopback name
    (unless ``allowed_hosts`` says otherwise)."""

    # Out of repr: settings get printed and logged, and both may hold secrets.
    database_url: str | None = dataclasses.field(default=None, repr=False)
    # Token -> its scopes (pgqueue.api.scopes), once built: a set of entries is parsed.
    tokens: Tokens = dataclasses.field(default=frozenset(), repr=False)
    # The Host names (or IP literals) requests may be sent to; ``*``: any. None: any when
    # tokens are configured (a rebinding page cannot send one), else the loopback names.
    allowed_hosts: Set[str] | None = None
    # Without tokens, serve requests from other machines too (something in front of the API
    # authenticates: a host application's login, a proxy). Not recommended otherwise.
    allow_unauthenticated: bool = False
    # None: three times the payload limit (PGQUEUE_MAX_PAYLOAD_BYTES) plus ENVELOPE_BYTES.
    max_body_bytes: int | None = None
    # Seconds for a request's whole body to arrive (else 408); PGQUEUE_API_BODY_TIMEOUT.
    body_timeout: float = DEFAULT_BODY_TIMEOUT
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
        # Checked here, so that a short token or an unknown scope stops the start.
        if isinstance(self.tokens, Mapping):
            tokens = scopes.check_scopes(self.tokens, "ApiSettings.tokens")
        else:
            tokens = scopes.parse_tokens(self.tokens, "ApiSettings.tokens")
        object.__setattr__(self, "tokens", tokens)
        if self.allowed_hosts is not None:
            where = "ApiSettings.allowed_hosts"
            hosts = frozenset(_allowed_host(h, where) for h in self.allowed_hosts)
            object.__setattr__(self, "allowed_hosts", hosts)

    def token_scopes(self) -> Mapping[str, frozenset[str]]:
        """Each token with its scopes."""
        tokens = self.tokens
        assert isinstance(tokens, dict)  # made so by __post_init__
        return tokens

    def host_check(self) -> Callable[[str], bool] | None:
        """Whether a request's host (from its Host header, without the port, lower case) may
        be served; None when any host may."""
        if self.allowed_hosts is None:
            return None if self.tokens else is_loopback_host
        if "*" in self.allowed_hosts:
            return None
        return self.allowed_hosts.__contains__

    def body_limit(self) -> int:
        """The most bytes a request body may have: ``max_body_bytes`` when set, else three
        times the payload limit plus :data:`ENVELOPE_BYTES` (see :data:`ESCAPING_RATIO`), so
        that the largest payload the library accepts is accepted over HTTP too (and refused,
        one byte over, by the payload rule with its own 413, not by this one)."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return ESCAPING_RATIO * config.max_payload_bytes() + ENVELOPE_BYTES

    @classmethod
    def from_env(cls) -> ApiSettings:
        """Tokens from ``PGQUEUE_API_TOKENS`` (comma-separated) and/or the file named by
        ``PGQUEUE_API_TOKENS_FILE`` (one per line, # comments), each ``TOKEN`` or
        ``SCOPE[+SCOPE]:TOKEN``; the Host names from ``PGQUEUE_API_ALLOWED_HOSTS``
        (comma-separated); ``PGQUEUE_API_ALLOW_UNAUTHENTICATED`` (1 or 0); the body limit
        from ``PGQUEUE_API_MAX_BODY_BYTES`` (unset: three payload limits plus 64 KiB); the
        waits' from ``PGQUEUE_API_MAX_WAITERS`` and ``PGQUEUE_API_WAIT_POLL_SECONDS``; the time a
        body may take from ``PGQUEUE_API_BODY_TIMEOUT``."""
        pooler = pooling.resolve_pooler()  # a bad PGQUEUE_POOLER is refused here, not later
        entries = [t.strip() for t in os.environ.get(ENV_TOKENS, "").split(",") if t.strip()]
        tokens = scopes.parse_tokens(entries, ENV_TOKENS)
        path = os.environ.get(ENV_TOKENS_FILE, "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigurationError(f"{ENV_TOKENS_FILE}: cannot read {path}: {exc}") from None
            listed = [t for t in (ln.strip() for ln in lines) if t and not t.startswith("#")]
            from_file = scopes.parse_tokens(listed, ENV_TOKENS_FILE)
            tokens = scopes.merge(tokens, from_file, f"{ENV_TOKENS} and {ENV_TOKENS_FILE}")
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
        raw = os.environ.get(ENV_BODY_TIMEOUT, "").strip()
        try:
            body_timeout = float(raw) if raw else DEFAULT_BODY_TIMEOUT
        except ValueError:
            raise ConfigurationError(f"{ENV_BODY_TIMEOUT} must be seconds, not {raw!r}") from None
        if not 0 < body_timeout < float("inf"):
            raise ConfigurationError(f"{ENV_BODY_TIMEOUT} must be more than 0 seconds, not {raw!r}")
        return cls(
            tokens=tokens,
            allowed_hosts=_allowed_hosts_from_env(),
            allow_unauthenticated=_flag(ENV_ALLOW_UNAUTHENTICATED),
            max_body_bytes=max_body,
            body_timeout=body_timeout,
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


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("", "0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be 1 or 0, not {raw!r}")


def _allowed_hosts_from_env() -> frozenset[str] | None:
    raw = os.environ.get(ENV_ALLOWED_HOSTS, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        return None
    return frozenset(_allowed_host(n, ENV_ALLOWED_HOSTS) for n in names)


def _allowed_host(name: str, where: str) -> str:
    if name.strip() == "*":
        return "*"
    host = host_name(name)
    if host is None:
        raise ConfigurationError(
            f"{where}: {name!r} is not a host name or IP address (list names such as "
            "queue.example.com, 10.0.0.5 or [::1], comma-separated, or * for any)"
        )
    return host


def host_name(value: str) -> str | None:
    """The host of a Host header (or of an allowed-hosts entry): lower case, without the
    port, an IPv6 address without its brackets, a name without a trailing dot; None when it
    is not one."""
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if end < 0 or not _is_ip(host, 6) or not (rest == "" or _is_port(rest)):
            return None
        return host
    if text.count(":") > 1:  # an IPv6 address written without brackets
        return text if _is_ip(text, 6) else None
    host, colon, port = text.partition(":")
    if colon and not _is_port(colon + port):
        return None
    host = host.removesuffix(".")
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-._")
    if not host or not set(host) <= allowed:
        return None
    return host


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit() and len(text) <= 6


def _is_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """``localhost``, an address of 127.0.0.0/8, or ``::1``: the names that reach this
    machine whatever DNS says, and so the only ones a tokenless API answers by default."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
