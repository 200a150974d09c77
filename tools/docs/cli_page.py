"""The command line reference: every command of ``pgqueue`` with its help, its arguments and
its options, read from the click tree that typer builds from ``pgqueue.cli.app``.

The commands are walked as the shell would reach them (``list_commands`` and ``get_command``,
which load each command's module), so the page lists exactly what ``pgqueue --help`` and each
command's ``--help`` offer, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tools.docs.text import cell, code, paragraphs

INTRO = """\
# Command line

Every command of `pgqueue`, generated from the commands themselves: what each one's `--help`
says, in the order `pgqueue --help` lists them. For how to use them together, see
[Using the command line](../how-to/cli.md).

Options given before the command (`pgqueue --database-url URL status ID`) apply to every
command; `--json` is accepted before or after the command. Errors are one line on stderr:
usage errors (bad arguments, values the library refuses) exit with 2, other errors with 1;
`--debug` shows the traceback instead.
"""


def commands(root: Any = None) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Every command and group below the root, with its path and its click context, depth
    first in listing order; the root itself first, with the path ``()``."""
    import typer.main

    if root is None:
        from pgqueue.cli import app

        root = typer.main.get_command(app)
    # typer carries its own copy of click: its classes, not the click package's, are used here.
    top = root.context_class(root, info_name="pgqueue")

    def walk(command: Any, path: tuple[str, ...], ctx: Any) -> Iterator[Any]:
        yield path, command, ctx
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is None or sub.hidden:
                    continue
                yield from walk(
                    sub, (*path, name), sub.context_class(sub, info_name=name, parent=ctx)
                )

    yield from walk(root, (), top)


def anchor(path: tuple[str, ...]) -> str:
    return "-".join(("pgqueue", *path))


def _usage(command: Any, ctx: Any) -> str:
    return " ".join(["pgqueue", *ctx.command_path.split()[1:], *command.collect_usage_pieces(ctx)])


def _params(command: Any, ctx: Any, kind: str) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False) or param.param_type_name != kind:
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        rows.append(f"| {code(names)} | {cell(help_text)} |")
    return rows


def _section(path: tuple[str, ...], command: Any, ctx: Any) -> str:
    title = " ".join(("pgqueue", *path)) if path else "pgqueue (global options)"
    out = [f"## `{title}` {{#{anchor(path)}}}", "", "```", _usage(command, ctx), "```", ""]
    if command.help:
        out += [paragraphs(command.help), ""]
    arguments = _params(command, ctx, "argument")
    if arguments:
        out += ["| argument | |", "|---|---|", *arguments, ""]
    options = _params(command, ctx, "option")
    if options:
        out += ["| option | |", "|---|---|", *options, ""]
    if hasattr(command, "list_commands"):
        subs = [
            f"[`{name}`](#{anchor((*path, name))})"
            for name in command.list_commands(ctx)
            if not getattr(command.get_command(ctx, name), "hidden", False)
        ]
        out += ["Commands: " + ", ".join(subs) + ".", ""]
    return "\n".join(out)


def render(root: Any = None) -> str:
    """The page's Markdown."""
    return "\n".join([INTRO, *(_section(*c) for c in commands(root))])
