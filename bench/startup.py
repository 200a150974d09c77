"""Start-up cost: commands, ``import pgqueue``, a worker's first claim.

    git worktree add --detach /tmp/base c73af0f
    python -m bench.startup --base-tree /tmp/base \
        --server-url postgresql://postgres@127.0.0.1:5432/postgres [--rounds 10] \
        [--bytecode as-is|cached]

Every figure is taken in fresh processes of this interpreter, with each tree first on
``PYTHONPATH`` (checked: ``pgqueue.__file__`` is in that tree), so only pgqueue's code
differs. The machine is noisy, so the trees take turns, case by case, the order alternating
from round to round, and each ratio (tree ÷ base) is taken within a round before the median.

- wall time of ``pgqueue --help``, ``pgqueue status ID --help``, ``pgqueue enqueue --help``
  (the console script's own code: ``from pgqueue.cli import main; main()``);
- ``import pgqueue``: wall time, and ``-X importtime``'s cumulative figure for ``pgqueue``
  beside psycopg's own; and "core": ``import pgqueue`` then using ``pgqueue.enqueue``,
  ``Client`` and ``TaskRegistry``, whose import time is every module it loaded that a bare
  ``python -c pass`` does not (the lazy facade would otherwise hide them);
- which heavy modules each of these loads (once, from ``-X importtime``), and, with a
  database, ``enqueue``, ``status`` and a worker really running;
- with ``--server-url``: a worker's time from exec to its first claim (a task enqueued
  before the launch; the claim's ``started_at`` against the wall clock at ``Popen``), for
  ``--processes 1``, ``2`` and ``4`` (``--worker-processes``): with N > 1, each child's first
  claim, reported as the first child's, the median child's and the last child's (one task
  per child, held for 3 s, at concurrency 1, so that no child can take two), and the CPU
  time its processes (the supervisor and the children: the session) had used when the last
  child had claimed, less noisy than the wall time on a shared machine. Each tree gets a
  database of its own, migrated by that tree. ``--worker-only`` skips the other cases.

``--bytecode as-is`` keeps this environment's setting (here ``PYTHONDONTWRITEBYTECODE=1``:
an editable checkout compiles pgqueue's sources at every start); ``cached`` gives each
process a warm bytecode cache of its own (``PYTHONPYCACHEPREFIX``), as a wheel install has.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import pgqueue

HERE = Path(__file__).resolve().parents[1]
CONSOLE = "import sys; from pgqueue.cli import main; sys.argv[0] = 'pgqueue'; main()"
CORE = "import pgqueue; pgqueue.enqueue, pgqueue.Client, pgqueue.TaskRegistry"
HEAVY = (
    "psycopg",
    "rich",
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pgqueue.operations",
    "pgqueue.worker",
    "pgqueue.api",
)
HANDLERS = """
import time

import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.handler("hold")
def hold(payload, ctx):
    time.sleep(payload["seconds"])
"""
TASK_ID = "00000000-0000-7000-8000-000000000000"  # no such task: `status ID --help` only


class Tree:
    """One checkout of pgqueue and the environment its processes run in."""

    def __init__(self, name: str, path: Path, bytecode: str, cache: Path, cwd: Path) -> None:
        # Run elsewhere than in a checkout: `python -c` puts the current directory first.
        self.name, self.path, self.cwd = name, path, cwd
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [env.get("PYTHONPATH")])])
        if bytecode == "cached":
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(cache / name)
        self.env = env
        found = self.run(["-c", "import pgqueue; print(pgqueue.__file__)"]).stdout.strip()
        assert found.startswith(str(path)), (found, str(path))
        if bytecode == "cached":  # warm the cache: every module the cases load
            self.run(["-c", f"{CORE}; pgqueue.Worker; import pgqueue.cli.tasks, pgqueue.migrate"])

    def run(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            env={**self.env, **kwargs.pop("env", {})},
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=120,
            **kwargs,
        )

    def wall(self, args: Sequence[str]) -> tuple[float, float]:
        """Seconds of wall time and of CPU (user + system) of one run: the CPU figure moves
        much less with the machine's load than the wall time, which the targets are in."""
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0, (args, proc.returncode)
        return elapsed, usage.ru_utime + usage.ru_stime


