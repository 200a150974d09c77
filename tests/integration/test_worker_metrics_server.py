"""The metrics port of a real ``pgqueue worker`` process: where it listens by default, and what
connections that never finish their request cost it.

Each test starts ``pgqueue worker --metrics-port PORT`` and talks to the port over raw sockets;
the worker's threads are counted in /proc/PID/task. Every wait polls against a deadline.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import NOOP_HANDLERS, Worker, wait_until

from bench.private_postgres import free_port

pytestmark = [pytest.mark.timeout(120)]


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str] | None:
    """(status, body), or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


@pytest.fixture
def worker(database_url: str, tmp_path: Path) -> Iterator[tuple[Worker, int]]:
    """``pgqueue worker noop_handlers:tasks --metrics-port PORT`` (the default host), once its
    /healthz answers."""
    (tmp_path / "noop_handlers.py").write_text(NOOP_HANDLERS)
    port = free_port()
    started = Worker(
        database_url,
        tmp_path,
        "noop_handlers:tasks",
        "--metrics-port",
        str(port),
        log=tmp_path / "worker.log",
    )
    try:
        wait_until(
            lambda: started.alive() and get(port, "/healthz") == (200, "ok\n"),
            60,
            "the worker's /healthz",
        )
        yield started, port
    finally:
        started.stop()


def test_the_metrics_port_listens_on_loopback_by_default(worker: tuple[Worker, int]) -> None:
    process, port = worker
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
    assert f"worker.metrics_serving host=127.0.0.1 port={port}" in process.text()


def test_half_sent_requests_hold_no_thread_and_are_closed_within_the_timeout(
    worker: tuple[Worker, int],
) -> None:
    process, port = worker
    pid = process.proc.pid
    assert get(port, "/metrics") is not None  # the render threads exist before the baseline
    baseline = threads(pid)
    started = time.monotonic()
    half_sent = []
    for _ in range(60):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        half_sent.append(sock)
    try:
        assert threads(pid) <= baseline + 2, (baseline, threads(pid))
        during = get(port, "/metrics")  # a scraper is not locked out meanwhile
        assert during is not None and during[0] == 200, during
        assert "pgqueue_worker_tasks_started_total" in during[1] or "# HELP" in during[1]
        assert get(port, "/healthz") == (200, "ok\n")

        def all_closed() -> bool:
            for sock in half_sent:
                sock.setblocking(False)
                try:
                    if sock.recv(1) != b"":
                        return False
                except BlockingIOError:
                    return False
                except ConnectionResetError:
                    pass
            return True

        wait_until(all_closed, 15, "the server to close the 60 half-sent connections")
        assert time.monotonic() - started < 5 + 3
        assert threads(pid) <= baseline + 2, (baseline, threads(pid))
    finally:
        for sock in half_sent:
            sock.close()
    assert get(port, "/metrics") is not None
    assert get(port, "/healthz") == (200, "ok\n")
    assert process.alive()
