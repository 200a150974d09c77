"""The global options (``--database-url``, ``--pooler``, ``--json``, ``--debug``), kept where
every command and the error handling can read them.

Typer hands the root callback's options to that callback only; the commands and ``main``
need them too, so the callback writes them into one module-level :class:`State`.

``--json`` is also accepted after the command (``pgqueue status ID --json``): people add it
at the end as often as at the start. :class:`RootGroup` gives every command of the tree the
same option, once, where the tree is built, so that no command can lack it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
import typer.core
import typer.main

from pgqueue.cli.coercion import plain_coercion
from pgqueue.config import resolve_database_url
from pgqueue.pooling import ENV_POOLER, Pooler, resolve_pooler


class State:
    database_url: str | None = None
    # The pooler in front of the database (pgqueue.pooling): every command that opens a
    # connection opens it for this mode; `serve` and `worker` hand it on.
    pooler: Pooler = "none"
    json: bool = False
    debug: bool = False

    def reset(self) -> None:
        """Back to the defaults: a usage error can stop a run before the root callback sets
        them, and the tests run many invocations in one process."""
        self.database_url = None
        self.pooler = "none"
        self.json = False
        self.debug = False

    def url(self) -> str:
        """Resolved only when a command needs a database: resolving may start the embedded
        server, which ``--help`` or ``grant --print`` must not do."""
        return resolve_database_url(self.database_url)


state = State()

ROOT_JSON_HELP = (
    "Machine-readable output: one JSON document on stdout; an error is one JSON document on "
    "stderr, with the same exit code. Also accepted after the command."
)
JSON_HELP = "Machine-readable output (also accepted before the command)."


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
    pooler: Annotated[
        str | None,
        typer.Option(
            "--pooler",
            envvar=ENV_POOLER,
            metavar="MODE",
            help="The pooler in front of the database: none, session, or transaction "
            "(PgBouncer, Supavisor, RDS Proxy in transaction mode: no prepared statements, "
            "and waits poll unless $PGQUEUE_LISTEN_URL gives a direct URL to LISTEN on).",
            show_envvar=True,
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help=ROOT_JSON_HELP)] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    """The root command's callback (registered in :mod:`pgqueue.cli.root`): runs before
    every command, so each starts from the options of this invocation, not a previous one's
    (the tests invoke many in one process). A ``--json`` after the command is read later,
    when that command's own options are."""
    state.database_url = database_url
    state.json = json_output
    state.debug = debug
    # Checked here, before any command runs: a bad value is a configuration error (exit 1).
    state.pooler = resolve_pooler(pooler, name=f"--pooler ({ENV_POOLER})")


def _set_json(value: bool) -> None:
    if value:
        state.json = True


def _after_command_option() -> Any:
    """``--json`` as a command's own option, built by typer from a declaration like any other
    (typer's click is its own: building the parameter by hand would reach into it)."""
    probe = typer.Typer()

    @probe.command()
    def command(
        json_output: Annotated[
            bool,
            # Eager: set before a missing argument or a bad value of the same command is
            # reported, so that the error is rendered as JSON too.
            typer.Option(
                "--json", help=JSON_HELP, is_eager=True, expose_value=False, callback=_set_json
            ),
        ] = False,
    ) -> None:
        pass

    return typer.main.get_command(probe).params[0]


def plain_help(command: Any) -> None:
    """Help as click writes it, not in rich's boxes: those cut option names short at 80
    columns (``--allow-unauthenticat…``) and show a flag as taking a value (``--json
    <bool>``); click's wraps the help text and keeps every name and summary whole."""
    command.rich_markup_mode = None
    for param in getattr(command, "params", []):
        plain_metavar(param)
    # A group lists its commands by their first paragraph, whole: click would cut it to fit
    # one line ("Submit a task: its payload as --payload JSON, or a function...").
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(sub.help.split("\n\n")[0].split())


# Words in a number option's name that say it is a duration in seconds.
_SECONDS_WORDS = {"seconds", "interval", "timeout", "period", "retention", "after", "grace"}


def plain_metavar(param: Any) -> None:
    """A conventional placeholder where the declaration gave none: typer shows the Python
    type (``--queue <list[str]>``, ``--concurrency <int range>``, ``--log-level <str>``),
    which says nothing of what to write. Counts read ``N``, durations ``SECONDS``, memory
    ``MB``, and text the last word of the option's name (``--log-level LEVEL``, ``--queue
    QUEUE``); an argument its own name (``REGISTRY``). Flags and choices keep theirs."""
    descriptor = getattr(param, "type_descriptor", None)
    if param.param_type_name == "argument" and descriptor is not None:
        # Its name says what to write; typer would add the Python type after it (TYPE <str>).
        param.display_type_rich = lambda ctx: None
    if param.metavar is not None or getattr(param, "is_flag", False) or descriptor is None:
        return
    if descriptor.is_choice:
        return
    words = set(param.name.split("_"))
    annotation = descriptor.annotation
    if param.param_type_name == "argument":
        param.metavar = param.name.upper()
    elif "memory" in words:
        param.metavar = "MB"
    elif annotation is int:
        param.metavar = "N"
    elif annotation is float:
        param.metavar = "SECONDS" if words & _SECONDS_WORDS else "NUMBER"
    else:
        longest = max(param.opts, key=len).lstrip("-")
        param.metavar = longest.rsplit("-", 1)[-1].upper()


class RootGroup(typer.core.TyperGroup):
    """The root command's group: adds ``--json`` to every command and group below it, and
    gives them all plain help (:func:`plain_help`).

    Typer builds the click tree anew for each run (and for each ``CliRunner.invoke``), the
    subcommands before the root, so the commands given are all there when this runs; one
    added later (a lazily loaded one) gets the option from :meth:`with_json_option`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._json_option = _after_command_option()
        plain_coercion(self)  # the root's own options (--database-url, ...)
        plain_help(self)
        for command in self.commands.values():
            self.with_json_option(command)

    def with_json_option(self, command: Any) -> Any:
        """``command`` and every command below it, given ``--json`` (once), and the plain
        coercion of their options (pgqueue/cli/coercion.py: no pydantic for plain values)."""
        plain_coercion(command)
        option = self._json_option
        pending = [command]
        while pending:
            cmd = pending.pop()
            plain_help(cmd)
            if not any(p.name == option.name for p in cmd.params):
                cmd.params.append(option)
            pending.extend(getattr(cmd, "commands", {}).values())
        return command
