"""The ``pgqueue`` command line: thin over the library, with tables for people and --json.

Each command parses its arguments, calls :mod:`pgqueue.operations` on a connection from a
:class:`~pgqueue.client.Client`, and formats the answer; there is no SQL here. Errors are one
line on stderr: usage errors (bad arguments, values the library rejects) exit with 2, every
other error with 1; ``--debug`` shows the traceback instead.

The package is split by concern so that each part can be read on its own:

- :mod:`~pgqueue.cli.root`: the root app, the command tree in ``--help`` order, ``main``;
- shared plumbing: :mod:`~pgqueue.cli.state` (global options), :mod:`~pgqueue.cli.errors`
  (error lines and exit codes), :mod:`~pgqueue.cli.output` (``emit``),
  :mod:`~pgqueue.cli.database` (connections), :mod:`~pgqueue.cli.parsing` (payloads, counts,
  times, durations), :mod:`~pgqueue.cli.arguments` (options several commands share);
- the commands: :mod:`~pgqueue.cli.tasks`, :mod:`~pgqueue.cli.queues`,
  :mod:`~pgqueue.cli.dead_letters`, :mod:`~pgqueue.cli.limits`, :mod:`~pgqueue.cli.admin`,
  :mod:`~pgqueue.cli.workers`, :mod:`~pgqueue.cli.bench`, :mod:`~pgqueue.cli.serve`,
  :mod:`~pgqueue.cli.embedded`, :mod:`~pgqueue.cli.demo`.

The names below are what code outside the package uses: ``main`` is the console script,
``app`` the typer app, ``worker`` the command whose defaults the deploy manifests are checked
against, ``DEFAULT_QUEUE`` the queue it works on when given none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from pgqueue.cli.root import app, main
from pgqueue.config import DEFAULT_QUEUE

if TYPE_CHECKING:
    from pgqueue.cli.workers import worker

__all__ = ["DEFAULT_QUEUE", "_is_terminal", "app", "main", "worker"]


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal: the one name to replace to make the streams count as
    terminals (the tests do, to draw the progress bar); the dead-letter commands call it
    through this package at each call."""
    return stream.isatty()


def __getattr__(name: str) -> object:
    """``worker``, imported on first use: the package itself loads no command module."""
    if name == "worker":
        from pgqueue.cli.workers import worker

        return worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
