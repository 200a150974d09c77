"""The deployment examples (deploy/) and docs/autoscaling.md, checked against pgqueue itself.

- Every Kubernetes manifest parses with ``yaml.safe_load_all`` and holds the kinds
  docs/deployment.md lists, and the manifests name each other consistently.
- Shutdown timing: every systemd unit and every Deployment that runs ``pgqueue worker`` gives
  it longer than the ``--grace-period`` on its command line (the CLI's default when absent),
  by a margin, before SIGKILL.
- Probes name endpoints the API really serves (its routes from ``create_app``), and they
  answer without a token while the API requires one everywhere else.
- The KEDA trigger's query, taken from the manifest, runs against a real migrated database
  and counts the ready and running tasks of the Deployment's queues: not scheduled ones, not
  finished ones, not another queue's, not a paused queue's ready ones. The backlog query in
  docs/autoscaling.md and ``pgqueue --json stats`` report the same ready counts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import shlex
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from boundaries import Api, run_main
from psycopg import errors, sql

import pgqueue
from pgqueue import cli
from pgqueue.api import ApiSettings, create_app

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
AUTOSCALING_DOC = ROOT / "docs" / "autoscaling.md"

# What each manifest holds (docs/deployment.md's table); a new file must be listed here.
EXPECTED_KINDS = {
    "api-deployment.yaml": ["Deployment", "Service"],
    "keda-scaledobject.yaml": ["TriggerAuthentication", "ScaledObject"],
    "migrate-job.yaml": ["Job"],
    "worker-deployment.yaml": ["Deployment"],
}
# After the grace period a stopping worker still releases its leftover tasks (one UPDATE,
# retried on a database blip), flushes completions and closes its handler pools (up to 2 s);
# a deadline closer than this to the grace period would SIGKILL it in the middle of that.
MIN_STOP_MARGIN_SECONDS = 10.0
# The CLI's own default, for a worker command line that does not give --grace-period.
DEFAULT_GRACE_PERIOD = float(inspect.signature(cli.worker).parameters["grace_period"].default)


# --- reading the files ---------------------------------------------------------------------------


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every YAML document under deploy/kubernetes, by file name."""
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
        for path in sorted(KUBERNETES.glob("*.y*ml"))
    }


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for docs in manifests().values()
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def is_worker(argv: list[str]) -> bool:
    """``argv`` runs ``pgqueue worker`` (directly or as ``python -m pgqueue worker``)."""
    return any(
        Path(a).name == "pgqueue" and argv[i + 1 : i + 2] == ["worker"] for i, a in enumerate(argv)
    )


def option(argv: list[str], name: str) -> list[str]:
    """Every value given to ``name`` on a command line, as ``name VALUE`` or ``name=VALUE``."""
    values = []
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
    return values


def grace_period(argv: list[str]) -> float:
    """The grace period a worker command line gives (typer keeps the last of repeats)."""
    values = option(argv, "--grace-period")
    return float(values[-1]) if values else DEFAULT_GRACE_PERIOD


def worker_deployments() -> list[dict[str, Any]]:
    return [
        doc
        for docs in manifests().values()
        for doc in docs
        if doc["kind"] == "Deployment"
        and any(is_worker(c["command"]) for c in doc["spec"]["template"]["spec"]["containers"])
    ]


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's port as a number (a named port resolved through the container's ports)."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: section -> key -> values (in order; continuation lines joined)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


SPAN_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "ms": 0.001,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
}


def seconds(span: str) -> float:
    """A systemd time span ("45", "45s", "1min 30s", "infinity") in seconds."""
    if span == "infinity":
        return float("inf")
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[a-z]*)+", span), span
    return sum(float(n) * SPAN_UNITS[u] for n, u in parts)


def worker_units() -> list[tuple[Path, dict[str, dict[str, list[str]]]]]:
    return [
        (path, parsed)
        for path in sorted(SYSTEMD.glob("*.service"))
        if (parsed := unit(path))
        and any(is_worker(shlex.split(e)) for e in parsed["Service"].get("ExecStart", []))
    ]


def sql_blocks(path: Path) -> list[str]:
    return re.findall(r"```sql\n(.*?)```", path.read_text(encoding="utf-8"), re.DOTALL)


