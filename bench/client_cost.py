"""What pgqueue's own Python costs per task, counted rather than timed, for trees side by side.

    python -m bench.client_cost --tree /tmp/before --tree .          # every scenario, 3 rounds
    python -m bench.client_cost --tree A --tree B --scenarios enqueue_single --repeat 1

Why: on a machine shared with other work, ``bench.compare``'s throughput figures swing by 2x
between rounds, so a refactor that must cost nothing cannot be judged from them. What a
refactor of pgqueue's Python can change is the CPU its own process spends per task, and that
can be measured without the noise:

* ``enqueue_single``, ``enqueue_bulk`` (enqueue_many of dicts) and ``enqueue_columns`` (the
  columnar form, ``pgqueue.enqueue_columns``, skipped for a tree without it): the producer
  runs under ``valgrind --tool=callgrind``, which counts the instructions the process
  executes (not seconds: the same count whatever else the machine does). Each tree runs the
  same script twice, with a small and a large number of tasks; the difference divided by the
  difference in tasks is the instructions per task, with interpreter start-up, imports and
  connecting cancelled out. The server's work is not counted (it is the same SQL text for a
  refactor; bench.compare covers the server).
* ``drain``: a real ``pgqueue worker`` process (one process, concurrency 100), also under
  callgrind, drains a backlog enqueued before it starts, small then large, differenced the
  same way: the worker's own instructions per task (claim, dispatch, handler call, batched
  completion), the server's excluded. Under valgrind's slowdown every claim meets a full
  queue; how many slots are free at each claim still varies with timing, so rounds of one
  tree differ by up to 5 %: read the spread, not only the median.

Each tree runs from its own virtualenv (``~/.cache/pgqueue-bench/venvs/cost-<hash of the
path>``, the tree installed editable), against a fresh database per run on the server given by
``--database-url`` (default: this machine's PostgreSQL on 127.0.0.1:5432). Trees alternate
within each round. Output: one markdown table; ratios are against the first tree (the first
that has the scenario's API).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import psycopg

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
VENVS = Path("~/.cache/pgqueue-bench/venvs").expanduser()
SCENARIOS = ("enqueue_single", "enqueue_bulk", "enqueue_columns", "drain")
# (small, large) task counts per scenario: large enough that per-task work dominates the
# difference, small enough for valgrind (about 50x slower than the plain interpreter).
SIZES = {
    "enqueue_single": (100, 600),
    "enqueue_bulk": (1000, 6000),
    "enqueue_columns": (1000, 6000),
    "drain": (1000, 4000),
}
BULK_BATCH = 1000
PAYLOAD = {"data": "x" * 100}

PRODUCER = """
import sys, psycopg, pgqueue
dsn, scenario, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
payload = {payload!r}
if scenario == "enqueue_single":
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(n):
            pgqueue.enqueue(conn, "bench.noop", payload)
elif scenario == "enqueue_columns":
    with psycopg.connect(dsn) as conn:
        for start in range(0, n, {batch}):
            pgqueue.enqueue_columns(conn, "bench.noop", [payload] * min({batch}, n - start))
            conn.commit()
else:
    item = {{"type": "bench.noop", "payload": payload}}
    with psycopg.connect(dsn) as conn:
        for start in range(0, n, {batch}):
            pgqueue.enqueue_many(conn, [item] * min({batch}, n - start))
            conn.commit()
"""

HANDLERS = """
import pgqueue
tasks = pgqueue.TaskRegistry()

@tasks.handler("bench.noop")
async def noop(payload, ctx):
    return None
"""


def venv_python(tree: Path) -> Path:
    """The tree's own virtualenv (created once, the tree installed editable)."""
    tree = tree.resolve()
    digest = hashlib.sha256(str(tree).encode()).hexdigest()[:8]
    venv = VENVS / f"cost-{digest}"
    python = venv / "bin" / "python"
    marker = venv / "cost-tree.json"
    pyproject = hashlib.sha256((tree / "pyproject.toml").read_bytes()).hexdigest()[:12]
    wanted = {"tree": str(tree), "pyproject": pyproject}
    if python.exists() and marker.exists() and json.loads(marker.read_text()) == wanted:
        return python
    print(f"creating {venv} for {tree} ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", str(tree)], check=True)
    marker.write_text(json.dumps(wanted))
    return python


