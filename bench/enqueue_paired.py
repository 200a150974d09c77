"""Single and bulk enqueue, this tree against an earlier one, in many short alternating runs.

    git worktree add --detach /tmp/base 73ab790
    python -m bench.enqueue_paired --base-tree /tmp/base \
        --server-url postgresql://postgres@127.0.0.1:5432/postgres [--rounds 10]

On a machine shared with other work the load moves by 2x within minutes, so one long run
of each (bench.compare) can land in different weather. Here each tree has a long-lived
process on a database of its own (migrated by that tree) and the two run short blocks in
turn, seconds apart (the order alternating from round to round); the ratio is taken per
round before the median, so a load swing hits both sides of a ratio alike.

Both sides run in this interpreter, with the same dependencies: each burst puts its tree
first on ``sys.path`` (and checks that pgqueue was imported from there), so only pgqueue's
code differs. This tree is the repository this file is in.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

# Run in each contender's process: migrate its database with its own tree, warm up, then
# answer each line on stdin ("single N" or "bulk N") with the seconds the block took: N
# single enqueues (autocommit, one transaction each, a type no worker declared: the common
# by-name case), or N tasks by enqueue_many in batches of 1,000.
SERVE = r"""
import json, sys, time
tree, url, async_commit = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
sys.path.insert(0, tree)
import psycopg, pgqueue
from pgqueue import migrate
assert pgqueue.__file__.startswith(tree), (pgqueue.__file__, tree)
migrate.upgrade(url)
payload = {"data": "x" * 100}
with psycopg.connect(url, autocommit=True) as conn:
    if async_commit:  # the client's and server's CPU alone: no WAL flush in each block
        conn.execute("SET synchronous_commit = off")
    for _ in range(50):  # warm up: prepared statements, caches
        pgqueue.enqueue(conn, "noop", payload)
    pgqueue.enqueue_many(conn, [{"type": "noop", "payload": payload}] * 1000)
    print("ready", flush=True)
    for line in sys.stdin:
        kind, n = line.split()
        began = time.perf_counter()
        if kind == "single":
            for _ in range(int(n)):
                pgqueue.enqueue(conn, "noop", payload)
        else:
            for _ in range(int(n) // 1000):
                pgqueue.enqueue_many(conn, [{"type": "noop", "payload": payload}] * 1000)
        print(time.perf_counter() - began, flush=True)
"""


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def _fresh_database(server_url: str) -> tuple[str, str]:
    """An empty database; the burst migrates it with its own tree's revisions."""
    name = f"pgqueue_paired_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, _with_database(server_url, name)


def _drop(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Contender:
    """One tree's long-lived process on a database of its own, running blocks on request."""

    def __init__(self, tree: str, server_url: str, async_commit: bool = False) -> None:
        self.name, url = _fresh_database(server_url)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, tree, url, "1" if async_commit else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._reply() == "ready"

    def _reply(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the contender exited with {self.proc.wait()}")
        return line

    def rate(self, kind: str, n: int) -> float:
        """Tasks a second over one block of ``n``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{kind} {n}\n")
        self.proc.stdin.flush()
        return n / float(self._reply())

    def close(self, server_url: str) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        _drop(server_url, self.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-tree", required=True)
    parser.add_argument("--server-url", required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--single", type=int, default=200)
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit off in both: compare the CPU of a change that does not touch "
        "durability, without the WAL flush's wait (most of a durable single enqueue's time, "
        "and its noise, on a machine whose disk is shared)",
    )
    args = parser.parse_args(argv)

    here = str(Path(__file__).resolve().parent.parent)
    sides = {"tree": here, "base": str(Path(args.base_tree).resolve())}
    ratios: dict[str, list[float]] = {"single": [], "bulk": []}
    figures: dict[str, dict[str, list[float]]] = {s: {"single": [], "bulk": []} for s in sides}
    contenders = {
        side: Contender(tree, args.server_url, args.async_commit) for side, tree in sides.items()
    }
    try:
        for n in range(args.rounds):
            order = ["tree", "base"] if n % 2 == 0 else ["base", "tree"]
            got: dict[str, dict[str, float]] = {side: {} for side in sides}
            for kind, size in (("single", args.single), ("bulk", args.bulk)):
                for side in order:
                    got[side][kind] = contenders[side].rate(kind, size)
                    figures[side][kind].append(got[side][kind])
                ratios[kind].append(got["tree"][kind] / got["base"][kind])
            print(
                f"round {n + 1} ({' then '.join(order)}): single {got['tree']['single']:.0f} / "
                f"{got['base']['single']:.0f}/s, bulk {got['tree']['bulk']:.0f} / "
                f"{got['base']['bulk']:.0f}/s",
                flush=True,
            )
    finally:
        for contender in contenders.values():
            contender.close(args.server_url)
    print()
    print("| | tree (median/s) | base (median/s) | tree ÷ base, median of rounds (min-max) |")
    print("|---|---|---|---|")
    for kind, label in (("single", f"single enqueue, {args.single} a burst"),
                        ("bulk", f"bulk enqueue_many, {args.bulk:,} a burst")):  # fmt: skip
        r = ratios[kind]
        print(
            f"| {label} | {statistics.median(figures['tree'][kind]):,.0f} | "
            f"{statistics.median(figures['base'][kind]):,.0f} | "
            f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}) |"
        )


if __name__ == "__main__":
    main()
