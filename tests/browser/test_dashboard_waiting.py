"""Tasks waiting for their parents (status 'waiting') on the dashboard's overview, in
a real browser against a real ``pgqueue serve`` (the fixtures and helpers of test_dashboard):
a column of their own in the queue table, not counted in the Queued card, and a queue whose
tasks all wait has a row and a Pause button."""

from __future__ import annotations

from typing import Any

import psycopg

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, cell, expect, sign_in

import pgqueue

browser = dashboard.browser
page = dashboard.page
server = dashboard.server


def test_the_queue_table_counts_waiting_tasks_apart_from_the_queued_ones(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    parent = pgqueue.enqueue(conn, "fetch", {})
    pgqueue.enqueue(conn, "fetch.more", {}, depends_on=[parent])
    for priority in ("normal", "normal", "high"):
        pgqueue.enqueue(
            conn, "notify", {}, queue="callbacks", depends_on=[parent], priority=priority
        )

    sign_in(page, server)
    headers = page.locator("#queues thead th")
    expect(headers).to_contain_text(["Ready", "Scheduled", "Waiting", "Running"])
    expect(cell(page, "default", "normal", "ready")).to_have_text("1")
    expect(cell(page, "default", "normal", "waiting")).to_have_text("1")
    expect(cell(page, "callbacks", "normal", "waiting")).to_have_text("2")
    expect(cell(page, "callbacks", "high", "waiting")).to_have_text("1")
    expect(cell(page, "callbacks", "normal", "ready")).to_have_text("·")
    expect(cell(page, "callbacks", "normal", "oldest")).to_have_text("—")
    # The Queued card counts what a worker may claim: the parent only.
    card = page.locator('#cards [data-card="queued"]')
    expect(card.locator(".card-label")).to_have_text("Queued")
    expect(card.locator(".card-value")).to_have_text("1")

    # A queue whose tasks all wait is a queue: it may be paused (no 404 for want of --create).
    page.locator('#queues button[data-queue="callbacks"]').click()
    expect(page.locator("#confirm-text")).to_contain_text(
        "its 0 queued tasks (and the 3 tasks waiting for their parents, once released)"
    )
    page.click("#confirm-ok")
    expect(page.locator("#notice")).to_contain_text("Paused queue callbacks")
    expect(page.locator('#queues tr[data-queue="callbacks"] .badge.paused')).to_be_visible()
