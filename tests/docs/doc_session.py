"""One page's session: its directory, its Python namespace, its event loop and its
background processes (tests/docs/test_doc_examples.py; the contract is in doc_blocks.py).

- File blocks are written under the page's directory (their folders become packages).
- Python blocks run in one namespace (a module of its own), compiled with top-level ``await``
  allowed; a block that awaits runs on the page's one event loop, so that async objects made
  in one block still work in the next. A traceback's line numbers are the page's.
- Console commands starting ``pgqueue``, ``python`` or ``curl`` run in the page's directory
  with the page's environment (in bash, with ``pipefail``) and must exit 0 (a ``curl``
  answered with an HTTP error status fails, unless it shows the status itself: ``-i``,
  ``-w``, ``-f``, or the page shows the error's body, ``{"error": ...}``, as its output:
  then that answer must be an error); ``pgqueue worker`` and ``pgqueue serve`` start
  in the background (a worker once it logged ``worker.started``, serve once it answers
  /healthz) and get SIGTERM at the page's end (SIGKILL 10 s later). Other commands are shown.
- ``localhost:8000``, ``127.0.0.1:8000`` and ``--port 8000`` anywhere in the page mean the
  page's own free port.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import inspect
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import Block, Command, commands, python_source

REPOSITORY = Path(__file__).resolve().parents[2]
RUN = frozenset({"pgqueue", "python", "python3", "curl"})
# ``python -m pip``/``venv``: installing, as ``pip`` is; shown, not run.
INSTALLING = frozenset({"pip", "venv", "ensurepip"})
BACKGROUND = frozenset({"worker", "serve"})
COMMAND_TIMEOUT = 120.0
START_TIMEOUT = 60.0
STOP_GRACE = 10.0
LOG_TAIL = 40  # lines of a background process's output shown with a failure
AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

_PORT = re.compile(r"\b(localhost|127\.0\.0\.1):8000\b")
_PORT_OPTION = re.compile(r"--port([ =])8000\b")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _tail(exc: BaseException) -> types.TracebackType | None:
    """``exc``'s traceback from the first frame of a page on."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.endswith(".md"):
        tb = tb.tb_next
    return tb or exc.__traceback__


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _words(text: str) -> list[str]:
    """The command's words after any leading ``NAME=value`` assignments."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def _pgqueue_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``pgqueue`` (or ``python -m pgqueue``) command; else None."""
    if words and words[0] == "pgqueue":
        return words[1:]
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1:3] == ["-m", "pgqueue"]:
        return words[3:]
    return None


def strip_comment(text: str) -> str:
    """``text`` without a trailing shell comment (a ``#`` after a blank, outside quotes)."""
    quote = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            i += 2  # an escaped character, whatever it is
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
        i += 1
    return text


# curl options with which the command shows or handles an HTTP error status itself.
_CURL_STATUS_LONG = frozenset(
    {"--fail", "--fail-with-body", "--include", "--head", "--write-out", "--verbose"}
)
_CURL_STATUS_SHORT = frozenset("fiIwv")


_ERROR_ANSWER = re.compile(r'"error"\s*:')


def shows_an_error(command: Command) -> bool:
    """The page shows this command answered with pgqueue's error body (``{"error": ...}``)."""
    return bool(_ERROR_ANSWER.search(command.output))


def curl_fails_on_http_errors(text: str, words: list[str]) -> str:
    """A ``curl`` command with ``--fail-with-body`` added (exit 22 on a 4xx or 5xx answer, the
    body still shown), unless it shows or handles the status itself (``-f``, ``-i``, ``-w``,
    ...): a documented request that is refused is a failing example, not a passing one."""
    if not words or words[0] != "curl":
        return text
    for word in words[1:]:
        if word in _CURL_STATUS_LONG:
            return text
        if word.startswith("-") and not word.startswith("--") and _CURL_STATUS_SHORT & set(word):
            return text
    return re.sub(r"(^|\s)curl(?=\s)", r"\1curl --fail-with-body", text, count=1)


def runs(words: list[str]) -> bool:
    """Whether a command of these words is run (else it is shown only)."""
    if not words or words[0] not in RUN:
        return False
    installing = words[0].startswith("python") and words[1:2] == ["-m"] and len(words) > 2
    return not (installing and words[2] in INSTALLING)


