"""``pgqueue serve``: the HTTP API under uvicorn.

It refuses to listen beyond loopback without API tokens unless told to: an API open to the
network without authentication would let anyone submit, cancel and discard tasks. Before
uvicorn's own lines it says where the API and the dashboard are, the database (password
masked) and whether authentication is on (``--json``: the same as one JSON document).

uvicorn runs with the limits of :mod:`pgqueue.api.server` (a bounded request head, a timeout
for it and for idle connections, a bound on connections) and an access log that masks
credential-looking query values.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from pgqueue.cli.errors import UsageProblem
from pgqueue.cli.output import emit
from pgqueue.cli.state import state
from pgqueue.config import redact
from pgqueue.errors import PgQueueError

if TYPE_CHECKING:
    from pgqueue.api import ApiSettings

commands = typer.Typer()

ENV_MAX_HEADER_BYTES = "PGQUEUE_API_MAX_HEADER_BYTES"
ENV_HEADER_TIMEOUT = "PGQUEUE_API_HEADER_TIMEOUT"
ENV_KEEP_ALIVE_TIMEOUT = "PGQUEUE_API_KEEP_ALIVE_TIMEOUT"
ENV_LIMIT_CONCURRENCY = "PGQUEUE_API_LIMIT_CONCURRENCY"
# Above PGQUEUE_API_MAX_WAITERS by default: room for ordinary requests and idle keep-alive
# connections (uvicorn counts both) while every waiter the API allows is waiting.
CONCURRENCY_ABOVE_WAITERS = 1_000


MaxHeaderBytesOption = Annotated[
    int,
    typer.Option(
        min=1024,
        envvar=ENV_MAX_HEADER_BYTES,
        show_envvar=True,
        help="Largest request head (request line and headers); a larger one is refused "
        "with 431 and the connection closed.",
    ),
]
HeaderTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0.1,
        envvar=ENV_HEADER_TIMEOUT,
        show_envvar=True,
        help="Seconds a request's head may take to arrive, from the connection's start or "
        "the previous response; then 408 and the connection closed.",
    ),
]
KeepAliveTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0.1,
        envvar=ENV_KEEP_ALIVE_TIMEOUT,
        show_envvar=True,
        help="Seconds an idle connection (no request yet, or between requests) is kept open.",
    ),
]
LimitConcurrencyOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        envvar=ENV_LIMIT_CONCURRENCY,
        show_envvar=True,
        help="Connections and requests a server process holds at once; beyond them a "
        "request gets 503. Default: PGQUEUE_API_MAX_WAITERS + 1000 (waiting requests "
        "hold theirs); it must exceed PGQUEUE_API_MAX_WAITERS.",
    ),
]


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _base_url(host: str, port: int) -> str:
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}"


def banner(
    host: str,
    port: int,
    database_url: str,
    tokens: int,
    allow_unauthenticated: bool,
    allowed_hosts: frozenset[str] | None = None,
) -> tuple[dict[str, object], str]:
    """What ``serve`` says before uvicorn does: where the API and the dashboard are, which
    database they serve (password masked), and whether a request needs a token, so that
    nobody has to read the code to find the dashboard, or learns from an attacker that
    authentication was off."""
    base = _base_url(host, port)
    if tokens:
        auth = f"on ({tokens} token{'s' if tokens != 1 else ''}: send Authorization: Bearer TOKEN)"
    elif allow_unauthenticated:
        auth = "OFF (--allow-unauthenticated): anyone who can reach the port can use the API"
    else:
        auth = "off (no PGQUEUE_API_TOKENS; listening on loopback only)"
    data: dict[str, object] = {
        "api_url": f"{base}/api/v1",
        "dashboard_url": f"{base}/dashboard/",
        "docs_url": f"{base}/docs",
        "database": redact(database_url),
        "authentication": bool(tokens),
        "allowed_hosts": sorted(allowed_hosts) if allowed_hosts is not None else None,
    }
    if allowed_hosts is not None:
        hosts = ", ".join(sorted(allowed_hosts))
    elif tokens:
        hosts = "any (a token is required; PGQUEUE_API_ALLOWED_HOSTS refuses other names)"
    else:
        hosts = "loopback names only (localhost, 127.0.0.1, ::1): PGQUEUE_API_ALLOWED_HOSTS"
    lines = [
        f"API:            {data['api_url']}  (OpenAPI: {data['docs_url']})",
        f"dashboard:      {data['dashboard_url']}",
        f"database:       {data['database']}",
        f"authentication: {auth}",
        f"Host header:    {hosts}",
    ]
    if host in ("0.0.0.0", "::"):
        lines.append(f"listening on every {'IPv6' if host == '::' else 'IPv4'} interface")
    return data, "\n".join(lines)


@commands.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 1,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Listen on a non-loopback address without API tokens (not recommended).",
        ),
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A name clients reach the API by (their Host header), repeatable; '*' for "
            "any. Sets PGQUEUE_API_ALLOWED_HOSTS. Default: loopback names without tokens, any "
            "name with them.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    max_header_bytes: MaxHeaderBytesOption = 64 * 1024,
    header_timeout: HeaderTimeoutOption = 10.0,
    keep_alive_timeout: KeepAliveTimeoutOption = 5.0,
    limit_concurrency: LimitConcurrencyOption = None,
) -> None:
    """Serve the HTTP API (tokens: PGQUEUE_API_TOKENS or PGQUEUE_API_TOKENS_FILE)."""
    import os

    try:
        import uvicorn

        from pgqueue.api import ApiSettings
        from pgqueue.api import server as limits
    except ImportError as exc:
        raise PgQueueError(
            f"the HTTP API needs its extra dependencies ({exc.name} is missing): "
            "pip install 'pgqueue-jobs[api]'"
        ) from None
    from pgqueue.api.settings import ENV_ALLOW_UNAUTHENTICATED, ENV_ALLOWED_HOSTS

    # Through the environment, as the URL below: every server process's app reads them.
    if allowed_host:
        os.environ[ENV_ALLOWED_HOSTS] = ",".join(allowed_host)
    if allow_unauthenticated:
        os.environ[ENV_ALLOW_UNAUTHENTICATED] = "1"
    settings = ApiSettings.from_env()
    _check_exposure(host, settings, allow_unauthenticated)
    concurrency = _concurrency(limit_concurrency, settings.max_waiters)
    # Resolve once here (starting the embedded server if needed) and hand the URL to every
    # server process through the environment, where the app factory reads it.
    url = state.url()
    os.environ["PGQUEUE_DATABASE_URL"] = url
    os.environ["PGQUEUE_POOLER"] = state.pooler  # --pooler, for the app's pool and waits
    data, human = banner(
        host,
        port,
        url,
        len(settings.tokens),
        allow_unauthenticated,
        frozenset(settings.allowed_hosts) if settings.allowed_hosts is not None else None,
    )
    emit(data, human)
    open_files, wanted = limits.raise_open_files_limit(concurrency)
    if open_files < wanted:
        print(
            f"warning: {open_files} open files allowed (ulimit -n), fewer than the "
            f"{wanted} that --limit-concurrency {concurrency} needs: raise the limit "
            "(systemd: LimitNOFILE=) or lower --limit-concurrency",
            file=sys.stderr,
        )
    sys.stdout.flush()  # before uvicorn's lines, also when stdout is a pipe
    connection = limits.ConnectionLimits(
        max_header_bytes=max_header_bytes,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
    )
    uvicorn.run(
        "pgqueue.api:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        log_config=limits.log_config(),
        proxy_headers=False,
        http=limits.protocol(connection),
        limit_concurrency=concurrency,
    )


def _check_exposure(host: str, settings: ApiSettings, allow_unauthenticated: bool) -> None:
    """Refuse a start that would serve the network without tokens by mistake, or that would
    answer no other machine at all (the Host check's default is loopback names)."""
    from pgqueue.api.settings import ENV_ALLOWED_HOSTS

    if not settings.tokens and not _is_loopback(host):
        if not allow_unauthenticated:
            raise UsageProblem(
                f"refusing to listen on {host} without authentication: set PGQUEUE_API_TOKENS "
                "(or PGQUEUE_API_TOKENS_FILE), listen on 127.0.0.1, or pass "
                "--allow-unauthenticated"
            )
        if settings.allowed_hosts is None:
            # Without tokens the Host check is what stops DNS rebinding; its default would
            # refuse every request from another machine, which is not what was asked for.
            raise UsageProblem(
                f"listening on {host} without tokens, only requests naming a loopback host "
                "would be answered: name the hosts clients use with --allowed-host (or "
                f"{ENV_ALLOWED_HOSTS}; '*' for any, which leaves DNS rebinding open)"
            )


def _concurrency(limit: int | None, max_waiters: int) -> int:
    """--limit-concurrency, or its default; refused at or below the waiters the API allows,
    which would otherwise get uvicorn's 503 before the API's own limit is reached."""
    if limit is None:
        return max_waiters + CONCURRENCY_ABOVE_WAITERS
    if limit <= max_waiters:
        raise UsageProblem(
            f"--limit-concurrency {limit} is not above PGQUEUE_API_MAX_WAITERS ({max_waiters}): "
            "requests waiting for a result (?wait=) would take every connection; set "
            f"PGQUEUE_API_MAX_WAITERS below {limit} or raise --limit-concurrency",
            param_hint="'--limit-concurrency'",
        )
    return limit
