"""Workflows: chains, groups and chords of tasks, built in Python, written at once.

A :class:`Step` is a task not yet enqueued: ``fn.s(*args, **kwargs)`` for a function task
(``@tasks.task``), ``pgqueue.step(type, payload, **options)`` for a type by name. ``chain``,
``group`` and ``chord`` combine steps (and each other) into a graph; ``.enqueue(conn)`` turns
it into prepared tasks with ``depends_on`` and one shared ``workflow_id``, and writes them
with ONE ``enqueue_many`` in the caller's transaction: all or nothing, like any enqueue. The
database then runs it (the release rules are pgqueue.dependencies' and the SQL's): nothing
here runs after the enqueue, so a crashed producer leaves no half-built workflow.

Result passing. A chain step receives its parent's result; a step after a group (a chord's
callback) receives the list of the group's results, in the group's order. A function step
receives it in the first positional parameter its own arguments leave unbound (``add.s(2)``
binds ``x=2``; ``y`` receives); the enqueue-side check allows exactly that one missing. The
payload stores a marker there (``{"$pgqueue": "parent_result"}`` or ``"parent_results"``,
visible in psql and the dashboard), which the worker replaces with the parents' results
(pgqueue.function_tasks). A ``handler(payload, ctx)`` type reads ``ctx.parent_results``.
``fn.si(...)`` makes a step that receives nothing (every argument bound at once), and
``fn.s(..., parent_result="first")`` one that receives in its first positional parameter,
Celery's order (the arguments given bind the parameters after it).

Error handlers. ``step.link_error(handler.s(...))`` adds a task that depends on the step as a
clean-up step does (it runs once the step is final) and receives the failed task
(``{"task_id", "type", "error", "traceback"}``, marker ``"parent_failure"``) in its receiving
parameter; the worker completes it without calling the function (result None) when the step
did not fail. Error handlers are not of the workflow (no ``workflow_id``): the workflow's
status, sinks and result are its steps' alone, whichever way the handler went.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pgqueue.dependencies import parse_on_parent_failure
from pgqueue.enqueue import new_task_id, prepare
from pgqueue.errors import ValidationError
from pgqueue.handle import TaskHandle
from pgqueue.operations import enqueue_many, wait_workflow
from pgqueue.queries.specs import TaskSpec

# The marker a function step's payload holds in the parameter that receives its parents'
# results; the worker replaces it (function_tasks.fill_parent_results).
MARKER_KEY = "$pgqueue"
PARENT_RESULT = "parent_result"  # one parent: its result
PARENT_RESULTS = "parent_results"  # after a group: the list of its results, in order
PARENT_FAILURE = "parent_failure"  # an error handler's: the failed task, or skip the call
MARKERS = (PARENT_RESULT, PARENT_RESULTS, PARENT_FAILURE)
PARENT_RESULT_PLACES = ("unbound", "first")

# The enqueue options a step takes (pgqueue.prepare's); depends_on and workflow_id are the
# builder's to set.
STEP_OPTIONS = frozenset(
    {
        "priority",
        "queue",
        "run_at",
        "delay",
        "max_attempts",
        "retry",
        "expires_in",
        "expires_at",
        "concurrency_key",
        "on_parent_failure",
    }
)


def is_marker(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and value.get(MARKER_KEY) in MARKERS


# --- the graph ---------------------------------------------------------------------------------


class Node:
    """A piece of a workflow: a Step, a chain, a group or a chord."""

    def _build(self, builder: _Builder, after: tuple[uuid.UUID, ...], many: bool) -> _Sinks:
        raise NotImplementedError

    def build(self, workflow_id: uuid.UUID | None = None) -> tuple[uuid.UUID, list[TaskSpec], int]:
        """The workflow's id, its prepared tasks and how many sinks (final tasks) it has: the
        workflow's tasks in build order (parents before children), its sinks last among them,
        then its error handlers (``link_error``; no ``workflow_id``), each after its step.
        Raises ValidationError before anything is written."""
        builder = _Builder(workflow_id or new_task_id())
        sinks, _ = self._build(builder, (), False)
        order = {spec.id: i for i, spec in enumerate(builder.specs)}
        builder.sinks = sorted(sinks, key=order.__getitem__)
        while builder.error_handlers:  # after the sinks, and a handler's own after it
            handler, failed = builder.error_handlers.pop(0)
            handler._build_error_handler(builder, failed)
        return builder.workflow_id, builder.specs, len(builder.sinks)

    def enqueue(self, conn: Any, /) -> WorkflowHandle:
        """Write the whole workflow in the caller's transaction (a psycopg connection or a
        SQLAlchemy Session, like ``pgqueue.enqueue_many``) with one ``enqueue_many``; nothing
        is written when any step is refused."""
        workflow_id, specs, sinks = self.build()
        results = enqueue_many(conn, specs)
        return WorkflowHandle.of(workflow_id, specs, [TaskHandle(r) for r in results], sinks)

    async def aenqueue(self, conn: Any, /) -> WorkflowHandle:
        """As :meth:`enqueue`, on an async connection (psycopg AsyncConnection or SQLAlchemy
        AsyncSession)."""
        workflow_id, specs, sinks = self.build()
        results = await enqueue_many.aio(conn, specs)
        return WorkflowHandle.of(workflow_id, specs, [TaskHandle(r) for r in results], sinks)


_Sinks = tuple[list[uuid.UUID], bool]  # the ids a next step depends on; True: a group's list


@dataclasses.dataclass
class _Builder:
    workflow_id: uuid.UUID
    specs: list[TaskSpec] = dataclasses.field(default_factory=list)
    sinks: list[uuid.UUID] = dataclasses.field(default_factory=list)
    # (handler, the id of the step it handles), built once the workflow's tasks are
    error_handlers: list[tuple[Step, uuid.UUID]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Step(Node):
    """One task of a workflow, not yet enqueued: a type, its payload and enqueue options.

    ``receives``: for a function step, the parameter that gets its parents' results (None:
    it takes none, it is ``fn.si(...)``, or it is a ``handler(payload, ctx)`` type, which
    reads ``ctx.parent_results``); ``required``: whether that parameter has no default (a
    step with no parent must then bind it). ``run_anyway()`` makes it a clean-up step;
    ``link_error(handler)`` gives it error handlers (``error_handlers``).
    """

    type: str
    payload: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    receives: str | None = None
    required: bool = False
    # The JSON types the receiving parameter accepts (None: not checked): a clean-up step
    # after one parent receives None when that parent did not complete.
    receives_types: tuple[str, ...] | None = None
    error_handlers: tuple[Step, ...] = ()

    def link_error(self, *handlers: Step) -> Step:
        """This step with error handlers: each runs only if this step fails (is
        dead-lettered, its retries spent), after it, and receives the failed task as
        ``{"task_id", "type", "error", "traceback"}`` (``error``: the exception's type and
        message) in the parameter where a step receives its parent's result: ``on_failure(
        failed: dict, channel: str)`` as ``on_failure.s(channel="ops")``. When this step
        completes or is cancelled, a handler is completed without being called (result
        None). A handler is a task of its own, not of the workflow: the workflow's status and
        result are its steps' alone. Checked now: a handler must be a function step that
        receives (``fn.s(...)``, not ``fn.si(...)`` nor a ``pgqueue.step`` by name)."""
        for handler in handlers:
            _check_error_handler(handler)
        return dataclasses.replace(self, error_handlers=(*self.error_handlers, *handlers))

    def run_anyway(self) -> Step:
        """This step as a clean-up step: it runs once all its parents are final, whatever
        their outcome (``on_parent_failure="run"``), and sees which failed in
        ``ctx.parents``; a parent that did not complete gives None as its result."""
        return self.set_options(on_parent_failure="run")

    def set_options(self, **options: Any) -> Step:
        """This step with these enqueue options over its own (those of ``pgqueue.step``)."""
        return dataclasses.replace(self, options={**self.options, **_check_options(options)})

    def _build(self, builder: _Builder, after: tuple[uuid.UUID, ...], many: bool) -> _Sinks:
        payload = dict(self.payload or {})
        if self.receives is not None:
            if after:
                payload[self.receives] = {MARKER_KEY: PARENT_RESULTS if many else PARENT_RESULT}
                self._check_cleanup(many)
            elif self.required:
                raise ValidationError(
                    "step",
                    f"{self.type}: argument {self.receives!r} is missing (a step receives its "
                    "parent's result there, and this one has no parent)",
                )
        spec = prepare(
            self.type, payload, depends_on=after, workflow_id=builder.workflow_id, **self.options
        )
        builder.specs.append(spec)
        builder.error_handlers.extend((h, spec.id) for h in self.error_handlers)
        return [spec.id], False

    def _build_error_handler(self, builder: _Builder, failed: uuid.UUID) -> None:
        """This step as an error handler of task ``failed``: after it whatever its outcome
        (the worker skips the call unless it failed), outside the workflow."""
        assert self.receives is not None  # _check_error_handler
        payload = {**(self.payload or {}), self.receives: {MARKER_KEY: PARENT_FAILURE}}
        options = {**self.options, "on_parent_failure": "run"}
        spec = prepare(self.type, payload, depends_on=(failed,), **options)
        builder.specs.append(spec)
        builder.error_handlers.extend((h, spec.id) for h in self.error_handlers)

    def _check_cleanup(self, many: bool) -> None:
        run_anyway = self.options.get("on_parent_failure") == "run"
        types = self.receives_types
        if run_anyway and not many and types is not None and "null" not in types:
            raise ValidationError(
                "step",
                f"{self.type}: argument {self.receives!r} of a clean-up step receives None when "
                f"its parent did not complete, and it must be {' or '.join(types)}: allow None "
                "in its annotation (e.g. `int | None`)",
            )


def _check_error_handler(handler: Any) -> None:
    if not isinstance(handler, Step):
        hint = " (call .s(...) on it)" if callable(getattr(handler, "s", None)) else ""
        raise ValidationError(
            "link_error",
            f"an error handler must be a step (fn.s(...)), not {type(handler).__name__}{hint}",
        )
    if handler.receives is None:
        raise ValidationError(
            "link_error",
            f"{handler.type}: an error handler receives the failed task in the first parameter "
            "its arguments leave unbound, and this step has none (make it a function task with "
            "such a parameter, e.g. `def on_failure(failed: dict, ...)`, and use .s(...))",
        )
    types = handler.receives_types
    if types is not None and "object" not in types:
        raise ValidationError(
            "link_error",
            f"{handler.type}: argument {handler.receives!r} receives the failed task as a dict "
            f"(task_id, type, error, traceback), and it must be {' or '.join(types)}: annotate "
            "it `dict` (or leave it unannotated)",
        )


def _check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    for name in options:
        if name not in STEP_OPTIONS:
            hint = (
                " (a workflow sets it from its shape)"
                if name in ("depends_on", "workflow_id")
                else " (a task with parents cannot have one)"
                if name == "idempotency_key"
                else ""
            )
            raise ValidationError(name, f"is not an option of a workflow step{hint}")
    if "on_parent_failure" in options:
        parse_on_parent_failure(options["on_parent_failure"])
    return dict(options)


def step(type: str, payload: Mapping[str, Any] | None = None, **options: Any) -> Step:
    """A workflow step of a task type by name (a ``handler(payload, ctx)`` type, or any type
    whose code is elsewhere), with ``pgqueue.enqueue``'s options: ``queue``, ``priority``,
    ``max_attempts``, ``retry``, ``run_at``, ``delay``, ``expires_in``, ``expires_at``,
    ``concurrency_key``, and ``on_parent_failure="run"`` for a clean-up step. It reads its
    parents' results in ``ctx.parent_results``. Checked now (a trial ``prepare``), so a bad
    step fails here."""
    checked = _check_options(options)
    prepare(type, payload, **checked)  # raises on a bad type, payload or option
    return Step(type, payload, checked)


def function_step(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, receives_result: bool = True
) -> Step:
    """``fn.s(*args, **kwargs)`` for a TaskFunction ``fn`` (not imported here: function_tasks
    imports this module): the call's arguments bound and checked, allowing exactly
    one missing parameter: the first positional one they leave unbound (or with
    ``parent_result="first"``, the first positional one), which receives the parents'
    results. ``receives_result=False`` (``fn.si``): every argument bound, nothing received."""
    if not receives_result:
        payload, receives, required = fn.arguments(*args, **kwargs), None, False
    else:
        kwargs = dict(kwargs)
        names = {p["name"] for p in fn.parameters.description["parameters"]}
        place = "unbound" if "parent_result" in names else kwargs.pop("parent_result", "unbound")
        if place not in PARENT_RESULT_PLACES:
            raise ValidationError(
                "parent_result",
                f"must be 'first' (the first positional parameter receives, the arguments "
                f"given bind those after it: Celery's order) or 'unbound' (the first one the "
                f"arguments leave unbound: the default), not {place!r}",
            )
        payload, receives, required = fn.partial_arguments(*args, first=place == "first", **kwargs)
    options = {k: v for k, v in fn.step_options(payload, receives).items() if v is not None}
    prepare(fn.type, payload, **options)  # the options, checked now
    types = None if receives is None else fn.receiving_types(receives)
    return Step(fn.type, payload, options, receives, required, types)


# --- composition -------------------------------------------------------------------------------


def _node(value: Any, where: str) -> Node:
    if isinstance(value, Node):
        return value
    # A TaskFunction (by its .s, since function_tasks imports this module).
    hint = " (call .s(...) on it to make a step)" if callable(getattr(value, "s", None)) else ""
    raise ValidationError(
        where,
        f"must be a step (fn.s(...), pgqueue.step(...)) or a chain, group or chord, "
        f"not {type(value).__name__}{hint}",
    )


def _nodes(values: tuple[Any, ...], where: str) -> tuple[Node, ...]:
    if len(values) == 1 and not isinstance(values[0], Node) and _iterable(values[0]):
        values = tuple(values[0])
    if not values:
        raise ValidationError(where, f"an empty {where} has nothing to run")
    return tuple(_node(v, where) for v in values)


def _iterable(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


@dataclasses.dataclass(frozen=True, init=False)
class Chain(Node):
    """Steps one after another: each starts when the previous completed, and receives its
    result (after a group: the list of the group's results)."""

    nodes: tuple[Node, ...]

    def __init__(self, *nodes: Any) -> None:
        object.__setattr__(self, "nodes", _nodes(nodes, "chain"))

    def _build(self, builder: _Builder, after: tuple[uuid.UUID, ...], many: bool) -> _Sinks:
        sinks: list[uuid.UUID] = list(after)
        for node in self.nodes:
            sinks, many = node._build(builder, tuple(sinks), many)
        return sinks, many


@dataclasses.dataclass(frozen=True, init=False)
class Group(Node):
    """Steps in parallel (each after what precedes the group); what follows the group waits
    for all of them and receives the list of their results, in the group's order (a member
    that is a chain gives its last step's result; a nested group's results are flattened in)."""

    nodes: tuple[Node, ...]

    def __init__(self, *nodes: Any) -> None:
        object.__setattr__(self, "nodes", _nodes(nodes, "group"))

    def _build(self, builder: _Builder, after: tuple[uuid.UUID, ...], many: bool) -> _Sinks:
        sinks: list[uuid.UUID] = []
        for node in self.nodes:
            member, _ = node._build(builder, after, many)
            sinks.extend(member)
        return sinks, True


@dataclasses.dataclass(frozen=True, init=False)
class Chord(Node):
    """A group (the header) and then one callback that receives the list of the header's
    results, in order."""

    header: Group
    callback: Node

    def __init__(self, header: Any, callback: Any) -> None:
        if isinstance(header, Group):
            group_ = header
        elif isinstance(header, Node):
            group_ = Group(header)
        elif _iterable(header):
            group_ = Group(*tuple(header))
        else:
            raise ValidationError(
                "chord", f"the header must be a group or steps, not {type(header).__name__}"
            )
        object.__setattr__(self, "header", group_)
        object.__setattr__(self, "callback", _node(callback, "chord callback"))

    def _build(self, builder: _Builder, after: tuple[uuid.UUID, ...], many: bool) -> _Sinks:
        sinks, _ = self.header._build(builder, after, many)
        return self.callback._build(builder, tuple(sinks), True)


def chain(*steps: Any) -> Chain:
    """``chain(a, b, c)``: a, then b with a's result, then c with b's (steps, groups, chords
    or chains; or one iterable of them)."""
    return Chain(*steps)


def group(*steps: Any) -> Group:
    """``group(a, b, c)`` or ``group(steps)``: all in parallel."""
    return Group(*steps)


def chord(header: Any, callback: Any) -> Chord:
    """``chord(group_or_steps, callback)``: the callback runs once every header task
    completed, with the list of their results in order."""
    return Chord(header, callback)


# --- what enqueueing gives back ----------------------------------------------------------------


class WorkflowHandle:
    """An enqueued workflow: ``id`` (every task's ``workflow_id``), ``tasks`` (a TaskHandle
    per step, in build order: a chain's steps in order, a group's members in order, a chord's
    header before its callback), ``sinks`` (its final tasks), ``result_task`` (the final
    task when there is one, else None) and ``error_handlers`` (the tasks ``link_error``
    added, outside the workflow, in build order)."""

    def __init__(
        self,
        workflow_id: uuid.UUID,
        tasks: list[TaskHandle],
        sinks: int,
        error_handlers: list[TaskHandle] | None = None,
    ) -> None:
        self.id = workflow_id
        self.tasks = tasks
        self.sinks = tasks[len(tasks) - sinks :]
        self.error_handlers = error_handlers or []

    @classmethod
    def of(
        cls, workflow_id: uuid.UUID, specs: list[TaskSpec], handles: list[TaskHandle], sinks: int
    ) -> WorkflowHandle:
        """The handle of what ``build`` gave and ``enqueue_many`` wrote: the error handlers
        (no workflow id) come after the workflow's tasks."""
        steps = sum(1 for spec in specs if spec.workflow_id == workflow_id)
        return cls(workflow_id, handles[:steps], sinks, handles[steps:])

    @property
    def result_task(self) -> TaskHandle | None:
        return self.sinks[0] if len(self.sinks) == 1 else None

    def __repr__(self) -> str:
        return f"<pgqueue workflow {self.id} ({len(self.tasks)} tasks)>"

    def wait(self, conn: Any, *, timeout: float, poll_interval: float | None = None) -> Any:
        """The workflow's final result (``pgqueue.wait_workflow``): its final task's result,
        or the list of its final tasks' results in build order when it has several. Raises
        WorkflowFailed (a task was dead-lettered), WorkflowCancelled, or WorkflowWaitTimeout
        (a WaitTimeout) after ``timeout`` seconds. The connection must not be in the
        transaction that enqueued it."""
        return wait_workflow(conn, self.id, timeout=timeout, **_poll(poll_interval))

    async def await_result(
        self, conn: Any, *, timeout: float, poll_interval: float | None = None
    ) -> Any:
        """As :meth:`wait`, on an async connection (``pgqueue.aio.wait_workflow``)."""
        return await wait_workflow.aio(conn, self.id, timeout=timeout, **_poll(poll_interval))


def _poll(poll_interval: float | None) -> dict[str, float]:
    return {} if poll_interval is None else {"poll_interval": poll_interval}
