"""The worker's Prometheus metrics and /healthz (``--metrics-port``), in process.

A Worker runs on its own event loop in a thread with ``metrics_port=0`` (any free port), and
the tests read ``/metrics`` over HTTP and parse it with prometheus_client's parser; the
depth gauges, the sweep counters and /healthz are also checked on the metrics object
directly. Every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue.errors import ConfigurationError
from pgqueue.queries import driver
from pgqueue.queries.maintenance import maintenance_try_lock
from pgqueue.registry import Retry, TaskRegistry
from pgqueue.worker import Worker, WorkerConfig
from pgqueue.worker import metrics as worker_metrics
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.metrics import NO_METRICS, PrometheusWorkerMetrics

T = TypeVar("T")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def wait_until(predicate: Callable[[], T], *, timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    return parse(text)


def metrics_of(worker: Worker) -> PrometheusWorkerMetrics:
    assert isinstance(worker.metrics, PrometheusWorkerMetrics)
    return worker.metrics


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[int]:
    """Run the worker on an event loop of its own in a thread; yields its metrics port."""
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            loop.run_until_complete(worker.run_async())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    metrics = metrics_of(worker)
    try:
        wait_until(lambda: failure or metrics.port, timeout=30, what="the metrics server to listen")
        assert not failure, failure
        yield metrics.port
    finally:
        loop.call_soon_threadsafe(worker.request_stop)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive(), "the worker did not stop"
    assert not failure, failure


def registry() -> TaskRegistry:
    tasks = TaskRegistry()

    @tasks.handler("ok")
    def ok(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"ok": True}

    @tasks.handler("flaky", max_attempts=2)
    def flaky(payload: dict[str, Any], ctx: Any) -> None:
        if ctx.attempt == 1:
            raise Retry("not yet", after=0)
        raise RuntimeError("still broken")

    return tasks


def config(**overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "queues": ["default", "held"],
        "poll_interval": 0.05,
        "grace_period": 1,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        **overrides,
    }
    return WorkerConfig(**settings)


# --- a worker in process ------------------------------------------------------------------


def test_worker_counts_each_outcome_by_type_times_handlers_and_claims_and_reports_depth(
    conn: psycopg.Connection[Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_metrics, "QUEUE_DEPTH_MAX_AGE", 0.0)  # read at every scrape
    pgqueue.pause_queue(conn, "held")
    pgqueue.enqueue_many(conn, [{"type": "ok"}] * 3 + [{"type": "flaky"}])
    pgqueue.enqueue_many(conn, [{"type": "ok", "queue": "held", "priority": "low"}] * 2)
    worker = Worker(registry(), database_url, config())

    with running(worker) as port:
        settled = wait_until(
            lambda: (
                (s := scrape(port))
                and value(s, "pgqueue_worker_tasks_completed_total", queue="default", type="ok")
                == 3
                and value(s, "pgqueue_worker_tasks_dead_total", queue="default", type="flaky") == 1
                and s
            ),
            timeout=30,
            what="3 completions and a dead letter in /metrics",
        )
        health = http_get(port, "/healthz")
        missing = http_get(port, "/nothing-here")

    def count(name: str, type_: str) -> float | None:
        return value(settled, name, queue="default", type=type_)

    assert count("pgqueue_worker_tasks_started_total", "ok") == 3
    assert count("pgqueue_worker_tasks_failed_total", "ok") == 0  # at 0 from the first start
    assert count("pgqueue_worker_tasks_started_total", "flaky") == 2
    assert count("pgqueue_worker_tasks_failed_total", "flaky") == 2  # Retry counts as raised
    assert count("pgqueue_worker_tasks_retried_total", "flaky") == 1
    assert count("pgqueue_worker_tasks_completed_total", "flaky") == 0
    assert count("pgqueue_worker_task_duration_seconds_count", "ok") == 3
    assert count("pgqueue_worker_task_duration_seconds_count", "flaky") == 2
    ok_sum = count("pgqueue_worker_task_duration_seconds_sum", "ok")
    assert ok_sum is not None and ok_sum > 0
    inf_bucket = value(
        settled,
        "pgqueue_worker_task_duration_seconds_bucket",
        queue="default",
        type="ok",
        le="+Inf",
    )
    assert inf_bucket == 3
    claims = value(settled, "pgqueue_worker_claim_duration_seconds_count")
    assert claims is not None and claims >= 2  # at least the first claim and the retry's
    claim_seconds = value(settled, "pgqueue_worker_claim_duration_seconds_sum")
    assert claim_seconds is not None and claim_seconds > 0

    # The paused queue's backlog, every priority of both queues present (0 when empty).
    depth = {
        (labels[1][1], labels[0][1]): v  # (queue, priority)
        for (name, labels), v in settled.items()
        if name == "pgqueue_worker_queue_depth"
    }
    assert depth == {
        (q, p): 2 if (q, p) == ("held", "low") else 0
        for q in ("default", "held")
        for p in ("high", "normal", "low")
    }
    age = value(
        settled, "pgqueue_worker_queue_oldest_ready_age_seconds", queue="held", priority="low"
    )
    assert age is not None and age > 0
    assert value(settled, "pgqueue_worker_queue_depth_errors_total") == 0

    assert health == (200, "ok\n")
    assert missing[0] == 404


def test_worker_without_metrics_port_has_no_op_hooks_and_never_imports_prometheus_client(
    database_url: str,
) -> None:
    assert Worker(TaskRegistry(), database_url).metrics is NO_METRICS
    code = (
        "import sys\n"
        "from pgqueue.registry import TaskRegistry\n"
        "from pgqueue.worker import Worker\n"
        "from pgqueue.worker.maintenance import Maintenance\n"
        f"Worker(TaskRegistry(), {database_url!r}); Maintenance()\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_metrics_port_without_prometheus_client_fails_saying_what_to_install(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    with pytest.raises(ConfigurationError, match=r"prometheus_client.*pgqueue-jobs\[api\]"):
        Worker(TaskRegistry(), database_url, config())


def test_a_metrics_port_in_use_stops_the_worker_with_a_clear_error(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker(TaskRegistry(), database_url, config(metrics_port=port))
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            asyncio.run(worker.run_async())


def test_metrics_port_is_validated() -> None:
    with pytest.raises(pgqueue.ValidationError, match="metrics_port"):
        config(metrics_port=70000)


# --- /healthz -------------------------------------------------------------------------------


def test_healthz_fails_while_the_event_loop_is_blocked_and_recovers_after(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_metrics, "HEARTBEAT_SECONDS", 0.05)
    monkeypatch.setattr(worker_metrics, "HEALTHZ_STALE_SECONDS", 2.0)  # 40 beats
    metrics = PrometheusWorkerMetrics(0, host="127.0.0.1", queues=["default"], database_url="")
    seen: list[tuple[int, str]] = []

    async def main() -> None:
        metrics.start()
        try:
            # The loop runs (the request is made from a thread), so the heartbeat beats
            # however long a busy machine takes to answer.
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(status_is, 200):
                assert time.monotonic() < deadline, "/healthz never answered 200 at first"
                await asyncio.sleep(0.05)
            # Blocking the loop (as a misbehaving async handler would) stops the heartbeat.
            wait_until(lambda: status_is(503), timeout=60, what="/healthz to answer 503")
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(status_is, 200):  # the heartbeat resumes
                assert time.monotonic() < deadline, "/healthz stayed 503 after the loop resumed"
                await asyncio.sleep(0.05)
        finally:
            metrics.stop()

    def status_is(status: int) -> bool:
        seen.append(http_get(metrics.port, "/healthz"))
        return seen[-1][0] == status

    asyncio.run(main())
    assert any(s == 503 and "event loop stalled" in text for s, text in seen), seen
    with pytest.raises(OSError):  # stopped: nothing listens any more
        http_get(metrics.port, "/healthz")


# --- the metrics object directly ----------------------------------------------------------


def test_a_database_error_at_scrape_leaves_the_depth_out_and_serves_the_rest(
    database_url: str,
) -> None:
    bad = database_url.rsplit("/", 1)[0] + "/pgqueue_no_such_database"
    metrics = PrometheusWorkerMetrics(0, host="127.0.0.1", queues=["default"], database_url=bad)
    samples = parse(metrics.exposition()[0].decode())

    names = {name for name, _ in samples}
    assert "pgqueue_worker_queue_depth" not in names
    assert "pgqueue_worker_queue_oldest_ready_age_seconds" not in names
    assert value(samples, "pgqueue_worker_queue_depth_errors_total") == 1
    assert "pgqueue_worker_claim_duration_seconds_count" in names


def test_the_depth_is_read_at_most_once_per_interval(
    conn: psycopg.Connection[Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = PrometheusWorkerMetrics(
        0, host="127.0.0.1", queues=["default"], database_url=database_url
    )

    def ready_high() -> float | None:
        samples = parse(metrics.exposition()[0].decode())
        return value(samples, "pgqueue_worker_queue_depth", queue="default", priority="high")

    # The reuse is driven by QUEUE_DEPTH_MAX_AGE, not by the clock; a read that gives up on a
    # loaded machine (the production 3 s timeout) would leave the gauge out (None) and prove
    # nothing about reuse, so the reads here may take as long as the machine needs.
    monkeypatch.setattr(worker_metrics, "QUEUE_DEPTH_TIMEOUT_SECONDS", 120)
    try:
        monkeypatch.setattr(worker_metrics, "QUEUE_DEPTH_MAX_AGE", 3600.0)
        assert ready_high() == 0
        pgqueue.enqueue(conn, "x", {}, priority="high")
        assert ready_high() == 0  # within the interval: the last read is reused
        monkeypatch.setattr(worker_metrics, "QUEUE_DEPTH_MAX_AGE", 0.0)
        assert ready_high() == 1
    finally:
        metrics.depth.close()


def test_sweep_counts_requeued_and_dead_lettered_tasks_and_skipped_rounds(
    conn: psycopg.Connection[Any], database_url: str, connect: Callable[..., Any]
) -> None:
    pgqueue.enqueue_many(conn, [{"type": "x", "max_attempts": 1}, {"type": "x", "max_attempts": 3}])
    claimed = pgqueue.claim(conn, ["default"], limit=2, worker_id="gone")
    assert len(claimed) == 2
    conn.execute("UPDATE pgqueue.tasks SET lease_expires_at = now() - interval '1 minute'")
    metrics = PrometheusWorkerMetrics(
        0, host="127.0.0.1", queues=["default"], database_url=database_url
    )
    maintenance = Maintenance(metrics=metrics)

    async def sweep() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await maintenance.sweep_once(c)

    asyncio.run(sweep())
    other = connect(autocommit=False)  # another runner holds the maintenance lock
    assert driver.run(other, maintenance_try_lock())
    asyncio.run(sweep())
    other.rollback()
    metrics.depth.close()

    samples = parse(metrics.exposition()[0].decode())
    assert value(samples, "pgqueue_worker_lease_sweep_requeued_total") == 1
    assert value(samples, "pgqueue_worker_lease_sweep_dead_total") == 1
    assert value(samples, "pgqueue_worker_lease_sweeps_total", result="swept") == 1
    assert value(samples, "pgqueue_worker_lease_sweeps_total", result="skipped") == 1


# --- the command line -----------------------------------------------------------------------


def test_cli_refuses_metrics_ports_past_65535_for_its_processes(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "empty_handlers.py").write_text(
        "from pgqueue import TaskRegistry\ntasks = TaskRegistry()\n"
    )
    command = [sys.executable, "-m", "pgqueue", "--database-url", database_url, "worker"]
    command += ["empty_handlers:tasks", "--processes", "2", "--metrics-port", "65535"]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "--metrics-port" in proc.stderr, proc.stderr
    assert "65536" in proc.stderr and "Traceback" not in proc.stderr
