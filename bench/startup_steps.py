"""Where a worker's start goes: the time and CPU at each step, exec to first claim.

    python -m bench.startup_steps --base-tree /tmp/base \
        --server-url postgresql://postgres@127.0.0.1:5432/postgres [--rounds 8] \
        [--processes 1 2 4] [--bytecode as-is|cached]

Each launch is ``pgqueue worker`` (``--processes N``) run through a driver that imports the
worker's layers one after the other and wraps a few functions to print, at each step, the
wall time since the launch and the CPU time of the process that took it (a forked child
counts its own CPU from its fork):

- the interpreter up; typer and the command tree (``pgqueue.cli.root``); the worker command's
  module (psycopg and pgqueue's core); the worker's modules; the options read and the
  registry loaded (``registry.load`` returns);
- with N > 1: the supervisor's first child started (forked after its preload, or spawned;
  a spawned child runs this driver too);
- in each worker process: the worker built (``Worker.run_async`` starts), the schema checked
  (``migrate.check`` or ``check_revision`` returns), the first claim statement answered.

The trees take turns as in bench/startup.py (a database each, the same handlers). A launch is
killed once every process has claimed. The wrapped names are found in either tree; a step a
tree does not have is left blank.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg

import pgqueue
from bench.startup import HERE, Tree, WorkerBench

DRIVER = r"""
import os, sys, time
T0 = float(sys.argv[1]); del sys.argv[1]
def mark(step):
    wall, cpu = (time.time() - T0) * 1000, time.process_time() * 1000
    sys.stderr.write(f"STEP {os.getpid()} {wall:.1f} {cpu:.1f} {step}\n")
    sys.stderr.flush()
mark("interpreter up")
import pgqueue.cli.root
mark("typer and the command tree")
import pgqueue.cli.workers
mark("the worker command: psycopg, pgqueue's core")
import pgqueue.worker.service
mark("the worker's modules")
from pgqueue import migrate, registry
try:  # where the statements are executed: the driver's room, or (older trees) one module
    from pgqueue.queries import driver as queries
except ImportError:
    from pgqueue import queries
from pgqueue.worker.service import Worker

def after(owner, name, step, asynchronous=False):
    original = getattr(owner, name, None)
    if original is None:
        return
    if asynchronous:
        async def wrapped(*args, **kwargs):
            result = await original(*args, **kwargs)
            mark(step)
            return result
    else:
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            mark(step)
            return result
    setattr(owner, name, wrapped)

after(registry, "load", "options read, registry loaded")
after(migrate, "check", "worker: schema checked")
after(migrate, "check_revision", "worker: schema checked")
original_run = Worker.run_async
async def run_async(self, **kwargs):
    mark("worker: built, its loop running")
    return await original_run(self, **kwargs)
Worker.run_async = run_async
execute_name = next(n for n in ("_astep", "_aexecute") if hasattr(queries, n))
original_execute = getattr(queries, execute_name)
async def aexecute(raw, sql, query, *rest):
    rows = await original_execute(raw, sql, query, *rest)
    if getattr(query, "name", "") in ("task_claim", "claim_round"):
        mark("worker: first claim answered")
    return rows
setattr(queries, execute_name, aexecute)
try:
    from pgqueue import supervisor
    for name in ("fork",):
        original_fork = getattr(supervisor, name, None)
        if original_fork is not None:
            def fork(run, _original=original_fork):
                mark("supervisor: first child started")
                return _original(run)
            setattr(supervisor, name, fork)
    import subprocess
    original_popen = subprocess.Popen.__init__
    def popen(self, args, *a, **k):
        if list(args[1:4]) == ["-m", "pgqueue", "worker"]:  # a spawned child: this driver too
            mark("supervisor: first child started")
            args = [args[0], "-c", os.environ["STARTUP_STEPS_DRIVER"], str(T0), *args[3:]]
        original_popen(self, args, *a, **k)
    subprocess.Popen.__init__ = popen
except ImportError:
    pass
