"""What the contender scripts share: arguments, the payload, worker processes, the drain clock.

Standard library only: each contender script runs in its own virtualenv with only its own
queue library and driver installed, and imports this file by path (the scripts' directory is
``sys.path[0]`` when they run, and on ``PYTHONPATH`` for the worker processes they start).
Keeping the measuring code here means every contender is timed by the same lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DSN_ENV = "BENCH_DSN"  # how worker processes learn where to write their bench_runs rows
SCENARIOS = ("drain", "enqueue_single", "enqueue_bulk", "latency")
TASK_TYPE = "bench.noop"
DEFAULT_PAYLOAD_BYTES = 100  # the data string of the payload {"data": "xxx..."}
DATA = "x" * DEFAULT_PAYLOAD_BYTES  # set by parse_args from --payload-bytes

# Written by the workers at shutdown, checked by the harness: one row per handler run.
RUNS_COPY = "COPY bench_runs (task_id, enqueued_at, started_at, pid) FROM STDIN"


def payload(enqueued_at: float | None = None) -> dict[str, Any]:
    """The task payload; the latency scenario carries the enqueue time inside it."""
    if enqueued_at is None:
        return {"data": DATA}
    return {"data": DATA, "t": enqueued_at}


def parse_args(description: str, **defaults: Any) -> argparse.Namespace:
    """The arguments every contender script takes (the harness passes all of them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dsn", required=True, help="the scratch database for this scenario")
    parser.add_argument("--scenario", required=True, choices=SCENARIOS)
    parser.add_argument("--tasks", type=int, required=True, help="tasks in the scenario")
    parser.add_argument("--batch-size", type=int, default=defaults.get("batch_size", 1000))
    parser.add_argument("--concurrency", type=int, default=defaults.get("concurrency", 50))
    parser.add_argument(
        "--dequeue-batch", type=int, default=defaults.get("dequeue_batch", 10), help="PgQueuer"
    )
    parser.add_argument("--processes", type=int, default=2, help="worker processes (drain)")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="completion polls (s)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="latency: enqueue gap")
    parser.add_argument("--warmup", type=int, default=5, help="latency: tasks before measuring")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (s)")
    parser.add_argument("--log-dir", type=Path, default=Path("."), help="worker logs go here")
    parser.add_argument(
        "--payload-bytes",
        type=int,
        default=DEFAULT_PAYLOAD_BYTES,
        help="length of the payload's data string (the JSON is about 12 bytes more)",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="enqueue_single (pgqueue): alternate blocks with the bare INSERT loop",
    )
    parser.add_argument(
        "--bulk-api",
        default="default",
        help="enqueue_bulk: which of the library's bulk APIs (pgqueue: many or columns)",
    )
    args = parser.parse_args()
    set_payload_bytes(args.payload_bytes)
    return args


def set_payload_bytes(size: int) -> None:
    """Every contender's payload: the data string ``size`` characters long."""
    global DATA
    DATA = "x" * size


def emit(result: dict[str, Any]) -> None:
    """The one JSON line the harness reads (the last line of stdout)."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def worker_env(dsn: str, **extra: str) -> dict[str, str]:
    """Environment for worker processes: the DSN for bench_runs, and this directory importable."""
    env = dict(os.environ)
    env[DSN_ENV] = dsn
    env["PYTHONPATH"] = str(HERE)
    env.update(extra)
    return env


class Deadline:
    """The script's own time limit, so a stuck drain ends with an error rather than a kill."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def check(self, what: str) -> None:
        if time.monotonic() > self.at:
            raise TimeoutError(f"timed out while {what}")


class Workers:
    """Worker processes started from a contender's own CLI, stopped with SIGTERM.

    They stay in our process group, so the harness's kill of the group on a timeout takes
    them too. A graceful stop matters: that is when each worker writes its bench_runs rows.
    """

    def __init__(self, commands: list[list[str]], env: dict[str, str], log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        for n, command in enumerate(commands):
            log = log_dir / f"worker-{n}.log"
            self.logs.append(log)
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
                )

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker {proc.args!r} exited with {proc.returncode}:\n{tail(log)}"
                )

    def stop(self, grace: float = 60.0) -> list[int]:
        """SIGTERM all, wait up to ``grace`` seconds, SIGKILL what is left; the exit codes."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return [proc.returncode for proc in self.procs]


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class DrainClock:
    """Turns completion counts polled from the contender's own table into a drain rate.

    The rate counts only what completed after the first poll that saw a completion, over the
    time after that poll, so the poll interval does not bias it (a poll may first see
    hundreds of completions at once).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.first_at: float | None = None
        self.first_done = 0
        self.last_at: float | None = None
        self.polls = 0

    def observe(self, done: int) -> bool:
        """Record one poll's completed count; True once every task has completed."""
        now = time.monotonic()
        self.polls += 1
        if done and self.first_at is None:
            self.first_at, self.first_done = now, done
        if done >= self.total:
            self.last_at = now
            return True
        return False

    def result(self) -> dict[str, Any]:
        assert self.first_at is not None and self.last_at is not None
        span = self.last_at - self.first_at
        # None when one poll saw every completion (tiny smoke sizes): no span to divide by.
        rate = round((self.total - self.first_done) / span, 1) if span > 0 else None
        return {
            "per_s": rate,
            "total_s": round(self.last_at - self.started, 3),
            "first_completion_s": round(self.first_at - self.started, 3),
            "drain_s": round(span, 3),
            "polls": self.polls,
        }


def pace(start: float, index: int, interval_s: float) -> float:
    """Seconds to sleep so that enqueue ``index`` happens at ``start + index * interval``."""
    return max(0.0, start + index * interval_s - time.monotonic())


def wait_for(
    completed: Callable[[], int],
    clock: DrainClock,
    workers: Workers,
    deadline: Deadline,
    poll: float,
) -> None:
    """Poll ``completed`` (the contender's own count of finished tasks) until ``clock`` has
    seen them all, failing early if a worker died or the deadline passed."""
    while not clock.observe(completed()):
        workers.check_alive()
        deadline.check(f"waiting for {clock.total} completions")
        time.sleep(poll)


async def await_completions(
    completed: Callable[[], Awaitable[int]],
    clock: DrainClock,
    workers: Workers,
    deadline: Deadline,
    poll: float,
) -> None:
    """:func:`wait_for` for a contender whose driver is async."""
    while not clock.observe(await completed()):
        workers.check_alive()
        deadline.check(f"waiting for {clock.total} completions")
        await asyncio.sleep(poll)