def import_lines(stderr: str) -> list[tuple[int, int, str]]:
    """``-X importtime`` lines: (depth, cumulative µs, module)."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        out.append(((len(name) - len(name.lstrip())) // 2, int(cumulative), name.strip()))
    return out


def heavy_in(stderr: str) -> list[str]:
    names = {name for _, _, name in import_lines(stderr)}
    return [h for h in HEAVY if any(n == h or n.startswith(h + ".") for n in names)]


def cumulative_of(stderr: str, module: str) -> float:
    """``module``'s cumulative import time, ms (its top-level line)."""
    return next(c for d, c, n in import_lines(stderr) if n == module and d == 0) / 1000


def loaded_beyond(stderr: str, baseline: set[str]) -> float:
    """ms spent importing what a bare interpreter does not: the top-level imports not in
    ``baseline`` (their cumulative figures include what they import in turn)."""
    return sum(c for d, c, n in import_lines(stderr) if d == 0 and n not in baseline) / 1000


# --- the cases ------------------------------------------------------------------------------


def cli(*args: str) -> list[str]:
    return ["-c", CONSOLE, *args]


WALL_CASES: dict[str, list[str]] = {
    "pgqueue --help": cli("--help"),
    "pgqueue status ID --help": cli("status", TASK_ID, "--help"),
    "pgqueue enqueue --help": cli("enqueue", "--help"),
    "python -c 'import pgqueue'": ["-c", "import pgqueue"],
    "python -c 'import pgqueue' + core use": ["-c", CORE],
}


def import_figures(tree: Tree, baseline: set[str]) -> dict[str, float]:
    """ms: -X importtime's `pgqueue` line, and everything the core use loaded."""
    plain = tree.run(["-X", "importtime", "-c", "import pgqueue"]).stderr
    core = tree.run(["-X", "importtime", "-c", CORE]).stderr
    return {
        "importtime: pgqueue (cumulative)": cumulative_of(plain, "pgqueue"),
        "importtime: import pgqueue + core use (all loaded)": loaded_beyond(core, baseline),
    }


def module_sets(tree: Tree, url: str | None) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {
        "import pgqueue": ["-c", "import pgqueue"],
        "import pgqueue + core use": ["-c", CORE],
        "pgqueue --help": cli("--help"),
        "pgqueue status ID --help": cli("status", TASK_ID, "--help"),
        "pgqueue enqueue --help": cli("enqueue", "--help"),
        "pgqueue worker --help": cli("worker", "--help"),
    }
    if url is not None:
        out = tree.run(cli("--database-url", url, "--json", "enqueue", "noop")).stdout
        task_id = json.loads(out)["task_id"]
        cases["pgqueue enqueue noop (runs)"] = cli("--database-url", url, "enqueue", "noop")
        cases["pgqueue status ID (runs)"] = cli("--database-url", url, "status", task_id)
    return {
        name: heavy_in(tree.run(["-X", "importtime", *args]).stderr) for name, args in cases.items()
    }


# --- the worker -----------------------------------------------------------------------------


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


