"""Query plans at a realistic size: the statements pgqueue runs must stay index-bound.

Every peer queue shipped a claim that got slow once the table grew, and its users found it
first. A plan is a property of the data's size and shape, so these tests build one large
table (a 200,000-task backlog over three queues and three priorities, 200,000 finished tasks,
1,000 running ones holding leases, 5,000 waiting on their parents), VACUUM ANALYZE it, and
EXPLAIN the real statements: loaded with
``driver.statements()`` and given the parameters the library's own operations build
(``next(claiming.task_claim(...))``), so a change to the SQL is what gets tested.

Each statement is checked twice: as planned on its first run (a custom plan for these
parameter values), and as planned once the server has settled on a plan for a prepared
statement. psycopg prepares a statement after five runs on a connection and PostgreSQL may
then switch to a generic plan that ignores the values, so a worker's long-lived connections run
the second; both must be good.

The claim is also checked by what it does, not only by its shape: under EXPLAIN ANALYZE the
rows read from the table must be bounded by the batch size, not by the backlog.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import pgqueue
from pgqueue.models import Lease, TaskStatus
from pgqueue.operations import list_args
from pgqueue.queries import claiming, dependencies, driver, leased, queues, stats, tasks

Plan = dict[str, Any]

QUEUED = 200_000
FINISHED = 200_000
RUNNING = 1_000
WAITING = 5_000  # dependants whose parents are not final
CLAIM_BATCH = 100  # the worker's largest claim (WorkerConfig.max_claim_batch)
MAINTENANCE_BATCH = 1_000  # MaintenanceConfig.batch_size
DAY = 86_400.0

# The backlog: 50% 'default', 30% 'email', 20% 'reports'; independently of the queue, 1 in 7
# high priority, 5 in 7 normal, 1 in 7 low; created over the last two hours; 1 in 19 scheduled
# an hour ahead (a delay or a retry backoff), so the claim must pass over rows it cannot take.
# The finished rows are the day after a burst: completed and cancelled ones finished over the
# last 48 h (half are past the 24 h retention), dead letters over the last 28 days (half past
# the 14 days). The waiting tasks are steps of workflows of ten (chains and chord callbacks),
# 60% in 'default' and 40% in 'reports'.
# Finished rows go in first, the backlog last, as in a table that grows.
FILL_SQL = f"""
INSERT INTO pgqueue.tasks (queue, type, payload, priority, status, attempts, visible_after,
                           created_at, started_at, finished_at, result, last_error)
SELECT (ARRAY['default', 'email', 'reports'])[1 + i % 3], 'report.build', '{{"n": 1}}', 1,
       CASE WHEN i % 20 = 0 THEN 'failed' WHEN i % 20 = 1 THEN 'cancelled'
            ELSE 'completed' END,
       CASE WHEN i % 20 = 0 THEN 3 ELSE 1 END,
       f.at, f.at, f.at, f.at,
       CASE WHEN i % 20 > 1 THEN '{{"ok": true}}'::jsonb END,
       CASE WHEN i % 20 = 0 THEN 'ValueError: boom' END
  FROM generate_series(1, {FINISHED}) AS i,
       LATERAL (SELECT now() - CASE WHEN i % 20 = 0 THEN interval '28 days'
                                    ELSE interval '48 hours' END
                             * (i::double precision / {FINISHED}) AS at) AS f;

INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, lease_owner, lease_token,
                           lease_expires_at, created_at, started_at)
SELECT 'default', 'email.send', '{{"n": 1}}', 'running', 1, 'host:1234', gen_random_uuid(),
       now() + CASE WHEN i % 50 = 0 THEN interval '-10 seconds' ELSE interval '25 seconds' END,
       now() - interval '1 minute', now() - interval '5 seconds'
  FROM generate_series(1, {RUNNING}) AS i;

INSERT INTO pgqueue.tasks (queue, type, payload, priority, status, parents_pending,
                           workflow_id, visible_after, created_at)
SELECT CASE WHEN i % 5 < 3 THEN 'default' ELSE 'reports' END,
       'report.build', '{{"n": 1}}', CASE WHEN i % 7 = 0 THEN 0 ELSE 1 END, 'waiting', 1,
       w.id, now() - interval '10 minutes', now() - interval '10 minutes'
  FROM generate_series(1, {WAITING}) AS i,
       LATERAL (SELECT md5((i / 10)::text)::uuid AS id) AS w;

INSERT INTO pgqueue.tasks (queue, type, payload, priority, status, visible_after, created_at)
SELECT CASE WHEN i % 10 < 5 THEN 'default' WHEN i % 10 < 8 THEN 'email' ELSE 'reports' END,
       'email.send', '{{"to": "someone@example.com"}}',
       CASE WHEN i % 7 = 0 THEN 0 WHEN i % 7 < 6 THEN 1 ELSE 2 END,
       'queued',
       CASE WHEN i % 19 = 3 THEN now() + interval '1 hour' ELSE c.at END,
       c.at
  FROM generate_series(1, {QUEUED}) AS i,
       LATERAL (SELECT now() - interval '2 hours' * (1 - i::double precision / {QUEUED}) AS at)
       AS c;
