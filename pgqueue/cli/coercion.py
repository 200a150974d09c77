"""Option values turned into Python values without pydantic, where the answer is certain.

typer 0.29 coerces every option's value through a pydantic ``TypeAdapter`` built on first
use, so the first option of any command that runs imports pydantic: about 100 ms, a fifth
of a worker's start, to read ``--concurrency 10``. pgqueue's options are strings,
numbers with bounds, flags and lists of strings. :func:`plain_coercion` gives those a
coercion that answers alone only where pydantic's answer is certain and the same: a string
for a ``str``, plain digits within the bounds for an ``int`` or ``float``, a default that is
already of its type. Anything else (a value out of bounds, ``' 10'``, ``1e3``, ``1_000``, a
word) goes to typer's own coercion, so that what typer accepts, and the message of what it
refuses, stay exactly typer's. ``tests/unit/test_cli_coercion.py`` compares the two on every
option of the command tree.

It reaches into typer (``typer._coercion``, a parameter's ``_runtime_param``): with a typer
that lacks them, nothing is replaced and typer coerces everything, as before.
"""

from __future__ import annotations

import math
import re
from typing import Any, get_args, get_origin

try:
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
except ImportError:  # pragma: no cover - another typer: leave its coercion alone
    RuntimeParam = None  # type: ignore[assignment,misc]

# Digits as pydantic reads them, and as int() and float() read them too; bounded in length so
# that an int stays within pydantic's 64 bits and a float's decimal is one float() and Rust's
# parser both round the same way (correctly).
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})\Z")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?\Z")


class _Unsure:
    """No certain answer: typer's own coercion decides."""


UNSURE = _Unsure()


def _within(number: float, info: Any) -> bool:
    return (info.min is None or number >= info.min) and (info.max is None or number <= info.max)


def plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """What typer's coercion makes of ``value`` for a parameter of ``annotation`` and
    ``info`` (its min and max), or UNSURE."""
    if annotation is str:
        return value if type(value) is str else UNSURE
    if annotation is int or annotation is float:
        if type(value) is str and (_INT if annotation is int else _FLOAT).match(value):
            number: float = annotation(value)
        elif type(value) is annotation and math.isfinite(value):
            number = value
        else:
            return UNSURE
        return number if _within(number, info) else UNSURE
    if annotation is bool:
        return value if type(value) is bool else UNSURE
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return list(value) if _strings(value) else UNSURE
    return UNSURE


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(type(v) is str for v in value)


def applies(descriptor: Any) -> bool:
    """Whether the parameter is one :func:`plain_value` knows: no parser, choice, path, file
    or clamping, which typer's own coercion handles."""
    info = descriptor.parameter_info
    if info.parser is not None or info.clamp or descriptor.file_annotation is not None:
        return False
    if descriptor.is_choice or descriptor.is_path:
        return False
    annotation = descriptor.annotation
    return annotation in (str, int, float, bool) or (
        get_origin(annotation) is list and get_args(annotation) == (str,)
    )


if RuntimeParam is not None:

    class PlainRuntimeParam(RuntimeParam):
        """A parameter's coercion: :func:`plain_value`, else typer's own (built only then).
        Its fields and ``__init__`` are RuntimeParam's (a frozen dataclass): no decorator,
        whose generated methods would cost every command's start a millisecond."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, self.parameter_info, value)
            if plain is not UNSURE:
                return plain
            descriptor: TypeDescriptor = param.type_descriptor
            return build_runtime_param(descriptor)._coerce_value(value, param=param, ctx=ctx)


def _give(param: Any) -> None:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return  # not typer's, or its coercion is already built
    if applies(descriptor):
        param._runtime_param = PlainRuntimeParam(
            parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
        )


def plain_coercion(command: Any) -> None:
    """Give the parameters of ``command`` (a click command or group, its subcommands too)
    that :func:`applies` to the plain coercion: when the command asks for its parameters,
    since its ``--help`` option is made only then."""
    if RuntimeParam is None:
        return
    pending = [command]
    while pending:
        cmd = pending.pop()
        pending.extend(getattr(cmd, "commands", {}).values())
        if getattr(cmd, "_plain_coercion", False):
            continue
        get_params = cmd.get_params

        def with_plain_coercion(ctx: Any, get_params: Any = get_params) -> Any:
            params = get_params(ctx)
            for param in params:
                _give(param)
            return params

        cmd.get_params = with_plain_coercion
        cmd._plain_coercion = True