class Scratch:
    """A fresh database migrated by the tree's own pgqueue; dropped afterwards."""

    def __init__(self, server_url: str, python: Path) -> None:
        self.server_url = server_url
        self.name = f"pgqueue_cost_{uuid.uuid4().hex[:10]}"
        self.url = urllib.parse.urlsplit(server_url)._replace(path=f"/{self.name}").geturl()
        self.python = python

    def __enter__(self) -> str:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        code = "import sys; from pgqueue import migrate; migrate.upgrade(sys.argv[1])"
        subprocess.run([self.python, "-c", code, self.url], check=True, capture_output=True)
        return self.url

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def child_env(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED="0", PGQUEUE_LOG_LEVEL="WARNING")
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def instructions(python: Path, script: Path, url: str, scenario: str, n: int) -> int:
    """Instructions the producer process executed (callgrind's total), enqueuing ``n``."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        str(python),
        str(script),
        url,
        scenario,
        str(n),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if not found:
        raise RuntimeError(f"no callgrind total in:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def drain_instructions(python: Path, handlers_dir: str, url: str, n: int) -> int:
    """Instructions one worker process executed (callgrind's total) draining ``n`` no-op tasks.

    The backlog is enqueued first, so under valgrind's slowdown every claim finds a full
    queue and takes as many tasks as the worker has free slots, the same for every tree."""
    item = {"type": "bench.noop", "payload": PAYLOAD}
    code = (
        "import sys, json, psycopg, pgqueue\n"
        "item = json.loads(sys.argv[2]); n = int(sys.argv[3])\n"
        "with psycopg.connect(sys.argv[1]) as conn:\n"
        f"    for s in range(0, n, {BULK_BATCH}):\n"
        f"        pgqueue.enqueue_many(conn, [item] * min({BULK_BATCH}, n - s)); conn.commit()\n"
    )
    subprocess.run([python, "-c", code, url, json.dumps(item), str(n)], check=True)
    cli = str(python.parent / "pgqueue")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [str(python), cli, "--database-url", url, "worker", "cost_handlers:tasks"]
    cmd += ["--concurrency", "100", "--log-level", "WARNING"]
    proc = subprocess.Popen(
        cmd, env=child_env(handlers_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 1800
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE status = 'completed'"
            ).fetchone()
            if row and row[0] >= n:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}")
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("drain did not finish in 1800 s")
            time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    found = re.search(r"Collected\s*:\s*(\d+)", err.decode(errors="replace"))
    if not found:
        raise RuntimeError(f"no callgrind total in:\n{err[-2000:]!r}")
    return int(found.group(1))


def per_task(scenario: str, python: Path, work: Path, server_url: str) -> float:
    """Instructions per task: the large run's minus the small run's, over the extra tasks."""
    small, large = SIZES[scenario]
    values = []
    for n in (small, large):
        with Scratch(server_url, python) as url:
            if scenario == "drain":
                values.append(float(drain_instructions(python, str(work), url, n)))
            else:
                values.append(float(instructions(python, work / "producer.py", url, scenario, n)))
    return (values[1] - values[0]) / (large - small)


def has_columns(tree: Path) -> bool:
    """Whether the tree has pgqueue.enqueue_columns (the enqueue_columns scenario's API)."""
    return "def enqueue_columns(" in (tree / "pgqueue" / "operations.py").read_text()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", type=Path, required=True, help="a checkout")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=DEFAULT_URL)
    args = p.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))} (known: {', '.join(SCENARIOS)})")
    trees = [t.resolve() for t in args.tree]
    pythons = {t: venv_python(t) for t in trees}
    commits = {
        t: subprocess.run(
            ["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?"
        for t in trees
    }
    with tempfile.TemporaryDirectory(prefix="pgqueue-cost-") as tmp:
        work = Path(tmp)
        # Children run here: with the repository as the working directory, ``python -c``
        # would import the pgqueue beside it instead of the tree's own.
        os.chdir(work)
        (work / "producer.py").write_text(PRODUCER.format(payload=PAYLOAD, batch=BULK_BATCH))
        (work / "cost_handlers.py").write_text(HANDLERS)
        results: dict[tuple[str, Path], list[float]] = {}
        for r in range(1, args.repeat + 1):
            for scenario in scenarios:
                for tree in trees:
                    if scenario == "enqueue_columns" and not has_columns(tree):
                        continue
                    print(f"round {r}: {scenario} / {commits[tree]} ...", file=sys.stderr)
                    value = per_task(scenario, pythons[tree], work, args.database_url)
                    results.setdefault((scenario, tree), []).append(value)
    print("| scenario | tree | instructions per task (each round) | median | ÷ first tree |")
    print("|---|---|---|---|---|")
    for scenario in scenarios:
        measured = [t for t in trees if (scenario, t) in results]
        if not measured:
            continue
        first = statistics.median(results[(scenario, measured[0])])
        for tree in measured:
            values = results[(scenario, tree)]
            med = statistics.median(values)
            each = ", ".join(f"{v:,.0f}" for v in values)
            print(f"| {scenario} | {commits[tree]} | {each} | {med:,.0f} | {med / first:.3f}x |")


if __name__ == "__main__":
    main()