"""

SCAN_TYPES_USING_AN_INDEX = {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}


# --- the table -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_database_url(server_url: str, template_db: str) -> Iterator[str]:
    """One migrated database with the large table, shared by this module's tests (building it
    is most of the module's run time; every test here only reads it or rolls back)."""
    name = f"pgqueue_plans_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL_SQL)
            # VACUUM as autovacuum would have by now (it also sets hint bits, so the timed
            # EXPLAIN ANALYZE below measures the claim, not the first read of fresh pages).
            conn.execute("VACUUM ANALYZE pgqueue.tasks")
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def big(big_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the large table; whatever a test does in it is rolled back."""
    with psycopg.connect(big_database_url) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


def partial_index(
    conn: psycopg.Connection[Any], status: str, column: str, *, keyed: bool = False
) -> str:
    """The name of the partial index on pgqueue.tasks for rows of ``status`` that covers
    ``column``: found in the catalog, so a renamed index does not break these tests. The
    waiting tasks with a concurrency key have claim indexes of their own: ``keyed`` picks
    those, else those of the tasks without a key (and every other index)."""
    rows = conn.execute(
        """
        SELECT c.relname
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'pgqueue.tasks'::regclass
           AND pg_get_expr(i.indpred, i.indrelid) LIKE %s
           AND pg_get_indexdef(i.indexrelid) LIKE %s
           AND (pg_get_expr(i.indpred, i.indrelid) LIKE '%%concurrency_key IS NOT NULL%%') = %s
        """,
        (f"%'{status}'%", f"%({column}%", keyed),
    ).fetchall()
    assert len(rows) == 1, f"expected one partial index for {status} rows by {column}: {rows}"
    return str(rows[0][0])


def running_leases(conn: psycopg.Connection[Any], n: int) -> list[Lease]:
    rows = conn.execute(
        "SELECT id, lease_token FROM pgqueue.tasks WHERE status = 'running' LIMIT %s", (n,)
    ).fetchall()
    assert len(rows) == n
    return [Lease(task_id=r[0], token=r[1]) for r in rows]


# --- explaining the library's own statements -------------------------------------------------


def first_query(op: driver.Op[Any]) -> driver.Query:
    """The statement an operation runs first, with the parameters it builds."""
    query = next(op)
    assert isinstance(query, driver.Query), f"not a plain statement: {query!r}"
    return query


def all_queries(op: driver.Op[Any]) -> list[driver.Query]:
    """Every statement an operation runs when each one finds nothing (so it goes on to the
    next: for prune, one statement per status)."""
    out: list[driver.Query] = []
    try:
        query = next(op)
        while True:
            assert isinstance(query, driver.Query), f"not a plain statement: {query!r}"
            out.append(query)
            query = op.send([])
    except StopIteration:
        return out


def explain(conn: psycopg.Connection[Any], query: driver.Query, *, analyze: bool = False) -> Plan:
    """EXPLAIN the statement as driver.run would execute it; ANALYZE runs it (the caller's
    transaction is rolled back by the fixture, and by us right here for writes)."""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    row = conn.execute(
        f"EXPLAIN ({options}) {driver.statements()[query.name]}", query.params
    ).fetchone()
    conn.rollback()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(document[0])


def explain_prepared(conn: psycopg.Connection[Any], query: driver.Query) -> Plan:
    """The plan a prepared statement settles on (what a worker's connection runs once psycopg
    has prepared the statement): after five custom plans the server decides whether to keep
    planning per call or switch to a generic plan, and the sixth EXPLAIN EXECUTE shows the
    choice. The SQL is the library's with psycopg's placeholders turned into $n."""
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)[sbt]", placeholder, driver.statements()[query.name])
    conn.execute(f"PREPARE plan_probe AS {text.replace('%%', '%')}")
    conn.commit()
    try:
        # Client-side binding renders the values as literals in EXECUTE's argument list.
        cur = psycopg.ClientCursor(conn)
        args = ", ".join(["%s"] * len(names))
        values = [query.params[n] for n in names]
        for _ in range(6):
            cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe({args})", values)
        row = cur.fetchone()
    finally:
        conn.rollback()
        conn.execute("DEALLOCATE plan_probe")  # not transactional: PREPARE outlives rollback
        conn.commit()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(document[0])


def plans(conn: psycopg.Connection[Any], query: driver.Query) -> dict[str, Plan]:
    """Both plans a statement runs with: on a fresh connection and on a settled one."""
    return {"first run": explain(conn, query), "prepared": explain_prepared(conn, query)}


# --- reading plan trees ----------------------------------------------------------------------


def nodes(plan: Plan) -> Iterator[Plan]:
    """Every node of a plan tree, CTEs (init plans) included."""
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def table_scans(plan: Plan) -> list[Plan]:
    """The nodes that read pgqueue.tasks itself (not the Update/Delete node on it)."""
    return [
        n
        for n in nodes(plan)
        if n.get("Relation Name") == "tasks" and str(n["Node Type"]).endswith("Scan")
    ]


def sorts_over_the_table(plan: Plan) -> list[Plan]:
    """Sort nodes fed by table rows with no Limit in between: they sort everything that
    matched, however much that is (a bounded sort of a few per-queue batches is fine)."""

    def reaches_table(node: Plan) -> bool:
        for child in node.get("Plans", []):
            if child["Node Type"] == "Limit":
                continue
            if child.get("Relation Name") == "tasks" or reaches_table(child):
                return True
        return False

    return [n for n in nodes(plan) if n["Node Type"] == "Sort" and reaches_table(n)]


def rows_read(plan: Plan) -> int:
    """Rows EXPLAIN ANALYZE saw read from pgqueue.tasks: returned plus filtered out, per loop
    (EXPLAIN reports both as per-loop averages)."""
    total = 0.0
    for n in table_scans(plan):
        per_loop = (
            n.get("Actual Rows", 0)
            + n.get("Rows Removed by Filter", 0)
            + n.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * n.get("Actual Loops", 1)
    return round(total)


def outline(plan: Plan, depth: int = 0) -> str:
    """A plan tree as indented lines, for assertion messages."""
    node = plan
    line = "  " * depth + str(node["Node Type"])
    if "Relation Name" in node:
        line += f" on {node['Relation Name']}"
    if "Index Name" in node:
        line += f" using {node['Index Name']}"
    if "Actual Rows" in node:
        line += f" (rows={node['Actual Rows']} loops={node.get('Actual Loops', 1)})"
    return "\n".join([line, *(outline(child, depth + 1) for child in node.get("Plans", []))])


def assert_index_only_access(plan: Plan, label: str) -> None:
    """The statement reaches pgqueue.tasks through indexes only: no Seq Scan, at least one
    index-driven scan."""
    scans = table_scans(plan["Plan"])
    assert scans, f"{label}: no scan of pgqueue.tasks at all?\n{outline(plan['Plan'])}"
    kinds = {str(s["Node Type"]) for s in scans}
    assert kinds <= SCAN_TYPES_USING_AN_INDEX, (
        f"{label}: reads pgqueue.tasks by {sorted(kinds - SCAN_TYPES_USING_AN_INDEX)}"
        f"\n{outline(plan['Plan'])}"
    )


def assert_claim_walks_the_index(plan: Plan, claim_index: str, label: str) -> None:
    """The claim reads the partial claim index in order: an ordered index scan (a bitmap scan
    has no order), no Seq Scan, and no sort of everything that matched."""
    tree = plan["Plan"]
    assert_index_only_access(plan, label)
    assert any(
        n["Node Type"] in ("Index Scan", "Index Only Scan") and n.get("Index Name") == claim_index
        for n in nodes(tree)
    ), f"{label}: no ordered scan of {claim_index}\n{outline(tree)}"
    assert not sorts_over_the_table(tree), (
        f"{label}: sorts the matching backlog instead of reading it in index order\n{outline(tree)}"
    )


def claim_query(queues: list[str]) -> driver.Query:
    return first_query(
        claiming.task_claim(
            queues=queues, limit=CLAIM_BATCH, owner="host:1234:claimer", lease_seconds=30
        )
    )


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Measurements go to the terminal even when output is captured: they inform, they are
    not asserted (timings on a shared 2-core machine are too noisy to gate on)."""
    with capsys.disabled():
        print(f"\n[query plans] {text}")


# --- the claim -------------------------------------------------------------------------------


def assert_claim_is_bounded(
    big: psycopg.Connection[Any],
    queues: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    claim_index = partial_index(big, "queued", "queue")
    query = claim_query(queues)
    analyzed = explain(big, query, analyze=True)
    read = rows_read(analyzed["Plan"])
    report(
        capsys,
        f"claim of {CLAIM_BATCH} from {queues} with a {QUEUED:,}-task backlog: "
        f"{analyzed['Execution Time']:.2f} ms, {read:,} rows read from pgqueue.tasks",
    )
    for label, plan in plans(big, query).items():
        assert_claim_walks_the_index(plan, claim_index, f"claim {queues} ({label})")
    # Each queue's batch, plus the scheduled rows skipped on the way, plus the UPDATE's
    # lookups by id: a few hundred rows. Reading the backlog is tens of thousands.
    bound = 3 * CLAIM_BATCH * len(queues) + CLAIM_BATCH
    assert read <= bound, (
        f"the claim read {read:,} rows of pgqueue.tasks for a batch of {CLAIM_BATCH} "
        f"(bound {bound:,})\n{outline(analyzed['Plan'])}"
    )


def test_claim_from_one_queue_reads_the_claim_index_in_order_not_the_backlog(
    big: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert_claim_is_bounded(big, ["default"], capsys)


def test_claim_from_two_queues_reads_a_batch_per_queue_not_the_backlog(
    big: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert_claim_is_bounded(big, ["email", "reports"], capsys)


def test_claim_from_two_queues_takes_their_most_urgent_visible_tasks_in_order(
    big: psycopg.Connection[Any],
) -> None:
    """A fast plan must still be the right one: from two queues the claim takes the 100 most
    urgent visible tasks of both together (high priority first, then oldest first), none of
    another queue and none scheduled for later."""
    expected = big.execute(
        """
        SELECT id FROM pgqueue.tasks
         WHERE status = 'queued' AND queue IN ('email', 'reports') AND visible_after <= now()
         ORDER BY priority, created_at, id LIMIT %s
        """,
        (CLAIM_BATCH,),
    ).fetchall()
    claimed = driver.run(
        big,
        claiming.task_claim(
            queues=["email", "reports"],
            limit=CLAIM_BATCH,
            owner="host:1234:claimer",
            lease_seconds=30,
        ),
    )
    big.rollback()
    assert [t.id for t in claimed] == [r[0] for r in expected]
    assert {t.queue for t in claimed} == {"email", "reports"}


def limited_claim_query(queues: list[str]) -> driver.Query:
    params = {"queues": queues, "limit": CLAIM_BATCH, "owner": "host:1:c", "lease_seconds": 30}
    return driver.Query("task_claim_limited", {**params, "now": None})


@pytest.fixture
def limits(big: psycopg.Connection[Any]) -> Iterator[Callable[..., None]]:
    """Set limits in the big table (committed: the prepared-plan check commits anyway), and
    remove them afterwards so that the module's other tests see none."""

    def set_limits(*rows: tuple[str, str, int]) -> None:
        for kind, name, max_running in rows:
            big.execute(
                "INSERT INTO pgqueue.limits (kind, name, max_running) VALUES (%s, %s, %s)",
                (kind, name, max_running),
            )
        big.commit()

    yield set_limits
    big.rollback()
    big.execute("DELETE FROM pgqueue.limits")
    big.commit()


@pytest.mark.parametrize(
    ("limited", "queues"),
    [
        # The whole backlog is of the limited type: it is read per queue by the type index.
        ([("type", "email.send", 5000)], ["default", "email"]),
        # A limited queue is read by the claim index.
        ([("queue", "reports", 5000)], ["reports"]),
        # A limit whose type has no waiting task: nothing to walk past.
        ([("type", "sms.send", 10)], ["default", "email", "reports"]),
    ],
    ids=["type-limit", "queue-limit", "idle-type-limit"],
)
def test_the_limited_claim_reads_each_limit_by_index_not_the_backlog(
    big: psycopg.Connection[Any],
    limits: Callable[..., None],
    capsys: pytest.CaptureFixture[str],
    limited: list[tuple[str, str, int]],
    queues: list[str],
) -> None:
    limits(*limited)
    query = limited_claim_query(queues)
    analyzed = explain(big, query, analyze=True)
    read = rows_read(analyzed["Plan"])
    report(
        capsys,
        f"limited claim of {CLAIM_BATCH} under {limited} from {queues}: "
        f"{analyzed['Execution Time']:.2f} ms, {read:,} rows read from pgqueue.tasks",
    )
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"limited claim ({label})")
        assert not sorts_over_the_table(plan["Plan"]), f"{label}\n{outline(plan['Plan'])}"
    # The running tasks (counted against the limits), a batch per queue and the UPDATE's
    # lookups; never the 200,000-task backlog.
    bound = RUNNING + 3 * CLAIM_BATCH * len(queues) + CLAIM_BATCH
    assert read <= bound, f"read {read:,} rows (bound {bound:,})\n{outline(analyzed['Plan'])}"


def test_the_limits_probe_is_a_probe_per_limit(
    big: psycopg.Connection[Any], limits: Callable[..., None]
) -> None:
    """Every claim round of a worker that has seen limits starts with this probe, so it must
    cost an index probe per limit, never a read of the backlog, whether the limited type has
    waiting tasks (all 200,000 here) or none."""
    limits(("type", "email.send", 10), ("type", "sms.send", 10), ("queue", "reports", 10))
    query = first_query(claiming.limits_probe(["default", "email"]))
    plan = explain(big, query, analyze=True)
    assert_index_only_access(plan, "limits probe")
    assert rows_read(plan["Plan"]) <= 10, outline(plan["Plan"])


def test_the_ordinary_claim_probes_limits_without_losing_the_index_walk(
    big: psycopg.Connection[Any], limits: Callable[..., None]
) -> None:
    """With limits on other types, the ordinary claim still walks the claim index: the
    limits are probed per row by primary key, which the planner estimates sensibly (an array
    of their names made it expect almost no rows to pass, and sort the whole backlog)."""
    limits(("type", "sms.send", 10), ("queue", "elsewhere", 10))
    claim_index = partial_index(big, "queued", "queue")
    for label, plan in plans(big, claim_query(["default", "email"])).items():
        assert_claim_walks_the_index(plan, claim_index, f"claim with limits ({label})")


# --- the other statements on the hot path or in maintenance ----------------------------------


def test_completion_and_heartbeat_find_their_tasks_by_index(
    big: psycopg.Connection[Any],
) -> None:
    leases = running_leases(big, CLAIM_BATCH)
    complete = first_query(leased.task_complete_many([(lease, None) for lease in leases]))
    heartbeat = first_query(leased.task_heartbeat(leases, 30))
    for query in (complete, heartbeat):
        for label, plan in plans(big, query).items():
            assert_index_only_access(plan, f"{query.name} of {len(leases)} ({label})")


def test_sweep_finds_expired_leases_by_index(big: psycopg.Connection[Any]) -> None:
    query = first_query(claiming.task_sweep_expired(MAINTENANCE_BATCH))
    lease_index = partial_index(big, "running", "lease_expires_at")
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"sweep ({label})")
        used = {n.get("Index Name") for n in table_scans(plan["Plan"])}
        assert lease_index in used, f"sweep ({label}) does not use {lease_index}: {used}"


def test_expiry_finds_expired_tasks_by_their_index_not_the_backlog(
    big: psycopg.Connection[Any],
) -> None:
    """Maintenance's expiry pass (every sweep) reads tasks_expiry_idx, which holds
    only waiting tasks with an expiry, never the backlog."""
    query = first_query(claiming.task_expire(MAINTENANCE_BATCH))
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"expire ({label})")
        used = {n.get("Index Name") for n in table_scans(plan["Plan"])}
        assert "tasks_expiry_idx" in used, f"expire ({label}) does not use it: {used}"


def test_prune_finds_tasks_past_retention_by_index(big: psycopg.Connection[Any]) -> None:
    """Half of the finished rows are past retention (the day after a burst): each batch of
    1,000 must still come from an index, not from a scan of the table, which reads through
    the backlog and every dead tuple left by earlier batches. Every statement the prune
    operations run is checked (one per status, in the current SQL)."""
    completed = all_queries(
        queues.task_prune([TaskStatus.COMPLETED, TaskStatus.CANCELLED], DAY, MAINTENANCE_BATCH)
    )
    dead = all_queries(queues.task_prune([TaskStatus.FAILED], 14 * DAY, MAINTENANCE_BATCH))
    assert completed and dead
    for query in completed + dead:
        for label, plan in plans(big, query).items():
            assert_index_only_access(plan, f"prune {dict(query.params)} ({label})")


def test_promotion_walks_the_claim_index_per_queue_and_level(big: psycopg.Connection[Any]) -> None:
    """The starvation policy runs every sweep round over a backlog of any size: it must reach
    the aged tasks through the claim indexes (a loose walk over the queues, then a range per
    queue and level), never by reading the backlog. (Tasks with a concurrency key: in
    test_key_plans.py.)"""
    query = first_query(queues.task_promote(300, MAINTENANCE_BATCH))
    claim_index = partial_index(big, "queued", "queue")
    key_index = partial_index(big, "queued", "queue", keyed=True)
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"promote ({label})")
        used = {n.get("Index Name") for n in nodes(plan["Plan"])} - {None}
        # The claim indexes find the tasks; the primary key is the UPDATE's way back to them.
        assert claim_index in used and used <= {claim_index, key_index, "tasks_pkey"}, (
            label,
            used,
        )


