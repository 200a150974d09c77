"""DNS rebinding against a tokenless ``pgqueue serve``, in a real browser: Chromium is told
that ``rebind.test`` is 127.0.0.1 (as an attacker's DNS would tell it, after serving its own
page under that name), opens the dashboard under that name and tries to read the tasks. The
API answers 400 ``host_not_allowed`` and no task reaches the page; the same dashboard under
127.0.0.1 reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import CHROMIUM, Server, expect, serving, sync_api, wait_until

import pgqueue

REBOUND = "rebind.test"
SECRET = "card-4242-rebinding-secret"


@pytest.fixture
def tokenless(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """``pgqueue serve`` without tokens, on 127.0.0.1 (its default), as a real process."""
    with serving(database_url, tmp_path / "serve.log", None) as running:
        yield running


@pytest.fixture
def rebinding_browser() -> Iterator[Any]:
    """Chromium resolving rebind.test to 127.0.0.1, as after the attacker's DNS answer."""
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"],
        )
        yield launched
        launched.close()


READ_TASKS = """async () => {
  const response = await fetch("/api/v1/tasks");
  return { status: response.status, text: await response.text() };
}"""

DISCARD = """async () => {
  const response = await fetch("/api/v1/dead-letters/discard", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ all: true }),
  });
  return { status: response.status, text: await response.text() };
}"""


def test_a_page_under_a_rebound_name_cannot_read_or_change_the_tasks(
    rebinding_browser: Any, tokenless: Server, conn: psycopg.Connection[Any]
) -> None:
    pgqueue.enqueue(conn, "payment.capture", {"card": SECRET})
    pgqueue.enqueue(conn, "doomed", {}, queue="dlq", max_attempts=1)
    (claimed,) = pgqueue.claim(conn, ["dlq"], limit=1, worker_id="test")
    pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")
    port = tokenless.base.rsplit(":", 1)[1]
    context = rebinding_browser.new_context()
    page = context.new_page()
    try:
        # The rebound name: the page itself is refused, and so is every API call from it.
        refused = page.goto(f"http://{REBOUND}:{port}/dashboard/")
        assert refused is not None and refused.status == 400
        assert "host_not_allowed" in refused.text()
        read = page.evaluate(READ_TASKS)
        assert read["status"] == 400 and "host_not_allowed" in read["text"]
        assert SECRET not in read["text"]
        discard = page.evaluate(DISCARD)
        assert discard["status"] == 400, discard
        assert pgqueue.count_dead_letters(conn) == 1

        # The same server under its own name: the dashboard reads the tasks.
        page.goto(f"http://127.0.0.1:{port}/dashboard/#/tasks")
        expect(page.locator("#tasks")).to_contain_text("payment.capture")
        read = page.evaluate(READ_TASKS)
        assert read["status"] == 200 and SECRET in read["text"]
    finally:
        context.close()


browser = dashboard.browser  # the module's shared Chromium, for a test that needs no rules


def test_the_dashboard_under_localhost_reads_the_tasks_without_a_token(
    browser: Any, tokenless: Server, conn: psycopg.Connection[Any]
) -> None:
    pgqueue.enqueue(conn, "payment.capture", {"card": SECRET})
    port = tokenless.base.rsplit(":", 1)[1]
    page = browser.new_page()
    try:
        page.goto(f"http://localhost:{port}/dashboard/#/tasks")
        expect(page.locator("#tasks")).to_contain_text("payment.capture")
        wait_until(lambda: page.locator("#login").is_hidden(), 20, "no token asked for")
    finally:
        page.close()