def keda_query() -> str:
    (trigger,) = one("ScaledObject")["spec"]["triggers"]
    query: str = trigger["metadata"]["query"]
    return query


def worker_queues() -> list[str]:
    """The queues the scaled Deployment's workers serve (their --queue options)."""
    target = one("ScaledObject")["spec"]["scaleTargetRef"]["name"]
    (container,) = one("Deployment", target)["spec"]["template"]["spec"]["containers"]
    return option(container["command"], "--queue") or [cli.DEFAULT_QUEUE]


def words(text: str) -> str:
    return " ".join(text.split())


# --- the manifests -------------------------------------------------------------------------------


def test_kubernetes_manifests_parse_and_hold_the_documented_kinds():
    found = manifests()
    assert {name: [doc["kind"] for doc in docs] for name, docs in found.items()} == EXPECTED_KINDS
    for docs in found.values():
        for doc in docs:
            assert doc["apiVersion"] and doc["metadata"]["name"]


def test_manifests_name_each_other_consistently():
    scaled = one("ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert trigger["authenticationRef"]["name"] == one("TriggerAuthentication")["metadata"]["name"]
    assert one("Deployment", scaled["spec"]["scaleTargetRef"]["name"]) in worker_deployments()
    # KEDA's CRD types trigger metadata as strings: an unquoted 8 is refused by the API server.
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger["metadata"]
    # The HPA owns the worker count; a `replicas` in the Deployment would reset it on apply.
    assert "replicas" not in one("Deployment", scaled["spec"]["scaleTargetRef"]["name"])["spec"]
    for deployment in [one("Deployment", "pgqueue-api"), *worker_deployments()]:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one("Service")
    api_pod = one("Deployment", "pgqueue-api")["spec"]["template"]
    assert service["spec"]["selector"].items() <= api_pod["metadata"]["labels"].items()
    (api,) = api_pod["spec"]["containers"]
    for port in service["spec"]["ports"]:
        assert container_port(api, port["targetPort"]) == int(option(api["command"], "--port")[0])


# --- shutdown timing -----------------------------------------------------------------------------


def test_every_worker_unit_waits_longer_than_the_grace_period_before_sigkill():
    units = worker_units()
    assert units, "no systemd unit runs `pgqueue worker`"
    for path, parsed in units:
        service = parsed["Service"]
        (exec_start,) = service["ExecStart"]
        grace = grace_period(shlex.split(exec_start))
        assert service.get("KillSignal", ["SIGTERM"])[-1] in ("SIGTERM", "TERM", "15"), path.name
        (timeout,) = service["TimeoutStopSec"]
        assert seconds(timeout) - grace >= MIN_STOP_MARGIN_SECONDS, (path.name, timeout, grace)


def test_worker_unit_signals_only_the_supervisor_so_children_get_one_sigterm():
    # With --processes N the supervisor passes SIGTERM on to its children; systemd's default
    # KillMode (control-group) would signal them too, and a second signal skips the grace
    # period. mixed: SIGTERM to the main process, SIGKILL to all at the deadline.
    for path, parsed in worker_units():
        assert parsed["Service"].get("KillMode") == ["mixed"], path.name


def test_every_worker_deployment_waits_longer_than_the_grace_period_before_sigkill():
    deployments = worker_deployments()
    assert deployments, "no Deployment runs `pgqueue worker`"
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            grace = grace_period(container["command"])
            margin = pod["terminationGracePeriodSeconds"] - grace
            assert margin >= MIN_STOP_MARGIN_SECONDS, (deployment["metadata"]["name"], grace)
            # A preStop hook runs before SIGTERM and its time counts against the same deadline.
            assert "preStop" not in container.get("lifecycle", {}), deployment["metadata"]["name"]


def test_api_deployment_stops_after_its_prestop_pause_and_within_its_deadline():
    pod = one("Deployment", "pgqueue-api")["spec"]["template"]["spec"]
    (api,) = pod["containers"]
    pause = api["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pause[1])


# --- probes --------------------------------------------------------------------------------------


def test_api_probes_name_endpoints_the_api_serves(database_url):
    routes = {
        getattr(r, "path", None) for r in create_app(ApiSettings(database_url=database_url)).routes
    }
    (api,) = one("Deployment", "pgqueue-api")["spec"]["template"]["spec"]["containers"]
    readiness, liveness = api["readinessProbe"]["httpGet"], api["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz" and liveness["path"] == "/healthz"
    assert {readiness["path"], liveness["path"]} <= routes
    api_port = int(option(api["command"], "--port")[0])
    assert container_port(api, readiness["port"]) == api_port
    assert container_port(api, liveness["port"]) == api_port


def test_api_probe_paths_answer_without_the_token_the_rest_requires(database_url):
    (api,) = one("Deployment", "pgqueue-api")["spec"]["template"]["spec"]["containers"]
    paths = [api["readinessProbe"]["httpGet"]["path"], api["livenessProbe"]["httpGet"]["path"]]
    server = Api(
        ApiSettings(
            database_url=database_url, tokens=frozenset({"deploy-test-token-5c7e9a1b3d5f7a9c"})
        )
    )
    try:
        # The kubelet sends no Authorization header.
        assert [server.request("GET", p).status_code for p in paths] == [200, 200]
        assert server.request("GET", "/api/v1/stats").status_code == 401
    finally:
        server.close()


def test_worker_liveness_probe_is_the_healthz_of_its_own_metrics_port():
    for deployment in worker_deployments():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            probe = container["livenessProbe"]["httpGet"]
            assert probe["path"] == "/healthz"
            (metrics_port,) = option(container["command"], "--metrics-port")
            assert container_port(container, probe["port"]) == int(metrics_port)
            # A worker serves no traffic: readiness would gate nothing.
            assert "readinessProbe" not in container


# --- the autoscaling queries, against a real database --------------------------------------------


@dataclasses.dataclass
class Backlog:
    ready: dict[str, int]  # per queue
    running: dict[str, int]
    oldest_ready_seconds: float  # at least this, in the scaled queue


@pytest.fixture
def backlog(conn: psycopg.Connection[Any]) -> Backlog:
    """In the scaled queue: ready tasks of each priority (one due an hour ago), running ones,
    a completed one, scheduled ones; in another queue, ready tasks only."""
    (queue,) = worker_queues()
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    # Low, so that the claim below (high first, then normal) leaves it ready.
    pgqueue.enqueue(conn, "t", {}, queue=queue, priority="low", run_at=hour_ago)
    for priority in ("high", "normal", "normal", "normal", "normal", "low", "low", "low"):
        pgqueue.enqueue(conn, "t", {}, queue=queue, priority=priority)
    claimed = pgqueue.claim(conn, [queue], limit=4, worker_id="deploy-test")
    pgqueue.complete(conn, claimed[0].lease, {"ok": True})
    for _ in range(3):  # not due for an hour: must not count
        pgqueue.enqueue(conn, "t", {}, queue=queue, delay=3600)
    for _ in range(6):
        pgqueue.enqueue(conn, "t", {}, queue="elsewhere")
    # 9 enqueued ready; the claim took the high one and 3 normal ones (3 still running, 1
    # completed): 1 normal and 4 low ready.
    return Backlog({queue: 5, "elsewhere": 6}, {queue: 3}, oldest_ready_seconds=3600)


def in_flight(conn: psycopg.Connection[Any], query: str) -> Any:
    (value,) = conn.execute(query).fetchall()[0]
    return value


def test_keda_query_counts_ready_and_running_tasks_of_the_worker_queue(conn, backlog):
    (queue,) = worker_queues()
    value = in_flight(conn, keda_query())
    # KEDA scans the first column into a float64.
    assert isinstance(value, float)
    assert value == backlog.ready[queue] + backlog.running[queue]


def test_keda_query_leaves_out_ready_tasks_of_a_paused_queue(conn, backlog):
    (queue,) = worker_queues()
    pgqueue.pause_queue(conn, queue)
    assert in_flight(conn, keda_query()) == backlog.running[queue]
    pgqueue.resume_queue(conn, queue)
    assert in_flight(conn, keda_query()) == backlog.ready[queue] + backlog.running[queue]


@pytest.mark.parametrize(
    ("which", "scans_of_tasks"), [("the KEDA trigger's", 10), ("the documented backlog", 5)]
)
def test_autoscaling_queries_read_only_waiting_and_running_rows(conn, which, scans_of_tasks):
    # The design keeps a day of finished tasks (10 million) for their results: a query run
    # every 15 s must reach the few waiting and running rows through their partial indexes.
    query = keda_query() if which == "the KEDA trigger's" else sql_blocks(AUTOSCALING_DOC)[0]
    conn.execute("""
        INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, started_at,
                                   finished_at, result)
        SELECT 'default', 't', '{}', 'completed', 1, now(), now(), '{}'
          FROM generate_series(1, 20000)
    """)
    pgqueue.enqueue(conn, "t", {}, queue="default")
    conn.execute("ANALYZE pgqueue.tasks")
    ((plan,),) = conn.execute("EXPLAIN (FORMAT JSON) " + query).fetchall()

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    on_tasks = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "tasks"]
    # At most one index scan per branch of pgqueue.queue_depth (one per partial index) per
    # status asked (the KEDA query asks two); PostgreSQL 16+ drops the branches whose status
    # contradicts the one asked, 15 keeps them (each finds nothing at once).
    assert 0 < len(on_tasks) <= scans_of_tasks
    assert all(n["Node Type"] != "Seq Scan" for n in on_tasks), on_tasks


def documented_backlog(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float | None]]:
    """docs/autoscaling.md's backlog query (its first sql block): queue -> (ready, oldest)."""
    query = sql_blocks(AUTOSCALING_DOC)[0]
    assert "pgqueue.queue_depth" in query and "ready" in query
    return {q: (int(ready), oldest) for q, ready, oldest in conn.execute(query).fetchall()}


def test_documented_backlog_query_counts_ready_tasks_per_queue(conn, backlog):
    found = documented_backlog(conn)
    assert {q: ready for q, (ready, _) in found.items()} == backlog.ready
    (queue,) = worker_queues()
    oldest = found[queue][1]
    assert oldest is not None
    assert backlog.oldest_ready_seconds <= oldest < backlog.oldest_ready_seconds + 60


def test_documented_scaler_query_is_the_manifests_and_adds_running_to_the_backlog(conn, backlog):
    assert words(keda_query()) in [words(block) for block in sql_blocks(AUTOSCALING_DOC)]
    (queue,) = worker_queues()
    assert in_flight(conn, keda_query()) == documented_backlog(conn)[queue][0] + 3


def test_stats_json_reports_the_ready_count_of_the_documented_query(database_url, conn, backlog):
    result = run_main(database_url, "--json", "stats")
    assert result.code == 0, result.stderr
    ready: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for row in json.loads(result.stdout)["depth"]:
        if row["status"] == "queued":
            ready[row["queue"]] = ready.get(row["queue"], 0) + row["ready"]
            age = row["oldest_ready_age_seconds"] or 0.0
            oldest[row["queue"]] = max(oldest.get(row["queue"], 0.0), age)
    documented = documented_backlog(conn)
    assert ready == {q: r for q, (r, _) in documented.items()} == backlog.ready
    (queue,) = worker_queues()
    assert abs(oldest[queue] - float(documented[queue][1] or 0)) < 60


# --- the role KEDA logs in as --------------------------------------------------------------------


@pytest.fixture
def keda_url(server_url: str, database_url: str) -> Iterator[str]:
    """A login role granted exactly docs/autoscaling.md's statements (its `pgqueue_keda`
    block, under a name of this test's own: roles are cluster-wide), and a URL for it."""
    (block,) = [b for b in sql_blocks(AUTOSCALING_DOC) if "CREATE ROLE pgqueue_keda" in b]
    role, password = f"pgqueue_keda_{uuid.uuid4().hex[:10]}", "keda-pw-3f9a"
    script = block.replace("pgqueue_keda", role).replace("'...'", f"'{password}'")
    with psycopg.connect(database_url, autocommit=True) as admin:
        for statement in (s.split("--")[0] for s in script.split(";")):
            if statement.strip():
                admin.execute(statement)
    try:
        yield psycopg.conninfo.make_conninfo(database_url, user=role, password=password)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_documented_keda_role_runs_the_query_and_reads_no_task(keda_url, backlog):
    (queue,) = worker_queues()
    with psycopg.connect(keda_url, autocommit=True) as keda:
        assert keda.execute("SELECT current_user").fetchone() != ("postgres",)
        assert in_flight(keda, keda_query()) == backlog.ready[queue] + backlog.running[queue]
        with pytest.raises(errors.InsufficientPrivilege):
            keda.execute("SELECT payload FROM pgqueue.tasks LIMIT 1")
