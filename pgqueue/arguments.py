"""A function task's parameters as JSON, and the one check of arguments against them.

A worker records :func:`describe_parameters`' description of each declared function in
pgqueue.task_types.parameters at its start; :func:`check_arguments` checks a call's arguments
(by name, as the payload stores them) against it, wherever a task is submitted: by the caller
holding the function (pgqueue.function_tasks), and by the CLI and the HTTP API, which never
import the user's code (pgqueue.check_arguments reads the recorded description). One check,
so the error is word for word the same at every boundary.

What is checked: missing required arguments, unknown ones (unless the function takes
``**kwargs``), values that are not JSON, and, where a parameter's annotation is one of
``int``, ``float``, ``str``, ``bool``, ``list``/``tuple``, ``dict``, ``None`` (or a union or
``Optional`` of them, ``list[...]`` and ``dict[...]`` included), the JSON type of the value
(an ``int`` is a number; a ``bool`` is not an integer). Other annotations are not checked.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pgqueue.errors import InvalidArgument, ValidationError

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
    inspect.Parameter.KEYWORD_ONLY: "keyword",
}


# --- what a function's parameters are, as JSON ------------------------------------------------


def _is_context(annotation: Any) -> bool:
    """A parameter annotated with pgqueue.TaskContext (or ``TaskContext | None``), matched by
    name: importing the executor here would be an import cycle."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        return any(
            text
            in (f"{prefix}TaskContext", f"{prefix}TaskContext|None", f"None|{prefix}TaskContext")
            for prefix in ("", "pgqueue.", "pgqueue.executor.")
        )
    if getattr(annotation, "__name__", None) == "TaskContext" and str(
        getattr(annotation, "__module__", "")
    ).startswith("pgqueue"):
        return True
    return any(_is_context(a) for a in _union_members(annotation) or ())


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return None


_SIMPLE = {
    int: ("integer",),
    float: ("number",),
    str: ("string",),
    bool: ("boolean",),
    list: ("array",),
    tuple: ("array",),
    dict: ("object",),
    type(None): ("null",),
    None: ("null",),
}
_SIMPLE_NAMES = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
    "list": "array",
    "tuple": "array",
    "dict": "object",
    "None": "null",
}


def json_types(annotation: Any) -> list[str] | None:
    """The JSON types an annotation allows, or None: not checked (no annotation, Any, or a
    type that has no one JSON form, such as a dataclass)."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):  # not evaluable: only the plain names are understood
        parts = [p.strip() for p in annotation.split("|")]
        names = [_SIMPLE_NAMES.get(p) for p in parts]
        return None if None in names else sorted(set(typing.cast(list[str], names)))
    if typing.get_origin(annotation) is typing.Annotated:
        return json_types(typing.get_args(annotation)[0])
    members = _union_members(annotation)
    if members is not None:
        out: set[str] = set()
        for member in members:
            allowed = json_types(member)
            if allowed is None:
                return None
            out.update(allowed)
        return sorted(out)
    origin = typing.get_origin(annotation) or annotation
    try:
        simple = _SIMPLE.get(origin)
    except TypeError:  # unhashable annotation
        return None
    return list(simple) if simple else None


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a forward reference that does not resolve: take the text
        return inspect.signature(fn)


@dataclasses.dataclass(frozen=True)
class Parameters:
    """A function task's parameters: the description recorded in pgqueue.task_types, and the
    names of the context parameter and of positional-only ones (how the worker calls it)."""

    description: dict[str, Any]
    context: str | None
    positional_only: tuple[str, ...]
    order: tuple[str, ...]  # every parameter but the context one, in signature order


def describe_parameters(fn: Callable[..., Any], where: str) -> Parameters:
    """Read ``fn``'s signature into what is stored and checked; refuses ``*args`` (which no
    JSON object of names can carry) with an error naming ``where`` (the task type)."""
    params: list[dict[str, Any]] = []
    context: str | None = None
    positional_only: list[str] = []
    order: list[str] = []
    extra = False
    for p in _signature(fn).parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            raise ValidationError(
                "task",
                f"{where}: *{p.name} cannot be stored in a task (arguments are stored by "
                "name); take a list parameter instead",
            )
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if _is_context(p.annotation):
            if context is not None:
                raise ValidationError("task", f"{where}: only one parameter can be the context")
            context = p.name
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional_only.append(p.name)
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional_only.append(p.name)
        order.append(p.name)
        params.append(
            {
                "name": p.name,
                "kind": _KINDS[p.kind],
                "required": p.default is inspect.Parameter.empty,
                "types": json_types(p.annotation),
            }
        )
    return Parameters(
        description={"parameters": params, "extra": extra},
        context=context,
        positional_only=tuple(positional_only),
        order=tuple(order),
    )


# --- checking arguments against it (everywhere the same) -------------------------------------


def _json_type(value: Any) -> str | None:
    """The JSON type of a value, or None when it has none."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number" if math.isfinite(value) else None
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array" if all(_json_type(v) for v in value) else None
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) and _json_type(v) for k, v in value.items()):
            return None
        return "object"
    return None


def _not_json(value: Any) -> str:
    """What in ``value`` is not JSON, for the error: the type of the first such part."""
    if isinstance(value, float):
        return f"{value!r}"
    if isinstance(value, list | tuple):
        return next(_not_json(v) for v in value if _json_type(v) is None)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a {type(k).__name__} key"
            if _json_type(v) is None:
                return _not_json(v)
    return type(value).__name__


def _allows(types_: list[str], kind: str) -> bool:
    return kind in types_ or (kind == "integer" and "number" in types_)


def check_arguments(description: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """Raise InvalidArgument naming the first argument that is missing, unknown, not JSON or
    of a JSON type its annotation does not allow; ``description`` is what
    :func:`describe_parameters` recorded (pgqueue.task_types.parameters)."""
    params = description.get("parameters", [])
    known = {p["name"]: p for p in params}
    if not description.get("extra"):
        for name in arguments:
            if name not in known:
                raise InvalidArgument(name, f"unexpected argument {name!r}")
    for p in params:
        name = p["name"]
        if name not in arguments:
            if p.get("required"):
                raise InvalidArgument(name, f"argument {name!r} is missing")
            continue
        value = arguments[name]
        kind = _json_type(value)
        if kind is None:
            raise InvalidArgument(name, f"argument {name!r}: {_not_json(value)} is not JSON")
        allowed = p.get("types")
        if allowed and not _allows(allowed, kind):
            expected = " or ".join(allowed)
            raise InvalidArgument(name, f"argument {name!r} must be {expected}, not {kind}")
    for name, value in arguments.items():  # **kwargs: still JSON
        if name not in known and _json_type(value) is None:
            raise InvalidArgument(name, f"argument {name!r}: {_not_json(value)} is not JSON")
