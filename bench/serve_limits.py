"""What the connection limits of ``pgqueue serve`` cost: requests/s of ``GET /healthz`` from
``pgqueue serve`` (pgqueue.api.server's protocol) against uvicorn's own httptools protocol
serving the same application, in alternating rounds on the same machine.

    PGQUEUE_DATABASE_URL=postgresql://... python -m bench.serve_limits [--rounds 4] [--seconds 5]

The client is a few raw keep-alive connections on one asyncio loop (no HTTP library, whose
cost would dwarf the server's), each sending one request at a time. Access logs go to
/dev/null in both servers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx

from bench.private_postgres import free_port

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
STOCK = (
    "import uvicorn; uvicorn.run('pgqueue.api:app_from_env', factory=True, host='127.0.0.1', "
    "port={port}, log_level='info', proxy_headers=False)"
)


def start(kind: str, port: int) -> subprocess.Popen[bytes]:
    if kind == "limited":
        command = [sys.executable, "-m", "pgqueue", "serve", "--port", str(port)]
    else:
        command = [sys.executable, "-c", STOCK.format(port=port)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{kind} server did not start")


async def one_connection(port: int, until: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    while time.monotonic() < until:
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        done += 1
    writer.close()
    return done


async def load(port: int, seconds: float, connections: int) -> float:
    until = time.monotonic() + seconds
    counts = await asyncio.gather(*(one_connection(port, until) for _ in range(connections)))
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    if not os.environ.get("PGQUEUE_DATABASE_URL"):
        raise SystemExit("set PGQUEUE_DATABASE_URL")
    servers = {kind: (port := free_port(), start(kind, port)) for kind in ("stock", "limited")}
    results: dict[str, list[float]] = {kind: [] for kind in servers}
    try:
        for _ in range(args.rounds):
            for kind, (port, _) in servers.items():
                rate = asyncio.run(load(port, args.seconds, args.connections))
                results[kind].append(rate)
                print(f"{kind:8} {rate:8.0f} requests/s", flush=True)
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=20)
    for kind, rates in results.items():
        median = statistics.median(rates)
        print(f"{kind:8} median {median:8.0f} requests/s over {len(rates)} rounds")
    ratio = statistics.median(results["limited"]) / statistics.median(results["stock"])
    print(f"limited/stock: {ratio:.3f}")


if __name__ == "__main__":
    main()
