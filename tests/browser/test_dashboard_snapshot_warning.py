"""The overview's warning that an old snapshot holds back the cleanup of pgqueue.tasks, in a
real browser against a real ``pgqueue serve`` (the fixtures and helpers of test_dashboard).

The server runs with ``PGQUEUE_SNAPSHOT_WARN_SECONDS=1``, so a session left idle in its
transaction for a second is enough. The test checks that nothing is shown while nothing holds
a snapshot, that the page's own refresh brings the warning (naming the session, its state and
how long it has held it) once one does, and that the warning goes away when the session ends.
Every wait polls a condition against a deadline; nothing sleeps and hopes.

``PGQUEUE_SCREENSHOTS=DIR`` saves ``dashboard-snapshot-warning.png`` there, as test_dashboard
does for its pages.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import psycopg
import pytest

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import test_dashboard as dashboard
from test_dashboard import TOKEN, Seeded, Server, expect, screenshot, sign_in, wait_until

# Its fixtures, by name: a fresh database seeded with tasks in every state, ``pgqueue serve``
# on it with a token, and a browser tab that fails the test on script errors.
browser = dashboard.browser
page = dashboard.page
seeded = dashboard.seeded
server = dashboard.server

APPLICATION = "nightly-revenue-report"
WARNING = "#snapshot-warning"


@pytest.fixture(autouse=True)
def warn_after_one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before ``server`` starts (autouse fixtures come first): it copies this environment."""
    monkeypatch.setenv("PGQUEUE_SNAPSHOT_WARN_SECONDS", "1")


def stats(server: Server) -> dict[str, Any]:
    response = httpx.get(
        f"{server.base}/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def next_refresh(page: Any) -> None:
    """Wait for the page's next refresh of its own: "updated HH:MM:SS" changes (refreshes are
    5 s apart, so the time always does)."""
    updated = page.locator("#updated")
    before = updated.inner_text()
    expect(updated).not_to_have_text(before)
    expect(updated).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))


def held_for(text: str) -> int:
    found = re.search(r"open for (\d+)s \(", text)
    assert found, text
    return int(found[1])


def test_the_snapshot_warning_names_who_holds_cleanup_back_and_goes_away_when_it_ends(
    page: Any, server: Server, seeded: Seeded, database_url: str
) -> None:
    # The server has the test's threshold, and nothing holds a snapshot.
    before = stats(server)
    assert before["oldest_snapshot_warn_seconds"] == 1.0
    assert before["oldest_snapshot_warning"] is False

    sign_in(page, server)
    warning = page.locator(WARNING)
    expect(page.locator('#cards [data-card="queued"] .card-value')).to_have_text("10")
    expect(warning).to_be_hidden()
    next_refresh(page)  # and it stays hidden over a refresh, a second being the threshold
    expect(warning).to_be_hidden()
    expect(warning).to_have_text("")

    # A session that began a transaction, took an xid and went idle: a report left open.
    # (psycopg with autocommit off sends the BEGIN before the first statement.)
    holder = psycopg.connect(database_url, autocommit=False, application_name=APPLICATION)
    try:
        pid, user = holder.info.backend_pid, holder.info.user
        began = time.monotonic()
        holder.execute("SELECT txid_current()").fetchone()

        # The page's next refresh past the threshold says who it is, in what state and for
        # how long, and what to do.
        expect(warning).to_have_text(
            re.compile(
                rf"^Vacuum of pgqueue\.tasks is held back: a session, "
                rf"pid {pid} \({re.escape(user)}, {re.escape(APPLICATION)}\), "
                r"idle in transaction, has kept a snapshot open for \d+s "
                r"\([\d,]+ transactions?\)\. "
                r"Finished tasks cannot be cleaned up until it ends: end it, or set "
                r"idle_in_transaction_session_timeout"
            )
        )
        expect(warning).to_be_visible()
        expect(warning).to_have_attribute("role", "alert")
        first = held_for(warning.inner_text())
        assert 1 <= first <= time.monotonic() - began + 1
        # The rest of the overview is still there beneath it.
        expect(page.locator('#cards [data-card="queued"] .card-value')).to_have_text("10")
        screenshot(page, "dashboard-snapshot-warning")

        # The time is the server's, read again at each refresh: the next one shows longer.
        wait_until(lambda: held_for(warning.inner_text()) > first, 20, "the held time to grow")
        assert held_for(warning.inner_text()) <= time.monotonic() - began + 1
        expect(warning).to_contain_text(f"pid {pid} ")
    finally:
        holder.close()  # the session ends, and with it its transaction

    # The next refresh finds nothing holding a snapshot and takes the warning away.
    expect(warning).to_be_hidden()
    expect(warning).to_have_text("")
    assert stats(server)["oldest_snapshot_warning"] is False
