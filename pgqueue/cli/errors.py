"""Errors as the command line reports them: one line on stderr and an exit code.

Usage errors (bad arguments, values the library rejects) exit with 2, a wait that ran out
(``status --wait``) with 3, every other error with 1, an interrupt with 130; ``--debug``
shows the traceback instead of the line. Commands only raise; deciding the line and the code
here keeps every command's failures alike.

Under ``--json`` the line is a JSON document instead, on stderr too (stdout is where a
program reads answers, and a failed command has none), with the same exit code::

    {"error": "invalid_request", "message": "queue: must not be empty", "field": "queue",
     "exit_code": 2}

``error`` is the kind, spelled as the HTTP API spells it where both can fail alike
(``invalid_request``, ``not_found``, ``conflict``, ``idempotency_conflict``, ``unavailable``,
``schema_not_ready``), plus ``usage`` (an option or argument as typed: ``field`` is then its
name, ``--payload``), ``configuration``, ``aborted``, ``interrupted``, ``timeout`` (exit code
3), ``error`` and ``internal_error``;
``field`` is there when one value is at fault, ``task_id`` and ``status`` when one task is;
``idempotency_conflict`` (``enqueue --key-reuse refuse``, exit code 1) gives the original's
``task_id``, the ``idempotency_key`` and the ``differing_fields``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer

from pgqueue.cli.state import state
from pgqueue.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidTaskState,
    PgQueueError,
    QueueNotFound,
    SchemaNotReady,
    TaskNotFound,
    ValidationError,
    WaitTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
)

# `pgqueue status ID --wait SECONDS` when the task did not finish in time: neither a usage
# error (2) nor a failure (1), so that a script can tell "not yet" from "went wrong".
EXIT_WAIT_TIMEOUT = 3


class UsageProblem(typer.BadParameter):
    """A usage error about how options combine rather than one value (exit code 2)."""

    def format_message(self) -> str:
        return self.message


class Declined(PgQueueError):
    """The person asked to confirm said no (or ended stdin): nothing was done (exit code 1)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def asks_for_json(args: Sequence[str]) -> bool:
    """Whether ``--json`` was given, read from the arguments themselves: an error found while
    parsing them (an unknown option) comes before the option has been handled."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _wants_json() -> bool:
    return state.json or asks_for_json(sys.argv[1:])


def _fail(message: str, code: int, kind: str, **details: Any) -> NoReturn:
    message = _one_line(message)
    if _wants_json():
        body = {"error": kind, "message": message, **details, "exit_code": code}
        typer.echo(json.dumps(body, ensure_ascii=False, default=str), err=True)
    else:
        typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    sys.exit(code)


def _param_name(exc: Exception) -> str | None:
    """The option or argument a usage error is about, as typed (``--payload``, ``TASK_ID``)."""
    param = getattr(exc, "param", None)
    kind = getattr(param, "param_type_name", None)
    if kind == "option" and getattr(param, "opts", None):
        return str(max(param.opts, key=len))  # type: ignore[union-attr]
    if kind == "argument":
        return str(getattr(param, "metavar", None) or getattr(param, "name", "")).upper()
    hint = getattr(exc, "param_hint", None)
    if isinstance(hint, str):
        return hint.strip("'\"")
    return None


def _kind(exc: PgQueueError) -> tuple[str, dict[str, Any]]:
    """The JSON kind of a library error, with the details that identify what it is about."""
    if isinstance(exc, WorkflowNotFound):
        return "not_found", {"workflow_id": str(exc.workflow_id)}
    if isinstance(exc, TaskNotFound):
        return "not_found", {"task_id": str(exc.task_id)}
    if isinstance(exc, WorkflowFailed | WorkflowCancelled):
        kind = "workflow_failed" if isinstance(exc, WorkflowFailed) else "workflow_cancelled"
        return kind, {"workflow_id": str(exc.workflow_id), "task_id": str(exc.task.id)}
    if isinstance(exc, QueueNotFound):
        return "not_found", {"queue": exc.queue}
    if isinstance(exc, InvalidTaskState):
        return "conflict", {"task_id": str(exc.task_id), "status": exc.status}
    if isinstance(exc, IdempotencyConflict):
        return "idempotency_conflict", {
            "task_id": str(exc.task_id),
            "idempotency_key": exc.idempotency_key,
            "differing_fields": list(exc.differing_fields),
        }
    if isinstance(exc, SchemaNotReady):
        return "schema_not_ready", {}
    if isinstance(exc, DatabaseUnavailable):
        return "unavailable", {}
    if isinstance(exc, ConfigurationError):
        return "configuration", {}
    if isinstance(exc, Declined):
        return "aborted", {}
    if type(exc).__name__ == "PrivilegeMissing":  # pgqueue.roles imports psycopg
        return "permission_denied", {}
    return "error", {}


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
        field = _param_name(exc)
        _fail(message + hint, exit_code, "usage", **({"field": field} if field else {}))
    except ValidationError as exc:  # a value the library refused is a usage error too
        if state.debug:
            raise
        _fail(str(exc), 2, "invalid_request", field=exc.field)
    except WaitTimeout as exc:
        _fail(str(exc), EXIT_WAIT_TIMEOUT, "timeout", task_id=str(exc.task_id), status=exc.status)
    except PgQueueError as exc:
        if state.debug:
            raise
        kind, details = _kind(exc)
        _fail(str(exc), 1, kind, **details)
    except typer.Abort:
        _fail("aborted", 1, "aborted")
    except KeyboardInterrupt:
        if _wants_json():
            _fail("interrupted", 130, "interrupted")
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if state.debug:
            raise
        if getattr(exc, "sqlstate", None) == "42501":  # insufficient_privilege, any command
            from pgqueue.roles import privilege_missing  # psycopg: not at every command's start

            _fail(str(privilege_missing(exc)), 1, "permission_denied")  # type: ignore[arg-type]
        _fail(
            f"{type(exc).__name__}: {exc} (run with --debug for the traceback)",
            1,
            "internal_error",
        )
    sys.exit(code if isinstance(code, int) else 0)
