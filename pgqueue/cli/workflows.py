"""``pgqueue workflow``: a workflow's status and tasks, cancelling it, waiting for its result.
Thin: each command calls one library function and formats what it returns."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pgqueue.cli.arguments import workflow_id
from pgqueue.cli.database import connection, open_client
from pgqueue.cli.output import emit
from pgqueue.errors import ValidationError
from pgqueue.formatting import MISSING, key_values, table, timestamp
from pgqueue.models import TaskStatus, WorkflowInfo

group = typer.Typer(
    help="Workflows (chains, groups, chords): status, tasks, cancel, wait for the result.",
    no_args_is_help=True,
)

WorkflowIdArg = Annotated[
    str,
    typer.Argument(metavar="WORKFLOW_ID", help="The workflow's id.", callback=workflow_id),
]


def describe(info: WorkflowInfo) -> str:
    """A workflow for people: its status and counts, then a table of its tasks in build
    order, each with its parents' ids."""
    counts = ", ".join(f"{n} {status}" for status, n in info.counts.items() if n)
    head = key_values(
        [
            ("workflow", str(info.id)),
            ("status", info.status.value),
            ("tasks", f"{len(info.tasks)} ({counts})"),
            ("created", timestamp(info.created_at)),
            ("finished", MISSING if info.finished_at is None else timestamp(info.finished_at)),
        ]
    )
    rows = []
    for t in info.tasks:
        status = t.status.value
        if t.status is TaskStatus.RUNNING and t.task.cancel_requested:
            status += " (cancel requested)"
        parents = ", ".join(str(p) for p in t.parents) or MISSING
        rows.append(
            [str(t.id), t.type, status, f"{t.task.attempts}/{t.task.max_attempts}", parents]
        )
    return head + "\n\n" + table(["ID", "TYPE", "STATUS", "ATTEMPTS", "PARENTS"], rows)


@group.command("show")
def workflow_show(workflow_id: WorkflowIdArg) -> None:
    """Show a workflow: its status, and its tasks with their statuses and parents."""
    from pgqueue import operations as ops

    with connection() as conn:
        info = ops.workflow(conn, workflow_id)
    emit(info.to_dict(), describe(info))


@group.command("cancel")
def workflow_cancel(workflow_id: WorkflowIdArg) -> None:
    """Cancel what has not finished: waiting and queued tasks at once, running ones by asking
    their handlers to stop."""
    from pgqueue import operations as ops

    with connection() as conn:
        info = ops.cancel_workflow(conn, workflow_id)
    emit(info.to_dict(), describe(info))


@group.command("wait")
def workflow_wait(
    workflow_id: WorkflowIdArg,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Wait up to this long for every task to finish; if they have not, exit with "
            "code 3.",
        ),
    ] = 60.0,
) -> None:
    """Wait for a workflow to finish and print its final result (exit code 1 if it failed or
    was cancelled, 3 on timeout)."""
    from pgqueue import operations as ops

    try:
        seconds = ops.check_seconds("timeout", timeout)
    except ValidationError as exc:
        raise typer.BadParameter(exc.reason, param_hint="'--timeout'") from None
    # WorkflowWaitTimeout is a WaitTimeout: exit code 3, as `pgqueue status --wait` (cli/errors).
    with open_client() as client:
        result = client.wait_workflow(workflow_id, timeout=seconds)
    emit({"workflow_id": workflow_id, "result": result}, json.dumps(result, default=str))
