"""Errors as the command line reports them: one line on stderr and an exit code.

Usage errors (bad arguments, values the library rejects) exit with 2, every other error with
1, an interrupt with 130; ``--debug`` shows the traceback instead of the line. Commands only
raise; deciding the line and the code here keeps every command's failures alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

import typer

from pgqueue.cli.state import state
from pgqueue.errors import PgQueueError, ValidationError


class UsageProblem(typer.BadParameter):
    """A usage error about how options combine rather than one value (exit code 2)."""

    def format_message(self) -> str:
        return self.message


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(message: str, code: int) -> NoReturn:
    typer.secho(f"error: {_one_line(message)}", fg=typer.colors.RED, err=True)
    sys.exit(code)


def exit_reporting_errors(run: Callable[[], object]) -> NoReturn:
    """Run the command line and exit with its code, or with one readable line per error.

    ``run`` calls the app with typer's standalone mode off, so that usage errors come back
    here instead of typer's multi-line boxes."""
    try:
        code = run()
    except typer.TyperException as exc:  # usage errors (exit code 2)
        exit_code = getattr(exc, "exit_code", 2)
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help has been printed
            sys.exit(exit_code)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        # typer validates some values with pydantic, whose messages start "Value error, ".
        message = exc.format_message().replace("Value error, ", "")
        _fail(message + hint, exit_code)
    except ValidationError as exc:  # a value the library refused is a usage error too
        if state.debug:
            raise
        _fail(str(exc), 2)
    except PgQueueError as exc:
        if state.debug:
            raise
        _fail(str(exc), 1)
    except typer.Abort:
        _fail("aborted", 1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if state.debug:
            raise
        _fail(f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", 1)
    sys.exit(code if isinstance(code, int) else 0)
