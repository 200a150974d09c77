"""The boundaries a caller meets pgqueue at, in this process, for the tests that drive the same
situation through each of them (test_bad_input_boundaries.py, test_failure_modes.py); shared
like helpers.py (tests/conftest.py's folder is on sys.path).

- the CLI: the real entry point ``pgqueue.cli.main()`` with ``sys.argv`` set and stdout and
  stderr captured (typer's CliRunner would bypass ``main()``, which is what turns an error into
  one line and an exit code; a subprocess per call would cost a second each);
- the HTTP API: ``create_app(...)`` through httpx's ASGI transport with its lifespan running;
- the tasks table, snapshotted whole, to prove that nothing was written;
- the markdown tables these modules write of what they observed (docs/bad-input.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import io
import sys
import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from pgqueue import cli
from pgqueue.api import ApiSettings, create_app

# --- the CLI -------------------------------------------------------------------------------------


@dataclasses.dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def line(self) -> str:
        """The last line on stderr (the error line of a failed command)."""
        lines = self.stderr.splitlines()
        return lines[-1] if lines else ""


def run_main(url: str, *args: str) -> CliResult:
    """``pgqueue --database-url URL ARGS...`` through the real entry point, in this process."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["pgqueue", "--database-url", url, *args]
    code: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = saved
    return CliResult(int(code or 0), out.getvalue(), err.getvalue())


# --- the HTTP API --------------------------------------------------------------------------------


class Api:
    """``create_app(settings)`` through httpx's ASGI transport, on an event loop in a thread of
    its own, with the application's lifespan entered (so its connection pool is open; a startup
    that fails raises here)."""

    def __init__(self, settings: ApiSettings) -> None:
        self.app = create_app(settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asgi-test", daemon=True)
        self.thread.start()
        self.lifespan = self.app.router.lifespan_context(self.app)
        try:
            self.run(self.lifespan.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, method: str, url: str, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Send a request without waiting for the answer."""
        return asyncio.run_coroutine_threadsafe(
            self.client.request(method, url, **kwargs), self.loop
        )

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response: httpx.Response = self.start(method, url, **kwargs).result(60)
        return response

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    def close(self) -> None:
        try:
            self.run(self.client.aclose())
            self.run(self.lifespan.__aexit__(None, None, None))
        finally:
            self._stop_loop()


# --- the tasks table -----------------------------------------------------------------------------

Snapshot = dict[uuid.UUID, dict[str, Any]]


def snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    """Every row of pgqueue.tasks, every column."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT * FROM pgqueue.tasks").fetchall()
    return {row["id"]: row for row in rows}


# --- the report ----------------------------------------------------------------------------------


def code(text: str) -> str:
    """``text`` as a markdown code span, whatever backticks it holds."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def shorten(text: str, limit: int = 300) -> str:
    """At most ``limit`` characters, closing a code span the cut left open."""
    if len(text) <= limit:
        return text
    text = text[: limit - 3] + "..."
    if text.count("``") % 2:
        return text + " ``"
    return text + "`" if text.replace("``", "").count("`") % 2 else text


def write_tables(
    path: Path, header: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]
) -> None:
    """``rows`` (group, cells) as markdown tables: a ``### group`` heading and a table with
    ``header`` wherever the group changes. The cells are written as they are."""
    lines: list[str] = []
    current = None
    for group, cells in rows:
        if group != current:
            current = group
            lines += ["", f"### {group}", "", "| " + " | ".join(header) + " |"]
            lines.append("|" + "---|" * len(header))
        lines.append("| " + " | ".join(cells) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).lstrip() + "\n", encoding="utf-8")
