"""The dashboard's lists in a real browser against a real ``pgqueue serve`` (the fixtures of
test_dashboard): every list it loads, refreshed every few seconds, asks for the summary form,
so that what a submitter puts in payloads and results does not decide what each viewer's
refresh costs the server; a task's own page still shows its payload."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import Seeded, Server, expect, row, sign_in

browser = dashboard.browser
page = dashboard.page
server = dashboard.server
seeded = dashboard.seeded

LISTS = ("/api/v1/tasks", "/api/v1/dead-letters")


def test_every_list_the_dashboard_loads_asks_for_tasks_without_payloads(
    page: Any, server: Server, seeded: Seeded
) -> None:
    lists: list[str] = []
    page.on("request", lambda r: lists.append(r.url) if urlsplit(r.url).path in LISTS else None)

    sign_in(page, server)
    expect(row(page, "running", seeded.running)).to_be_visible()
    page.goto(f"{server.base}/dashboard/#/tasks")
    expect(row(page, "tasks", seeded.completed[0])).to_be_visible()
    page.goto(f"{server.base}/dashboard/#/dead-letters")
    expect(row(page, "dead-letters", seeded.dead[0])).to_be_visible()

    assert {urlsplit(url).path for url in lists} == set(LISTS), lists
    for url in lists:
        assert parse_qs(urlsplit(url).query).get("fields") == ["summary"], url
    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.dead[0]}")
    expect(page.locator('#task [data-field="payload"]')).to_contain_text('"order": 1040')
