"""The ``pgqueue`` command line: thin over the library, with tables for people and --json."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from pgqueue import migrate as migrate_mod
from pgqueue.config import redact, resolve_database_url
from pgqueue.errors import PgQueueError

app = typer.Typer(
    help="pgqueue: a job queue that lives in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class State:
    database_url: str | None = None
    json: bool = False
    debug: bool = False

    def url(self) -> str:
        return resolve_database_url(self.database_url)


state = State()


@app.callback()
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
    state.database_url = database_url
    state.json = json_output
    state.debug = debug


def emit(data: Any, human: str) -> None:
    typer.echo(json.dumps(data, default=str) if state.json else human)


@app.command()
def migrate(
    check: Annotated[
        bool, typer.Option("--check", help="Only report; exit 1 if the schema is behind.")
    ] = False,
) -> None:
    """Create or upgrade the pgqueue schema (idempotent)."""
    url = state.url()
    before = migrate_mod.current(url)
    head = migrate_mod.head()
    if check:
        ok = before == head
        emit(
            {"current": before, "head": head, "up_to_date": ok},
            f"schema at {before or 'nothing'}; head is {head}: "
            + ("up to date" if ok else "behind, run `pgqueue migrate`"),
        )
        raise typer.Exit(0 if ok else 1)
    migrate_mod.upgrade(url)
    emit(
        {"previous": before, "current": head, "database": redact(url)},
        f"pgqueue schema at {head} (was {before or 'not installed'}) on {redact(url)}",
    )


def main() -> None:
    """Entry point: one readable line per error, a traceback only with --debug."""
    try:
        app()  # standalone: typer reports usage errors itself and exits 2
    except PgQueueError as exc:
        if state.debug:
            raise
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if state.debug:
            raise
        typer.secho(f"error: {type(exc).__name__}: {exc}", fg=typer.colors.RED, err=True)
        typer.echo("(run with --debug for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
