"""A task's progress report on its dashboard page, in a real browser against a real
``pgqueue serve`` (the fixtures and helpers of test_dashboard).

The report is written as a worker writes it (fenced by the task's lease); the page shows it
while the task runs, follows it as it changes (the page refreshes itself), and keeps the last
one once the task completes. Every wait is Playwright's ``expect``, polling with a deadline.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, expect, sign_in

import pgqueue
from pgqueue.queries.driver import run
from pgqueue.queries.leased import task_progress

browser = dashboard.browser
page = dashboard.page
server = dashboard.server


def shown(locator: Any) -> Any:
    return json.loads(locator.text_content())


def test_a_task_page_shows_the_running_handlers_progress_and_keeps_the_last_one(
    page: Any, server: Server, conn: psycopg.Connection[Any]
):
    task_id = pgqueue.enqueue(conn, "import_rows", {"file": "rows.csv"}).id
    (claimed,) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")
    assert run(conn, task_progress(claimed.lease, '{"done": 40, "of": 100}'))

    sign_in(page, server)
    page.goto(f"{server.base}/dashboard/#/tasks/{task_id}")
    panel = page.locator('#task [data-panel="progress"]')
    expect(panel.locator("p")).to_have_text("reported by its handler, written at most every 0.5 s")
    report = panel.locator('[data-field="progress"]')
    expect(report).to_contain_text('"done": 40')
    assert shown(report) == {"done": 40, "of": 100}

    assert run(conn, task_progress(claimed.lease, '{"done": 100, "of": 100}'))
    pgqueue.complete(conn, claimed.lease, {"rows": 100})
    expect(panel.locator("p")).to_have_text("its handler's last report", timeout=30_000)
    expect(report).to_contain_text('"done": 100')
    assert shown(report) == {"done": 100, "of": 100}


def test_a_task_page_without_a_report_has_no_progress_panel(
    page: Any, server: Server, conn: psycopg.Connection[Any]
):
    task_id = pgqueue.enqueue(conn, "quiet", {}).id
    sign_in(page, server)
    page.goto(f"{server.base}/dashboard/#/tasks/{task_id}")
    expect(page.locator('#task [data-field="payload"]')).to_be_visible()
    expect(page.locator('#task [data-panel="progress"]')).to_have_count(0)