def test_listing_queues_walks_the_claim_index_once_per_queue(big: psycopg.Connection[Any]) -> None:
    """`pgqueue stats` and every /metrics scrape list the queues (for the paused ones): that
    must cost a probe per queue, not a read of the whole backlog."""
    query = first_query(queues.queue_list())
    # No parameters: its generic plan is its custom plan, so one EXPLAIN covers both.
    assert_index_only_access(explain(big, query), "queue list")


# --- the waiting tasks: counted and listed through their own index ------------------

WAITING_INDEX = "tasks_waiting_idx"


def index_scans(plan: Plan, index: str) -> list[Plan]:
    """The nodes that read ``index`` (an index or index-only scan of the table, or the bitmap
    index scan under a bitmap heap scan)."""
    return [n for n in nodes(plan) if n.get("Index Name") == index]


def picks_waiting_rows_by_condition(plan: Plan) -> list[Plan]:
    """Scans that pick the waiting rows by a condition on status (a filter, a recheck, an
    index condition): what any read of them but from tasks_waiting_idx, which holds those
    rows alone and so needs none, has to do, be it of the table or of another index. (A
    bitmap heap scan of tasks_waiting_idx's entries alone rechecks the index's predicate: it
    visits the waiting rows only.)"""
    keys = ("Filter", "Recheck Cond", "Index Cond")

    def of_the_waiting_index_alone(node: Plan) -> bool:
        bitmaps = [n for n in nodes(node) if n["Node Type"] == "Bitmap Index Scan"]
        return bool(bitmaps) and all(n.get("Index Name") == WAITING_INDEX for n in bitmaps)

    return [
        n
        for n in nodes(plan)
        if n.get("Index Name") != WAITING_INDEX
        and not (n["Node Type"] == "Bitmap Heap Scan" and of_the_waiting_index_alone(n))
        and "'waiting'" in " ".join(str(n.get(k, "")) for k in keys)
    ]


