"""/metrics: the Prometheus exposition, outside /api/v1 and the OpenAPI document, where
scrapers expect it; added to the app itself (see pgqueue.api.routes.health for why)."""

from __future__ import annotations

import contextlib

from fastapi import FastAPI, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pgqueue import aio, config
from pgqueue.api.dependencies import AppState
from pgqueue.errors import PgQueueError
from pgqueue.roles import privileges_explained


async def metrics(state: AppState) -> Response:
    # With the database unreachable a scrape still answers, with the request counters and
    # the gauges as last read, rather than failing the whole target.
    with contextlib.suppress(PgQueueError), privileges_explained():
        async with state.connection() as conn:
            depth = await aio.overview(conn)
            queues = await aio.list_queues(conn)
            limits = await aio.list_limits(conn)
            keys = await aio.busiest_keys(conn)
            held = await aio.oldest_snapshot(conn)
        state.metrics.show(depth, queues, limits, keys)
        state.metrics.show_snapshot(held, config.snapshot_warn_seconds())
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def add_to(app: FastAPI) -> None:
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