def runnable(block: Block) -> bool:
    """Whether the runner does anything with ``block`` (a page with none needs no database)."""
    if block.skip is not None:
        return False
    if block.kind in ("file", "python"):
        return True
    if block.kind == "console":
        return any(runs(_words(c.text)) for c in commands(block))
    return False


def _background(words: list[str]) -> str | None:
    """``worker`` or ``serve`` for a command that runs until stopped; else None."""
    args = _pgqueue_args(words)
    if args is None or "--help" in args:
        return None
    for word in args:
        if word.startswith("-"):
            continue
        return word if word in BACKGROUND else None
    return None


def _logs_its_start(words: list[str]) -> bool:
    """Whether a worker started with these words logs ``worker.started`` (an INFO line)."""
    for i, word in enumerate(words):
        if word.startswith("--log-level"):
            level = word.partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "")
            return level.lower() in ("debug", "info")
    return True


class Background:
    """A process started by a console command, its output in ``log``."""

    def __init__(self, command: Command, what: str, proc: subprocess.Popen[bytes], log: Path):
        self.command, self.what, self.proc, self.log = command, what, proc, log
        self.stopped = False

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_GRACE)


class PageSession:
    """Runs the blocks of one page (and the pages it comes ``after``) in order."""

    def __init__(self, directory: Path, database_url: str, port: int) -> None:
        self.directory = directory
        self.port = port
        self.module = types.ModuleType("docs_page")
        self.namespace: dict[str, Any] = self.module.__dict__
        self.runner = asyncio.Runner()
        self.background: list[Background] = []
        self.bin = directory.parent / "bin"
        self.bin.mkdir(exist_ok=True)
        # Scripts, not symlinks: a symlink to a virtualenv's python elsewhere runs the base
        # interpreter, without the virtualenv's packages.
        python = shlex.quote(sys.executable)
        for name, line in (
            ("python", f'exec {python} "$@"'),
            ("python3", f'exec {python} "$@"'),
            ("pgqueue", f'exec {python} -m pgqueue "$@"'),
        ):
            script = self.bin / name
            script.write_text(f"#!/bin/sh\n{line}\n")
            script.chmod(0o755)
        self.env = {
            "PGQUEUE_DATABASE_URL": database_url,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            # An embedded server a command starts (``pgqueue embedded url``) is the page's own,
            # stopped at its end: never the one in the user data directory of whoever runs
            # the tests.
            "PGQUEUE_HOME": str(directory.parent / "pgqueue-home"),
        }

    # -- the blocks ---------------------------------------------------------------------

    def substitute(self, text: str) -> str:
        text = _PORT.sub(rf"\1:{self.port}", text)
        return _PORT_OPTION.sub(rf"--port\g<1>{self.port}", text)

    def run(self, block: Block) -> None:
        """Run ``block``; a failure also shows the end of each background process's output
        (a handle's wait that timed out is often a worker that could not run the task)."""
        try:
            self._run(block)
        except pytest.fail.Exception as exc:
            if not self.background:
                raise
            logs = "\n".join(
                f"--- `{b.command.text}` (page line {b.command.line}), "
                f"{'running' if b.proc.poll() is None else f'exited {b.proc.returncode}'}; "
                f"its output ends:\n" + "\n".join(b.text().splitlines()[-LOG_TAIL:])
                for b in self.background
            )
            pytest.fail(f"{exc}\n\n{logs}", pytrace=False)

    def _run(self, block: Block) -> None:
        if block.skip is not None:
            return
        kind = block.kind
        if kind == "file":
            self.write_file(block)
        elif kind == "python":
            self.run_python(block)
        elif kind == "console":
            for command in commands(block):
                self.run_command(block, command)

    def write_file(self, block: Block) -> None:
        relative = block.file_path
        assert relative is not None
        target = self.directory / relative
        folder = target.parent
        while folder != self.directory:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch(exist_ok=True)
            folder = folder.parent
        target.write_text(self.substitute(block.text))
        importlib.invalidate_caches()
        # A module already imported from an earlier version of this file is reloaded on its
        # next import, not served stale.
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == str(target):
                del sys.modules[name]

    def run_python(self, block: Block) -> None:
        source = self.substitute(python_source(block))
        filename = str(REPOSITORY / block.page)
        try:
            code = compile(source, filename, "exec", flags=AWAIT, dont_inherit=True)
            if code.co_flags & inspect.CO_COROUTINE:
                self.runner.run(eval(code, self.namespace))
            else:
                exec(code, self.namespace)
        except (KeyboardInterrupt, pytest.fail.Exception):
            raise
        except BaseException as exc:
            # The block's own frames, not this runner's.
            shown = "".join(traceback.format_exception(exc.with_traceback(_tail(exc))))
        else:
            return
        pytest.fail(
            f"{block.page}: the python block at line {block.line} raised:\n{shown}",
            pytrace=False,
        )

    def run_command(self, block: Block, command: Command) -> None:
        text = strip_comment(self.substitute(command.text))
        words = _words(text)
        error_shown = shows_an_error(command)
        if not error_shown:
            text = curl_fails_on_http_errors(text, words)
        if not runs(words):
            return  # shown, not run (pip, psql, docker, export, ...)
        what = _background(words)
        if what is None and text.rstrip().endswith("&") and not text.rstrip().endswith("&&"):
            what = "background"
        if what is not None:
            self.start(block, Command(command.line, text.rstrip().rstrip("&")), what)
            return
        try:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", text],
                cwd=self.directory,
                env=self.process_env(),
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"{block.page}:{command.line}: `{text}` took over {COMMAND_TIMEOUT:.0f} s\n"
                f"stdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}",
                pytrace=False,
            )
        if error_shown and words[0] == "curl" and not _ERROR_ANSWER.search(done.stdout):
            pytest.fail(
                f"{block.page}:{command.line}: the page shows `{text}` answered with an error, "
                f"but it was not\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}",
                pytrace=False,
            )
        if done.returncode != 0:
            pytest.fail(
                f"{block.page}:{command.line}: `{text}` exited {done.returncode}\n"
                f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}",
                pytrace=False,
            )

    def process_env(self) -> dict[str, str]:
        from processes import clean_env

        return clean_env(**self.env)

    # -- background processes -----------------------------------------------------------

    def start(self, block: Block, command: Command, what: str) -> None:
        text = command.text
        if what == "serve" and "--port" not in text:
            text += f" --port {self.port}"
        log = self.directory.parent / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-o", "pipefail", "-c", text],
                cwd=self.directory,
                env=self.process_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = Background(Command(command.line, text), what, proc, log)
        self.background.append(started)
        if what == "worker" and _logs_its_start(_words(text)):
            self._wait(block, started, lambda: "worker.started" in started.text())
        elif what == "worker":  # its start line is below its log level: alive for 3 s
            since = time.monotonic()
            self._wait(block, started, lambda: time.monotonic() - since > 3)
        elif what == "serve":
            self._wait(block, started, self._answers)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered (with a refusal: a token, say)
        except OSError:
            return False

    def _wait(self, block: Block, started: Background, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if started.proc.poll() is not None:
                pytest.fail(
                    f"{block.page}:{started.command.line}: `{started.command.text}` exited "
                    f"{started.proc.returncode} before it was ready; its output:\n"
                    f"{started.text()}",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{block.page}:{started.command.line}: `{started.command.text}` was not "
                    f"ready after {START_TIMEOUT:.0f} s; its output:\n{started.text()}",
                    pytrace=False,
                )
            time.sleep(0.1)

    def died(self) -> list[str]:
        """The background processes that exited on their own with an error, and their logs."""
        return [
            f"{b.command.text!r} (page line {b.command.line}) exited {b.proc.returncode}:\n"
            f"{b.text()}"
            for b in self.background
            if not b.stopped and b.proc.poll() not in (None, 0)
        ]

    def close(self) -> None:
        """Stop every background process and the page's embedded server, if a command started
        one; then close the event loop."""
        try:
            for started in self.background:
                started.stop()
            if Path(self.env["PGQUEUE_HOME"]).exists():
                subprocess.run(
                    [sys.executable, "-m", "pgqueue", "embedded", "stop"],
                    env=self.process_env(),
                    capture_output=True,
                    timeout=COMMAND_TIMEOUT,
                    check=False,
                )
        finally:
            self.runner.close()


def threads_left(before: set[threading.Thread], wait: float = 10.0) -> list[str]:
    """The names of the non-daemon threads started since ``before`` still alive after
    ``wait`` seconds (a daemon thread does not hold up the interpreter's exit)."""
    deadline = time.monotonic() + wait
    while True:
        left = [
            t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon
        ]
        if not left or time.monotonic() > deadline:
            return [t.name for t in left]
        time.sleep(0.1)
