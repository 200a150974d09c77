"""The docs' samples of what the server answers and of what a task sees stay true: the
/healthz answer the HTTP API guide shows is a real server's, at this release's head revision,
and the attributes the workflows guide names on ``ctx.parents`` are the ones a parent has."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from boundaries import Api

from pgqueue.api import ApiSettings
from pgqueue.models import Parent

DOCS = Path(__file__).parents[2] / "docs"
HTTP_API_GUIDE = DOCS / "how-to" / "http-api.md"
WORKFLOWS_GUIDE = DOCS / "how-to" / "workflows.md"


def page(path: Path) -> str:
    assert path.is_file(), f"{path.relative_to(DOCS.parent)} is missing: it holds a sample"
    return path.read_text(encoding="utf-8")


def healthz_sample() -> str:
    """The commented answer under the guide's ``curl -s localhost:8000/healthz``: a line
    ``# /healthz: {...}``, its continuation lines also starting with ``#``."""
    found = re.search(r"^# /healthz: (\{.*?\})$", page(HTTP_API_GUIDE), re.MULTILINE | re.DOTALL)
    assert found is not None, "the HTTP API guide lost its /healthz sample"
    return re.sub(r"\n#\s+", " ", found.group(1))


def test_the_http_guides_healthz_sample_is_what_a_migrated_server_answers(database_url):
    api = Api(ApiSettings(database_url=database_url))
    try:
        response = api.request("GET", "/healthz")
    finally:
        api.close()

    assert response.status_code == 200, response.text
    assert json.loads(healthz_sample()) == response.json()


def test_the_workflows_guide_names_the_attributes_a_parent_has():
    found = re.search(r"`ctx\.parents`: each parent's ([^)]*)\)", page(WORKFLOWS_GUIDE))
    assert found is not None, "the workflows guide no longer says what ctx.parents holds"
    named = re.findall(r"`\.(\w+)`", found.group(1))
    fields = {f.name for f in dataclasses.fields(Parent)}

    assert named, found.group(0)
    assert set(named) <= fields, (named, fields)
    assert "task_id" in named
