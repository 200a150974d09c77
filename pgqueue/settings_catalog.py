"""Every setting pgqueue reads from the environment, in one table: its variable, the command
line flag that overrides it (if any), its default, who reads it and what it does.

This is the one description of the settings: the documentation's configuration reference
(``docs/reference/configuration.md``) is generated from it, and
``tests/unit/test_settings_catalog.py`` fails when the package reads a ``PGQUEUE_*`` variable
that is not here, or when a row names a variable nothing reads. The values are read where they
are used (``pgqueue/config.py``, ``pgqueue/pooling.py``, ``pgqueue/api/settings.py``, ...);
this module is data only, and imports nothing.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable and what it controls."""

    env: str
    default: str  # as a reader sees it, in words when it is computed
    reader: str  # who reads it: "every command and the library", "`pgqueue serve`", ...
    description: str  # Markdown: what it does, and why one would change it
    flags: tuple[str, ...] = ()  # command line options that take its place, where given
    docs: str = ""  # the documentation page that says more, relative to docs/


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "PGQUEUE_DATABASE_URL",
        "the embedded server",
        "every command and the library's default client",
        "The database: `postgresql://user:pass@host:5432/db` (`postgres://` and "
        "`postgresql+psycopg://` are accepted too); `sslmode` and other libpq parameters go in "
        "the query string. Without it, commands start (or reuse) an embedded PostgreSQL in "
        "`PGQUEUE_HOME`.",
        flags=("pgqueue --database-url",),
        docs="databases.md",
    ),
    Setting(
        "PGQUEUE_POOLER",
        "`none`",
        "every command, workers and the library",
        "`transaction` behind PgBouncer, Supavisor or RDS Proxy in transaction mode: no "
        "prepared statements, and no LISTEN through the pooler.",
        flags=("pgqueue --pooler", "pgqueue worker --pooler"),
        docs="databases.md",
    ),
    Setting(
        "PGQUEUE_LISTEN_URL",
        "none",
        "workers and waits",
        "A direct URL (bypassing the pooler) used for LISTEN only. Without it, behind a "
        "transaction pooler, workers and waits poll instead of being woken.",
        flags=("pgqueue worker --listen-url",),
        docs="databases.md",
    ),
    Setting(
        "PGQUEUE_NOTIFY",
        "`on`",
        "enqueues",
        "`off`: enqueues send no NOTIFY, so concurrent producers' commits no longer queue on its "
        "lock; workers then find new tasks by polling.",
        docs="databases.md",
    ),
    Setting(
        "PGQUEUE_MAX_PAYLOAD_BYTES",
        "1048576",
        "enqueues",
        "The largest payload, measured as the UTF-8 text PostgreSQL gives back.",
        docs="payloads.md",
    ),
    Setting(
        "PGQUEUE_MAX_RESULT_BYTES",
        "1048576",
        "workers",
        "The largest result a handler may return (or `complete` may record), measured as the "
        "UTF-8 text PostgreSQL gives back. A larger one dead-letters the task at once, since "
        "running it again would not make its result smaller.",
        docs="how-to/results.md",
    ),
    Setting(
        "PGQUEUE_MAX_SNOOZES",
        "100",
        "workers, at start",
        "How many times a task may snooze (`Snooze`) before a snooze counts as a failed "
        "attempt, so that a task that snoozes forever still ends.",
        docs="how-to/retries.md",
    ),
    Setting(
        "PGQUEUE_SNAPSHOT_WARN_SECONDS",
        "60",
        "`pgqueue stats`, `/metrics` and the dashboard",
        "How old a snapshot holding back cleanup (an open transaction anywhere on the server) "
        "may get before they warn: while it is held, vacuum cannot remove finished tasks.",
        docs="explanation/guarantees.md",
    ),
    Setting(
        "PGQUEUE_WORKER_START_METHOD",
        "`fork` on Linux, `spawn` elsewhere",
        "`pgqueue worker --processes N`",
        "How the supervisor starts worker processes: `fork` or `spawn`. Spawn for an "
        "application whose imports do not survive a fork.",
        docs="deployment.md",
    ),
    Setting(
        "PGQUEUE_TRACING",
        "off",
        "the library and workers",
        "`1` turns OpenTelemetry spans on (with `opentelemetry-api` installed): a submit span, "
        "and an execution span in the submitter's trace.",
        docs="how-to/tracing.md",
    ),
    Setting(
        "PGQUEUE_HOME",
        "the platform's user data directory",
        "the embedded server",
        "Where the embedded PostgreSQL keeps its data.",
    ),
    Setting(
        "PGQUEUE_EMBEDDED",
        "`on`",
        "every command and the library's default client",
        "`off`: without a database URL, refuse to start (naming the setting) instead of "
        "falling back to the embedded PostgreSQL. Set it in deployments, so that a service "
        "whose environment lost its URL fails at once rather than running a private queue "
        "that no producer reaches.",
        docs="deployment.md",
    ),
    Setting(
        "PGQUEUE_EMBEDDED_PG_VERSION",
        "18",
        "the embedded server",
        "The embedded PostgreSQL's major version: 16 or 18.",
    ),
    Setting(
        "PGQUEUE_API_TOKENS",
        "none",
        "`pgqueue serve`",
        "API tokens, comma-separated: `TOKEN` (admin) or `SCOPE[+SCOPE]:TOKEN` with the scopes "
        "`metrics`, `read`, `submit` and `admin`; each 32 characters at least.",
        docs="security.md",
    ),
    Setting(
        "PGQUEUE_API_TOKENS_FILE",
        "none",
        "`pgqueue serve`",
        "A file of API tokens, one a line, in the syntax of `PGQUEUE_API_TOKENS`: keeps them "
        "out of the process's environment.",
        docs="security.md",
    ),
    Setting(
        "PGQUEUE_API_ALLOWED_HOSTS",
        "loopback names without tokens; any name with them",
        "`pgqueue serve`",
        "The names clients reach the API by (the `Host` header), comma-separated; others get "
        "400. This stops DNS rebinding from reaching an API without tokens.",
        flags=("pgqueue serve --allowed-host",),
        docs="security.md",
    ),
    Setting(
        "PGQUEUE_API_ALLOW_UNAUTHENTICATED",
        "off",
        "`pgqueue serve`",
        "`1`: without tokens, answer requests from other machines too (for when something in "
        "front of the API authenticates).",
        flags=("pgqueue serve --allow-unauthenticated",),
        docs="security.md",
    ),
    Setting(
        "PGQUEUE_API_MAX_BODY_BYTES",
        "three times `PGQUEUE_MAX_PAYLOAD_BYTES`, plus 64 KiB",
        "`pgqueue serve`",
        "The largest request body; more is 413. Three payloads, because a client's JSON may "
        "escape a character in up to three times its bytes.",
        docs="bad-input.md",
    ),
    Setting(
        "PGQUEUE_API_BODY_TIMEOUT",
        "60",
        "`pgqueue serve`",
        "Seconds for a request's whole body to arrive once its head has; later is 408 and the "
        "connection is closed.",
        docs="security.md",
    ),
    Setting(
        "PGQUEUE_API_MAX_WAITERS",
        "10000",
        "`pgqueue serve`",
        "Requests waiting for a result at once (`?wait=`) per API process; more get 503 with "
        "`Retry-After`.",
        docs="how-to/http-api.md",
    ),
    Setting(
        "PGQUEUE_API_WAIT_POLL_SECONDS",
        "5",
        "`pgqueue serve`",
        "How often a waiting request reads its task, in case a notification was missed.",
        docs="how-to/http-api.md",
    ),
    Setting(
        "PGQUEUE_API_MAX_HEADER_BYTES",
        "65536",
        "`pgqueue serve`",
        "The most a request line and its headers may hold; more is 431 and the connection is "
        "closed.",
        flags=("pgqueue serve --max-header-bytes",),
        docs="deployment.md",
    ),
    Setting(
        "PGQUEUE_API_HEADER_TIMEOUT",
        "10",
        "`pgqueue serve`",
        "Seconds for a request's head to arrive; later is 408 and the connection is closed.",
        flags=("pgqueue serve --header-timeout",),
        docs="deployment.md",
    ),
    Setting(
        "PGQUEUE_API_KEEP_ALIVE_TIMEOUT",
        "5",
        "`pgqueue serve`",
        "Seconds an idle connection (including one that never sent a request) stays open.",
        flags=("pgqueue serve --keep-alive-timeout",),
        docs="deployment.md",
    ),
    Setting(
        "PGQUEUE_API_LIMIT_CONCURRENCY",
        "`PGQUEUE_API_MAX_WAITERS` + 1000",
        "`pgqueue serve`",
        "Connections and requests per server process; more get 503. It must stay above "
        "`PGQUEUE_API_MAX_WAITERS`, or waiting requests would crowd out every other.",
        flags=("pgqueue serve --limit-concurrency",),
        docs="deployment.md",
    ),
)

# Names matching PGQUEUE_* in the package's source that are not settings, each with why.
NOT_SETTINGS: dict[str, str] = {
    "PGQUEUE_PROCESS_CHILD_START": (
        "the process executor's fork server spawns its children instead of forking them when "
        "it is `spawn`: for measuring the cost of a spawn, not for users"
    ),
    "PGQUEUE_TYPE": "not a variable: a placeholder in `pgqueue celery forward --name`'s message",
}