sys.argv[0] = "pgqueue"
from pgqueue.cli import main
main()
"""

CLAIMED = "worker: first claim answered"


def launch(bench: WorkerBench, tree: Tree, processes: int) -> dict[str, tuple[float, float]]:
    """One launch: step -> (wall ms, CPU ms); a worker step is the median worker's, the
    supervisor's the first time it was taken."""
    url, queue = bench.urls[tree.name], f"steps_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn, [{"type": "hold", "payload": {"seconds": 3}, "queue": queue}] * processes
        )
    argv = [sys.executable, "-c", DRIVER, str(time.time()), "--database-url", url, "worker"]
    argv += ["startup_handlers:tasks", "--processes", str(processes), "--queue", queue]
    argv += ["--concurrency", "1"]
    proc = subprocess.Popen(
        argv,
        env={**tree.env, "STARTUP_STEPS_DRIVER": DRIVER},
        cwd=bench.workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watchdog = threading.Timer(60, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    marks: dict[int, dict[str, tuple[float, float]]] = {}
    claimed: set[int] = set()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if not line.startswith("STEP "):
                continue
            _, pid, wall, cpu, step = line.rstrip("\n").split(" ", 4)
            marks.setdefault(int(pid), {}).setdefault(step, (float(wall), float(cpu)))
            if step == CLAIMED:
                claimed.add(int(pid))
                if len(claimed) == processes:
                    break
    finally:
        watchdog.cancel()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if len(claimed) < processes:
        raise RuntimeError(f"{tree.name}: {len(claimed)} of {processes} processes claimed")
    out: dict[str, tuple[float, float]] = {}
    for step, value in marks[proc.pid].items():  # the command's own process
        if not step.startswith("worker:"):
            out[step] = value
    workers = [m for m in marks.values() if CLAIMED in m]
    for step in {s for m in workers for s in m if s.startswith("worker:")}:
        values = sorted((m[step] for m in workers if step in m), key=lambda v: v[0])
        out[step] = values[len(values) // 2]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-tree", required=True)
    parser.add_argument("--server-url", required=True)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--bytecode", choices=["as-is", "cached"], default="as-is")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pgqueue-steps-") as tmp:
        cache, workdir = Path(tmp) / "pycache", Path(tmp) / "work"
        workdir.mkdir()
        trees = [
            Tree("tree", HERE, args.bytecode, cache, workdir),
            Tree("base", Path(args.base_tree).resolve(), args.bytecode, cache, workdir),
        ]
        bench = WorkerBench(args.server_url, trees, workdir)
        print(f"# bench/startup_steps.py, {args.rounds} rounds, bytecode {args.bytecode}")
        for tree in trees:
            commit = subprocess.run(
                ["git", "-C", str(tree.path), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            print(f"# {tree.name}: {tree.path} at {commit}")
        try:
            for processes in args.processes:
                figures: dict[str, dict[str, list[tuple[float, float]]]] = {}
                for n in range(args.rounds):
                    for tree in trees if n % 2 == 0 else list(reversed(trees)):
                        for step, value in launch(bench, tree, processes).items():
                            figures.setdefault(step, {}).setdefault(tree.name, []).append(value)
                print(f"\n--processes {processes}: each step's wall time since exec, and the")
                print("CPU time of the process that took it (ms, medians of the rounds)\n")
                print(_table(figures, [t.name for t in trees]))
        finally:
            bench.close()


def _table(figures: dict[str, dict[str, list[tuple[float, float]]]], names: Sequence[str]) -> str:
    def wall(step: str) -> float:
        values = [w for by_tree in [figures[step]] for v in by_tree.values() for w, _ in v]
        return statistics.median(values)

    head = " | ".join(f"{n}: wall (min-max) | {n}: CPU" for n in names)
    lines = [f"| step | {head} |", "|---" * (1 + 2 * len(names)) + "|"]
    for step in sorted(figures, key=wall):
        cells = []
        for name in names:
            values = figures[step].get(name)
            if not values:
                cells += ["-", "-"]
                continue
            walls, cpus = [v[0] for v in values], [v[1] for v in values]
            cells.append(f"{statistics.median(walls):,.0f} ({min(walls):,.0f}-{max(walls):,.0f})")
            cells.append(f"{statistics.median(cpus):,.0f}")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
