"""The server's own pages against a real server: / leads to the dashboard, and /docs and
/redoc load everything they need from this server (no CDN, no other host), so that they work
offline and tell no third party who reads them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from test_api import Live, halt, launch

from pgqueue.api import ApiSettings

READ_TOKEN = "docs-read-token-3c1f9a7e5b2d4068a1c3"
ADMIN_TOKEN = "docs-admin-token-8e2a4c6f0b1d3957e7a9"
# src= and href= values, and url(...) in inline styles: every URL a page makes the browser load.
LINKED = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""")


@pytest.fixture
def start_server() -> Iterator[Callable[[ApiSettings], Live]]:
    started: list[Live] = []

    def _start(settings: ApiSettings) -> Live:
        started.append(launch(settings))
        return started[-1]

    yield _start
    halt(started)


def linked_urls(html: str) -> list[str]:
    return [a or b for a, b in LINKED.findall(html)]


def test_the_root_redirects_to_the_dashboard_with_a_relative_location(database_url, start_server):
    live = start_server(ApiSettings(database_url=database_url))

    response = live.client.get("/", follow_redirects=False)

    assert response.status_code == 307
    assert response.headers["location"] == "dashboard/"
    followed = live.client.get("/", follow_redirects=True)
    assert followed.status_code == 200
    assert str(followed.url).endswith("/dashboard/")
    assert "text/html" in followed.headers["content-type"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_every_file_from_this_server(database_url, start_server, page):
    live = start_server(ApiSettings(database_url=database_url))

    response = live.client.get(page)

    assert response.status_code == 200
    html = response.text
    assert "https://" not in html and "http://" not in html, html
    urls = linked_urls(html)
    assert urls, html
    for url in urls:
        assert url.startswith("/docs/assets/"), (url, html)
        asset = live.client.get(url)
        assert asset.status_code == 200, url
        expected = {"js": "javascript", "css": "text/css", "png": "image/png"}[url.rsplit(".")[-1]]
        assert expected in asset.headers["content-type"], (url, asset.headers)
        assert asset.headers["x-content-type-options"] == "nosniff"
        assert len(asset.content) > 1000, url
    # The script each page runs is there, as a script, not an empty shell.
    scripts = [u for u in urls if u.endswith(".js")]
    assert len(scripts) == 1, urls


def test_swagger_ui_asks_no_validator_on_another_host(database_url, start_server):
    live = start_server(ApiSettings(database_url=database_url))

    html = live.client.get("/docs").text

    assert '"validatorUrl": null' in html, html


def test_the_docs_pages_follow_the_mount_prefix(database_url, start_server):
    live = start_server(ApiSettings(database_url=database_url))

    # As under a reverse proxy that strips /queue and sets the root path.
    live.app.root_path = "/queue"
    try:
        html = live.client.get("/docs").text
    finally:
        live.app.root_path = ""
    for url in linked_urls(html):
        assert url.startswith("/queue/docs/assets/"), url
    assert "'/queue/openapi.json'" in html or '"/queue/openapi.json"' in html, html


def test_an_unknown_docs_asset_is_a_404_and_no_path_reaches_the_file_system(
    database_url, start_server
):
    live = start_server(ApiSettings(database_url=database_url))

    for name in ["nope.js", "..%2F__init__.py", "core.py", "%2E%2E%2Fcore.py"]:
        assert live.client.get(f"/docs/assets/{name}").status_code == 404, name


def test_with_tokens_the_assets_are_open_and_the_pages_still_need_a_token(
    database_url, start_server
):
    live = start_server(
        ApiSettings(
            database_url=database_url, tokens={READ_TOKEN: {"read"}, ADMIN_TOKEN: {"admin"}}
        )
    )
    bearer = {"Authorization": f"Bearer {READ_TOKEN}"}

    assert live.client.get("/docs").status_code == 401
    assert live.client.get("/redoc").status_code == 401
    assert live.client.get("/docs", headers=bearer).status_code == 200
    assert live.client.get("/redoc", headers=bearer).status_code == 200
    for name in ["swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"]:
        assert live.client.get(f"/docs/assets/{name}").status_code == 200, name
    # The root holds nothing: it sends anyone to the dashboard, whose page is open too.
    root = live.client.get("/", follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (307, "dashboard/")
