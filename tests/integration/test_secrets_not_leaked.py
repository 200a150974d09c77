"""Passwords and API tokens never reach logs, error messages or the process list.

Every check runs the real thing in a subprocess and reads everything it wrote: each CLI
command against an unreachable server and with malformed URLs, worker logs (text and JSON)
through a database outage and its reconnection, ``pgqueue serve`` (startup lines, access log,
error responses) with wrong and right tokens, and the command lines of a supervisor's worker
processes. The shared test server trusts 127.0.0.1, so a made-up password still connects;
where the server wants a real one (testcontainers), the real one is the secret.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from processes import BOOM_HANDLER, NOOP_HANDLERS, Worker, clean_env, run_cli, wait_until

import pgqueue
from bench.private_postgres import free_port

TOKEN = f"tok-Right-{uuid.uuid4().hex}"
WRONG_TOKEN = f"tok-Wrong-{uuid.uuid4().hex}"
MADE_UP_PASSWORD = f"pw-S3cret-{uuid.uuid4().hex[:12]}"
TASK_ID = "01a22f0d-98c9-7000-8728-d80607a4f6ca"

HANDLERS = NOOP_HANDLERS + BOOM_HANDLER
# psycopg_pool's warning for each connection it failed to open (a worker's pool reconnecting).
RECONNECT_FAILED = "error connecting in"


# --- helpers -------------------------------------------------------------------------------------


def leaked(text: str, *secrets: str) -> list[str]:
    """The secrets (or their URL-encoded spellings) that appear in ``text``."""
    return [s for s in secrets if s in text or quote(s, safe="") in text]


@pytest.fixture(scope="module")
def handlers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret-handlers")
    (path / "leak_handlers.py").write_text(HANDLERS)
    return path


def target(server_url: str) -> tuple[str, int, str, str]:
    """Host (or socket directory), port, user and password of the test server."""
    parts = psycopg.conninfo.conninfo_to_dict(server_url)
    return (
        str(parts.get("host") or "127.0.0.1"),
        int(parts.get("port") or 5432),
        str(parts.get("user") or "postgres"),
        str(parts.get("password") or ""),
    )


def dbname(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


@pytest.fixture(scope="module")
def secret(server_url: str) -> str:
    """The password in every URL here: the server's real one if it has one."""
    return target(server_url)[3] or MADE_UP_PASSWORD


@pytest.fixture(scope="module")
def unreachable_url(secret: str) -> str:
    return f"postgresql://postgres:{secret}@127.0.0.1:{free_port()}/x"


# --- a TCP proxy that can be cut ----------------------------------------------------------------


class Proxy:
    """127.0.0.1:port -> the test server. ``cut()`` drops every connection and refuses new ones
    (a database outage as clients see it); ``restore()`` accepts again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def _upstream(self) -> socket.socket:
        host, port = self.target
        if host.startswith("/"):  # a Unix socket directory (the embedded server)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(f"{host}/.s.PGSQL.{port}")
            return sock
        return socket.create_connection((host, port), timeout=5)

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = self._upstream()
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.cut()


@pytest.fixture
def proxy(server_url: str) -> Iterator[Proxy]:
    host, port, _, _ = target(server_url)
    p = Proxy(host, port)
    try:
        yield p
    finally:
        p.close()


def proxied_url(proxy: Proxy, server_url: str, database_url: str, secret: str) -> str:
    user = target(server_url)[2]
    return f"postgresql://{user}:{secret}@127.0.0.1:{proxy.port}/{dbname(database_url)}"


# --- the command line ----------------------------------------------------------------------------

# Every command that talks to the database, as run against an unreachable server.
COMMANDS: dict[str, list[str]] = {
    "enqueue": ["enqueue", "t", "--payload", "{}"],
    "status": ["status", TASK_ID],
    "list --json": ["--json", "list"],
    "list --debug": ["--debug", "list"],
    "cancel": ["cancel", TASK_ID],
    "stats": ["stats"],
    "dlq list": ["dlq", "list"],
    "dlq show": ["dlq", "show", TASK_ID],
    "dlq replay": ["dlq", "replay", "--all"],
    "dlq discard": ["dlq", "discard", "--all", "--yes"],
    "migrate": ["migrate"],
    "migrate --check": ["migrate", "--check"],
    "migrate --debug": ["--debug", "migrate"],
    "grant": ["grant", "pgqueue_app"],
    "bench": ["bench", "--tasks", "10", "--single", "2", "--latency-samples", "2"],
    "demo": ["demo"],
}

# Malformed URLs, each with the password in it (run with `list`).
BAD_URLS: dict[str, str] = {
    "bad percent-escape in the password": "postgresql://postgres:{secret}%zz@127.0.0.1:1/x",
    "password in the query string": "postgresql://postgres@127.0.0.1:1/x?password={secret}",
    "key passphrase in the query string": (
        "postgresql://postgres:pw@127.0.0.1:1/x?sslmode=require&sslpassword={secret}"
    ),
    "port out of range": "postgresql://postgres:{secret}@127.0.0.1:99999/x",
    "not postgresql": "mysql://root:{secret}@127.0.0.1:3306/x",
    "unknown parameter": "postgresql://postgres:{secret}@127.0.0.1:1/x?bogus=1",
    "bad sslmode": "postgresql://postgres:{secret}@127.0.0.1:1/x?sslmode=bogus",
    "no scheme": "postgres:{secret}@127.0.0.1:1/x",
}


# Runs the real entry point, ``pgqueue.cli.main()``, once per case inside one process (a Python
# start-up per command would cost a second each), with that case's stdout and stderr captured
# apart. What main() lets escape (with --debug) is printed as the interpreter would.
DRIVER = """
import contextlib, io, json, sys, traceback
from pgqueue import cli

