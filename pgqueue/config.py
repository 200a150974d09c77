"""Settings from arguments and the environment, and database-URL validation.

A URL given as an argument wins over ``PGQUEUE_DATABASE_URL``; with neither, pgqueue uses its
embedded PostgreSQL (see :mod:`pgqueue.embedded`) so that a new user needs no server at all.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from pgqueue.errors import ConfigurationError, InvalidDatabaseURL

ENV_DATABASE_URL = "PGQUEUE_DATABASE_URL"
ENV_MAX_PAYLOAD_BYTES = "PGQUEUE_MAX_PAYLOAD_BYTES"
ENV_MAX_RESULT_BYTES = "PGQUEUE_MAX_RESULT_BYTES"
ENV_EMBEDDED = "PGQUEUE_EMBEDDED"

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
# A result is stored in the task's row like its payload, read back by `pgqueue status`, the
# API and the dashboard: the same bound keeps a runaway handler from bloating the table.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
DEFAULT_QUEUE = "default"
MAX_NAME_LENGTH = 200

# The most tasks one call reads or changes (a list, a replay batch): one statement, one
# round trip, bounded. Here, not in operations.py, so that the CLI can declare its options
# with it without importing the library (and psycopg) for `--help`.
MAX_BATCH = 10_000

# A worker that recycles itself (too many handler threads past their timeouts, see
# WorkerConfig.max_overrunning) exits with this code so that its supervisor replaces it:
# EX_TEMPFAIL, a failure that a restart cures (systemd's Restart=on-failure restarts it, and
# ``--processes N`` restarts such a child at once, without the crash backoff). Here, not in
# the worker, so that the CLI's help and the supervisor read it without importing the worker.
EXIT_RECYCLE = 75

_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg_async")


# A password in the query string (``?password=...``, ``&sslpassword=...``), which libpq accepts.
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:ssl)?password=)[^&#]*")
# A password in a libpq key=value string (``host=db password=secret``, quoted or not).
_KEYWORD_PASSWORD = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)")


def redact(url: str) -> str:
    """The URL with every password in it replaced, for messages and logs: the one in the
    authority, ``password``/``sslpassword`` in the query string, and, in a string that is not
    a URL at all (``user:secret@host``), whatever stands between the first ``:`` and the
    last ``@``."""
    url = _QUERY_PASSWORD.sub(r"\1***", url)
    if "://" not in url:
        url = _KEYWORD_PASSWORD.sub(r"\1***", url)
        if "@" in url and ":" in url.rpartition("@")[0]:
            user = url.rpartition("@")[0].partition(":")[0]
            return f"{user}:***@{url.rpartition('@')[2]}"
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _without_userinfo_tokens(reason: str, url: str) -> str:
    """libpq's reason with any quoted token taken from the URL's user:password part masked
    (a bad percent-escape in the password is quoted back verbatim)."""
    authority = url.partition("://")[2].partition("/")[0]
    userinfo = authority.rpartition("@")[0]
    if not userinfo:
        return reason
    return re.sub(
        r'"([^"]*)"', lambda m: '"***"' if m.group(1) and m.group(1) in userinfo else m[0], reason
    )


def validate_database_url(url: str) -> str:
    """Return a libpq-ready URL, or raise InvalidDatabaseURL saying what is wrong with it.

    SQLAlchemy spellings (``postgresql+psycopg://``) are accepted and normalised, so one
    setting can serve pgqueue and an application's SQLAlchemy engine alike.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidDatabaseURL("database URL is empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        if "=" in url:  # libpq's keyword form: host=db1,db2 port=5432,5432 dbname=app
            return _checked_by_libpq(url, url)
        raise InvalidDatabaseURL(
            f"database URL {redact(url)!r} has no scheme; expected postgresql://user@host:port/db "
            "(or libpq's keywords: host=... dbname=...)"
        )
    if scheme not in _SCHEMES:
        raise InvalidDatabaseURL(
            f"database URL scheme {scheme!r} is not PostgreSQL; expected one of "
            + ", ".join(f"{s}://" for s in _SCHEMES)
        )
    normalised = f"postgresql://{rest}"
    # A primary and its standbys: several host[:port], comma-separated, as libpq reads them
    # (postgresql://u@db1:5432,db2:5433/app?target_session_attrs=read-write); each port checked.
    hosts = rest.partition("/")[0].partition("?")[0].rpartition("@")[2]
    for host in hosts.split(","):
        try:
            port = urlsplit(f"postgresql://{host}").port  # raises on a bad port
        except ValueError as exc:
            raise InvalidDatabaseURL(f"database URL {redact(url)!r}: {exc}") from None
        if port == 0:
            raise InvalidDatabaseURL(f"database URL {redact(url)!r}: port 0 is not valid")
    return _checked_by_libpq(normalised, url)


def _checked_by_libpq(conninfo: str, given: str) -> str:
    """``conninfo`` if libpq's parser takes it, else InvalidDatabaseURL with its reason."""
    import psycopg  # here, not above: `pgqueue --help` reads this module and needs no driver

    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "not understood"
        reason = _without_userinfo_tokens(reason, given)
        raise InvalidDatabaseURL(f"database URL {redact(given)!r}: {reason}") from None
    return conninfo


def sqlalchemy_url(url: str) -> str:
    """The same URL spelled for SQLAlchemy's psycopg 3 dialect."""
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", validate_database_url(url))


def resolve_database_url(url: str | None) -> str:
    """The argument, else ``PGQUEUE_DATABASE_URL``, else the embedded server (started if needed)."""
    if url is not None:  # an explicit "" is a mistake, not a request for the default
        return validate_database_url(url)
    env = os.environ.get(ENV_DATABASE_URL, "").strip()
    if env:
        try:
            return validate_database_url(env)
        except InvalidDatabaseURL as exc:
            raise InvalidDatabaseURL(f"{ENV_DATABASE_URL}: {exc}") from None
    if not embedded_allowed():
        raise ConfigurationError(
            f"no database URL: set {ENV_DATABASE_URL} or pass --database-url "
            f"({ENV_EMBEDDED}=off forbids falling back to the embedded PostgreSQL)"
        )
    from pgqueue import embedded

    return embedded.database_url()


def embedded_allowed() -> bool:
    """Whether a missing URL may start the embedded server: ``PGQUEUE_EMBEDDED``, ``on``
    unless set to ``off``. A deployment sets it off, so that a service whose environment lost
    its URL fails at start instead of quietly running a private queue no producer reaches."""
    raw = os.environ.get(ENV_EMBEDDED, "").strip().lower()
    if raw in ("", "on", "1", "true", "yes"):
        return True
    if raw in ("off", "0", "false", "no"):
        return False
    raise ConfigurationError(f"{ENV_EMBEDDED} must be on or off, not {raw!r}")


def _byte_limit(name: str, default: int) -> int:
    """A size limit from the environment variable ``name``: a positive integer, or
    ``default`` when unset or blank; anything else is a ConfigurationError naming ``name``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, not {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"{name} must be positive, not {value}")
    return value


def max_payload_bytes() -> int:
    """The payload size limit: ``PGQUEUE_MAX_PAYLOAD_BYTES`` or 1 MiB."""
    return _byte_limit(ENV_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PAYLOAD_BYTES)


def max_result_bytes() -> int:
    """The result size limit (a handler's return value, or ``complete``'s ``result``, as
    compact UTF-8 JSON): ``PGQUEUE_MAX_RESULT_BYTES`` or 1 MiB."""
    return _byte_limit(ENV_MAX_RESULT_BYTES, DEFAULT_MAX_RESULT_BYTES)


ENV_MAX_SNOOZES = "PGQUEUE_MAX_SNOOZES"
DEFAULT_MAX_SNOOZES = 100
MAX_MAX_SNOOZES = 1_000_000


def max_snoozes() -> int:
    """How many times a task may snooze (a handler's ``Snooze``) before a snooze counts as a
    failed attempt: ``PGQUEUE_MAX_SNOOZES`` or 100. Read by the worker at its start."""
    raw = os.environ.get(ENV_MAX_SNOOZES)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_SNOOZES
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{ENV_MAX_SNOOZES} must be an integer, not {raw!r}") from None
    if not 0 <= value <= MAX_MAX_SNOOZES:
        raise ConfigurationError(
            f"{ENV_MAX_SNOOZES} must be from 0 to {MAX_MAX_SNOOZES}, not {value}"
        )
    return value


ENV_SNAPSHOT_WARN_SECONDS = "PGQUEUE_SNAPSHOT_WARN_SECONDS"
DEFAULT_SNAPSHOT_WARN_SECONDS = 60.0


def snapshot_warn_seconds() -> float:
    """How old a snapshot holding back cleanup may get before stats, /metrics and the
    dashboard warn: ``PGQUEUE_SNAPSHOT_WARN_SECONDS`` or 60 s."""
    raw = os.environ.get(ENV_SNAPSHOT_WARN_SECONDS)
    if raw is None or not raw.strip():
        return DEFAULT_SNAPSHOT_WARN_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_SNAPSHOT_WARN_SECONDS} must be a number of seconds, not {raw!r}"
        ) from None
    if not value > 0:
        raise ConfigurationError(f"{ENV_SNAPSHOT_WARN_SECONDS} must be positive, not {raw!r}")
    return value
