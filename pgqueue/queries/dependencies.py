"""Tasks with parents: their insert (with the edges, in one statement), the reads of a
task's parents and children, and workflows (the tasks sharing a workflow id).

The release rule itself is SQL (``pgqueue.task_dependants_settle``), called by every
statement that makes a task final. Statements: sql/dependencies.sql.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from pgqueue import pooling
from pgqueue.errors import UnknownParent, WorkflowNotFound
from pgqueue.models import Parent, Task, TaskStatus, WorkflowInfo, WorkflowStatus, WorkflowTask
from pgqueue.queries.driver import Op, Query, Row
from pgqueue.queries.specs import TaskSpec, _defaults, _inserted, _spec_columns, _trace_json


def task_insert_dependent(
    specs: Sequence[TaskSpec],
    now: datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    batch: set[uuid.UUID] | None = None,
    notify: bool | None = None,
) -> Op[list[Task]]:
    """Insert tasks with parents and their edges in one statement; UnknownParent
    (nothing written) for a parent neither in ``batch`` (the ids of the enqueue_many batch)
    nor in the table. A cycle among the batch's tasks is refused before (DependencyCycle).
    Those queued at once wake idle workers unless ``notify`` is false (None:
    ``PGQUEUE_NOTIFY``'s)."""
    from pgqueue.dependencies import check_acyclic

    inside = batch or set()
    check_acyclic({s.id: s.depends_on for s in specs})
    edges = [
        (s.id, p, i, s.run_anyway, p in inside) for s in specs for i, p in enumerate(s.depends_on)
    ]
    rows = yield Query(
        "task_insert_dependent",
        {
            "edge_children": [e[0] for e in edges],
            "edge_parents": [e[1] for e in edges],
            "edge_positions": [e[2] for e in edges],
            "edge_run_anyway": [e[3] for e in edges],
            "edge_in_batch": [e[4] for e in edges],
            **_spec_columns(specs),
            "workflow_ids": [s.workflow_id for s in specs],
            "now": now,
            "trace_context": _trace_json(trace_context),
            "notify": pooling.resolve_notify(notify),
            **_defaults(),
        },
        prepare=False,
    )
    missing = rows[0]["missing"] if rows else None
    if missing:
        child = next((s.id for s in specs if missing[0] in s.depends_on), None)
        raise UnknownParent(missing[0], task_id=child)
    by_id = {row["id"]: row for row in rows}
    # A task inserted cancelled (a parent outside the batch had failed) cancels its children
    # inserted beside it, which could not see it final in the same statement.
    parents_here = {p for s in specs for p in s.depends_on}
    doomed = [i for i, row in by_id.items() if row["status"] == "cancelled" and i in parents_here]
    if doomed:
        yield Query("task_dependants_settle", {"ids": doomed})
        waiting = [i for i, row in by_id.items() if row["status"] == "waiting"]
        for row in (yield Query("task_outcomes", {"ids": waiting})):
            by_id[row["id"]] = {**by_id[row["id"]], **row}
    out = []
    for s in specs:
        row = by_id[s.id]
        task = _inserted(
            s,
            row["created_at"],
            row["visible_after"],
            row["max_attempts"],
            row["queue"],
            row["priority"],
            row["expires_at"],
        )
        out.append(
            dataclasses.replace(
                task,
                status=TaskStatus(row["status"]),
                workflow_id=row["workflow_id"],
                parents_pending=row["parents_pending"],
                cancelled_by=row["cancelled_by"],
                last_error=row["last_error"],
                finished_at=row["finished_at"],
            )
        )
    return out


def _parent(row: Row) -> Parent:
    return Parent(
        task_id=row["task_id"],
        type=row["type"],
        status=None if row["status"] is None else TaskStatus(row["status"]),
        position=row["position"],
        run_anyway=row["run_anyway"],
        result=row["result"],
        error=row["error"],
    )


def task_parents(task_id: uuid.UUID) -> Op[list[Parent]]:
    """A task's parents in depends_on order."""
    rows = yield Query("task_parents", {"id": task_id})
    return [_parent(r) for r in rows]


def task_children(task_id: uuid.UUID) -> Op[list[Parent]]:
    """A task's dependants; ``position`` is this task's place in each one's depends_on."""
    rows = yield Query("task_children", {"id": task_id})
    return [_parent(r) for r in rows]


def task_parents_many(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, tuple[Parent, ...]]]:
    """The parents of many tasks in one query (the worker, per claimed batch)."""
    rows = yield Query("task_parents_many", {"ids": list(ids)}, prepare=False)
    out: dict[uuid.UUID, list[Parent]] = {}
    for r in rows:
        out.setdefault(r["child_id"], []).append(_parent(r))
    return {k: tuple(v) for k, v in out.items()}


def workflow_get(workflow_id: uuid.UUID) -> Op[WorkflowInfo]:
    """A workflow and its tasks with their edges (WorkflowNotFound if no task has this
    workflow id). Its status, counts and times are derived from the tasks read, by the rule
    of the pgqueue.workflows view."""
    rows = yield Query("workflow_tasks", {"id": workflow_id})
    if not rows:
        raise WorkflowNotFound(workflow_id)
    tasks = tuple(
        WorkflowTask(Task.from_row(r), tuple(r["parent_ids"]), tuple(r["child_ids"])) for r in rows
    )
    counts = {s.value: 0 for s in TaskStatus}
    for t in tasks:
        counts[t.status.value] += 1
    status = WorkflowStatus.of(t.status for t in tasks)
    finished = [t.task.finished_at for t in tasks if t.task.finished_at is not None]
    return WorkflowInfo(
        id=workflow_id,
        status=status,
        counts=counts,
        tasks=tasks,
        created_at=min(t.task.created_at for t in tasks),
        finished_at=max(finished) if status.is_final and finished else None,
    )


def workflow_cancel(workflow_id: uuid.UUID, now: datetime | None = None) -> Op[int]:
    """Cancel the workflow's unfinished tasks; how many it cancelled or flagged."""
    rows = yield Query("workflow_cancel", {"id": workflow_id, "now": now})
    return len(rows)
