"""/dashboard/: the web page over this API.

The page is static: files shipped in the package (pgqueue/dashboard), no data in them, no
build step. Its script reads everything from /api/v1 with the bearer token the user enters,
which is why these routes need no token (BearerAuth leaves /dashboard open) and why they are
outside the OpenAPI document. They are added to the app itself (see pgqueue.api.routes.health
for why).
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import FastAPI, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

DASHBOARD_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
# Only this server's files and API: no inline script or style, no eval, no framing, no forms
# posted anywhere. Task payloads and errors are rendered as text; should one ever reach the
# page as markup, it still could not run.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DASHBOARD_HEADERS = {
    "Content-Security-Policy": DASHBOARD_CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: an upgraded pgqueue serves its new script
}


@functools.cache
def _dashboard_file(name: str) -> bytes:
    return resources.files("pgqueue").joinpath("dashboard", name).read_bytes()


def _dashboard_response(name: str) -> Response:
    return Response(
        _dashboard_file(name), media_type=DASHBOARD_FILES[name], headers=DASHBOARD_HEADERS
    )


async def dashboard_redirect() -> Response:
    # A relative Location, so it also works where the app is mounted under a prefix; the
    # page's relative links (app.js, ../api/v1/...) need the trailing slash.
    return Response(status_code=307, headers={**DASHBOARD_HEADERS, "Location": "dashboard/"})


async def root_redirect() -> Response:
    # The server's root has nothing of its own: a newcomer opening it lands on the dashboard.
    # Relative, as above, so that it also works under a prefix.
    return Response(status_code=307, headers={"Location": "dashboard/"})


async def dashboard() -> Response:
    """The dashboard (no token needed for the page; its data needs one)."""
    return _dashboard_response("index.html")


async def dashboard_file(name: str) -> Response:
    # Only the files listed, by name: no path from the request reaches the file system.
    if name not in DASHBOARD_FILES or name == "index.html":
        raise StarletteHTTPException(404, "no such dashboard file")
    return _dashboard_response(name)


def add_to(app: FastAPI) -> None:
    app.get("/", include_in_schema=False)(root_redirect)
    app.get("/dashboard", include_in_schema=False)(dashboard_redirect)
    app.get("/dashboard/", include_in_schema=False)(dashboard)
    app.get("/dashboard/{name}", include_in_schema=False)(dashboard_file)
