"""The root command: its global options, the command tree, and the entry point.

The tree is assembled here and only here, in the order ``pgqueue --help`` lists it: typer
lists commands in the order they are added, the top-level commands before the groups. The
command modules each hold a ``commands`` app of top-level commands (merged into the root,
having no name) and/or a ``group`` (added under the name given here); none of them imports
this module.
"""

from __future__ import annotations

import logging

import typer

from pgqueue.cli import (
    admin,
    bench,
    dead_letters,
    demo,
    embedded,
    limits,
    queues,
    serve,
    tasks,
    workers,
)
from pgqueue.cli.errors import exit_reporting_errors
from pgqueue.cli.state import RootGroup, main_options, state

app = typer.Typer(
    cls=RootGroup,
    help="pgqueue: a job queue that lives in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.callback()(main_options)

app.add_typer(tasks.commands)  # enqueue, status, list, cancel
app.add_typer(queues.commands)  # stats, schedules
app.add_typer(admin.commands)  # migrate, grant
app.add_typer(workers.commands)  # worker
app.add_typer(bench.commands)  # bench
app.add_typer(serve.commands)  # serve
app.add_typer(demo.commands)  # demo
app.add_typer(dead_letters.group, name="dlq")
app.add_typer(queues.group, name="queue")
app.add_typer(limits.group, name="limit")
app.add_typer(embedded.group, name="embedded")


def main() -> None:
    """Entry point: one readable line per error, a traceback only with --debug."""
    # psycopg's pool warns through logging ("discarding closed connection") before the error
    # reaches us; with no handler configured, logging would print it as a second line. The
    # worker configures real handlers, which still get these records.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    state.reset()
    # Not standalone: usage errors come back to exit_reporting_errors instead of typer's
    # multi-line boxes.
    exit_reporting_errors(lambda: app(prog_name="pgqueue", standalone_mode=False))
