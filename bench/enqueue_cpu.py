"""Client CPU and wall time of one single enqueue, for one tree, inside a transaction.

    python bench/enqueue_cpu.py TREE [SERVER_URL]     # run it for each tree, alternating

Inside one transaction (rolled back) no commit waits for the disk, so what is left is the
client's Python and psycopg work (process CPU time) and the statement itself (wall time):
what a change to the enqueue path costs, without the commit that dominates (and hides it
in) bench.compare's figures. ``TREE`` is put first on ``sys.path`` (and checked), so two
trees compare in the same interpreter with the same dependencies; each run migrates a fresh
database with its tree's revisions and drops it at the end.
"""

from __future__ import annotations

import sys
import time
import uuid

tree = sys.argv[1]
server = sys.argv[2] if len(sys.argv) > 2 else "postgresql://postgres@127.0.0.1:5432/postgres"
sys.path.insert(0, tree)

import psycopg  # noqa: E402

import pgqueue  # noqa: E402
from pgqueue import migrate  # noqa: E402

assert pgqueue.__file__ is not None and pgqueue.__file__.startswith(tree), pgqueue.__file__
name = "pgqueue_cpu_" + uuid.uuid4().hex[:8]
with psycopg.connect(server, autocommit=True) as admin:
    admin.execute(f'CREATE DATABASE "{name}"')
url = server.rsplit("/", 1)[0] + "/" + name
try:
    migrate.upgrade(url)
    payload = {"data": "x" * 100}
    with psycopg.connect(url) as conn:
        for _ in range(100):  # warm up: prepared statements, caches
            pgqueue.enqueue(conn, "noop", payload)
        runs = []
        for _ in range(5):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(2000):
                pgqueue.enqueue(conn, "noop", payload)
            cpu_us = (time.process_time() - cpu) / 2000 * 1e6
            runs.append((cpu_us, (time.perf_counter() - wall) / 2000 * 1e6))
        conn.rollback()
    print(
        f"{tree}: client CPU {min(r[0] for r in runs):.1f} us/enqueue, "
        f"wall {min(r[1] for r in runs):.1f} us (min of 5 x 2,000)"
    )
finally:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
