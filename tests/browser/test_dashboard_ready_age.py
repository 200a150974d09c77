"""The dashboard's ages of waiting work and a promoted task's priority, in a
real browser against a real ``pgqueue serve`` (the fixtures and helpers of test_dashboard).

A low task that became ready 15 minutes ago and was then promoted by the starvation policy
must read as waiting 15 minutes in the overview, not as young as its promotion, and its page
must say it was submitted low. The history is written in the past with ``now=``, so nothing
waits on the clock.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, expect, sign_in

import pgqueue

browser = dashboard.browser
page = dashboard.page
server = dashboard.server

WAITED = timedelta(minutes=15)


def test_a_promoted_task_shows_its_whole_wait_and_its_submitted_priority(
    page: Any, server: Server, conn: psycopg.Connection[Any]
):
    t0 = datetime.now(UTC) - WAITED
    task_id = pgqueue.enqueue(conn, "report", {}, queue="reports", priority="low", now=t0).id
    assert pgqueue.promote_aged(conn, after_seconds=300, now=t0 + timedelta(seconds=301)) == [
        task_id
    ]

    sign_in(page, server)
    oldest = page.locator(
        '#queues tr[data-queue="reports"][data-priority="normal"] [data-col="oldest"]'
    )
    expect(oldest).to_have_text(re.compile(r"^1[56]m \d\ds$"))  # not 10m, its age since promotion

    page.goto(f"{server.base}/dashboard/#/tasks/{task_id}")
    task = page.locator("#task")
    expect(task.locator('[data-field="priority"]')).to_have_text(
        "normal (submitted low, promoted for waiting)"
    )
    expect(task.locator('[data-field="ready-since"]')).to_contain_text(
        re.compile(r"1[56]m \d\ds ago")
    )