class WorkerBench:
    """A database of each tree's own, and worker launches timed to their first claims."""

    def __init__(self, server_url: str, trees: Sequence[Tree], workdir: Path) -> None:
        self.server_url, self.workdir = server_url, workdir
        (workdir / "startup_handlers.py").write_text(HANDLERS, encoding="utf-8")
        self.urls: dict[str, str] = {}
        self.names: list[str] = []
        for tree in trees:
            name = f"pgqueue_startup_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(server_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            self.names.append(name)
            url = self.urls[tree.name] = _with_database(server_url, name)
            migrated = tree.run(["-c", f"from pgqueue import migrate; migrate.upgrade({url!r})"])
            assert migrated.returncode == 0, migrated.stderr

    def close(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            for name in self.names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def first_claims(self, tree: Tree, processes: int) -> tuple[list[float], float]:
        """Seconds from exec to each child's first claim, in order, and the CPU seconds its
        processes (the supervisor and its children) had used once the last had claimed."""
        url, queue = self.urls[tree.name], f"startup_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url, autocommit=True) as conn:
            # Enqueued with this tree's pgqueue: the trees' schemas are alike (same head).
            pgqueue.enqueue_many(
                conn, [{"type": "hold", "payload": {"seconds": 3}, "queue": queue}] * processes
            )
            argv = [sys.executable, "-m", "pgqueue", "--database-url", url, "worker"]
            argv += ["startup_handlers:tasks", "--processes", str(processes), "--queue", queue]
            argv += ["--concurrency", "1", "--grace-period", "5"]
            launched = time.time()
            proc = subprocess.Popen(
                argv,
                env=tree.env,
                cwd=self.workdir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                claims = self._await_claims(conn, queue, processes)
                cpu = session_cpu(proc.pid)
            finally:
                # Killed, not stopped: a graceful stop would wait out the held tasks, and
                # nothing after the claims is measured (the queue is this launch's alone).
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _await_session_gone(proc.pid)
        return sorted(at.timestamp() - launched for at in claims), cpu

    @staticmethod
    def _await_claims(conn: Any, queue: str, processes: int) -> list[datetime]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT lease_owner, min(started_at) FROM pgqueue.tasks"
                " WHERE queue = %s AND started_at IS NOT NULL GROUP BY lease_owner",
                (queue,),
            ).fetchall()
            if len(rows) >= processes:
                return [r[1] for r in rows]
            time.sleep(0.01)
        raise RuntimeError(f"no {processes} first claims in 60 s on queue {queue}")


def _await_session_gone(session: int, timeout: float = 20) -> None:
    """Until the killed session's processes are gone: the next launch must not share the
    cores with them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            alive = alive or (int(fields[3]) == session and fields[0] != "Z")
        if not alive:
            return
        time.sleep(0.05)


def session_cpu(session: int) -> float:
    """CPU seconds (user + system) of the running processes of ``session`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[3]) == session:
            total += int(fields[11]) + int(fields[12])
    return total / tick


# --- rounds and the report ------------------------------------------------------------------


def _interleaved(
    trees: Sequence[Tree], rounds: int, measure: Callable[[Tree], dict[str, float]]
) -> dict[str, dict[str, list[float]]]:
    """figures[case][tree] over the rounds, the trees taking turns in alternating order."""
    figures: dict[str, dict[str, list[float]]] = {}
    for n in range(rounds):
        for tree in trees if n % 2 == 0 else list(reversed(trees)):
            for case, value in measure(tree).items():
                figures.setdefault(case, {}).setdefault(tree.name, []).append(value)
    return figures


def _table(figures: dict[str, dict[str, list[float]]], unit: str, scale: float) -> list[str]:
    names = list(next(iter(figures.values())))
    head = " | ".join(f"{n}: median (min-max) {unit}" for n in names)
    lines = [
        f"| case | {head} |" + (" tree ÷ base, median of rounds (min-max) |" * (len(names) > 1))
    ]
    lines.append("|---" * (len(names) + 1 + (len(names) > 1)) + "|")
    for case, by_tree in figures.items():
        cells = [
            f"{statistics.median(by_tree[n]) * scale:,.0f} "
            f"({min(by_tree[n]) * scale:,.0f}-{max(by_tree[n]) * scale:,.0f})"
            for n in names
        ]
        row = f"| {case} | " + " | ".join(cells) + " |"
        if len(names) > 1:
            ratios = [t / b for t, b in zip(by_tree["tree"], by_tree["base"], strict=True) if b]
            if ratios:
                row += f" {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
            else:
                row += " - |"
        lines.append(row)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-tree")
    parser.add_argument("--server-url")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--worker-rounds", type=int, default=5)
    parser.add_argument("--bytecode", choices=["as-is", "cached"], default="as-is")
    parser.add_argument("--worker-processes", type=int, nargs="+", default=[1, 2, 4], metavar="N")
    parser.add_argument(
        "--worker-only", action="store_true", help="only the worker's exec to first claim"
    )
    args = parser.parse_args()
    if args.worker_only and not args.server_url:
        parser.error("--worker-only needs --server-url")

    with tempfile.TemporaryDirectory(prefix="pgqueue-startup-") as tmp:
        cache, workdir = Path(tmp) / "pycache", Path(tmp) / "work"
        workdir.mkdir()
        trees = [Tree("tree", HERE, args.bytecode, cache, workdir)]
        if args.base_tree:
            trees.append(
                Tree("base", Path(args.base_tree).resolve(), args.bytecode, cache, workdir)
            )
        baseline = {
            n for _, _, n in import_lines(trees[0].run(["-X", "importtime", "-c", "pass"]).stderr)
        }
        print(
            f"# bench/startup.py, {args.rounds} rounds, bytecode {args.bytecode}, "
            f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}"
        )
        for tree in trees:
            commit = subprocess.run(
                ["git", "-C", str(tree.path), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            print(f"# {tree.name}: {tree.path} at {commit}")

        def walls(tree: Tree) -> dict[str, float]:
            out = {}
            for case, argv in WALL_CASES.items():
                out[f"{case}: wall"], out[f"{case}: cpu"] = tree.wall(argv)
            return out

        if not args.worker_only:
            figures = _interleaved(trees, args.rounds, walls)
            for kind in ("wall", "cpu"):
                print(f"\n{kind.capitalize()} time (ms):\n")
                chosen = {c[: -len(kind) - 2]: f for c, f in figures.items() if c.endswith(kind)}
                print("\n".join(_table(chosen, "ms", 1000)))

        def imports(tree: Tree) -> dict[str, float]:
            figures = import_figures(tree, baseline)
            psycopg_only = tree.run(["-X", "importtime", "-c", "import psycopg"]).stderr
            figures["importtime: psycopg alone (cumulative)"] = cumulative_of(
                psycopg_only, "psycopg"
            )
            return figures

        if not args.worker_only:
            print("\nImport time (ms, -X importtime):\n")
            print("\n".join(_table(_interleaved(trees, args.rounds, imports), "ms", 1)))

        bench = WorkerBench(args.server_url, trees, workdir) if args.server_url else None
        try:
            if not args.worker_only:
                print("\nHeavy modules loaded:\n")
                print("| case | " + " | ".join(t.name for t in trees) + " |")
                print("|---" * (len(trees) + 1) + "|")
                urls = bench.urls if bench else {}
                sets = {t.name: module_sets(t, urls.get(t.name)) for t in trees}
                for case in sets["tree"]:
                    cells = [", ".join(sets[t.name].get(case, [])) or "none" for t in trees]
                    print(f"| {case} | " + " | ".join(cells) + " |")
            if bench is None:
                return

            def claims(tree: Tree) -> dict[str, float]:
                out = {}
                for processes in args.worker_processes:
                    each, cpu = bench.first_claims(tree, processes)
                    name = f"--processes {processes}"
                    if processes == 1:
                        out[f"{name}: first claim"] = each[0]
                    else:
                        out[f"{name}: first child's first claim"] = each[0]
                        out[f"{name}: median child's"] = statistics.median(each)
                        out[f"{name}: last child's"] = each[-1]
                    out[f"{name}: CPU of its processes by then (all cores)"] = cpu
                return out

            print("\nWorker, exec to first claim (ms):\n")
            print("\n".join(_table(_interleaved(trees, args.worker_rounds, claims), "ms", 1000)))
        finally:
            if bench is not None:
                bench.close()


if __name__ == "__main__":
    main()
