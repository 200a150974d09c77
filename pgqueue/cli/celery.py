"""``pgqueue celery forward``: drain the messages of tasks moved from Celery out of its Redis
broker into pgqueue (:func:`pgqueue.contrib.celery.forward` does the work)."""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Any

import typer

from pgqueue.cli.output import emit
from pgqueue.cli.state import state
from pgqueue.errors import ValidationError
from pgqueue.function_tasks import TaskFunction

group = typer.Typer(
    help="Moving from Celery: forward the moved tasks' messages from its broker into pgqueue.",
    no_args_is_help=True,
)


def _names(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        celery_name, sep, type_ = pair.partition("=")
        if not sep or not celery_name or not type_:
            raise ValidationError(
                "--name",
                f"give CELERY_NAME=PGQUEUE_TYPE (e.g. tasks.send=send_welcome), not {pair!r}",
            )
        out[celery_name] = type_
    return out


def _task(given: str) -> str | TaskFunction[..., Any]:
    """A type name, or ``module:function``'s function task."""
    if ":" not in given:
        return given
    import importlib

    module_name, _, attr = given.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValidationError("--task", f"cannot import {given!r}: {exc}") from None
    if not isinstance(found, TaskFunction):
        raise ValidationError(
            "--task", f"{given} is a {type(found).__name__}, not a function task (@tasks.task)"
        )
    return found


@group.command("forward")
def celery_forward(
    registry: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:REGISTRY",
            help="The port's registry: its types (named as the Celery tasks) are what moved.",
        ),
    ],
    broker: Annotated[
        str,
        typer.Option(
            "--broker",
            envvar="CELERY_BROKER_URL",
            show_envvar=True,
            help="Celery's Redis broker URL (redis://, rediss:// or unix://).",
        ),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", help="A Celery queue to drain (repeatable; default: celery)."),
    ] = None,
    task: Annotated[
        list[str] | None,
        typer.Option(
            "--task",
            help="Forward only this type of the registry (repeatable; default: every type); "
            "as module:function, the function task itself, whose declared concurrency key is "
            "then computed from the arguments.",
        ),
    ] = None,
    name: Annotated[
        list[str] | None,
        typer.Option(
            "--name",
            metavar="CELERY_NAME=TYPE",
            help="A Celery task name that moved under another type name (repeatable).",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Keep forwarding until SIGTERM/SIGINT (for producers not yet moved); "
            "default: return once a pass finds nothing to forward.",
        ),
    ] = False,
    poll_interval: Annotated[
        float, typer.Option(min=0.05, help="Seconds between passes with --follow.")
    ] = 1.0,
    batch_size: Annotated[
        int, typer.Option(min=1, max=10_000, help="Messages per pgqueue transaction.")
    ] = 100,
) -> None:
    """Forward the messages of tasks moved from Celery, left in its Redis broker, into pgqueue.

    Each becomes a task of the type its Celery name maps to, keyed by its Celery id.
    Its args and kwargs go by the function's parameter names; its eta becomes run_at.
    It leaves Redis only once its task is committed; other messages stay for Celery.
    Exits 1 when a moved task's message could not be forwarded (left in Redis)."""
    from pgqueue.contrib.celery import forward
    from pgqueue.registry import load

    stop = threading.Event()
    if follow:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    report = forward(
        broker,
        load(registry),
        queues=queue or ["celery"],
        names=_names(name or []),
        only=[_task(t) for t in task] if task else None,
        database_url=state.url(),
        follow=follow,
        poll_interval=poll_interval,
        batch_size=batch_size,
        stop=stop,
    )
    lines = [
        f"forwarded {report.forwarded} (already in pgqueue: {report.duplicates}), "
        f"expired {report.expired}, left for Celery {report.left}, refused {len(report.refused)}"
    ]
    lines += [f"  refused {celery_id}: {reason}" for celery_id, reason in report.refused.items()]
    emit(report.as_dict(), "\n".join(lines))
    if report.refused:
        raise typer.Exit(1)
