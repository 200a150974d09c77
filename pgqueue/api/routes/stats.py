"""/api/v1/stats and /api/v1/throughput/series: counts of tasks, now and over time, for
autoscaling and the dashboard."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Query

from pgqueue import aio, config
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import (
    DepthRow,
    KeyStatsRow,
    Name,
    OldestSnapshotOut,
    StatsOut,
    ThroughputPointOut,
    ThroughputRow,
    ThroughputSeriesOut,
)
from pgqueue.operations import DEFAULT_BUSIEST_KEYS, MAX_BUSIEST_KEYS, MAX_SERIES_MINUTES

router = APIRouter(prefix=V1, route_class=Route)


@router.get("/stats", response_model=StatsOut, responses=responses(*COMMON))
async def stats(
    state: AppState,
    window_seconds: Annotated[float, Query(gt=0, le=86400)] = 60.0,
    keys: Annotated[int, Query(ge=1, le=MAX_BUSIEST_KEYS)] = DEFAULT_BUSIEST_KEYS,
) -> StatsOut:
    """Queued, running, waiting (for their parents: a workflow's later steps) and
    dead-lettered tasks per queue, priority and status, with the oldest ready task's age (the
    autoscaling signal), and tasks finished per queue in the last ``window_seconds``.
    Completed and cancelled tasks are counted only there: counting every one kept would read
    the whole table on each call. Also the oldest snapshot that holds back vacuum of the
    queue's table, flagged past ``PGQUEUE_SNAPSHOT_WARN_SECONDS``, and the ``keys`` busiest
    concurrency keys (at most 100): per queue and key, its tasks running and ready, busiest
    (running + ready) first."""
    async with state.connection() as conn:
        depth = await aio.overview(conn)
        done = await aio.throughput(conn, window_seconds=window_seconds)
        queues = await aio.list_queues(conn)
        held = await aio.oldest_snapshot(conn)
        busiest = await aio.busiest_keys(conn, limit=keys)
    warn = config.snapshot_warn_seconds()
    return StatsOut(
        depth=[DepthRow(**dataclasses.asdict(d)) for d in depth],
        throughput=[ThroughputRow(**dataclasses.asdict(t)) for t in done],
        window_seconds=window_seconds,
        paused_queues=sorted(q.name for q in queues if q.paused),
        oldest_snapshot=None if held is None else OldestSnapshotOut(**dataclasses.asdict(held)),
        oldest_snapshot_warning=held is not None and held.warns(warn),
        oldest_snapshot_warn_seconds=warn,
        busiest_keys=[KeyStatsRow(**dataclasses.asdict(k)) for k in busiest],
    )


@router.get("/throughput/series", response_model=ThroughputSeriesOut, responses=responses(*COMMON))
async def throughput_series(
    state: AppState,
    minutes: Annotated[int, Query(ge=1, le=MAX_SERIES_MINUTES)] = 60,
    queue: Name = None,
) -> ThroughputSeriesOut:
    """Tasks completed and dead-lettered per minute over the last ``minutes`` (at most
    1440), of one ``queue`` or of every queue; every minute has a point."""
    async with state.connection() as conn:
        points = await aio.throughput_series(conn, minutes=minutes, queue=queue)
    return ThroughputSeriesOut(
        minutes=minutes,
        queue=queue,
        points=[ThroughputPointOut(**dataclasses.asdict(p)) for p in points],
    )
