"""Checking a batch's dependencies before anything is written: pure functions.

A task's ``depends_on`` names its parents: task ids, or tasks of the same enqueue_many batch.
Refused here, before any SQL: the task itself, a parent named twice, more than
``MAX_PARENTS`` parents, and a cycle among the batch's tasks (a cycle needs tasks that do not
exist yet, so it can only be within one batch). Whether a parent outside the batch exists is
for the database to say (UnknownParent).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pgqueue.errors import DependencyCycle, DependencyError, UnknownParent, ValidationError

MAX_PARENTS = 50_000
# Parents per bucket: a member's completion locks its bucket, shared with this many at most.
BUCKET_SIZE = 64
ON_PARENT_FAILURE = ("cancel", "run")


def parent_id(item: Any) -> uuid.UUID:
    """A parent's id from what depends_on may hold: a UUID or its text, or anything with an
    ``id`` that is one (TaskHandle, EnqueueResult, Task, TaskSpec)."""
    value = getattr(item, "id", item)
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            raise DependencyError(f"{value!r} is not a task id") from None
    raise DependencyError(
        f"items must be task ids, TaskHandles or prepared tasks, not {type(item).__name__}"
    )


def parse_depends_on(depends_on: Iterable[Any] | None, task_id: uuid.UUID) -> tuple[uuid.UUID, ...]:
    """The parents' ids in the caller's order, checked one task at a time."""
    if depends_on is None:
        return ()
    if isinstance(depends_on, str | bytes) or not isinstance(depends_on, Iterable):
        raise DependencyError("must be a list of task ids", task_id=task_id)
    ids = tuple(parent_id(item) for item in depends_on)
    if len(ids) > MAX_PARENTS:
        raise DependencyError(
            f"{len(ids)} parents; a task may have at most {MAX_PARENTS}", task_id=task_id
        )
    if task_id in ids:
        raise DependencyError(f"task {task_id} cannot depend on itself", task_id=task_id)
    if len(set(ids)) != len(ids):
        seen: set[uuid.UUID] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise DependencyError(f"parent {twice} is named twice", task_id=task_id)
    return ids


def parse_on_parent_failure(value: str) -> bool:
    """Whether the task runs anyway when a parent failed or was cancelled."""
    if value not in ON_PARENT_FAILURE:
        raise ValidationError("on_parent_failure", f"must be 'cancel' or 'run', not {value!r}")
    return value == "run"


def check_acyclic(parents: Mapping[uuid.UUID, Sequence[uuid.UUID]]) -> list[uuid.UUID]:
    """The batch's tasks in an order where every parent in the batch comes before its
    children (Kahn's algorithm); DependencyCycle naming a cycle if there is none."""
    inside = {child: [p for p in ps if p in parents] for child, ps in parents.items()}
    waiting = {child: len(ps) for child, ps in inside.items()}
    children: dict[uuid.UUID, list[uuid.UUID]] = {}
    for child, ps in inside.items():
        for p in ps:
            children.setdefault(p, []).append(child)
    ready = [t for t, n in waiting.items() if n == 0]
    order: list[uuid.UUID] = []
    while ready:
        t = ready.pop()
        order.append(t)
        for c in children.get(t, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    if len(order) == len(parents):
        return order
    raise DependencyCycle(_a_cycle({t: inside[t] for t, n in waiting.items() if n > 0}))


def _a_cycle(graph: Mapping[uuid.UUID, Sequence[uuid.UUID]]) -> list[uuid.UUID]:
    """One cycle of a graph where every node is on or behind one: walk parents until a node
    repeats."""
    node = next(iter(graph))
    path: list[uuid.UUID] = []
    seen: dict[uuid.UUID, int] = {}
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in graph[node] if p in graph)
    cycle = path[seen[node] :]
    cycle.reverse()  # parent before child
    return [*cycle, cycle[0]]


def check_known(
    wanted: Iterable[uuid.UUID], found: Iterable[uuid.UUID], task_id: uuid.UUID | None = None
) -> None:
    """UnknownParent for the first wanted parent that the database did not find."""
    have = set(found)
    for p in wanted:
        if p not in have:
            raise UnknownParent(p, task_id=task_id)
