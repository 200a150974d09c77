"""The dashboard with tokens of narrower scopes, in a real browser: a read token shows
everything and, on an action, says it may read but not act; a metrics token is turned away
at sign-in with a message saying it cannot read the dashboard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, expect, serving

import pgqueue

browser = dashboard.browser
READ = "read-" + "7" * 32
METRICS = "metrics-" + "8" * 32


@pytest.fixture
def scoped_server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """``pgqueue serve`` with a read token and a metrics token only."""
    with serving(database_url, tmp_path / "serve.log", f"read:{READ},metrics:{METRICS}") as running:
        yield running


def sign_in(page: Any, server: Server, token: str, route: str = "") -> None:
    page.goto(f"{server.base}/dashboard/{route}")
    page.fill("#token-input", token)
    page.click("#token-form button[type=submit]")


def test_a_read_token_reads_and_an_action_says_it_may_read_not_act(
    browser: Any, scoped_server: Server, conn: psycopg.Connection[Any]
) -> None:
    pgqueue.enqueue(conn, "doomed", {}, queue="dlq", max_attempts=1)
    (claimed,) = pgqueue.claim(conn, ["dlq"], limit=1, worker_id="test")
    pgqueue.fail(conn, claimed.lease, "RuntimeError: boom")
    page = browser.new_page()
    try:
        sign_in(page, scoped_server, READ, "#/dead-letters")
        expect(page.locator("#dead-letters")).to_contain_text("doomed")
        page.click('#dead-letters button[data-action="discard"]')
        page.click("#confirm-ok")
        expect(page.locator("#notice")).to_contain_text("this token may read, not act: needs admin")
        expect(page.locator("#login")).to_be_hidden()  # still signed in: it may read
        assert pgqueue.count_dead_letters(conn) == 1
    finally:
        page.close()


def test_a_metrics_token_is_told_at_sign_in_that_it_cannot_read_the_dashboard(
    browser: Any, scoped_server: Server
) -> None:
    page = browser.new_page()
    try:
        sign_in(page, scoped_server, METRICS)
        expect(page.locator("#login-error")).to_contain_text("cannot read the dashboard")
        expect(page.locator("#login-error")).to_contain_text("this token has metrics")
        assert METRICS not in page.locator("#login-error").inner_text()
    finally:
        page.close()
