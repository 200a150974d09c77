"""The public surface as text: the OpenAPI document, every CLI command's ``--help``, and the
names and signatures of ``pgqueue`` and ``pgqueue.aio``.

``test_public_surface.py`` compares them with the files beside this one, which were written
from main before the package was reorganised: a refactor that changes a route, an
option, a help line or a signature fails there. After a deliberate change to the surface,
regenerate with ``python -m tests.unit.surface.snapshot`` and review the diff.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OPENAPI = HERE / "openapi.json"
CLI_HELP = HERE / "cli_help.txt"
PYTHON_API = HERE / "python_api.txt"


def openapi_text() -> str:
    from pgqueue.api import ApiSettings, create_app

    # No server is needed to build the document; the closed port is never dialled.
    app = create_app(ApiSettings(database_url="postgresql://postgres@127.0.0.1:9/none"))
    return json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"


def _commands(group: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    # Through click's list_commands/get_command, not the commands dict: the root builds each
    # command from its module only when asked for it (pgqueue/cli/root.py).
    yield path
    if not hasattr(group, "list_commands"):
        return
    for name in sorted(group.list_commands(None)):
        yield from _commands(group.get_command(None, name), (*path, name))


def cli_help_text() -> str:
    import typer.main
    from typer.testing import CliRunner

    from pgqueue.cli import app

    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        runner = CliRunner()
        root = typer.main.get_command(app)
        out = []
        for path in _commands(root, ()):
            result = runner.invoke(app, [*path, "--help"], env=env, terminal_width=100)
            out.append(f"==== pgqueue {' '.join(path)} --help (exit {result.exit_code})\n")
            out.append(result.output)
        return "".join(out)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _describe(module: Any, name: str) -> str:
    obj = getattr(module, name)
    if inspect.isclass(obj):
        return f"{name}: class"
    if callable(obj):
        kind = "async def" if inspect.iscoroutinefunction(obj) else "def"
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = "(...)"
        return f"{name}: {kind}{sig}"
    return f"{name}: {type(obj).__name__}"


def python_api_text() -> str:
    import pgqueue
    import pgqueue.aio

    lines = ["# pgqueue"]
    lines += [_describe(pgqueue, n) for n in sorted(pgqueue.__all__)]
    lines.append("# pgqueue.aio")
    public = sorted(
        n
        for n, v in vars(pgqueue.aio).items()
        if not n.startswith("_") and inspect.iscoroutinefunction(v)
    )
    lines += [_describe(pgqueue.aio, n) for n in public]
    return "\n".join(lines) + "\n"


def main() -> None:
    OPENAPI.write_text(openapi_text(), encoding="utf-8")
    CLI_HELP.write_text(cli_help_text(), encoding="utf-8")
    PYTHON_API.write_text(python_api_text(), encoding="utf-8")


if __name__ == "__main__":
    main()
