"""``pgqueue limit``: limits on a task type or a queue, kept in the database so that every
worker of the fleet keeps to them."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue import operations as ops
from pgqueue.cli.database import connection
from pgqueue.cli.output import emit
from pgqueue.cli.parsing import parse_count, parse_duration, show_duration
from pgqueue.formatting import MISSING, table
from pgqueue.models import Limit as LimitRow

group = typer.Typer(
    help="Limits on a task type or a queue, across every worker: how many run at once, how "
    "many start per period, and how many run at once per concurrency key.",
    no_args_is_help=True,
)

LimitType = Annotated[str | None, typer.Option("--type", help="Limit the tasks of this type.")]
LimitQueue = Annotated[str | None, typer.Option("--queue", help="Limit the tasks of this queue.")]


def _limit_dict(limit: LimitRow) -> dict[str, object]:
    return {
        "kind": limit.kind.value,
        "name": limit.name,
        "max_running": limit.max_running,
        "rate": limit.rate_limit,
        "per": limit.rate_period,
        "burst": limit.rate_burst,
        "per_key_max_running": limit.per_key_max_running,
        "declared_by": limit.declared_by,
        "running": limit.running,
        "recent_starts": limit.recent_starts,
        "keys_running": limit.keys_running,
        "keys_at_cap": limit.keys_at_cap,
        "updated_at": limit.updated_at.isoformat() if limit.updated_at else None,
    }


def _rate_text(limit: LimitRow) -> str:
    if limit.rate_limit is None or limit.rate_period is None:
        return MISSING
    rate = f"{limit.rate_limit} per {show_duration(limit.rate_period)}"
    if limit.rate_burst is None:
        return rate
    return f"{rate}, burst {limit.rate_burst}"


@group.command("set")
def limit_set(
    task_type: LimitType = None,
    queue: LimitQueue = None,
    max_running: Annotated[
        int | None,
        typer.Option(min=0, help="At most this many running at once, across every worker."),
    ] = None,
    rate: Annotated[
        int | None,
        typer.Option(min=0, max=ops.MAX_RATE, help="At most this many starts per --per."),
    ] = None,
    per: Annotated[
        float,
        typer.Option(
            parser=parse_duration, metavar="DURATION", help="The rate's period (e.g. 1s, 1m)."
        ),
    ] = 1.0,
    burst: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=ops.MAX_RATE,
            help="Space the rate's starts evenly (one every --per / --rate), at most this many "
            "at once. Without it, any --rate starts within a --per window, all at once if "
            "they wait.",
        ),
    ] = None,
    per_key_max_running: Annotated[
        str | None,
        typer.Option(
            metavar="N",
            help="At most this many running at once per concurrency key (tenant), across "
            "every worker, 0 to 1000000; tasks without a key are not held by it.",
        ),
    ] = None,
) -> None:
    """Limit a task type (--type) or a queue (--queue) across the whole fleet, in the
    database. The limit is set as a whole: a part left out is no limit of that kind. It is
    the operator's: a rate_limit the workers declare from their code never overwrites it."""
    with connection() as conn:
        limit = ops.set_limit(
            conn,
            type=task_type,
            queue=queue,
            max_running=max_running,
            rate=rate,
            per=per,
            # Read as the library and the HTTP API read it: 2.0 is not a count, and the
            # range is the library's to say.
            per_key_max_running=parse_count(per_key_max_running, "--per-key-max-running"),
            burst=burst,
        )
    parts = []
    if limit.max_running is not None:
        parts.append(f"at most {limit.max_running} running at once")
    if limit.rate_limit is not None:
        parts.append(f"at most {_rate_text(limit)} started")
    if limit.per_key_max_running is not None:
        parts.append(f"at most {limit.per_key_max_running} running at once per key")
    emit(_limit_dict(limit), f"{limit.kind.value} {limit.name!r}: " + ", ".join(parts))


@group.command("clear")
def limit_clear(task_type: LimitType = None, queue: LimitQueue = None) -> None:
    """Remove the limit on a task type or a queue."""
    with connection() as conn:
        removed = ops.clear_limit(conn, type=task_type, queue=queue)
    kind, name = ("type", task_type) if task_type is not None else ("queue", queue)
    emit(
        {"kind": kind, "name": name, "removed": removed},
        f"{kind} {name!r}: limit removed" if removed else f"{kind} {name!r} had no limit",
    )


def _keys_at_cap_text(limit: LimitRow) -> str:
    """Of the keys with tasks running under a per-key limit, those at their cap."""
    if limit.per_key_max_running is None:
        return MISSING
    return f"{limit.keys_at_cap} of {limit.keys_running}"


@group.command("list")
def limit_list() -> None:
    """Every limit, with the tasks running under it and its starts in the rate window. For a
    per-key limit (PER KEY), KEYS AT CAP says how many of the keys with tasks running under
    it are at that cap: their next tasks wait for one of theirs to finish. SET BY is
    operator, or the worker that declared the limit from its code (a rate_limit)."""
    with connection() as conn:
        limits = ops.list_limits(conn)
    human = (
        table(
            [
                "KIND",
                "NAME",
                "MAX RUNNING",
                "RUNNING",
                "RATE",
                "STARTS IN WINDOW",
                "SET BY",
                "PER KEY",
                "KEYS AT CAP",
            ],
            [
                [
                    x.kind.value,
                    x.name,
                    MISSING if x.max_running is None else x.max_running,
                    x.running,
                    _rate_text(x),
                    MISSING if x.rate_limit is None else x.recent_starts,
                    "operator" if x.declared_by is None else x.declared_by,
                    MISSING if x.per_key_max_running is None else x.per_key_max_running,
                    _keys_at_cap_text(x),
                ]
                for x in limits
            ],
        )
        if limits
        else "no limits"
    )
    emit([_limit_dict(x) for x in limits], human)
