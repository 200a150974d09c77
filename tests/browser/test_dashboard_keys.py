"""The busiest concurrency keys on the dashboard's overview, in a real browser against a real
``pgqueue serve`` (the fixtures and helpers of test_dashboard): a panel of its own, shown only
where tasks have keys, with each key's running and ready tasks, busiest first, a key counted
no further than 1,000 queued tasks marked with a +, and a hostile key shown as text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from keyed_tasks import add_keyed
from test_dashboard import Server, expect, sign_in

import pgqueue

browser = dashboard.browser
page = dashboard.page
server = dashboard.server

HOSTILE_KEY = '<img src=x onerror="window.__pwned=4">'


def key_cell(page: Any, queue: str, key: str, column: str) -> Any:
    rows = page.locator(f'#keys tr[data-queue="{queue}"]').filter(has_text=key)
    return rows.locator(f'td[data-col="{column}"]')


def test_the_busiest_keys_panel_shows_running_and_ready_per_key(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    add_keyed(conn, "acme", 2, at=past)
    claimed: list[pgqueue.ClaimedTask] = []
    for _ in range(2):  # the keys take turns: a claim may take one of a key's tasks
        claimed += pgqueue.claim(conn, ["default"], limit=2 - len(claimed), worker_id="w")
    assert len(claimed) == 2
    add_keyed(conn, "acme", 3, at=past)
    add_keyed(conn, "whale", 1_200, queue="email", at=past)
    add_keyed(conn, HOSTILE_KEY, 1, at=past)

    sign_in(page, server)
    expect(page.locator("#keys-panel")).to_be_visible()
    expect(page.locator("#keys thead th")).to_have_text(["Queue", "Key", "Running", "Ready"])
    expect(page.locator("#keys tbody tr")).to_have_count(3)
    expect(page.locator("#keys tbody tr").first).to_contain_text("whale")
    expect(key_cell(page, "email", "whale", "ready")).to_have_text("1,000+")
    expect(key_cell(page, "default", "acme", "running")).to_have_text("2")
    expect(key_cell(page, "default", "acme", "ready")).to_have_text("3")
    expect(key_cell(page, "default", HOSTILE_KEY, "key")).to_have_text(HOSTILE_KEY)
    assert page.evaluate("window.__pwned") is None


def test_the_busiest_keys_panel_is_hidden_where_no_task_has_a_key(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    pgqueue.enqueue(conn, "plain", {})

    sign_in(page, server)
    expect(page.locator("#queues tbody tr")).to_have_count(1)
    expect(page.locator("#keys-panel")).to_be_hidden()
