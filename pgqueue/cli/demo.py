"""``pgqueue demo``: a first look at pgqueue working, for someone who has just installed it.

The demo itself (:mod:`pgqueue.demo`) reports as it goes through ``say``; in a ``--json`` run
that stays quiet, so that stdout is one JSON document, the summary.
"""

from __future__ import annotations

import json

import typer

from pgqueue.cli.state import state

commands = typer.Typer()


@commands.command()
def demo() -> None:
    """See pgqueue work: migrate, enqueue a mix of tasks, run a worker, summarise."""
    from pgqueue.demo import run_demo

    def say(line: str) -> None:
        if not state.json:
            typer.echo(line)

    summary = run_demo(state.database_url, say, as_json=state.json)
    if state.json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"\n{summary['tasks']} tasks in {summary['seconds']} s: "
        f"{summary['completed']} completed ({summary['completed_after_retry']} after a retry), "
        f"{summary['dead_lettered']} dead-lettered"
    )
    for error in summary["dead_letter_errors"]:
        typer.echo(f"  dead-letter error: {error}")
    typer.echo("\nLook for yourself (psql, or `pgqueue stats` / `pgqueue dlq list`):")
    for sql in summary["sql"]:
        typer.echo(f"  {sql}")
