"""The documentation's Reference pages are generated from the code (tools/docs/): each page
covers everything it describes, so that a new command, option, route, setting, public name or
column cannot be left out of the site. No MkDocs needed: the generators are plain functions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import pgqueue
from pgqueue.settings_catalog import SETTINGS
from tools.docs import cli_page, config_page, hooks, http_page, python_page, sql_page

ROOT = Path(__file__).resolve().parents[2]


def _command_paths(command: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path, walked here rather than by the generator under test."""
    if not hasattr(command, "list_commands"):
        return [path]
    ctx = command.context_class(command)
    subs = [(n, command.get_command(ctx, n)) for n in command.list_commands(ctx)]
    return [path, *(p for n, sub in subs for p in _command_paths(sub, (*path, n)))]


def test_the_cli_page_has_every_command_and_every_option() -> None:
    import typer.main

    from pgqueue.cli import app

    page = cli_page.render()
    found = list(cli_page.commands())
    assert len(found) > 30, "the walk of the command tree found too few commands"
    assert [p for p, _, _ in found] == _command_paths(typer.main.get_command(app))
    for path, command, ctx in found:
        anchor = f"{{#{cli_page.anchor(path)}}}"
        assert anchor in page, f"pgqueue {' '.join(path)}"
        section = page.split(anchor, 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            record = param.get_help_record(ctx)
            if record is not None and not getattr(param, "hidden", False):
                assert f"| `{record[0]}` |" in section, (path, record[0])


def test_the_http_page_has_every_route_with_its_scope() -> None:
    app = http_page.build_app()
    page = http_page.render(app)
    names = http_page.route_names(app)
    assert ("POST", "/api/v1/tasks") in names
    for method, path in names:
        assert f"`{path}`" in page or f"`{method} {path}`" in page, (method, path)
    for path, operations in app.openapi()["paths"].items():
        for method in operations:
            name = names[(method.upper(), path)]
            assert f"{{#{name}}}" in page, name
            section = page.split(f"{{#{name}}}", 1)[1].split("\n### ", 1)[0]
            assert "Scope: " in section, name


def test_every_schema_the_http_page_links_to_is_on_it() -> None:
    page = http_page.render()
    targets = set(re.findall(r"\(#(schema-\w+)\)", page))
    anchors = set(re.findall(r"\{#(schema-\w+)\}", page))
    assert targets and targets <= anchors, sorted(targets - anchors)


def test_the_configuration_page_has_every_setting() -> None:
    page = config_page.render()
    for setting in SETTINGS:
        assert f"`{setting.env}`" in page


def test_the_configuration_page_links_only_to_pages_that_exist() -> None:
    page = config_page.render(lambda docs_page: docs_page == "security.md")
    links = set(re.findall(r"\]\(\.\./([^)#]+)\)", page))
    assert links == {"security.md"}


def test_the_python_page_documents_every_public_name() -> None:
    page = python_page.render().split("## Beyond", 1)[0]
    documented = set(re.findall(r"^::: pgqueue\.(?:[\w.]+\.)?(\w+)$", page, re.MULTILINE))
    anchored = set(re.findall(r'^<a id="pgqueue\.(\w+)"></a>$', page, re.MULTILINE))
    assert anchored == {"enqueue"}, "a name shadowed by a submodule is anchored by hand"
    assert documented == set(pgqueue.__all__) - {"__version__"}
    assert "`enqueue`" in page.split("## Async", 1)[1]


def test_the_sql_catalogue_describes_every_column_of_the_schema() -> None:
    known = sql_page.columns()
    views = set(re.findall(r"^CREATE VIEW pgqueue\.(\w+)", sql_page.SNAPSHOT.read_text(), re.M))
    assert views and views == {r.name for r in sql_page.VIEWS}, "a view missing from VIEWS"
    for relation in sql_page.RELATIONS:
        names = [c for c, _ in known[relation.name]]
        undescribed = [c for c in names if not relation.columns.get(c)]
        gone = sorted(set(relation.columns) - set(names))
        assert not undescribed, f"pgqueue.{relation.name}: no description of {undescribed}"
        assert not gone, f"pgqueue.{relation.name}: described but not in the schema: {gone}"


def test_the_sql_page_lists_each_relation_with_its_columns_and_types() -> None:
    page = sql_page.render()
    assert "| `oldest_ready_age` | interval |" in page
    assert "| `concurrency_key` | text |" in page
    for relation in sql_page.RELATIONS:
        assert f"`pgqueue.{relation.name}`" in page


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def test_the_nav_lists_every_page_on_disk_and_the_generated_ones() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = _nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page twice in the nav"
    on_disk = hooks._pages_on_disk(ROOT / "docs")
    assert on_disk <= set(listed), sorted(on_disk - set(listed))
    assert set(hooks.GENERATED) <= set(listed)
    assert not set(hooks.GENERATED) & on_disk, "a generated page also written to docs/"


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({"a.md", "b/c.md"}, [{"A": "a.md"}, {"B": ["b/c.md"]}]),
        ({"a.md"}, [{"A": "a.md"}]),
        (set(), None),
    ],
)
def test_the_nav_leaves_out_pages_not_written_yet(present: set[str], expected: object) -> None:
    nav = [{"A": "a.md"}, {"B": ["b/c.md", {"D": "b/d.md"}]}]
    assert hooks._prune(nav, present) == expected


def test_the_modules_beyond_pgqueue_list_only_names_they_define() -> None:
    import ast
    import importlib.util

    for module, _about, members in python_page.MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        assert set(members) <= defined, (module, sorted(set(members) - defined))


def _rewrite(markdown: str, repo_url: str = "") -> str:
    """``markdown`` as docs/deployment.md, through the hooks' link rewriting."""

    class File:
        src_uri = "deployment.md"

    class Page:
        file = File()

    config = {"docs_dir": str(ROOT / "docs"), "repo_url": repo_url}
    return hooks.on_page_markdown(markdown, Page(), config, None)


def test_a_link_outside_the_docs_names_the_file_in_the_repository() -> None:
    assert _rewrite("See [the manifests](../deploy/).") == (
        "See the manifests (`deploy` in the repository)."
    )
    assert _rewrite("[bench/RESULTS.md](../bench/RESULTS.md#pooler)") == (
        "`bench/RESULTS.md` (in the repository)"
    )
    assert _rewrite("[grants](../pgqueue/sql/grants.sql)", "https://example.org/pgqueue") == (
        "[grants](https://example.org/pgqueue/blob/main/pgqueue/sql/grants.sql)"
    )


def test_links_inside_the_docs_and_in_code_blocks_are_left_alone() -> None:
    text = "[security](security.md) and\n\n```python\nx = [a](../bench/RESULTS.md)\n```\n"
    assert _rewrite(text) == text


def test_a_link_to_a_page_not_written_yet_is_its_text_while_that_is_allowed() -> None:
    hooks._pending.update({"how-to/tasks.md"})
    try:
        assert _rewrite("see [the tasks guide](how-to/tasks.md#idempotency)") == (
            "see the tasks guide"
        )
    finally:
        hooks._pending.clear()
    assert _rewrite("[the tasks guide](how-to/tasks.md)") == "[the tasks guide](how-to/tasks.md)"
