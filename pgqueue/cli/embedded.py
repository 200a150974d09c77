"""``pgqueue embedded``: the PostgreSQL server pgqueue starts for itself when no database URL
is configured, so that it can be reached with other tools and stopped when not wanted."""

from __future__ import annotations

import typer

from pgqueue.cli.output import emit

group = typer.Typer(
    help="The embedded PostgreSQL used when no database URL is configured.",
    no_args_is_help=True,
)


@group.command("url")
def embedded_url() -> None:
    """Start the embedded server if needed and print its URL (for psql and other tools)."""
    from pgqueue import embedded

    url = embedded.database_url()
    emit({"url": url, "data_dir": str(embedded.data_dir())}, url)


@group.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (its data stays; the next command starts it again)."""
    from pgqueue import embedded

    stopped = embedded.stop()
    emit({"stopped": stopped}, "stopped" if stopped else "the embedded server was not running")
