"""The dashboard mounted inside a host application, behind the host's own login, in a real
browser: examples/fastapi_app served by uvicorn as its README says, with pgqueue's API and
dashboard under /queue behind HTTP Basic and no pgqueue tokens.

The page's API calls must carry the browser's credentials for the origin (the host's Basic
login here, a session cookie elsewhere): the page then shows the data and can act, without
asking for a token.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, expect, free_port, wait_until

import pgqueue

browser = dashboard.browser
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "host-login-5e1d"


@pytest.fixture
def shop(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """The FastAPI example as a real uvicorn process: ``uvicorn --factory
    examples.fastapi_app.app:create_app``, run from the repository."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env |= {"PGQUEUE_DATABASE_URL": database_url, "ADMIN_PASSWORD": PASSWORD}
    log = tmp_path / "uvicorn.log"
    command = [sys.executable, "-m", "uvicorn", "--factory", "examples.fastapi_app.app:create_app"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    running = Server(f"http://127.0.0.1:{port}", process)

    def answering() -> bool:
        if process.poll() is not None:
            pytest.fail(f"uvicorn exited with {process.returncode}: {log.read_text()}")
        try:
            return httpx.get(f"{running.base}/queue/healthz", timeout=2).status_code == 401
        except httpx.TransportError:
            return False

    wait_until(answering, 30, "the example app to answer")
    yield running
    running.stop()


def test_the_mounted_dashboard_reads_and_acts_with_the_hosts_login_and_no_token(
    browser: Any, shop: Server, conn: psycopg.Connection[Any]
) -> None:
    order = {"email": "ada@example.com", "item": "teapot", "payment": "tok_visa"}
    assert httpx.post(f"{shop.base}/orders", json=order, timeout=10).status_code == 201
    context = browser.new_context(http_credentials={"username": "admin", "password": PASSWORD})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    api_statuses: list[int] = []
    page.on(
        "response",
        lambda response: (
            api_statuses.append(response.status) if "/queue/api/v1/" in response.url else None
        ),
    )
    try:
        page.goto(f"{shop.base}/queue/dashboard/")
        button = page.locator('#queues button[data-queue="default"]')
        expect(button).to_have_text("Pause")  # the overview's data came, with the order's task
        expect(page.locator("#login")).to_be_hidden()

        button.click()
        page.click("#confirm-ok")
        expect(page.locator("#notice")).to_contain_text("Paused queue default")
        wait_until(
            lambda: any(q.name == "default" and q.paused for q in pgqueue.list_queues(conn)),
            20,
            "the pause",
        )
    finally:
        context.close()
    assert problems == []
    assert api_statuses and set(api_statuses) <= {200, 201, 202, 304}, api_statuses
