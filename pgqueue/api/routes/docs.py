"""/docs and /redoc: the API's interactive reference, served whole by this server.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they are blank on a machine
without internet access (an air-gapped cluster, a laptop on a train) and tell the CDN who
reads the docs. The same pages here load the files the ``fastapi-offline`` package ships
(MIT; Swagger UI is Apache-2.0, ReDoc MIT), from /docs/assets/. Added to the app itself
(see pgqueue.api.routes.health for why); kept out of the OpenAPI document, as FastAPI's
pages are.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

ASSETS_PACKAGE = "fastapi_offline"
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
ASSET_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "public, max-age=86400",  # the package's files change only on upgrade
}
TITLE = "pgqueue"


@functools.cache
def _asset(name: str) -> bytes:
    return resources.files(ASSETS_PACKAGE).joinpath("static", name).read_bytes()


def _base(request: Request) -> str:
    # Where the app is mounted (uvicorn --root-path, or a parent app's mount), so that the
    # pages' URLs work under a prefix too.
    return str(request.scope.get("root_path", "")).rstrip("/")


async def swagger_ui_html(request: Request) -> Response:
    base = _base(request)
    return get_swagger_ui_html(
        openapi_url=f"{base}/openapi.json",
        title=f"{TITLE} - Swagger UI",
        swagger_js_url=f"{base}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{base}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{base}/docs/assets/favicon.png",
        oauth2_redirect_url=f"{base}/docs/oauth2-redirect",
        # Swagger UI would otherwise send the document's URL to validator.swagger.io for a
        # badge: a request to another host, and this server's address told to a third party.
        swagger_ui_parameters={"validatorUrl": None},
    )


async def swagger_ui_redirect() -> Response:
    return get_swagger_ui_oauth2_redirect_html()


async def redoc_html(request: Request) -> Response:
    base = _base(request)
    return get_redoc_html(
        openapi_url=f"{base}/openapi.json",
        title=f"{TITLE} - ReDoc",
        redoc_js_url=f"{base}/docs/assets/redoc.standalone.js",
        redoc_favicon_url=f"{base}/docs/assets/favicon.png",
        with_google_fonts=False,
    )


async def docs_asset(name: str) -> Response:
    # Only the files listed, by name: no path from the request reaches the file system.
    if name not in DOCS_ASSETS:
        raise StarletteHTTPException(404, "no such docs asset")
    try:
        body = _asset(name)
    except ModuleNotFoundError:  # fastapi installed by hand, without the api extra
        raise StarletteHTTPException(
            404,
            f"the docs' files come from the {ASSETS_PACKAGE.replace('_', '-')} package: "
            "pip install 'pgqueue-jobs[api]'",
        ) from None
    return Response(body, media_type=DOCS_ASSETS[name], headers=ASSET_HEADERS)


def add_to(app: FastAPI) -> None:
    """The pages under the names FastAPI gives its own (the scope table knows them by name);
    the app is made with ``docs_url=None, redoc_url=None`` so these are the only ones."""
    app.get("/docs", include_in_schema=False, name="swagger_ui_html")(swagger_ui_html)
    app.get("/docs/oauth2-redirect", include_in_schema=False, name="swagger_ui_redirect")(
        swagger_ui_redirect
    )
    app.get("/docs/assets/{name}", include_in_schema=False, name="docs_asset")(docs_asset)
    app.get("/redoc", include_in_schema=False, name="redoc_html")(redoc_html)