cases_file, results_file = sys.argv[1:3]
cases = json.load(open(cases_file))
results = {}
for name, argv in cases.items():
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["pgqueue", *argv]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
json.dump(results, open(results_file, "w"))
"""

# Cases that get a process of their own: the environment variable, `serve`, and `demo` (which
# configures logging for the whole process).
OWN_PROCESS = ("env: list", "cli: demo", "url: serve with a bad percent-escape")


@pytest.fixture(scope="module")
def cli_runs(
    unreachable_url: str, secret: str, handlers_dir: Path
) -> dict[str, subprocess.CompletedProcess[str]]:
    """name -> the finished run (exit code, stdout, stderr) of every case."""
    runs: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, args in COMMANDS.items():
        runs[f"cli: {name}"] = (["--database-url", unreachable_url, *args], clean_env())
    runs["env: list"] = (["list"], clean_env(PGQUEUE_DATABASE_URL=unreachable_url))
    for name, template in BAD_URLS.items():
        url = template.format(secret=secret)
        runs[f"url: {name}"] = (["--database-url", url, "list"], clean_env())
    bad_percent = BAD_URLS["bad percent-escape in the password"].format(secret=secret)
    runs["url: serve with a bad percent-escape"] = (
        ["--database-url", bad_percent, "serve", "--port", str(free_port())],
        clean_env(),
    )
    shared = {name: args for name, (args, _) in runs.items() if name not in OWN_PROCESS}
    (handlers_dir / "cases.json").write_text(json.dumps(shared))

    def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=handlers_dir,
            stdin=subprocess.DEVNULL,
        )

    with ThreadPoolExecutor(max_workers=len(OWN_PROCESS) + 1) as pool:
        driver = pool.submit(run, ["-c", DRIVER, "cases.json", "results.json"], clean_env())
        own = {
            name: pool.submit(run, ["-m", "pgqueue", *runs[name][0]], runs[name][1])
            for name in OWN_PROCESS
        }
        done = driver.result()
        results = {name: future.result() for name, future in own.items()}
    assert done.returncode == 0, done.stderr
    assert not leaked(done.stdout + done.stderr, secret), done.stdout + done.stderr
    for name, result in json.loads((handlers_dir / "results.json").read_text()).items():
        results[name] = subprocess.CompletedProcess(
            [name], result["code"], result["stdout"], result["stderr"]
        )
    return results


def cli_case_names() -> list[str]:
    names = [f"cli: {n}" for n in COMMANDS] + ["env: list"]
    names += [f"url: {n}" for n in BAD_URLS]
    return [*names, "url: serve with a bad percent-escape"]


@pytest.mark.parametrize("case", cli_case_names())
def test_no_command_error_shows_the_password(cli_runs, secret, case):
    proc = cli_runs[case]
    output = proc.stdout + proc.stderr

    assert proc.returncode in (1, 2), (proc.returncode, output)
    assert not leaked(output, secret), output
    if "--debug" not in case:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        # One line: plain, or under --json one JSON document.
        json_error = "--json" in case and json.loads(lines[0]).get("exit_code") == proc.returncode
        assert json_error or lines[0].startswith("error: "), proc.stderr
        assert "Traceback" not in output


def test_the_migrate_success_line_hides_the_password(database_url, server_url, secret, proxy):
    url = proxied_url(proxy, server_url, database_url, secret)

    proc = run_cli(url, "migrate")

    assert proc.returncode == 0, proc.stderr
    assert "pgqueue schema at" in proc.stdout
    assert not leaked(proc.stdout + proc.stderr, secret)
    assert ":***@" in proc.stdout


def test_library_errors_hide_the_password(unreachable_url, secret):
    with pytest.raises(pgqueue.DatabaseUnavailable) as caught:
        pgqueue.Client(unreachable_url).list_tasks()

    assert not leaked(str(caught.value) + repr(caught.value), secret)
    bad = f"postgresql://postgres:{secret}%zz@127.0.0.1:1/x"
    with pytest.raises(pgqueue.InvalidDatabaseURL) as invalid:
        pgqueue.Client(bad)
    assert not leaked(str(invalid.value), secret), str(invalid.value)


# --- worker logs ---------------------------------------------------------------------------------


def leak_worker(url: str, cwd: Path, log_format: str, *options: str) -> Worker:
    """``pgqueue worker`` with the handlers above, logging everything in ``log_format``."""
    return Worker(
        url,
        cwd,
        "leak_handlers:tasks",
        *("--log-format", log_format, "--log-level", "DEBUG"),
        *("--poll-interval", "0.2", "--sweep-interval", "0.2", *options),
        log=cwd / f"worker-{log_format}-{uuid.uuid4().hex[:6]}.log",
    )


@pytest.mark.slow
def test_a_worker_waiting_for_an_unreachable_database_logs_no_password(
    unreachable_url, secret, handlers_dir
):
    # A worker started while its database is down waits for it, saying so: by URL option and
    # by environment, in both log formats, and with --debug.
    workers = {
        "text, --database-url": (["--database-url", unreachable_url], "text", clean_env()),
        "json, environment": ([], "json", clean_env(PGQUEUE_DATABASE_URL=unreachable_url)),
        "text, --debug": (["--debug", "--database-url", unreachable_url], "text", clean_env()),
    }
    procs = {}
    for name, (options, fmt, env) in workers.items():
        log = handlers_dir / f"unreachable-{fmt}-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "pgqueue", *options, "worker", "leak_handlers:tasks"),
                    *("--log-format", fmt, "--log-level", "DEBUG"),
                ],
                cwd=handlers_dir,
                env=env,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        procs[name] = (proc, log)
    try:
        for name, (proc, log) in procs.items():
            wait_until(
                lambda proc=proc, log=log: (
                    proc.poll() is not None or log.read_text().count("database_unreachable") >= 2
                ),
                60,
                f"the worker ({name}) to report the unreachable database twice",
            )
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
    for name, (_, log) in procs.items():
        text = log.read_text(errors="replace")
        assert "database_unreachable" in text, (name, text)
        assert not leaked(text, secret), (name, text)


@pytest.mark.slow
def test_worker_logs_in_text_and_json_hide_the_password_through_an_outage(
    database_url, server_url, secret, proxy, conn, handlers_dir
):
    url = proxied_url(proxy, server_url, database_url, secret)
    workers = {fmt: leak_worker(url, handlers_dir, fmt, "--queue", fmt) for fmt in ("text", "json")}

    def settled(queue: str, count: int) -> Callable[[], bool]:
        def check() -> bool:
            for worker in workers.values():
                worker.alive()
            (done,) = conn.execute(
                "SELECT count(*) FROM pgqueue.tasks WHERE queue = %s"
                " AND status IN ('completed', 'failed')",
                (queue,),
            ).fetchone()
            return bool(done == count)

        return check

    try:
        for fmt in workers:
            pgqueue.enqueue(conn, "noop", {}, queue=fmt)
            pgqueue.enqueue(conn, "boom", {}, queue=fmt)  # a dead letter: an error in the log
        for fmt in workers:
            wait_until(settled(fmt, 2), 30, f"the {fmt} worker's first tasks")
        before = {fmt: len(w.text()) for fmt, w in workers.items()}
        proxy.cut()  # the database goes away: every connection dropped, new ones refused
        for fmt, worker in workers.items():
            pgqueue.enqueue(conn, "noop", {}, queue=fmt)  # directly, not through the proxy
            wait_until(
                lambda w=worker: "listen_lost" in w.text() and "database_error" in w.text(),
                30,
                f"the {fmt} worker to report the outage",
            )
        for fmt, worker in workers.items():
            # What each failed reconnection logs (psycopg_pool's warning) is read too.
            wait_until(
                lambda w=worker, n=before[fmt]: w.text()[n:].count(RECONNECT_FAILED) >= 2,
                30,
                f"the {fmt} worker's pool to fail to reconnect twice",
            )
        proxy.restore()
        for fmt in workers:
            wait_until(settled(fmt, 3), 30, f"the {fmt} worker to recover")
    finally:
        codes = {fmt: w.stop() for fmt, w in workers.items()}
    logs = {fmt: w.text() for fmt, w in workers.items()}

    assert codes == {"text": 0, "json": 0}, logs
    for text in logs.values():
        assert not leaked(text, secret), text
        assert "task.dead" in text and "worker.database_error" in text, text
    for line in logs["json"].splitlines():
        json.loads(line)  # still one JSON object per line, psycopg's own warnings included


@pytest.mark.slow
def test_worker_processes_of_a_supervisor_do_not_get_the_password_on_their_command_line(
    database_url, server_url, secret, proxy, handlers_dir
):
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("no /proc to read other processes' command lines from")
    url = proxied_url(proxy, server_url, database_url, secret)
    # The password is only in the environment, which other users cannot read; the command
    # line of every process is public (ps, /proc/PID/cmdline).
    worker = leak_worker(url, handlers_dir, "json", "--processes", "2")
    try:

        def children() -> list[int]:
            worker.alive()
            return [
                int(e["pid"])
                for e in map(json.loads, worker.text().splitlines())
                if e["event"] == "worker.process_started"
            ]

        wait_until(lambda: len(children()) == 2, 30, "two worker processes")
        command_lines = {
            pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for pid in [worker.proc.pid, *children()]
        }
    finally:
        worker.stop()

    for pid, command_line in command_lines.items():
        assert not leaked(command_line, secret), (pid, command_line)


# --- the HTTP API --------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(url: str, tmp_path: Path, *args: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """``pgqueue serve`` with tokens, in a subprocess; yields its base URL and its output."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "pgqueue", "--database-url", url, "serve"),
                *("--port", str(port), *args),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(PGQUEUE_API_TOKENS=TOKEN),
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 60, "pgqueue serve to answer /healthz")
        yield base, lambda: log.read_text(errors="replace")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def access_lines(log: str) -> int:
    """uvicorn's access-log lines in ``log``, but for the health checks made while starting."""
    return sum(1 for line in log.splitlines() if ' HTTP/1.1" ' in line and "/healthz" not in line)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def requests_with_tokens(base: str) -> list[httpx.Response]:
    """Wrong tokens in every header shape, then the right one, on every kind of endpoint; all
    at once (against an unreachable database each waits out the pool's timeout)."""
    calls: list[tuple[str, str, dict[str, str], Any]] = []
    for headers in (
        {},
        bearer(WRONG_TOKEN),
        {"Authorization": f"Basic {WRONG_TOKEN}"},
        {"Authorization": WRONG_TOKEN},
        {"X-API-Token": WRONG_TOKEN},
        bearer(TOKEN),
    ):
        calls += [
            ("POST", "/api/v1/tasks", headers, {"json": {"type": "t"}}),
            ("GET", "/api/v1/tasks", headers, {}),
            ("GET", f"/api/v1/tasks/{TASK_ID}", headers, {}),
            ("GET", "/api/v1/stats", headers, {}),
            ("GET", "/metrics", headers, {}),
            ("GET", "/readyz", headers, {}),
            ("POST", "/api/v1/tasks", headers, {"content": b"{not json"}),
        ]
    with (
        httpx.Client(base_url=base, timeout=30) as client,
        ThreadPoolExecutor(max_workers=len(calls)) as pool,
    ):
        return list(pool.map(lambda c: client.request(c[0], c[1], headers=c[2], **c[3]), calls))


@pytest.mark.slow
@pytest.mark.parametrize("database", ["unreachable", "reachable"])
def test_serve_hides_tokens_and_the_password_in_responses_and_its_log(
    database, unreachable_url, database_url, server_url, secret, proxy, tmp_path
):
    url = (
        unreachable_url
        if database == "unreachable"
        else proxied_url(proxy, server_url, database_url, secret)
    )

    with serving(url, tmp_path, "--log-level", "debug") as (base, output):
        responses = requests_with_tokens(base)

        def logged() -> str:
            text = output()
            return text if access_lines(text) >= len(responses) else ""

        log = wait_until(logged, 30, f"the access log of all {len(responses)} requests")

    codes = {r.status_code for r in responses}
    assert 401 in codes and (503 in codes if database == "unreachable" else 202 in codes), codes
    for response in responses:
        body = response.text + str(response.headers)
        assert not leaked(body, secret, TOKEN, WRONG_TOKEN), (response.request.url, body)
    assert "Uvicorn running on" in log or "Application startup complete" in log, log
    assert not leaked(log, secret, TOKEN, WRONG_TOKEN), log
