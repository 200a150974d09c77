"""The global options (``--database-url``, ``--json``, ``--debug``), kept where every command
and the error handling can read them.

Typer hands the root callback's options to that callback only; the commands and ``main``
need them too, so the callback writes them into one module-level :class:`State`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue.config import resolve_database_url


class State:
    database_url: str | None = None
    json: bool = False
    debug: bool = False

    def url(self) -> str:
        """Resolved only when a command needs a database: resolving may start the embedded
        server, which ``--help`` or ``grant --print`` must not do."""
        return resolve_database_url(self.database_url)


state = State()


def main_options(
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="PGQUEUE_DATABASE_URL",
            help="PostgreSQL URL (default: $PGQUEUE_DATABASE_URL, else the embedded server).",
            show_envvar=True,
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    """The root command's callback (registered in :mod:`pgqueue.cli.root`): runs before
    every command, so each starts from the options of this invocation, not a previous one's
    (the tests invoke many in one process)."""
    state.database_url = database_url
    state.json = json_output
    state.debug = debug
