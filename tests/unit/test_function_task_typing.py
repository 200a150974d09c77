"""A function task carries its function's signature to mypy: ``enqueue``, ``bind``
and ``options(...).enqueue`` with an argument of the wrong type are type errors, and the
decorated object is still typed as a call of the function.

Runs mypy (strict) on a small module that uses the public API as an application would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

SNIPPET = """
import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.task(name="send_receipt", queue="mail")
def send_receipt(order_id: int, *, resend: bool = False) -> str:
    return ""


@tasks.task
async def bare(n: int) -> int:
    return n


def use(conn: object) -> None:
    handle: pgqueue.TaskHandle = send_receipt.enqueue(conn, 42, resend=True)
    send_receipt.enqueue(conn, "x")  # error
    send_receipt.options(queue="urgent").enqueue(conn, 1, resend="no")  # error
    result: str = send_receipt(1)
    send_receipt.bind(1, foo=2)  # error
    bare.enqueue(conn, 1)
"""


def test_wrong_argument_types_are_mypy_errors_and_right_ones_are_not(tmp_path: Path) -> None:
    module = tmp_path / "app_tasks.py"
    module.write_text(SNIPPET)
    expected = [str(n) for n, line in enumerate(SNIPPET.splitlines(), 1) if "# error" in line]
    out, err, _ = mypy_api.run(
        ["--strict", "--no-error-summary", "--hide-error-context", str(module)]
    )
    lines = sorted(  # the line number of each error
        line.split(": error: ")[0].rsplit(":", 1)[1]
        for line in out.splitlines()
        if ": error: " in line
    )
    assert lines == expected, out + err
    assert 'incompatible type "str"; expected "int"' in out
    assert 'Unexpected keyword argument "foo"' in out
