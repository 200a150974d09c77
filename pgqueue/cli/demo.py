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
    typer.echo("\n" + ending(summary["embedded_server"]))


def ending(embedded: bool) -> str:
    """Where a newcomer stands once the demo is over: what is still running on their machine
    and how to stop it, then what to read next."""
    lines = []
    if embedded:
        from pgqueue import embedded as server

        lines += [
            f"The embedded PostgreSQL keeps running in the background (data in "
            f"{server.data_dir()}), so the next command finds these tasks:",
            "  pgqueue embedded url    its URL, for psql",
            "  pgqueue embedded stop   stop it (the data stays; the next command starts it)",
            "",
        ]
    lines += [
        "Next:",
        "  pgqueue serve                   the dashboard and the HTTP API, on 127.0.0.1:8000",
        "                                  (needs the api extra: pip install 'pgqueue-jobs[api]')",
        "  docs/tutorial/index.md          your first task: enqueue in your transaction, run",
        "                                  `pgqueue worker app.tasks:tasks`, read the result",
    ]
    return "\n".join(lines)
