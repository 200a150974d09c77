"""What one connection may hold of a real ``pgqueue serve`` process, and what its log keeps.

Each test starts ``pgqueue serve`` in a subprocess and talks to it over raw sockets: a
connection that sends nothing, one that dribbles a header (slowloris), five that each try to
send a 40 MiB header (the server's RSS, read from /proc, must stay bounded), connections
beyond --limit-concurrency, and requests carrying a token in their query string, which the
process's output must never show. Every wait polls against a deadline.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from processes import clean_env, wait_until

from bench.private_postgres import free_port

pytestmark = [pytest.mark.timeout(120)]

SECRETS = ("SECRETVALUE1", "SECRETVALUE2", "SECRETVALUE3", "SECRETVALUE4", "SECRETVALUE5")


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc/PID/status")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def healthz(self) -> int:
        return httpx.get(f"{self.base}/healthz", timeout=10).status_code


@pytest.fixture
def serve(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Starts ``pgqueue serve ARGS...`` (its output, stdout and stderr, in a file) and waits
    for /healthz; stops every one started at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, **env: str) -> Served:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgqueue", "serve", "--port", str(port), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_env(PGQUEUE_DATABASE_URL=database_url, **env),
            )
        started.append(proc)
        served = Served(proc, port, log)

        def healthy() -> bool:
            assert proc.poll() is None, served.output()
            try:
                return served.healthz() == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, "pgqueue serve to answer /healthz")
        return served

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def closed_by_server(sock: socket.socket) -> bytes | None:
    """What the server sent before closing, once it has closed; None while it is open."""
    sock.setblocking(False)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except BlockingIOError:
        return None
    except ConnectionResetError:
        pass
    return received


def wait_closed(sock: socket.socket, timeout: float) -> bytes:
    """What the server sent before closing ``sock``; fails if it has not closed it in time."""
    replies: list[bytes] = []

    def closed() -> bool:
        reply = closed_by_server(sock)
        if reply is not None:
            replies.append(reply)
        return reply is not None

    wait_until(closed, timeout, "the server to close the connection")
    return replies[0]


def test_idle_and_slow_connections_are_closed_by_the_default_timeouts(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    started = time.monotonic()
    idle = served.connect()  # sends nothing
    slow = served.connect()  # a slowloris: part of a head, then a byte now and then
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    closed: dict[str, float] = {}
    replies: dict[str, bytes] = {}

    def both_closed() -> bool:
        for name, sock in (("idle", idle), ("slow", slow)):
            if name in closed:
                continue
            if name == "slow":
                with contextlib.suppress(OSError):
                    sock.send(b"a")
            reply = closed_by_server(sock)
            if reply is not None:
                closed[name], replies[name] = time.monotonic() - started, reply
        return len(closed) == 2

    wait_until(both_closed, 30, "the server to close the idle and the slow connection", 0.5)
    # 5 s of keep-alive for the idle one, 10 s for a head; a second of slack for the polls.
    assert closed["idle"] < 5 + 2, closed
    assert 10 - 1 < closed["slow"] < 10 + 2, closed
    assert replies["idle"] == b"", replies
    assert replies["slow"].startswith(b"HTTP/1.1 408 "), replies
    assert served.healthz() == 200


def test_an_endless_header_is_cut_off_at_the_limit_with_bounded_memory(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    before = served.rss_kib()
    header = b"a" * (40 * 1024 * 1024)
    sent: list[int] = []

    def endless() -> None:
        with served.connect() as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            view, total = memoryview(header), 0
            try:
                while total < len(header):
                    total += sock.send(view[total : total + 1024 * 1024])
            except OSError:  # cut off: reset or broken pipe
                pass
            sent.append(total)

    threads = [threading.Thread(target=endless) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    grown_mib = (served.rss_kib() - before) / 1024
    # The server read a limit's worth (64 KiB) of each, and the kernel's buffers some more.
    assert all(n < 8 * 1024 * 1024 for n in sent), sent
    assert grown_mib < 16, f"the server's RSS grew by {grown_mib:.1f} MiB"
    assert served.healthz() == 200


def test_a_head_over_the_limit_is_answered_431(serve: Callable[..., Served]) -> None:
    served = serve("--max-header-bytes", "4096")
    with served.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 5000 + b"\r\n\r\n")
        reply = wait_closed(sock, 10)
    assert reply.startswith(b"HTTP/1.1 431 "), reply
    with served.connect() as sock:  # just under the limit: served
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 3500 + b"\r\n\r\n")
        reply = wait_until(lambda: sock.recv(65536), 10, "the answer")
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert "request head over 4096 bytes: refused (431" in served.output()


def test_connections_beyond_the_limit_get_503_until_some_close(
    serve: Callable[..., Served],
) -> None:
    served = serve(
        "--limit-concurrency", "4", "--keep-alive-timeout", "60", PGQUEUE_API_MAX_WAITERS="2"
    )
    held = [served.connect() for _ in range(4)]
    try:
        assert served.healthz() == 503
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: served.healthz() == 200, 10, "the server to answer again")


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_concurrency_limit_at_or_below_the_waiters_is_refused(
    database_url: str, how: str
) -> None:
    option = ["--limit-concurrency", "10000"] if how == "option" else []
    env = {"PGQUEUE_API_LIMIT_CONCURRENCY": "10000"} if how == "environment" else {}
    proc = subprocess.run(
        [sys.executable, "-m", "pgqueue", "serve", *option],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PGQUEUE_DATABASE_URL=database_url, **env),
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "PGQUEUE_API_MAX_WAITERS (10000)" in proc.stderr, proc.stderr
    assert "--limit-concurrency" in proc.stderr, proc.stderr


def test_the_access_log_masks_credentials_in_the_query_string(
    serve: Callable[..., Served],
) -> None:
    served = serve("--log-level", "debug")
    with httpx.Client(base_url=served.base, timeout=10) as client:
        client.get(f"/api/v1/tasks?token={SECRETS[0]}&limit=5")
        client.get(f"/api/v1/tasks?wait=1&access_token={SECRETS[1]}")
        client.get(f"/healthz?API_Key={SECRETS[2]}&%74oken={SECRETS[2]}")
    with served.connect() as sock:  # an invalid request (a header line without a colon)
        sock.sendall(
            f"GET /api/v1/tasks?token={SECRETS[3]} HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n".encode()
        )
        wait_closed(sock, 10)

    def logged() -> str:
        text = served.output()
        return text if text.count('HTTP/1.1" ') >= 4 and "Invalid HTTP" in text else ""

    log = wait_until(logged, 10, "the access lines and the invalid request's")
    assert "/api/v1/tasks?token=***&limit=5" in log, log
    assert "/api/v1/tasks?wait=1&access_token=***" in log, log
    assert "/healthz?API_Key=***&%74oken=***" in log, log
    for secret in SECRETS[:4]:
        assert secret not in log, log


def test_the_refusals_of_a_head_do_not_echo_it(serve: Callable[..., Served]) -> None:
    served = serve("--max-header-bytes", "4096", "--header-timeout", "1")
    for head in (
        f"GET /healthz?token={SECRETS[4]} HTTP/1.1\r\nX: {'c' * 5000}\r\n\r\n".encode(),
        f"GET /healthz?password={SECRETS[4]} HTTP/1.1\r\nHost: x\r\n".encode(),
    ):
        with served.connect() as sock:
            sock.sendall(head)
            wait_closed(sock, 10)

    def logged() -> str:
        text = served.output()
        return text if "(408" in text and "(431" in text else ""

    log = wait_until(logged, 10, "the 431 and the 408 in the log")
    assert SECRETS[4] not in log, log


def test_every_limit_has_an_environment_variable(serve: Callable[..., Served]) -> None:
    served = serve(
        PGQUEUE_API_MAX_HEADER_BYTES="4096",
        PGQUEUE_API_HEADER_TIMEOUT="1.5",
        PGQUEUE_API_KEEP_ALIVE_TIMEOUT="1",
    )
    started = time.monotonic()
    idle, slow, big = served.connect(), served.connect(), served.connect()
    slow.sendall(b"GET /healthz HTTP/1.1\r\n")
    big.sendall(b"GET /healthz HTTP/1.1\r\nX: " + b"d" * 5000 + b"\r\n\r\n")
    replies = [wait_closed(sock, 10) for sock in (idle, slow, big)]
    assert time.monotonic() - started < 4, replies
    assert replies[0] == b"", replies
    assert replies[1].startswith(b"HTTP/1.1 408 "), replies
    assert replies[2].startswith(b"HTTP/1.1 431 "), replies
    for sock in (idle, slow, big):
        sock.close()


def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_closed(
    serve: Callable[..., Served],
) -> None:
    served = serve(PGQUEUE_API_BODY_TIMEOUT="1")
    slow = served.connect()  # the head at once, then a body that stops short of its length
    started = time.monotonic()
    slow.sendall(
        b"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"type": '
    )

    reply = wait_closed(slow, 20)

    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert b"body_timeout" in reply and b"PGQUEUE_API_BODY_TIMEOUT" in reply, reply
    assert time.monotonic() - started >= 1
    assert served.healthz() == 200
