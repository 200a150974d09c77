"""The dashboard's task page shows the task's workflow, parents and children with their
statuses, each a link to its own page, in a real browser against a real
``pgqueue serve`` (the fixtures and helpers of test_dashboard)."""

from __future__ import annotations

from typing import Any

import psycopg

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Server, expect, sign_in

import pgqueue
from pgqueue.enqueue import new_task_id

browser = dashboard.browser
page = dashboard.page
server = dashboard.server


def test_a_tasks_page_links_its_parents_and_children_with_their_statuses(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    wf = new_task_id()
    first = pgqueue.prepare("fetch", {}, workflow_id=wf)
    second = pgqueue.prepare("fetch", {}, workflow_id=wf)
    report = pgqueue.prepare("report", {}, depends_on=[first, second], workflow_id=wf)
    pgqueue.enqueue_many(conn, [first, second, report])
    (claimed, *_) = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")
    pgqueue.complete(conn, claimed.lease, {"pages": 3})

    sign_in(page, server)
    page.goto(f"{server.base}/dashboard/#/tasks/{report.id}")
    panel = page.locator('#task [data-panel="workflow"]')
    expect(panel.locator('[data-field="workflow-id"]')).to_have_text(str(wf))
    parents = panel.locator('[data-field="parents"] li')
    expect(parents).to_have_count(2)
    done = panel.locator(f'[data-field="parents"] li[data-edge="{claimed.id}"]')
    expect(done.locator("[data-status]")).to_have_attribute("data-status", "completed")
    other = second.id if claimed.id == first.id else first.id
    expect(
        panel.locator(f'[data-field="parents"] li[data-edge="{other}"] [data-status]')
    ).to_have_attribute("data-status", "queued")
    expect(panel.locator('[data-field="children"]')).to_contain_text("none")

    # A parent's link leads to its page, which lists the report as its waiting child.
    done.locator("a").click()
    expect(page.locator("#task h2")).to_have_text(f"Task {claimed.id}")
    child = page.locator(f'#task [data-field="children"] li[data-edge="{report.id}"]')
    expect(child.locator("[data-status]")).to_have_attribute("data-status", "waiting")
    expect(child).to_contain_text("report")
    child.locator("a").click()
    expect(page.locator("#task h2")).to_have_text(f"Task {report.id}")


def test_a_plain_tasks_page_has_no_workflow_panel(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    task_id = pgqueue.enqueue(conn, "plain", {}).id
    sign_in(page, server)
    page.goto(f"{server.base}/dashboard/#/tasks/{task_id}")
    expect(page.locator("#task h2")).to_have_text(f"Task {task_id}")
    expect(page.locator('#task [data-panel="workflow"]')).to_have_count(0)


def test_a_cancelled_childs_page_links_the_parent_that_cancelled_it(
    page: Any, server: Server, conn: psycopg.Connection[Any]
) -> None:
    parent = pgqueue.enqueue(conn, "fetch", {})
    child = pgqueue.enqueue(conn, "report", {}, depends_on=[parent])
    pgqueue.cancel(conn, parent.id)
    sign_in(page, server)
    page.goto(f"{server.base}/dashboard/#/tasks/{child.id}")
    by = page.locator('#task [data-panel="workflow"] [data-field="cancelled-by"]')
    expect(by).to_contain_text("failed or was cancelled")
    by.locator("a").click()
    expect(page.locator("#task h2")).to_have_text(f"Task {parent.id}")
    expect(page.locator('#task [data-field="cancelled-by"]')).to_have_count(0)
