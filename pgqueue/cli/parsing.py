"""Values as people type them on the command line: payloads, counts, times and durations.

Each parser fails with a usage error that names the option and says what would have been
accepted, so a mistake is fixed from the message alone; ranges stay the library's to check,
so the command line and the HTTP API refuse the same values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import typer


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _reject_constant(name: str) -> Any:
    """NaN and Infinity: Python's json accepts them, but they are not JSON and PostgreSQL's
    jsonb refuses them."""
    raise typer.BadParameter(f"{name} is not valid JSON", param_hint="'--payload'")


def parse_payload(text: str) -> dict[str, Any]:
    """The --payload option: a JSON object, or a usage error naming what is wrong and where."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
            f"(character {exc.pos + 1})",
            param_hint="'--payload'",
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise typer.BadParameter(f"not usable JSON: {exc}", param_hint="'--payload'") from None
    except RecursionError:
        raise typer.BadParameter("nests too deeply", param_hint="'--payload'") from None
    if value is None:  # null: no payload, as None is in the library and the HTTP API
        return {}
    if not isinstance(value, dict):
        raise typer.BadParameter(
            f"must be a JSON object such as '{{\"order_id\": 42}}', not {_json_kind(value)}",
            param_hint="'--payload'",
        )
    return value


def _constant_as_text(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: not JSON, so --arg takes them as text


def parse_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    """The --arg NAME=VALUE options: a function task's arguments by name. VALUE is JSON when
    it parses as JSON (``42``, ``true``, ``null``, ``[1, 2]``, ``"42"`` for the string), else
    the text itself (``--arg to=a@example.com``), so that plain words need no quoting."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise typer.BadParameter(
                f"{pair!r} is not NAME=VALUE (for example order_id=42)", param_hint="'--arg'"
            )
        if name in out:
            raise typer.BadParameter(f"argument {name!r} is given twice", param_hint="'--arg'")
        try:
            out[name] = json.loads(text, parse_constant=_constant_as_text)
        except (ValueError, RecursionError):  # not JSON (or NaN, or absurdly deep): the text
            out[name] = text
    return out


def parse_count(text: str | None, option: str) -> int | None:
    """A whole number written as one (``2``, not ``2.0``: the library and the HTTP API refuse
    a float too); its range is the library's to check."""
    if text is None:
        return None
    if not re.fullmatch(r"\s*[+-]?\d+\s*", text):
        raise typer.BadParameter(f"{text!r} is not a whole number", param_hint=f"'{option}'")
    return int(text)


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 time that says its timezone (``Z`` or an offset)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time such as 2030-01-31T09:00:00+00:00",
            param_hint=f"'{option}'",
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise typer.BadParameter(
            f"{text!r} has no timezone; add one, e.g. {value.isoformat()}Z (UTC) or "
            f"{value.isoformat()}+02:00",
            param_hint=f"'{option}'",
        )
    return value


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float) -> float:
    """Seconds, or a number with a unit: 90s, 15m, 24h, 14d."""
    if isinstance(text, int | float):  # an option's default
        return float(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give seconds or e.g. 90s, 15m, 24h, 14d"
        )
    return float(match[1]) * DURATION_UNITS[match[2] or "s"]


def show_duration(seconds: float) -> str:
    """A duration as :func:`parse_duration` reads it, so what a listing shows can be typed
    back as an option."""
    for unit in ("d", "h", "m"):
        if seconds >= DURATION_UNITS[unit] and seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds / DURATION_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"
