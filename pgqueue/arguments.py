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
(an ``int`` is a number; a ``bool`` is not an integer).

Converted: a parameter annotated ``datetime`` (aware only: a naive one is refused, since it
names another instant on each machine), ``date``, ``time``, ``timedelta``, ``Decimal``,
``UUID``, an ``Enum``, a dataclass or a pydantic model (pydantic is never imported here; a
model class exists only once it is), or ``Optional``, ``list[X]`` or ``dict[str, X]`` of
them, has its argument encoded at enqueue (:meth:`Parameters.encode`: a value of the type, or
its JSON form) and decoded before the call (:meth:`Parameters.decode`). The stored JSON:
ISO 8601 strings (a date-time with its UTC offset), seconds for a timedelta, a string for a
Decimal (every digit kept), the UUID's text, the Enum member's value, the object of a
dataclass's fields (each converted by its own annotation) or ``model_dump(mode="json")``.
What a worker records for such a parameter (``format``, ``enum``, ``items``, ``values``,
``properties``) lets the CLI and the HTTP API refuse at submit what it could not decode; a
stored argument that still does not decode raises :class:`UndecodableArgument`, which
dead-letters the task at once. A union of several such types is not converted, nor a tuple
of them. Other annotations are not checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import inspect
import math
import sys
import types
import typing
import uuid
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
    """``fn``'s signature with its annotations evaluated (``from __future__ import
    annotations`` makes them strings). One that does not resolve (a class defined inside a
    function, a forward reference) is kept as its text, without costing the others theirs:
    a ``datetime`` parameter is converted even beside a ``"LocalThing"`` one."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:
        signature = inspect.signature(fn)
    scope = getattr(inspect.unwrap(fn), "__globals__", {})
    params = []
    for p in signature.parameters.values():
        annotation = p.annotation
        if isinstance(annotation, str):  # what does not resolve is kept as text: json_types
            with contextlib.suppress(Exception):
                annotation = eval(annotation, scope)  # as inspect's eval_str does
        params.append(p.replace(annotation=annotation))
    return signature.replace(parameters=params)


@dataclasses.dataclass(frozen=True)
class Parameters:
    """A function task's parameters: the description recorded in pgqueue.task_types, and the
    names of the context parameter and of positional-only ones (how the worker calls it)."""

    description: dict[str, Any]
    context: str | None
    positional_only: tuple[str, ...]
    order: tuple[str, ...]  # every parameter but the context one, in signature order
    # The parameters whose arguments are converted (a datetime, a Decimal, a dataclass, ...).
    codecs: Mapping[str, Codec] = dataclasses.field(default_factory=dict)

    def encode(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments with each converted one in its JSON form; raises InvalidArgument
        naming the one that does not fit its annotation."""
        if not self.codecs:
            return arguments
        out = dict(arguments)
        for name, codec in self.codecs.items():
            if name in out:
                try:
                    out[name] = codec.encode(out[name])
                except Misfit as exc:
                    raise misfit_error(name, exc) from None
        return out

    def decode(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """The payload's arguments as the function takes them (a date-time string back to a
        datetime, ...); raises :class:`UndecodableArgument`, which dead-letters the task."""
        if not self.codecs:
            return payload
        out = dict(payload)
        for name, codec in self.codecs.items():
            if name in out:
                try:
                    out[name] = codec.decode(out[name])
                except Misfit as exc:
                    raise misfit_error(name, exc, UndecodableArgument) from None
        return out


def describe_parameters(fn: Callable[..., Any], where: str) -> Parameters:
    """Read ``fn``'s signature into what is stored and checked; refuses ``*args`` (which no
    JSON object of names can carry) with an error naming ``where`` (the task type)."""
    params: list[dict[str, Any]] = []
    context: str | None = None
    positional_only: list[str] = []
    order: list[str] = []
    codecs: dict[str, Codec] = {}
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
        try:
            codec = codec_for(p.annotation)
        except TypeError as exc:  # an Enum whose values are not JSON
            raise ValidationError("task", f"{where}: parameter {p.name!r}: {exc}") from None
        if codec.converts:
            if p.default is None and not isinstance(codec, _Nullable):
                codec = _Nullable(codec)  # ``when: datetime = None`` takes None, as it says
            codecs[p.name] = codec
        params.append(
            {
                "name": p.name,
                "kind": _KINDS[p.kind],
                "required": p.default is inspect.Parameter.empty,
                **codec.schema(),
            }
        )
    return Parameters(
        description={"parameters": params, "extra": extra},
        context=context,
        positional_only=tuple(positional_only),
        order=tuple(order),
        codecs=codecs,
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
        if _CONVERTED.intersection(p):
            try:
                _fits(p, value)
            except Misfit as exc:
                raise misfit_error(name, exc) from None
            continue
        allowed = p.get("types")
        if allowed and not _allows(allowed, kind):
            expected = " or ".join(allowed)
            raise InvalidArgument(name, f"argument {name!r} must be {expected}, not {kind}")
    for name, value in arguments.items():  # **kwargs: still JSON
        if name not in known and _json_type(value) is None:
            raise InvalidArgument(name, f"argument {name!r}: {_not_json(value)} is not JSON")


# What a converted parameter's description has that a plain one has not.
_CONVERTED = frozenset({"format", "enum", "items", "values", "properties"})


def _fits(schema: Mapping[str, Any], value: Any) -> None:
    """Check a JSON value against a converted parameter's recorded description (what its
    codec would decode), raising the codec's own :class:`Misfit`: the CLI and the API refuse
    at submit what the worker could not decode. A format this version does not know (a newer
    worker's) is not checked."""
    if value is None and "null" in (schema.get("types") or ()):
        return
    fmt = schema.get("format")
    if fmt in _SCALARS:
        _SCALARS[fmt][1](value)
        return
    if "enum" in schema:
        _enum_member(schema.get("class", "the enum"), list(schema["enum"]), value)
        return
    kind = _json_type(value)
    allowed = schema.get("types")
    if allowed and kind is not None and not _allows(allowed, kind):
        what = schema.get("class")
        expected = f"{what} (an object of its fields)" if what else " or ".join(allowed)
        raise Misfit(f"must be {expected}, not {kind}")
    if "items" in schema and isinstance(value, list):
        for i, v in enumerate(value):
            try:
                _fits(schema["items"], v)
            except Misfit as exc:
                raise exc.within(f"[{i}]") from None
    if "values" in schema and isinstance(value, Mapping):
        for k, v in value.items():
            try:
                _fits(schema["values"], v)
            except Misfit as exc:
                raise exc.within(f"[{k!r}]") from None
    if "properties" in schema and isinstance(value, Mapping):
        _fits_object(schema, value)


def _fits_object(schema: Mapping[str, Any], value: Mapping[str, Any]) -> None:
    what, properties = schema.get("class", "the object"), schema["properties"]
    for name in value:
        if name not in properties:
            raise Misfit(f"has a field {what} does not have: {name!r:.64}")
    for name in schema.get("required_properties", ()):
        if name not in value:
            raise Misfit(f"lacks {what}'s required field {name!r}")
    for name, v in value.items():
        try:
            _fits(properties[name], v)
        except Misfit as exc:
            raise exc.within(f".{name}") from None


# --- typed arguments: values that are not plain JSON, and back ---------------------------------

# A parameter annotated with one of these types (or Optional, list[...] or dict[str, ...] of
# them, a dataclass or a pydantic model) has its argument encoded to JSON at enqueue and
# decoded back before the call. The stored form is readable in psql, and is what an HTTP or CLI
# submit by type name sends: a date-time is ISO 8601 with its UTC offset, a Decimal a string
# (its precision kept), a timedelta its seconds, a UUID its text, an Enum member its value.

FORMATS = {
    "date-time": "a date-time with a UTC offset (ISO 8601, such as 2026-01-02T03:04:05+00:00)",
    "date": "a date (ISO 8601, such as 2026-01-02)",
    "time": "a time of day (ISO 8601, such as 03:04:05)",
    "duration": "a duration in seconds (a number)",
    "decimal": 'a decimal number (a string such as "12.50", or a number)',
    "uuid": "a UUID (such as 6f1c2a52-8a7e-4c3b-9d0f-1e2d3c4b5a69)",
}


class Misfit(Exception):
    """A value that does not fit its annotation; ``path`` is where in the argument (``[2]``,
    ``.placed_at``), joined to the argument's name by :func:`misfit_error`."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def within(self, step: str) -> Misfit:
        return Misfit(self.message, step + self.path)


def misfit_error(name: str, misfit: Misfit, cls: type[InvalidArgument] = InvalidArgument) -> Any:
    where = f"argument {name!r}{misfit.path}"
    return cls(name, f"{where} {misfit.message}")


class UndecodableArgument(InvalidArgument):
    """A stored argument that cannot be decoded to its parameter's annotation (or does not
    fit the parameters at all) when the worker is about to call the function: a payload
    submitted by type name with a bad date, say. The payload never changes, so no retry
    could succeed: the worker dead-letters the task at once with this message."""


def _kind_of(value: Any) -> str:
    """What a value is, for an error: its JSON type, or its Python type when it has none."""
    return _json_type(value) or type(value).__name__


def _parse_datetime(value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise Misfit(f"must be {FORMATS['date-time']}, not {value[:64]!r}") from None
    else:
        raise Misfit(f"must be {FORMATS['date-time']}, not {_kind_of(value)}")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise Misfit(
            f"has no UTC offset ({parsed.isoformat()}): a naive date-time means another "
            "instant on each machine; give it a tzinfo (datetime.now(UTC)) or end the "
            "string with an offset such as +00:00"
        )
    return parsed


def _parse_date(value: Any) -> datetime.date:
    if isinstance(value, datetime.datetime):
        raise Misfit("must be a date, not a datetime (pass its .date())")
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            raise Misfit(f"must be {FORMATS['date']}, not {value[:64]!r}") from None
    raise Misfit(f"must be {FORMATS['date']}, not {_kind_of(value)}")


def _parse_time(value: Any) -> datetime.time:
    if isinstance(value, datetime.time):
        return value
    if isinstance(value, str):
        try:
            return datetime.time.fromisoformat(value)
        except ValueError:
            raise Misfit(f"must be {FORMATS['time']}, not {value[:64]!r}") from None
    raise Misfit(f"must be {FORMATS['time']}, not {_kind_of(value)}")


def _parse_duration(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return datetime.timedelta(seconds=value)
        except OverflowError:
            raise Misfit(f"is out of range for a timedelta ({value} s)") from None
    raise Misfit(f"must be {FORMATS['duration']}, not {_kind_of(value)}")


def _parse_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, decimal.Decimal):
        parsed = value
    elif isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            parsed = decimal.Decimal(str(value).strip() if isinstance(value, str) else repr(value))
        except decimal.InvalidOperation:
            raise Misfit(f"must be {FORMATS['decimal']}, not {str(value)[:64]!r}") from None
    else:
        raise Misfit(f"must be {FORMATS['decimal']}, not {_kind_of(value)}")
    if not parsed.is_finite():
        raise Misfit(f"must be a finite decimal number, not {parsed}")
    if isinstance(value, float) and len(parsed.as_tuple().digits) > _FLOAT_DIGITS:
        raise Misfit(
            f"is a float of more than {_FLOAT_DIGITS} digits ({value!r}), which may have lost "
            'some on its way here: send the decimal as a string, such as "12.50", or a Decimal'
        )
    return parsed


# Every decimal number of up to 15 significant digits comes back from a float (a JSON number
# read by Python) as written; one of more may not.
_FLOAT_DIGITS = 15


def _parse_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            raise Misfit(f"must be {FORMATS['uuid']}, not {value[:64]!r}") from None
    raise Misfit(f"must be {FORMATS['uuid']}, not {_kind_of(value)}")


# format: (the Python type, its parser, its JSON form, the JSON types of that form)
_SCALARS: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any], list[str]]] = {
    "date-time": (datetime.datetime, _parse_datetime, lambda v: v.isoformat(), ["string"]),
    "date": (datetime.date, _parse_date, lambda v: v.isoformat(), ["string"]),
    "time": (datetime.time, _parse_time, lambda v: v.isoformat(), ["string"]),
    "duration": (
        datetime.timedelta,
        _parse_duration,
        lambda v: (
            v // datetime.timedelta(seconds=1)
            if v % datetime.timedelta(seconds=1) == datetime.timedelta(0)
            else v.total_seconds()
        ),
        ["integer", "number"],
    ),
    "decimal": (decimal.Decimal, _parse_decimal, str, ["integer", "number", "string"]),
    "uuid": (uuid.UUID, _parse_uuid, str, ["string"]),
}
_SCALAR_FORMATS = {python_type: fmt for fmt, (python_type, *_) in _SCALARS.items()}


class Codec:
    """How values of one annotation become JSON (``encode``, at enqueue: a value of the type
    or its JSON form, normalised) and come back (``decode``, before the call); ``schema`` is
    what is recorded about it in pgqueue.task_types, for :func:`check_arguments`. Both raise
    :class:`Misfit`. The base class converts nothing: the value must be JSON of the
    annotation's JSON types."""

    converts = False

    def __init__(self, types: list[str] | None = None) -> None:
        self.types = types

    def schema(self) -> dict[str, Any]:
        return {"types": self.types}

    def encode(self, value: Any) -> Any:
        kind = _json_type(value)
        if kind is None:
            raise Misfit(f"is not JSON (a {_not_json(value)})")
        if self.types and not _allows(self.types, kind):
            raise Misfit(f"must be {' or '.join(self.types)}, not {kind}")
        return value

    def decode(self, value: Any) -> Any:
        return self.encode(value)


class _Scalar(Codec):
    converts = True

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.python_type, self.parse, self.to_json, types = _SCALARS[fmt]
        super().__init__(types)

    def schema(self) -> dict[str, Any]:
        return {"types": self.types, "format": self.format}

    def encode(self, value: Any) -> Any:
        return self.to_json(self.parse(value))

    def decode(self, value: Any) -> Any:
        return self.parse(value)


class _EnumCodec(Codec):
    converts = True

    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls = cls
        self.values = [m.value for m in cls]
        for v in self.values:
            if _json_type(v) is None:
                raise TypeError(f"{cls.__name__}'s values are not JSON ({v!r})")
        super().__init__(sorted({typing.cast(str, _json_type(v)) for v in self.values}))

    def schema(self) -> dict[str, Any]:
        return {"types": self.types, "enum": self.values, "class": self.cls.__name__}

    def _member(self, value: Any) -> enum.Enum:
        if isinstance(value, self.cls):
            return value
        return typing.cast(enum.Enum, _enum_member(self.cls.__name__, self.values, value, self.cls))

    def encode(self, value: Any) -> Any:
        return self._member(value).value

    def decode(self, value: Any) -> Any:
        return self._member(value)


def _enum_member(name: str, values: list[Any], value: Any, cls: Any = None) -> Any:
    """The member of an Enum (``cls``; None: only check ``value`` is among ``values``) whose
    value is ``value``; a bool is not the number 1, nor 1.0 the number 1."""
    for v in values:
        if type(v) is type(value) and v == value:
            return v if cls is None else cls(v)
    shown = ", ".join(repr(v) for v in values[:10])
    raise Misfit(f"must be one of {name}'s values ({shown}), not {value!r:.64}")


class _Nullable(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.converts = inner.converts
        super().__init__(sorted({*(inner.types or []), "null"}) if inner.types else None)

    def schema(self) -> dict[str, Any]:
        return {**self.inner.schema(), "types": self.types}

    def encode(self, value: Any) -> Any:
        return None if value is None else self.inner.encode(value)

    def decode(self, value: Any) -> Any:
        return None if value is None else self.inner.decode(value)


class _ListCodec(Codec):
    def __init__(self, item: Codec) -> None:
        self.item = item
        self.converts = item.converts
        super().__init__(["array"])

    def schema(self) -> dict[str, Any]:
        return {"types": self.types, "items": self.item.schema()}

    def _each(self, value: Any, convert: Callable[[Any], Any]) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise Misfit(f"must be array, not {_kind_of(value)}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(convert(v))
            except Misfit as exc:
                raise exc.within(f"[{i}]") from None
        return out

    def encode(self, value: Any) -> Any:
        return self._each(value, self.item.encode)

    def decode(self, value: Any) -> Any:
        return self._each(value, self.item.decode)


class _DictCodec(Codec):
    def __init__(self, value: Codec) -> None:
        self.value = value
        self.converts = value.converts
        super().__init__(["object"])

    def schema(self) -> dict[str, Any]:
        return {"types": self.types, "values": self.value.schema()}

    def _each(self, value: Any, convert: Callable[[Any], Any]) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise Misfit(f"must be object, not {_kind_of(value)}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise Misfit(f"has a {type(k).__name__} key ({k!r:.64}); JSON keys are strings")
            try:
                out[k] = convert(v)
            except Misfit as exc:
                raise exc.within(f"[{k!r}]") from None
        return out

    def encode(self, value: Any) -> Any:
        return self._each(value, self.value.encode)

    def decode(self, value: Any) -> Any:
        return self._each(value, self.value.decode)


class _ObjectCodec(Codec):
    """A dataclass, stored as the object of its fields (each encoded by its annotation)."""

    converts = True

    def __init__(self, cls: type) -> None:
        self.cls = cls
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a forward reference that does not resolve: fields unchecked
            hints = {}
        self.fields = {
            f.name: codec_for(hints.get(f.name, inspect.Parameter.empty))
            for f in dataclasses.fields(cls)
            if f.init
        }
        self.required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        super().__init__(["object"])

    def schema(self) -> dict[str, Any]:
        return {
            "types": self.types,
            "class": self.cls.__name__,
            "properties": {n: c.schema() for n, c in self.fields.items()},
            "required_properties": self.required,
        }

    def decode(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            return value
        fields = _check_object(value, self.fields, self.required, self.cls.__name__)
        try:
            return self.cls(**fields)
        except (TypeError, ValueError) as exc:  # the class's own checks (__post_init__)
            raise Misfit(f"is not a valid {self.cls.__name__}: {exc}") from None

    def encode(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            out = {}
            for name, codec in self.fields.items():
                try:
                    out[name] = codec.encode(getattr(value, name))
                except Misfit as exc:
                    raise exc.within(f".{name}") from None
            return out
        return self.encode(self.decode(value))


def _check_object(
    value: Any, fields: Mapping[str, Codec], required: list[str], what: str
) -> dict[str, Any]:
    """The decoded fields of an object for a class of these fields, refusing a value that is
    not an object, an unknown field and a missing required one."""
    if not isinstance(value, Mapping):
        raise Misfit(f"must be {what} (an object of its fields), not {_kind_of(value)}")
    for name in value:
        if name not in fields:
            raise Misfit(f"has a field {what} does not have: {name!r:.64}")
    for name in required:
        if name not in value:
            raise Misfit(f"lacks {what}'s required field {name!r}")
    out = {}
    for name, v in value.items():
        try:
            out[name] = fields[name].decode(v)
        except Misfit as exc:
            raise exc.within(f".{name}") from None
    return out


class _PydanticCodec(Codec):
    """A pydantic model, stored as ``model_dump(mode="json")``, read back by
    ``model_validate`` (pydantic's own checks and error text)."""

    converts = True

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        super().__init__(["object"])

    def schema(self) -> dict[str, Any]:
        return {"types": self.types, "class": self.cls.__name__}

    def decode(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            return value
        if not isinstance(value, Mapping):
            raise Misfit(
                f"must be {self.cls.__name__} (an object of its fields), not {_kind_of(value)}"
            )
        pydantic = sys.modules["pydantic"]
        try:
            return self.cls.model_validate(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
            loc = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in first["loc"])
            raise Misfit(
                f"is not a valid {self.cls.__name__}: {first['msg']}"
                + (f" (at {loc.lstrip('.')})" if loc else "")
            ) from None

    def encode(self, value: Any) -> Any:
        return self.decode(value).model_dump(mode="json")


def _is_pydantic_model(annotation: Any) -> bool:
    """Whether ``annotation`` is a pydantic model class, never importing pydantic: a model
    class exists only once pydantic is imported."""
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(annotation, type)
        and issubclass(annotation, pydantic.BaseModel)
    )


def codec_for(annotation: Any) -> Codec:
    """The codec of an annotation: a converting one for the types above (and Optional,
    ``list[X]``, ``dict[str, X]`` of them), else one that checks the JSON types
    :func:`json_types` allows."""
    if annotation is inspect.Parameter.empty or isinstance(annotation, str):
        return Codec(json_types(annotation))
    if typing.get_origin(annotation) is typing.Annotated:
        return codec_for(typing.get_args(annotation)[0])
    members = _union_members(annotation)
    if members is not None:
        present = [m for m in members if m is not type(None) and m is not None]
        if len(present) == 1 and len(present) < len(members):
            inner = codec_for(present[0])
            if inner.converts:
                return _Nullable(inner)
        return Codec(json_types(annotation))
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and len(args) == 1:
        item = codec_for(args[0])
        return _ListCodec(item) if item.converts else Codec(json_types(annotation))
    if origin is dict and len(args) == 2 and args[0] is str:
        value = codec_for(args[1])
        return _DictCodec(value) if value.converts else Codec(json_types(annotation))
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return _EnumCodec(annotation)
        for python_type, fmt in _SCALAR_FORMATS.items():
            if annotation is python_type:
                return _Scalar(fmt)
        if dataclasses.is_dataclass(annotation):
            return _ObjectCodec(annotation)
        if _is_pydantic_model(annotation):
            return _PydanticCodec(annotation)
    return Codec(json_types(annotation))
