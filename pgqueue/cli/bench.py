"""``pgqueue bench``: the library's benchmark (:mod:`pgqueue.bench`) on the user's own
database, with its progress on stderr so that stdout holds only the result."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from pgqueue.cli.output import emit
from pgqueue.cli.state import state
from pgqueue.formatting import table

commands = typer.Typer()


@commands.command()
def bench(
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to enqueue in bulk and drain.")] = 10_000,
    single: Annotated[
        int, typer.Option(min=1, help="Tasks to enqueue one per transaction.")
    ] = 1_000,
    latency_samples: Annotated[
        int, typer.Option(min=2, help="Tasks sent 20 ms apart to an idle worker.")
    ] = 200,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes for the drain.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks at once per process.")] = 100,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 300,
) -> None:
    """Measure enqueue, drain and pickup latency on this database (in a queue of its own)."""
    from pgqueue import bench as benchmark

    config = benchmark.BenchConfig(
        tasks=tasks,
        single=single,
        latency_samples=latency_samples,
        processes=processes,
        concurrency=concurrency,
        timeout=timeout,
    )
    result = benchmark.run(state.url(), config, progress=lambda line: typer.echo(line, err=True))
    rows = [
        ("bulk enqueue (enqueue_many, 1,000 a call)", f"{result.bulk_enqueue_per_s:,.0f} tasks/s"),
        ("single enqueue (one per transaction)", f"{result.single_enqueue_per_s:,.0f} tasks/s"),
        (
            f"drain ({processes} process(es) x {concurrency}, no-op handler)",
            f"{result.drain_per_s:,.0f} tasks/s",
        ),
        (
            "pickup latency p50 / p90 / p99 / max",
            (
                f"{result.latency_ms_p50:.1f} / {result.latency_ms_p90:.1f} / "
                f"{result.latency_ms_p99:.1f} / {result.latency_ms_max:.1f} ms"
            ),
        ),
        ("tasks that ran more than once", str(result.ran_more_than_once)),
    ]
    emit(dataclasses.asdict(result), table(["measurement", "result"], rows))