def entries_read(plan: Plan, index: str) -> int:
    """Index entries EXPLAIN ANALYZE saw returned by the scans of ``index``, all loops."""
    return round(
        sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in index_scans(plan, index))
    )


CALLBACKS = 200


@pytest.fixture
def waiting_only_queue(big: psycopg.Connection[Any]) -> Iterator[str]:
    """A queue whose tasks all wait, 'callbacks' (committed: the prepared-plan check commits
    anyway), removed afterwards. Added after the fill's ANALYZE, as the retrying tasks are: a
    fourth queue in the table's statistics can turn the promotion's range per queue and level
    into a bitmap scan and a sort of all its aged tasks, which the promotion's test rejects
    (a question of its own, not this fixture's)."""
    big.execute(
        f"""
        INSERT INTO pgqueue.tasks (queue, type, payload, status, parents_pending, workflow_id)
        SELECT 'callbacks', 'report.notify', '{{"n": 1}}', 'waiting', 1, gen_random_uuid()
          FROM generate_series(1, {CALLBACKS})
        """
    )
    big.commit()
    yield "callbacks"
    big.rollback()
    big.execute("DELETE FROM pgqueue.tasks WHERE queue = 'callbacks'")
    big.commit()


def test_the_overview_counts_waiting_tasks_from_their_index_alone(
    big: psycopg.Connection[Any], waiting_only_queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pgqueue stats`, GET /api/v1/stats, /metrics and the dashboard ask for the overview
    every few seconds: its waiting rows are counted from tasks_waiting_idx, an entry per
    waiting task and nothing else, never picked from the table or another index. (Its queued
    rows come from the backlog view, which here, with half the table queued, the planner
    reads by a Seq Scan: not this test's concern.)"""
    query = first_query(stats.queue_overview())
    # No parameters: its generic plan is its custom plan, so one EXPLAIN covers both.
    analyzed = explain(big, query, analyze=True)
    tree = analyzed["Plan"]
    scans = index_scans(tree, WAITING_INDEX)
    assert scans and not picks_waiting_rows_by_condition(tree), outline(tree)
    assert {s["Node Type"] for s in scans} <= SCAN_TYPES_USING_AN_INDEX | {"Bitmap Index Scan"}
    read = entries_read(tree, WAITING_INDEX)
    how = ", ".join(sorted({str(s["Node Type"]) for s in scans}))
    fetched = sum(n.get("Heap Fetches", 0) for n in scans)
    report(
        capsys,
        f"overview with {WAITING + CALLBACKS:,} waiting tasks: "
        f"{analyzed['Execution Time']:.2f} ms in all, {read:,} entries of {WAITING_INDEX} read "
        f"by {how}" + (f" ({fetched:,} heap fetches)" if "Index Only Scan" in how else ""),
    )
    assert read == WAITING + CALLBACKS, outline(tree)
    rows = driver.run(big, stats.queue_overview())
    big.rollback()
    counted = {(r.queue, r.priority): r.tasks for r in rows if r.status == "waiting"}
    assert sum(counted.values()) == WAITING + CALLBACKS
    assert {q for q, _ in counted} == {"default", "reports", waiting_only_queue}


def test_listing_queues_walks_the_waiting_index_once_per_queue(
    big: psycopg.Connection[Any], waiting_only_queue: str
) -> None:
    """The queue list finds a queue whose tasks all wait by a loose walk of
    tasks_waiting_idx: a probe per queue that has waiting tasks, not a read of them all."""
    query = first_query(queues.queue_list())
    analyzed = explain(big, query, analyze=True)
    tree = analyzed["Plan"]
    assert index_scans(tree, WAITING_INDEX), outline(tree)
    assert not picks_waiting_rows_by_condition(tree), outline(tree)
    # 'callbacks', 'default', 'reports', then the probe that finds no further queue.
    assert entries_read(tree, WAITING_INDEX) <= 4, outline(tree)
    listed = driver.run(big, queues.queue_list())
    big.rollback()
    assert waiting_only_queue in {q.name for q in listed}


@pytest.mark.parametrize("queue", ["callbacks", "nowhere"])
def test_the_queue_probe_reads_one_entry_of_the_waiting_index(
    big: psycopg.Connection[Any], waiting_only_queue: str, queue: str
) -> None:
    """Pausing a queue without --create first asks whether it exists: for a queue whose tasks
    all wait, and for one with no task at all (every probe runs), its waiting probe reads an
    entry of tasks_waiting_idx, or none, in both plans. (In the generic plan the server
    settles on, the queued and finished probes are Seq Scans, which read the whole table for
    a queue with no such task: reported, not this test's concern.)"""
    query = first_query(queues.queue_known(queue))
    for label, plan in plans(big, query).items():
        tree = plan["Plan"]
        assert index_scans(tree, WAITING_INDEX), f"{label}\n{outline(tree)}"
        assert not picks_waiting_rows_by_condition(tree), f"{label}\n{outline(tree)}"
    analyzed = explain(big, query, analyze=True)
    assert_index_only_access(analyzed, f"queue probe {queue}")
    assert entries_read(analyzed["Plan"], WAITING_INDEX) <= 1, outline(analyzed["Plan"])
    # The running probe reads the running tasks' index, filtered by queue: the slots in use.
    assert rows_read(analyzed["Plan"]) <= RUNNING + 1, outline(analyzed["Plan"])
    known = driver.run(big, queues.queue_known(queue))
    big.rollback()
    assert known is (queue == waiting_only_queue)


def test_throughput_counts_each_queue_window_by_index(big: psycopg.Connection[Any]) -> None:
    """Every /metrics scrape and `pgqueue stats` count the last minute's finished tasks: a
    range per queue and status of the retention index, not the day of finished tasks kept."""
    query = first_query(stats.queue_throughput(60))
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"throughput ({label})")
    analyzed = explain(big, query, analyze=True)
    assert rows_read(analyzed["Plan"]) < 1000, outline(analyzed["Plan"])


def test_listing_limits_reads_only_the_running_tasks(big: psycopg.Connection[Any]) -> None:
    query = first_query(queues.limit_list())
    plan = explain(big, query, analyze=True)
    assert_index_only_access(plan, "limit list")
    assert rows_read(plan["Plan"]) <= RUNNING, outline(plan["Plan"])


def test_dead_letter_listing_reads_dead_letters_by_index(big: psycopg.Connection[Any]) -> None:
    """The first page (as `pgqueue dlq list` and GET /dead-letters ask for it) and a later
    page by keyset cursor. (No index gives created_at order among dead letters, so each page
    still sorts all of them, top-N: work bounded by the dead-letter queue, not the table.)"""
    middle = big.execute(
        "SELECT created_at, id FROM pgqueue.tasks WHERE status = 'failed'"
        " ORDER BY created_at DESC, id DESC OFFSET 5000 LIMIT 1"
    ).fetchone()
    assert middle is not None
    cursor: tuple[datetime, uuid.UUID] = (middle[0], middle[1])
    for before, page in ((None, "first page"), (cursor, "a later page")):
        query = first_query(tasks.task_list(**list_args("failed", None, None, 50, before)))
        for label, plan in plans(big, query).items():
            assert_index_only_access(plan, f"dead letters, {page} ({label})")


# --- the dashboard's reads (refreshed every few seconds by each open dashboard) ---------------

RETRYING = 2_000


def retention_index(conn: psycopg.Connection[Any]) -> str:
    """The index of finished tasks by (status, queue, finished_at), found in the catalog."""
    rows = conn.execute(
        """
        SELECT c.relname
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'pgqueue.tasks'::regclass
           AND pg_get_indexdef(i.indexrelid) LIKE '%(status, queue, finished_at)%'
        """
    ).fetchall()
    assert len(rows) == 1, rows
    return str(rows[0][0])


def test_the_throughput_series_reads_the_hour_per_queue_by_index_not_the_day(
    big: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The dashboard's chart: a loose walk over the queues of each status, then a range of the
    retention index per queue from the hour's first minute; the 48 h of finished tasks kept
    (and 28 days of dead letters) are never read, whichever plan the server settles on."""
    index = retention_index(big)
    for minutes, queue in ((60, None), (60, "email"), (1440, None)):
        query = first_query(stats.throughput_series(minutes, queue))
        for label, plan in plans(big, query).items():
            name = f"throughput series {minutes} min of {queue or 'all'} ({label})"
            assert_index_only_access(plan, name)
            used = {n.get("Index Name") for n in table_scans(plan["Plan"])}
            assert used == {index}, f"{name}: {used}\n{outline(plan['Plan'])}"

    query = first_query(stats.throughput_series(60))
    analyzed = explain(big, query, analyze=True)
    in_window = big.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE status IN ('completed', 'failed')"
        " AND finished_at >= date_trunc('minute', now(), 'UTC') - interval '59 minutes'"
    ).fetchone()
    big.rollback()
    assert in_window is not None
    read = rows_read(analyzed["Plan"])
    report(
        capsys,
        f"throughput series of the last hour ({in_window[0]:,} tasks finished in it, "
        f"{FINISHED:,} kept): {analyzed['Execution Time']:.2f} ms, {read:,} rows read",
    )
    # The hour's tasks plus a probe or two per queue and status.
    assert read <= in_window[0] + 50, outline(analyzed["Plan"])


@pytest.fixture
def retrying_tasks(big: psycopg.Connection[Any]) -> Iterator[int]:
    """Tasks waiting for a retry after a failed attempt (committed: the prepared-plan check
    commits anyway), removed afterwards so that the module's other tests never see them."""
    big.execute(
        f"""
        INSERT INTO pgqueue.tasks (queue, type, payload, status, attempts, visible_after,
                                   created_at, started_at, last_error)
        SELECT 'hooks', 'webhook.deliver', '{{"n": 1}}', 'queued', 1 + i % 3,
               now() + i * interval '1 second', now() - interval '1 hour',
               now() - interval '1 minute', 'ConnectionError: refused'
          FROM generate_series(1, {RETRYING}) AS i
        """
    )
    big.commit()
    yield RETRYING
    big.rollback()
    big.execute("DELETE FROM pgqueue.tasks WHERE queue = 'hooks'")
    big.commit()


def test_recent_failures_read_the_retry_index_and_the_newest_dead_letters_per_queue(
    big: psycopg.Connection[Any], retrying_tasks: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dashboard's recent failures: the retrying tasks from their own small partial index
    (not the 200,000-task backlog they sit in), the dead letters by a backward range of the
    retention index per queue (not the 10,000 kept): rows read bounded by the page."""
    limit = 20
    query = first_query(stats.task_failures(limit))
    retry_index = partial_index(big, "queued", "visible_after")
    for label, plan in plans(big, query).items():
        assert_index_only_access(plan, f"recent failures ({label})")
        used = {n.get("Index Name") for n in table_scans(plan["Plan"])}
        assert used == {retry_index, retention_index(big)}, (label, used)
        assert not sorts_over_the_table(plan["Plan"]), f"{label}\n{outline(plan['Plan'])}"
    analyzed = explain(big, query, analyze=True)
    read = rows_read(analyzed["Plan"])
    report(
        capsys,
        f"recent failures ({retrying_tasks:,} retrying, 10,000 dead letters): "
        f"{analyzed['Execution Time']:.2f} ms, {read:,} rows read",
    )
    # A page of retrying tasks, a page per queue of dead letters, the walk's probes.
    assert read <= limit + 3 * limit + 10, outline(analyzed["Plan"])
    found = driver.run(big, stats.task_failures(limit))
    big.rollback()
    assert sum(not f.dead for f in found) == limit and sum(f.dead for f in found) == limit


# --- the checks themselves -------------------------------------------------------------------


def test_plan_checks_reject_a_seq_scan_and_a_sort_of_the_backlog(
    big: psycopg.Connection[Any],
) -> None:
    """The assertions above can fail: a lookup by payload (no index) is a Seq Scan, and a
    claim ordered by an expression cannot use the index order, so it sorts the backlog."""

    def plan_of(sql: str) -> Plan:
        row = big.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()
        big.rollback()
        assert row is not None
        return dict(row[0][0])

    by_payload = plan_of("SELECT id FROM pgqueue.tasks WHERE payload->>'to' = 'x'")
    with pytest.raises(AssertionError, match="Seq Scan"):
        assert_index_only_access(by_payload, "probe")

    unordered = plan_of(
        "SELECT id FROM pgqueue.tasks WHERE status = 'queued' AND queue = 'email'"
        " ORDER BY priority + 0, created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED"
    )
    assert sorts_over_the_table(unordered["Plan"]), outline(unordered["Plan"])
    with pytest.raises(AssertionError):
        assert_claim_walks_the_index(unordered, partial_index(big, "queued", "queue"), "probe")


def test_the_waiting_checks_reject_waiting_rows_read_from_the_table(
    big: psycopg.Connection[Any],
) -> None:
    """With index scans off, the overview counts its waiting rows by a Seq Scan that filters
    on status: the waiting checks above see it."""
    big.execute("SET LOCAL enable_indexscan = off")
    big.execute("SET LOCAL enable_indexonlyscan = off")
    big.execute("SET LOCAL enable_bitmapscan = off")
    row = big.execute(f"EXPLAIN (FORMAT JSON) {driver.statements()['queue_overview']}").fetchone()
    big.rollback()
    assert row is not None
    tree = dict(row[0][0])["Plan"]
    assert not index_scans(tree, WAITING_INDEX), outline(tree)
    assert any(n["Node Type"] == "Seq Scan" for n in picks_waiting_rows_by_condition(tree))


def test_reading_a_workflow_reads_only_its_rows_by_the_workflow_index(
    big: psycopg.Connection[Any],
) -> None:
    """pgqueue.workflow's statement, and the DBA's view with WHERE workflow_id,
    reach the workflow's rows through tasks_workflow_idx, not the table (the predicate passes
    the view's GROUP BY)."""
    workflow_id = uuid.uuid4()
    for _ in range(3):
        pgqueue.enqueue(big, "wf", {}, workflow_id=workflow_id)
    big.commit()
    try:
        big.execute("ANALYZE pgqueue.tasks")
        big.commit()
        query = first_query(dependencies.workflow_get(workflow_id))
        for label, plan in plans(big, query).items():
            assert_index_only_access(plan, f"workflow tasks ({label})")
        analyzed = explain(big, query, analyze=True)
        assert rows_read(analyzed["Plan"]) <= 3, outline(analyzed["Plan"])
        row = big.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM pgqueue.workflows WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
        assert row is not None
        view = dict(row[0][0])
        assert_index_only_access(view, "workflows view")
        assert rows_read(view["Plan"]) <= 3, outline(view["Plan"])
    finally:
        big.rollback()
        big.execute("DELETE FROM pgqueue.tasks WHERE workflow_id = %s", [workflow_id])
        big.commit()
