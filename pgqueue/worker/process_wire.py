"""What the worker and its child processes say to each other (the process executor).

Two channels, both Unix socket pairs:

- **worker <-> child**, a stream: each message is a 4-byte big-endian length and that many
  bytes of UTF-8 JSON. The worker sends ``run`` (a task: its row as the claim returned it,
  the timeout, the trace context), ``stop`` (``should_stop()`` turns true; with reason
  ``cancel`` the handler is also interrupted) and ``exit``; the child sends ``ready`` once,
  then one ``result`` per ``run`` (the outcome, as the executor's classes say it; a failure
  with the qualified name of the type of the exception the handler raised and its message,
  for the worker's hooks, which get a ``ChildException`` in its place), after any
  ``progress`` (a handler's ``ctx.set_progress``, the worker writes it). A handler that
  succeeded having written through ``ctx.connection`` has its completion committed by the
  child in that transaction: the child first says ``committing`` and waits
  for the worker's ``commit``, sent once the worker counts the task's outcome as being
  recorded (so that its heartbeat does not take the lease the commit clears for a lost one).
- **worker <-> fork server**, datagrams (``SOCK_SEQPACKET``: one JSON object each, no length
  needed): ``init`` (what every child needs to know), ``fork``, ``kill`` and ``exit`` from
  the worker; ``ready`` or ``error``, ``forked`` (with the new child's socket attached,
  ``socket.send_fds``) and ``exited`` (a pid and its exit code, negative for a signal)
  from the server.

JSON, not pickle: a payload and a result are JSON already (that is what the database holds),
a message can be read in a packet capture, and nothing the child sends can make the worker
run code.
"""

from __future__ import annotations

import json
import socket
import struct
import uuid
from datetime import datetime
from typing import Any

from pgqueue.executor import (
    Cancelled,
    Completed,
    Failed,
    Lost,
    Outcome,
    Recorded,
    Snoozed,
)
from pgqueue.hooks import ChildException, qualified_name
from pgqueue.models import ClaimedTask, Parent, Priority, TaskStatus

HEADER = struct.Struct(">I")
MAX_EXCEPTION_MESSAGE = 2000  # what a failure's exception message carries (the error has all)
MAX_MESSAGE = 1 << 30  # a sanity bound on the length word: a corrupt stream fails, not allocates


def frame(message: dict[str, Any]) -> bytes:
    """One message as it goes on a stream: its length, then its JSON."""
    body = json.dumps(message, separators=(",", ":"), default=str).encode()
    return HEADER.pack(len(body)) + body


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """The next message from a blocking stream socket; None at its end."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes: the stream is corrupt")
    body = _read_exactly(sock, size)
    if body is None:
        return None
    message: dict[str, Any] = json.loads(body)
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def packet(message: dict[str, Any]) -> bytes:
    """One message as it goes on the fork server's datagram socket."""
    return json.dumps(message, separators=(",", ":"), default=str).encode()


# --- a task, there and back ----------------------------------------------------------------


def task_message(task: ClaimedTask) -> dict[str, Any]:
    return {
        "id": str(task.id),
        "queue": task.queue,
        "type": task.type,
        "payload": task.payload,
        "priority": int(task.priority),
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "lease_token": str(task.lease_token),
        "lease_expires_at": task.lease_expires_at.isoformat(),
        "created_at": task.created_at.isoformat(),
        "trace_context": task.trace_context,
        "has_parents": task.has_parents,
        "workflow_id": None if task.workflow_id is None else str(task.workflow_id),
        "concurrency_key": task.concurrency_key,
        "parents": [
            {
                "task_id": str(p.task_id),
                "type": p.type,
                "status": None if p.status is None else p.status.value,
                "position": p.position,
                "run_anyway": p.run_anyway,
                "result": p.result,
                "error": p.error,
            }
            for p in task.parents
        ],
    }


def task_from(message: dict[str, Any]) -> ClaimedTask:
    workflow = message["workflow_id"]
    return ClaimedTask(
        id=uuid.UUID(message["id"]),
        queue=message["queue"],
        type=message["type"],
        payload=message["payload"],
        priority=Priority(message["priority"]),
        attempts=message["attempts"],
        max_attempts=message["max_attempts"],
        lease_token=uuid.UUID(message["lease_token"]),
        lease_expires_at=datetime.fromisoformat(message["lease_expires_at"]),
        created_at=datetime.fromisoformat(message["created_at"]),
        trace_context=message["trace_context"],
        has_parents=message["has_parents"],
        workflow_id=None if workflow is None else uuid.UUID(workflow),
        concurrency_key=message.get("concurrency_key"),
        parents=tuple(
            Parent(
                task_id=uuid.UUID(p["task_id"]),
                type=p["type"],
                status=None if p["status"] is None else TaskStatus(p["status"]),
                position=p["position"],
                run_anyway=p["run_anyway"],
                result=p["result"],
                error=p["error"],
            )
            for p in message["parents"]
        ),
    )


# --- a progress report, back ----------------------------------------------------------------


def progress_message(task_id: str, progress_json: str) -> dict[str, Any]:
    """A child handler's report; the worker checks it again (pgqueue.progress) and writes it,
    coalesced, fenced by the task's lease."""
    return {"op": "progress", "task_id": task_id, "progress": json.loads(progress_json)}


# --- an outcome, back ----------------------------------------------------------------------


def outcome_message(task_id: uuid.UUID, outcome: Outcome, *, timed_out: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "result", "task_id": str(task_id), "timed_out": timed_out}
    if isinstance(outcome, Completed | Recorded):
        out["outcome"] = "completed" if isinstance(outcome, Completed) else "recorded"
        out["result_json"] = outcome.result_json
    elif isinstance(outcome, Failed):
        out.update(
            outcome="failed",
            error=outcome.error,
            retry_after=outcome.retry_after,
            dead=outcome.dead,
        )
        if outcome.exception is not None:  # for the worker's hooks: its type and message
            out["exception"] = {
                "type": qualified_name(type(outcome.exception)),
                "message": str(outcome.exception)[:MAX_EXCEPTION_MESSAGE],
            }
    elif isinstance(outcome, Cancelled):
        out.update(outcome="cancelled", reason=outcome.reason)
    elif isinstance(outcome, Snoozed):
        out.update(outcome="snoozed", after=outcome.after, reason=outcome.reason)
    else:
        out["outcome"] = "lost"
    return out


def outcome_from(message: dict[str, Any]) -> Outcome:
    kind = message["outcome"]
    if kind == "completed":
        return Completed(message["result_json"])
    if kind == "recorded":
        return Recorded(message["result_json"])
    if kind == "failed":
        raised = message.get("exception")
        exception = None if raised is None else ChildException(raised["type"], raised["message"])
        return Failed(message["error"], message["retry_after"], message["dead"], exception)
    if kind == "cancelled":
        return Cancelled(message["reason"])
    if kind == "snoozed":
        return Snoozed(message["after"], message["reason"])
    return Lost()
