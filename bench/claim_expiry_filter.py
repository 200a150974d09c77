"""What the expiry filter costs the ordinary claim, measured on the statement alone.

    python -m bench.claim_expiry_filter --server-url postgresql://postgres@127.0.0.1:5432/postgres

One fresh database at head with a backlog of queued tasks (none with an expiry: the common
case), then the task_claim statement as it is and the same text without the expiry filter,
alternated, each run in a transaction that is rolled back (so every run claims the same
first tasks from the same backlog), planned each time. The end-to-end comparison
(bench.compare --base-tree) cannot see a difference this small on a shared 2-core machine;
this isolates it. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

import pgqueue
from pgqueue import migrate
from pgqueue.queries import claiming, driver

FILTER = "AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", required=True)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100, help="tasks per claim (100)")
    parser.add_argument("--runs", type=int, default=300, help="runs of each variant (300)")
    args = parser.parse_args()

    name = f"pgqueue_claim_filter_{uuid.uuid4().hex[:8]}"
    url = urlunsplit(urlsplit(args.server_url)._replace(path=f"/{name}"))
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for start in range(0, args.backlog, 10_000):
                n = min(10_000, args.backlog - start)
                pgqueue.enqueue_many(conn, [{"type": "t", "payload": {"i": i}} for i in range(n)])
            conn.execute("ANALYZE pgqueue.tasks")
            op = claiming.task_claim(
                queues=["default"], limit=args.batch, owner="bench", lease_seconds=30
            )
            query = next(op)
            assert isinstance(query, driver.Query)
            with_filter = driver.statements()["task_claim"]
            assert with_filter.count(FILTER) == 1, "the filter is not where this bench expects"
            variants = {"with the expiry filter": with_filter,
                        "without it (as before)": with_filter.replace(FILTER, "")}  # fmt: skip
            times: dict[str, list[float]] = {k: [] for k in variants}
            claimed: dict[str, set[int]] = {k: set() for k in variants}
            cur = conn.cursor(row_factory=dict_row)
            for i in range(args.runs * 2 + 20):
                label = list(variants)[i % 2]
                conn.execute("BEGIN")
                t0 = time.perf_counter()
                cur.execute(variants[label], query.params, prepare=False)  # type: ignore[arg-type]
                rows = cur.fetchall()
                elapsed = time.perf_counter() - t0
                conn.execute("ROLLBACK")
                claimed[label].add(len(rows))
                if i >= 20:  # after a warm-up of 10 runs each
                    times[label].append(elapsed)
        report: dict[str, Any] = {"backlog": args.backlog, "batch": args.batch}
        for label, values in times.items():
            report[label] = {
                "runs": len(values),
                "claimed": sorted(claimed[label]),
                "median_ms": round(statistics.median(values) * 1000, 3),
                "p90_ms": round(sorted(values)[int(len(values) * 0.9)] * 1000, 3),
                "mean_ms": round(statistics.fmean(values) * 1000, 3),
            }
        a, b = (report[k]["median_ms"] for k in variants)
        report["with ÷ without (medians)"] = round(a / b, 3)
        print(json.dumps(report, indent=2, ensure_ascii=False))
    finally:
        with psycopg.connect(args.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
