"""Helpers for tests that run pgqueue as a real process (the CLI, a worker) and read what it
printed, shared by several test modules (importable because tests/conftest.py's folder is on
sys.path, like helpers.py).

The child never inherits the test run's ``PGQUEUE_*`` variables (``clean_env``): what it is
given is what the test says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The handler module a worker process imports (``pgqueue worker MODULE:tasks``), written into
# its directory by the test: a handler that does nothing...
NOOP_HANDLERS = """
import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.handler("noop")
def noop(payload, ctx):
    return None
"""

# ...and one to append to it that always fails, with one attempt: a dead letter.
BOOM_HANDLER = """

@tasks.handler("boom", max_attempts=1)
def boom(payload, ctx):
    raise RuntimeError("boom")
"""


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something true, and return that; fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
    return value


# Kept by clean_env: the pooler pass (tests/conftest.py) sets them for every process it starts.
PASS_ENV: tuple[str, ...] = ()
if os.environ.get("PGQUEUE_TEST_THROUGH_POOLER"):
    PASS_ENV = ("PGQUEUE_POOLER", "PGQUEUE_LISTEN_URL")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``PGQUEUE_*`` variables (but the pooler pass's
    ``PASS_ENV``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_") or k in PASS_ENV}
    env.update(extra)
    return env


def run_cli(
    url: str, *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m pgqueue --database-url URL ARGS...`` to the end, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=cwd,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """``proc`` exited with ``code`` and said why in one line on stderr (no traceback)."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


class Worker:
    """``pgqueue worker TARGET OPTIONS...`` in a subprocess started in ``cwd`` (where the handler
    module is), the database URL in its environment (not on its command line), its stderr
    (the log) in the file ``log``."""

    def __init__(self, url: str, cwd: Path, target: str, *options: str, log: Path) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgqueue", "worker", target, *options],
                cwd=cwd,
                env=clean_env(PGQUEUE_DATABASE_URL=url),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        """True, or the test fails with the log of a worker that has exited."""
        assert self.proc.poll() is None, self.text()
        return True

    def stop(self) -> int:
        """SIGTERM (a graceful stop), SIGKILL if that takes over 30 s; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=30)


# The modules a process imported, read from what ``-X importtime`` (``PYTHONPROFILEIMPORTTIME=1``
# in its environment, which its children inherit) printed on its stderr, one line per module.
IMPORT_TIMES = {"PYTHONPROFILEIMPORTTIME": "1"}


def imported_modules(stderr: str) -> set[str]:
    """Every module named in ``-X importtime`` lines of ``stderr`` (other lines are skipped)."""
    return {
        line.rpartition("|")[2].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line  # not the header
    }


def among(modules: set[str], roots: set[str]) -> list[str]:
    """The ``roots`` (a package or module name) that ``modules`` holds, or holds a part of."""
    return sorted(r for r in roots if any(m == r or m.startswith(r + ".") for m in modules))
