"""The command line's plain coercion (pgqueue/cli/coercion.py) answers as typer's own does.

It turns option values into Python values without pydantic where the answer is certain, and
hands the rest to typer's coercion. For every option of every command, and a set of values
from the obvious to the odd, both give the same value of the same type, or both refuse it
with the same message. A typer whose answers change fails here, not in front of a user.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import typer
import typer.main
from typer._click import Context
from typer._coercion import build_runtime_param

from pgqueue.cli import coercion, root

VALUES: list[Any] = [
    *("10", "010", "0", "-0", "1", "-1", "7", "65535", "65536", "9" * 19, "-" + "9" * 19),
    *(" 10", "10 ", "+10", "1_000", "1e3", "10.0", "0.5", "-0.5", ".5", "5.", "0.01", "0.009"),
    *("1." + "1" * 20, "abc", "", "inf", "-inf", "nan", "true", "no", "\udcff", "é", "a\nb"),
    *(10, 0, -3, 10.0, 0.5, 30.0, 3.7, float("inf"), float("nan"), True, False),
    *(("a", "b"), ["x"], (), ("a", 1), None),
]


def commands() -> Iterator[tuple[str, Any]]:
    """Every command of the tree (the root, each command, each group's subcommands)."""
    group = typer.main.get_command(root.app)
    yield "pgqueue", group
    pending = [(entry.name, group.get_command(None, entry.name)) for entry in root.TREE]
    while pending:
        path, cmd = pending.pop()
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            pending.append((f"{path} {name}", sub))


def parameters() -> Iterator[tuple[str, Any, Any]]:
    for path, cmd in commands():
        ctx = Context(cmd, info_name=path)
        for param in cmd.get_params(ctx):
            if getattr(param, "type_descriptor", None) is not None:
                yield f"{path} {param.name}", ctx, param


def typer_answer(param: Any, ctx: Any, value: Any) -> tuple[str, Any]:
    try:
        return "value", build_runtime_param(param.type_descriptor).coerce(value, param, ctx)
    except typer.BadParameter as exc:
        return "refused", exc.format_message()


def plain_answer(param: Any, ctx: Any, value: Any) -> tuple[str, Any]:
    runtime = coercion.PlainRuntimeParam(
        parameter_info=param.type_descriptor.parameter_info,
        annotation=param.type_descriptor.annotation,
    )
    try:
        return "value", runtime.coerce(value, param, ctx)
    except typer.BadParameter as exc:
        return "refused", exc.format_message()


def same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    (kind_a, a_value), (kind_b, b_value) = a, b
    if kind_a != kind_b or type(a_value) is not type(b_value):
        return False
    if isinstance(a_value, float) and math.isnan(a_value):
        return math.isnan(b_value)
    return bool(a_value == b_value)


def test_every_option_of_every_command_is_coerced_as_typer_coerces_it() -> None:
    checked = 0
    for name, ctx, param in parameters():
        if not coercion.applies(param.type_descriptor):
            continue
        for value in [*VALUES, param.default]:
            ours, typers = plain_answer(param, ctx, value), typer_answer(param, ctx, value)
            assert same(ours, typers), (name, value, ours, typers)
            checked += 1
    assert checked > 100 * len(VALUES) // 2, checked


@pytest.mark.parametrize("value", ["10", " 10", "1e3", "abc", 10])
def test_a_value_without_a_certain_answer_goes_to_typer(value: Any) -> None:
    info = typer.models.OptionInfo(min=1)
    plain = coercion.plain_value(int, info, value)
    assert (plain is coercion.UNSURE) == (value not in ("10", 10)), plain


def test_the_worker_and_the_root_need_no_typer_coercion_at_all() -> None:
    # (Left to typer elsewhere: a choice, `list --status`, and the options with a parser.)
    for name, _, param in parameters():
        if name.startswith(("worker ", "pgqueue ")):
            assert coercion.applies(param.type_descriptor), name
