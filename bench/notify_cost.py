"""What NOTIFY on enqueue costs concurrent producers: commit throughput with it on and off.

    python -m bench.notify_cost [--producers 16] [--rounds 6] [--seconds 5]

A NOTIFY takes a lock held across the whole cluster from the moment its transaction queues
the notification until the commit is durable, so producers that each send one serialise
their commits on it; with it off (``PGQUEUE_NOTIFY=off``) their commits can share the WAL
flush (group commit). This measures that: ``--producers`` processes, each enqueuing one
task per transaction (autocommit) for ``--seconds``, all started together, on a private
server with durable commits (fsync and synchronous_commit on: what production runs); one
connection sits in ``LISTEN pgqueue`` throughout, as an idle worker's would. Rounds
alternate on and off (the order swapped each round) so that a change in the machine's load
hits both alike; the ratio is taken per pair of rounds before the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import psycopg

from bench.private_postgres import private_server
from pgqueue import migrate

# One producer: connect, warm up, wait for the common start, enqueue until the end, print
# how many were acknowledged.
PRODUCER = r"""
import sys, time
import psycopg, pgqueue
url, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
payload = {"data": "x" * 100}
with psycopg.connect(url, autocommit=True) as conn:
    for _ in range(20):
        pgqueue.enqueue(conn, "bench.noop", payload)
    while time.time() < start:
        time.sleep(0.001)
    n = 0
    while time.time() < end:
        pgqueue.enqueue(conn, "bench.noop", payload)
        n += 1
print(n, flush=True)
"""


def burst(url: str, producers: int, seconds: float, notify: bool) -> float:
    """Tasks per second acknowledged by ``producers`` processes in ``seconds``."""
    env = {**os.environ, "PGQUEUE_NOTIFY": "on" if notify else "off"}
    start = time.time() + 2.0 + 0.1 * producers  # after every producer has connected
    end = start + seconds
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, url, str(start), str(end)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(producers)
    ]
    counts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise SystemExit(f"a producer failed with exit code {proc.returncode}")
        counts.append(int(out.strip()))
    return sum(counts) / seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6, help="pairs of rounds (on and off)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one round")
    args = ap.parse_args(argv)

    with private_server() as server:
        url = server.url()
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute("LISTEN pgqueue")
            on: list[float] = []
            off: list[float] = []
            for i in range(args.rounds):
                order = (True, False) if i % 2 == 0 else (False, True)
                for notify in order:
                    rate = burst(url, args.producers, args.seconds, notify)
                    (on if notify else off).append(rate)
                    print(f"round {i + 1}: notify {'on ' if notify else 'off'} {rate:8.0f}/s")
                    sys.stdout.flush()
                    # Drain what the listener was sent, and keep the table small.
                    for _ in listener.notifies(timeout=0.01, stop_after=100_000):
                        pass
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("TRUNCATE pgqueue.tasks")
    ratios = [b / a for a, b in zip(on, off, strict=True)]
    print()
    print(f"producers {args.producers}, {args.rounds} rounds of {args.seconds:g} s each way")
    for name, rates in (("notify on ", on), ("notify off", off)):
        middle, low, high = statistics.median(rates), min(rates), max(rates)
        print(f"{name}: median {middle:8.0f}/s  (min {low:.0f}, max {high:.0f})")
    middle, low, high = statistics.median(ratios), min(ratios), max(ratios)
    print(f"off / on  : median {middle:.2f}x  (min {low:.2f}, max {high:.2f})")


if __name__ == "__main__":
    main()
