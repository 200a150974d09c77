"""The text PostgreSQL gives back for a value stored as jsonb, built here independently of
pgqueue's encoder, for the tests of the size rule (a payload's or a result's size is that
text's, in UTF-8 bytes); shared like helpers.py.

jsonb prints ", " between items and ": " after a key, and its numbers as numeric prints them:
in full, without an exponent, and no negative zero. Strings are escaped as Python's JSON
escapes them (ensure_ascii off).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def jsonb_text(value: Any) -> str:
    """What ``value::jsonb::text`` is, for a value of JSON types with unique keys."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        printed = format(Decimal(repr(value)), "f")
        return printed.removeprefix("-") if value == 0 else printed
    if isinstance(value, dict):
        items = (f"{_key(k)}: {jsonb_text(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(jsonb_text(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {value!r}")


def _key(key: Any) -> str:
    """A key as JSON writes it: a string, or a number, bool or None made one."""
    return json.dumps({key: None}, ensure_ascii=False)[1 : -len(": null}")]


def jsonb_size(value: Any) -> int:
    """The UTF-8 bytes of jsonb_text: the size a payload or a result is measured by."""
    return len(jsonb_text(value).encode("utf-8"))
