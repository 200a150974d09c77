"""A private PgBouncer in transaction mode in front of the test server, for the tests that prove
pgqueue works behind one (and the pooler pass of CI).

It runs Debian's ``pgbouncer`` (``apt-get install pgbouncer``; ``PGQUEUE_TEST_PGBOUNCER`` names
another binary) from a temporary directory, on 127.0.0.1 and a free port, with one pool per
database (a ``*`` entry: every test database is reachable under its own name), and always
stops it. Server connections log in as the server URL's user; PgBouncer refuses to run as
root, so as root it runs as ``postgres`` (or ``nobody``).

``pooled_url(pooler, database_url)`` is ``database_url`` through the pooler.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg


def pgbouncer_binary() -> str | None:
    """The pgbouncer to run, or None when this machine has none."""
    named = os.environ.get("PGQUEUE_TEST_PGBOUNCER")
    if named:
        return named
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )


# Where a URL's query string can put the server's own address.
_ADDRESS_KEYS = frozenset({"host", "hostaddr", "port"})


@dataclass(frozen=True)
class PgBouncer:
    host: str
    port: int
    server_url: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def exit_code(self) -> int | None:
        """None while it runs; else how it ended (a negative number: the signal)."""
        return None if self.process is None else self.process.poll()

    def pooled_url(self, database_url: str) -> str:
        """``database_url`` (a database of the server behind) through this pooler."""
        parts = urlsplit(database_url)
        user = parts.username or "postgres"
        # The server's own address may be in the query string (a Unix socket: the embedded
        # server's ?host=/path): it would win over the pooler's, so it goes.
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in _ADDRESS_KEYS]
        return urlunsplit(
            parts._replace(netloc=f"{user}@{self.host}:{self.port}", query=urlencode(query))
        )

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as(socket_dir: str | None) -> str | None:
    """Who pgbouncer runs as when we are root: the owner of the server's socket directory
    (the embedded server's is its data directory, which only its owner may enter), else
    ``postgres`` or ``nobody``."""
    if os.geteuid() != 0:
        return None
    if socket_dir is not None:
        return pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("pgbouncer refuses to run as root and no unprivileged user exists")


@contextlib.contextmanager
def pgbouncer(
    server_url: str,
    *,
    pool_size: int = 20,
    settings: dict[str, str] | None = None,
    server_user: str | None = None,
) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of ``server_url``'s server, until the block ends.

    Clients log in to it as ``server_url``'s user; its server connections log in as
    ``server_user`` (by default that same user). A role of its own for them makes what came
    through the pooler tell itself apart on the server (``pg_stat_activity.usename``, the
    log's ``%u``); the server must trust it, as it trusts the client's user."""
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    address = psycopg.conninfo.conninfo_to_dict(server_url)
    user = str(address.get("user") or "postgres")
    host = str(address.get("host") or "127.0.0.1")
    upstream = f"host={host} port={address.get('port') or 5432}"
    socket_dir = host if host.startswith("/") else None
    port = _free_port()
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-pgbouncer-"))
    config = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(directory / "userlist.txt"),
        "pool_mode": "transaction",
        "max_client_conn": "1000",
        "default_pool_size": str(pool_size),
        # Test databases come and go by the hundred: idle server connections to a dropped one
        # must not pile up against the server's max_connections.
        "server_idle_timeout": "5",
        "autodb_idle_timeout": "10",
        "logfile": str(directory / "pgbouncer.log"),
        "pidfile": str(directory / "pgbouncer.pid"),
        "admin_users": user,
        **(settings or {}),
    }
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    ini = ["[databases]", f"* = {upstream} user={server_user or user}", "", "[pgbouncer]"]
    ini += [f"{key} = {value}" for key, value in config.items()]
    (directory / "pgbouncer.ini").write_text("\n".join(ini) + "\n")
    command = [binary, str(directory / "pgbouncer.ini")]
    owner = _run_as(socket_dir)
    if owner is not None:
        entry = pwd.getpwnam(owner)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        for path in directory.iterdir():
            os.chown(path, entry.pw_uid, entry.pw_gid)
        command[1:1] = ["-u", owner]
    # Its output to a file, not a pipe: it writes a line per login and per server connection
    # to stderr as well as to its log, and a pipe nobody reads fills up (64 kB) and blocks it,
    # which hung every connection through it a few tests into a session.
    with (directory / "output.log").open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    bouncer = PgBouncer("127.0.0.1", port, server_url, directory, process)
    try:
        _wait_ready(bouncer, process)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_ready(bouncer: PgBouncer, process: subprocess.Popen[bytes]) -> None:
    """Until a query through the pooler answers (to the server's own database)."""
    url = bouncer.pooled_url(bouncer.server_url)
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            output = (bouncer.directory / "output.log").read_text(errors="replace")
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {output}")
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not answer: {bouncer.log()}") from None
            time.sleep(0.05)
