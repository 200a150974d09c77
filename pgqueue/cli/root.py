"""The root command: its global options, the command tree, and the entry point.

The tree is declared here and only here, in the order ``pgqueue --help`` lists it (the
top-level commands before the groups). The command modules each hold a ``commands`` app of
top-level commands (merged into the root, having no name) and/or a ``group`` (added under
the name given here); none of them imports this module.

A command's module is imported only when that command runs (or shows its own help):
``pgqueue status ID`` loads neither the worker nor FastAPI, and ``pgqueue --help`` none of
the command modules, nor psycopg. So that ``pgqueue --help`` can list the commands without
them, :data:`TREE` repeats each one's summary, the first paragraph of its help;
``tests/unit/test_imports.py`` fails when a summary and its command's help part.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

import typer
import typer.core
import typer.main

from pgqueue.cli.errors import exit_reporting_errors
from pgqueue.cli.state import RootGroup, main_options, state


@dataclasses.dataclass(frozen=True)
class Entry:
    """One command or group of the root, and where it lives."""

    name: str
    module: str  # under pgqueue.cli
    summary: str  # the first paragraph of its help: what `pgqueue --help` shows
    group: bool = False  # the module's `group`, added under `name`; else from its `commands`

    def load(self) -> Any:
        """The click command, built by typer exactly as an eager ``add_typer`` would."""
        # __import__, not importlib.import_module: `-X importtime` shows only the former.
        name = f"pgqueue.cli.{self.module}"
        __import__(name)
        module = sys.modules[name]
        holder = typer.Typer()
        if self.group:
            holder.add_typer(module.group, name=self.name)
        else:
            holder.add_typer(module.commands)
        return typer.main.get_group(holder).commands[self.name]

    def stand_in(self) -> Any:
        """What a listing needs of the command (its name and summary), without its module."""
        # short_help: listed whole, as plain_help (pgqueue/cli/state.py) lists a group's.
        return typer.core.TyperCommand(name=self.name, help=self.summary, short_help=self.summary)


TREE = (
    Entry(
        "enqueue",
        "tasks",
        "Submit a task: its payload as --payload JSON, or a function task's arguments as --arg.",
    ),
    Entry("status", "tasks", "Show one task: status, attempts, result, last error and timestamps."),
    Entry("list", "tasks", "List tasks, newest first."),
    Entry(
        "cancel",
        "tasks",
        "Cancel a task: a queued one at once, a running one by asking its handler to stop.",
    ),
    Entry(
        "stats",
        "queues",
        "Queued, running, waiting and dead-lettered tasks by queue and priority, and throughput.",
    ),
    Entry(
        "schedules",
        "queues",
        "Periodic tasks the workers declared: cron, time zone, last tick and next run.",
    ),
    Entry("migrate", "admin", "Create or upgrade the pgqueue schema (idempotent)."),
    Entry(
        "grant",
        "admin",
        "Grant ROLE what workers and the HTTP API need, and no DDL (run as the schema's owner).",
    ),
    Entry(
        "worker",
        "workers",
        "Run handlers for queued tasks until SIGTERM/SIGINT (a second signal, a second or more\n"
        "later, stops at once).",
    ),
    Entry(
        "bench",
        "bench",
        "Measure enqueue, drain and pickup latency on this database (in a queue of its own).",
    ),
    Entry(
        "serve",
        "serve",
        "Serve the HTTP API (tokens: PGQUEUE_API_TOKENS or PGQUEUE_API_TOKENS_FILE).",
    ),
    Entry(
        "demo",
        "demo",
        "See pgqueue work: migrate, enqueue a mix of tasks, run a worker, summarise.",
    ),
    Entry(
        "dlq",
        "dead_letters",
        "The dead-letter queue: tasks whose attempts are spent (status 'failed').",
        group=True,
    ),
    Entry(
        "queue",
        "queues",
        "Queues: pause and resume claiming, across every worker (settings live in the database).",
        group=True,
    ),
    Entry(
        "limit",
        "limits",
        "Limits on a task type or a queue, across every worker: how many run at once, how "
        "many start per period, and how many run at once per concurrency key.",
        group=True,
    ),
    Entry(
        "workflow",
        "workflows",
        "Workflows (chains, groups, chords): status, tasks, cancel, wait for the result.",
        group=True,
    ),
    Entry(
        "embedded",
        "embedded",
        "The embedded PostgreSQL used when no database URL is configured.",
        group=True,
    ),
    Entry(
        "celery",
        "celery",
        "Moving from Celery: forward the moved tasks' messages from its broker into pgqueue.",
        group=True,
    ),
)


class LazyRootGroup(RootGroup):
    """The root group of :data:`TREE`: each command built from its module when asked for.

    Every name is in ``commands`` from the start, as a stand-in (typer's "did you mean"
    reads the names there); :meth:`get_command` replaces a stand-in by the real command,
    except while the root's own help is written, which lists only names and summaries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entries = {entry.name: entry for entry in TREE}
        self._loaded: set[str] = set()
        self._listing = False
        for entry in TREE:
            self.commands[entry.name] = entry.stand_in()

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = self._entries.get(cmd_name)
        if entry is not None and not self._listing and cmd_name not in self._loaded:
            self.commands[cmd_name] = self.with_json_option(entry.load())
            self._loaded.add(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    cls=LazyRootGroup,
    help="pgqueue: a job queue that lives in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    # click's help is at most 80 columns wide by default, even in a wider terminal.
    context_settings={"max_content_width": 120},
)
app.callback()(main_options)


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
