"""The HTTP reference: every route of ``pgqueue serve``, from the OpenAPI document of
``pgqueue.api.create_app()`` (built without a database: nothing is dialled), with the scope each
route needs from ``pgqueue/api/scopes.py``; and the routes the document leaves out (metrics,
the interactive docs, the dashboard), from the app's route table.
"""

from __future__ import annotations

import json
from typing import Any

from tools.docs.text import cell, code, paragraphs, rst_literals

# Never dialled: the app is built, not served, as tests/unit/test_scope_table.py does.
_UNUSED_URL = "postgresql://postgres@127.0.0.1:9/none"

INTRO = """\
# HTTP API

Every route of `pgqueue serve`, generated from its OpenAPI document and its table of scopes.
For how to use them, see [The HTTP API](../how-to/http-api.md); for tokens and their scopes,
[Security](../security.md).

A running server shows the same document interactively at `/docs` (Swagger UI, e.g.
<http://localhost:8000/docs>) and `/redoc`, and as JSON at `/openapi.json`: these need a token
with the `read` scope when tokens are configured.

Requests carry their token as `Authorization: Bearer TOKEN`. The scope given for each route is
the one a token needs; an `admin` token may call every route. Errors are JSON objects with an
`error` code and a `message` ([ErrorOut](#schema-ErrorOut)).
"""


def build_app() -> Any:
    from pgqueue.api import ApiSettings, create_app

    return create_app(ApiSettings(database_url=_UNUSED_URL))


def route_names(app: Any) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> the route's name, the key of the scope table."""
    from fastapi.routing import iter_route_contexts

    names = {}
    for route in iter_route_contexts(list(app.routes)):
        for method in getattr(route, "methods", None) or ():
            names[(method, route.path_format)] = route.name
    return names


def schema_anchor(name: str) -> str:
    return f"schema-{name}"


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema, said briefly: ``string (1 to 200 characters) or null``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    if "anyOf" in schema:
        return " or ".join(type_of(s) for s in schema["anyOf"])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0])
    if "enum" in schema:
        return "one of " + ", ".join(code(str(v)) for v in schema["enum"])
    if "const" in schema:
        return code(str(schema["const"]))
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    bounds = _bounds(schema)
    if schema.get("format"):
        kind = f"{kind} ({schema['format']})"
    return f"{kind} ({bounds})" if bounds else kind


