"""The package's layout keeps the layers of docs/architecture.md honest.

Read from the source with ``ast`` (nothing is imported), so a violation names the module and
the line: no import cycle between pgqueue's modules; the core imports neither the worker nor
the interfaces; the worker imports no interface; and no function is longer than 100 lines
unless its docstring says why it is long.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pgqueue"

# The layers, top first; a module belongs to the first whose prefix it has, else to the core.
INTERFACES = ("pgqueue.api", "pgqueue.cli", "pgqueue.dashboard", "pgqueue.demo", "pgqueue.bench")
INTEGRATIONS = ("pgqueue.contrib", "pgqueue.testing")
WORKER = ("pgqueue.worker", "pgqueue.supervisor")
FACADES = ("pgqueue", "pgqueue.__main__")  # the public names gather from every layer
LONGEST_FUNCTION = 100


@dataclass(frozen=True)
class Import:
    module: str
    target: str
    line: int


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[Import]:
    """Every import of a pgqueue module, at module level or inside a function (a lazy import
    is still a dependency), resolved to the module it loads."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [(base, a.name) for a in node.names]
        else:
            continue
        for base, name in names:
            if not base.startswith("pgqueue"):
                continue
            target = f"{base}.{name}" if name and f"{base}.{name}" in MODULES else base
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target != module:
                yield Import(module, target, node.lineno)


IMPORTS = [i for m, p in MODULES.items() for i in _imports(m, p)]


def _layer(module: str) -> str:
    for name, prefixes in (
        ("facade", FACADES),
        ("interface", INTERFACES),
        ("integration", INTEGRATIONS),
        ("worker", WORKER),
    ):
        if name == "facade":
            if module in prefixes:
                return name
        elif any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return "core"


def _cycle() -> list[str] | None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        graph[i.module].add(i.target)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_layer_finder_sees_the_packages_it_judges() -> None:
    # The rules below pass vacuously if the layers are misnamed; they are not.
    layers = {_layer(m) for m in MODULES}
    assert {"facade", "interface", "worker", "core"} <= layers
    assert _layer("pgqueue.api") == "interface" and _layer("pgqueue.queries") == "core"


ALLOWED = {
    "core": {"core"},
    "worker": {"core", "worker"},
    "integration": {"core", "worker", "integration"},
    "interface": {"core", "worker", "integration", "interface"},
    "facade": {"core", "worker", "interface", "integration", "facade"},
}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = [
        f"{i.module}:{i.line} ({_layer(i.module)}) imports {i.target} ({_layer(i.target)})"
        for i in IMPORTS
        if _layer(i.target) not in ALLOWED[_layer(i.module)]
    ]
    assert wrong == []


def test_no_interface_imports_another() -> None:
    # The CLI and the API are peers over the library: neither reaches into the other.
    def top(module: str) -> str:
        return next(p for p in INTERFACES if module == p or module.startswith(p + "."))

    wrong = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in IMPORTS
        if _layer(i.module) == _layer(i.target) == "interface"
        and top(i.module) != top(i.target)
        and top(i.target) != "pgqueue.dashboard"  # the API serves the dashboard's files
        and top(i.module) != "pgqueue.cli"  # the CLI starts the API, the demo and the bench
    ]
    assert wrong == []


def test_no_function_is_longer_than_100_lines_without_saying_why() -> None:
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if length > LONGEST_FUNCTION and "long" not in doc.lower():
                    long.append(f"{module}.{node.name}: {length} lines")
    assert long == []
