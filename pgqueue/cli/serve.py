"""``pgqueue serve``: the HTTP API under uvicorn.

It refuses to listen beyond loopback without API tokens unless told to: an API open to the
network without authentication would let anyone submit, cancel and discard tasks.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue.cli.errors import UsageProblem
from pgqueue.cli.state import state
from pgqueue.errors import PgQueueError

commands = typer.Typer()


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Serve the HTTP API (tokens: PGQUEUE_API_TOKENS or PGQUEUE_API_TOKENS_FILE)."""
    import os

    try:
        import uvicorn

        from pgqueue.api import ApiSettings
    except ImportError as exc:
        raise PgQueueError(
            f"the HTTP API needs its extra dependencies ({exc.name} is missing): "
            "pip install 'pgqueue[api]'"
        ) from None
    settings = ApiSettings.from_env()
    if not settings.tokens and not _is_loopback(host) and not allow_unauthenticated:
        raise UsageProblem(
            f"refusing to listen on {host} without authentication: set PGQUEUE_API_TOKENS "
            "(or PGQUEUE_API_TOKENS_FILE), listen on 127.0.0.1, or pass --allow-unauthenticated"
        )
    # Resolve once here (starting the embedded server if needed) and hand the URL to every
    # server process through the environment, where the app factory reads it.
    os.environ["PGQUEUE_DATABASE_URL"] = state.url()
    uvicorn.run(
        "pgqueue.api:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        proxy_headers=False,
    )