def _bounds(schema: dict[str, Any]) -> str:
    parts = []
    if "minLength" in schema and "maxLength" in schema:
        parts.append(f"{schema['minLength']} to {schema['maxLength']} characters")
        schema = {k: v for k, v in schema.items() if k not in ("minLength", "maxLength")}
    for key, word in (
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minimum", "≥ {}"),
        ("exclusiveMinimum", "> {}"),
        ("maximum", "≤ {}"),
        ("exclusiveMaximum", "< {}"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
    ):
        if key in schema:
            value = schema[key]
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            parts.append(word.format(value))
    return ", ".join(parts)


def _describe(text: str | None) -> str:
    return cell(text or "")


def _parameters(operation: dict[str, Any]) -> list[str]:
    params = operation.get("parameters") or []
    if not params:
        return []
    out = ["| parameter | in | type | |", "|---|---|---|---|"]
    for p in params:
        name = code(p["name"]) + (" (required)" if p.get("required") else "")
        schema = p.get("schema", {})
        text = p.get("description") or schema.get("description") or ""
        if "default" in schema and schema["default"] is not None:
            text = f"{text} Default: `{json.dumps(schema['default'])}`.".strip()
        out.append(f"| {name} | {p['in']} | {type_of(schema)} | {_describe(text)} |")
    return [*out, ""]


def _body(operation: dict[str, Any]) -> list[str]:
    body = operation.get("requestBody")
    if not body:
        return []
    rows = []
    for media, content in body.get("content", {}).items():
        rows.append(f"Request body ({code(media)}): {type_of(content.get('schema', {}))}.")
    return [*rows, ""]


def _responses(operation: dict[str, Any]) -> list[str]:
    out = ["| status | body | |", "|---|---|---|"]
    for status, response in sorted(operation.get("responses", {}).items()):
        schemas = [
            type_of(c["schema"]) for c in response.get("content", {}).values() if "schema" in c
        ]
        text = response.get("description") or ""
        headers = response.get("headers") or {}
        if headers:
            text += ". Headers: " + ", ".join(
                f"{h} ({(v.get('description') or '').rstrip('.')})" for h, v in headers.items()
            )
        out.append(f"| {status} | {' or '.join(schemas) or '-'} | {_describe(text)} |")
    return [*out, ""]


def _operation(
    method: str, path: str, operation: dict[str, Any], names: dict[tuple[str, str], str]
) -> str:
    from pgqueue.api.scopes import describe

    name = names[(method.upper(), path)]
    title = operation.get("summary") or name
    out = [f"### {title} {{#{name}}}", "", f"`{method.upper()} {path}`", ""]
    out += [f"Scope: {describe(name)}.", ""]
    description = rst_literals(operation.get("description") or "")
    # The description's own last paragraph says the scope already; the table says it above.
    kept = [p for p in description.split("\n\n") if not p.strip().startswith("Scope:")]
    if kept:
        out += [paragraphs("\n\n".join(kept)), ""]
    out += _parameters(operation) + _body(operation) + _responses(operation)
    return "\n".join(out)


def _schema(name: str, schema: dict[str, Any]) -> str:
    out = [f"### {name} {{#{schema_anchor(name)}}}", ""]
    if schema.get("description"):
        out += [paragraphs(schema["description"]), ""]
    properties = schema.get("properties") or {}
    if not properties:
        return "\n".join([*out, f"Type: {type_of(schema)}.", ""])
    required = set(schema.get("required") or ())
    out += ["| field | type | |", "|---|---|---|"]
    for field, spec in properties.items():
        label = code(field) + (" (required)" if field in required else "")
        text = spec.get("description") or ""
        if "default" in spec and spec["default"] is not None:
            text = f"{text} Default: `{json.dumps(spec['default'])}`.".strip()
        out.append(f"| {label} | {type_of(spec)} | {_describe(text)} |")
    return "\n".join([*out, ""])


def _outside_schema(app: Any, documented: set[str]) -> list[str]:
    from fastapi.routing import iter_route_contexts

    from pgqueue.api.scopes import describe

    out = [
        "## Routes outside the OpenAPI document",
        "",
        "Served by the same process, but not part of the API's document: the metrics for "
        "Prometheus, the interactive documentation and the dashboard.",
        "",
        "| route | methods | scope | |",
        "|---|---|---|---|",
    ]
    for route in iter_route_contexts(list(app.routes)):
        if route.name in documented:
            continue
        methods = ", ".join(sorted(getattr(route, "methods", None) or ()))
        doc = getattr(getattr(route, "endpoint", None), "__doc__", None) or ""
        first = " ".join(doc.strip().split("\n\n")[0].split())
        out.append(
            f"| {code(route.path_format)} | {methods} | {describe(route.name)} "
            f"| {_describe(first)} |"
        )
    return [*out, ""]


def render(app: Any = None) -> str:
    """The page's Markdown."""
    app = app if app is not None else build_app()
    document = app.openapi()
    names = route_names(app)
    out = [INTRO]
    groups: dict[str, list[str]] = {}
    documented = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            tag = path.split("/")[3] if path.startswith("/api/v1/") else "probes"
            groups.setdefault(tag, []).append(_operation(method, path, operation, names))
            documented.add(names[(method.upper(), path)])
    for tag, sections in groups.items():
        title = "Health probes" if tag == "probes" else f"/api/v1/{tag}"
        out += [f"## {title}", "", *sections]
    out += _outside_schema(app, documented)
    out += ["## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        out.append(_schema(name, schema))
    return "\n".join(out)
