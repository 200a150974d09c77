"""The dashboard's operator actions in a real browser against a real ``pgqueue serve`` (the
fixtures and helpers of test_dashboard): finding a task by id or by filter, paging past the
first hundred, replaying and discarding dead letters by filter, pausing and resuming a queue,
cancelling a task. Each action is confirmed in the page's dialog, and the test then checks
the database, not only the page. Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import test_dashboard as dashboard
from helpers import make_dead_letters
from test_dashboard import Seeded, Server, expect, row, screenshot, sign_in, status_of, wait_until

# Importing test_dashboard also skips this module where it skips (no Chromium), and fails
# where it fails (PGQUEUE_REQUIRE_BROWSER without one).
import pgqueue

browser = dashboard.browser
page = dashboard.page
seeded = dashboard.seeded
server = dashboard.server


def paused(conn: psycopg.Connection[Any], queue: str) -> bool:
    return any(q.name == queue and q.paused for q in pgqueue.list_queues(conn))


def dead_count(conn: psycopg.Connection[Any], **filters: str) -> int:
    return pgqueue.count_dead_letters(conn, **filters)


def test_the_search_box_opens_a_task_by_its_id(page: Any, server: Server, seeded: Seeded) -> None:
    sign_in(page, server)

    page.fill("#find-id", f"  {seeded.running}  ")
    page.press("#find-id", "Enter")

    expect(page).to_have_url(re.compile(rf"#/tasks/{seeded.running}$"))
    expect(page.locator("#task h2")).to_have_text(f"Task {seeded.running}")


def test_an_unknown_or_malformed_id_in_the_search_box_says_so(
    page: Any, server: Server, seeded: Seeded
) -> None:
    sign_in(page, server)
    unknown = uuid.uuid4()

    page.fill("#find-id", str(unknown))
    page.press("#find-id", "Enter")

    expect(page.locator("#task h2")).to_have_text("No such task")
    expect(page.locator('#task [data-field="not-found"]')).to_contain_text(str(unknown))
    expect(page.locator("#banner")).to_be_hidden()

    page.fill("#find-id", "not-a-task-id")
    page.press("#find-id", "Enter")

    expect(page.locator("#task h2")).to_have_text("Not a task id")
    expect(page.locator('#task [data-field="not-found"]')).to_contain_text("not-a-task-id")
    expect(page.locator("#banner")).to_be_hidden()
    assert "Traceback" not in page.locator("body").inner_text()


def test_tasks_are_found_by_type_queue_and_status_and_paged_past_the_first_hundred(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    pgqueue.enqueue_many(conn, [{"type": "bulk.job", "queue": "bulk"}] * 130)
    # The newest task is of another type, so the unfiltered first page (also 100 rows) is told
    # from the filtered one: a click on "Next" before the filtered page showed would page the
    # unfiltered list instead (seen on a busy CI machine).
    pgqueue.enqueue(conn, "other.job")
    sign_in(page, server, "#/tasks")

    form = page.locator("#tasks-filter")
    form.locator('input[name="type"]').fill("bulk.job")
    form.locator('input[name="queue"]').fill("bulk")
    form.locator('select[name="status"]').select_option("queued")
    form.locator('button[type="submit"]').click()

    rows = page.locator("#tasks tbody tr")
    expect(rows).to_have_count(100)
    expect(rows.filter(has_not_text="bulk.job")).to_have_count(0)  # the filter's page shows
    expect(page.locator("#tasks-summary")).to_have_text("1 to 100, newest first")
    first_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.taskId)"))
    page.click('#tasks-pager [data-page="next"]')
    expect(rows).to_have_count(30)
    expect(page.locator("#tasks-summary")).to_have_text("101 to 130, newest first (the last page)")
    second_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.taskId)"))
    assert not first_page & second_page
    page.click('#tasks-pager [data-page="previous"]')
    expect(rows).to_have_count(100)

    # Another status: nothing matches; an unknown one in the address: the API's message.
    page.goto(f"{server.base}/dashboard/#/tasks?type=bulk.job&status=completed")
    expect(page.locator("#tasks .empty")).to_have_text("No task matches this filter.")
    page.goto(f"{server.base}/dashboard/#/tasks?status=exploded")
    expect(page.locator('#tasks [data-field="filter-error"]')).to_contain_text("status")
    expect(page.locator("#banner")).to_be_hidden()


def test_dead_letters_page_past_a_hundred_and_replay_by_filter_after_naming_the_count(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    # The text a worker stores (exception first, then a real traceback), as in the screenshot.
    refused = dashboard.raised(ConnectionError("crm.example.com:443 refused the connection"))
    make_dead_letters(conn, 130, type="sync.crm", queue="crm", error=refused)
    make_dead_letters(conn, 5, type="sync.erp", queue="crm", error=refused)
    sign_in(page, server, "#/dead-letters?queue=crm")

    rows = page.locator("#dead-letters tbody tr")
    expect(rows).to_have_count(100)
    expect(page.locator("#dlq-summary")).to_have_text("1 to 100 of 135 dead letters in queue crm")
    page.click('#dlq-pager [data-page="next"]')
    expect(rows).to_have_count(35)
    expect(page.locator("#dlq-summary")).to_have_text("101 to 135 of 135 dead letters in queue crm")

    page.goto(f"{server.base}/dashboard/#/dead-letters?type=sync.crm&queue=crm")
    expect(page.locator("#dlq-replay-all")).to_have_text("Replay all 130…")
    page.click("#dlq-replay-all")
    expect(page.locator("#confirm-title")).to_have_text("Replay 130 dead letters?")
    expect(page.locator("#confirm-text")).to_contain_text("of type sync.crm in queue crm")
    screenshot(page, "dashboard-confirm")
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_have_text(
        "Replayed 130 dead letters of type sync.crm in queue crm."
    )
    assert dead_count(conn, type="sync.crm") == 0
    assert dead_count(conn, type="sync.erp") == 5  # outside the filter: untouched
    queued = conn.execute(
        "SELECT count(*) FROM pgqueue.tasks WHERE type = 'sync.crm' AND status = 'queued'"
        " AND attempts = 0"
    ).fetchone()
    assert queued == (130,)


def test_discard_by_filter_deletes_only_the_matching_dead_letters(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    sign_in(page, server, "#/dead-letters?type=payment.capture")
    expect(page.locator("#dlq-discard-all")).to_have_text("Discard all 3…")

    page.click("#dlq-discard-all")
    expect(page.locator("#confirm-text")).to_contain_text("cannot be undone")
    page.keyboard.press("Escape")  # dismissed: nothing happens
    expect(page.locator("#confirm")).to_be_hidden()
    assert dead_count(conn, type="payment.capture") == 3

    page.click("#dlq-discard-all")
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_have_text(
        "Discarded 3 dead letters of type payment.capture."
    )
    wait_until(lambda: dead_count(conn, type="payment.capture") == 0, 20, "the discard")
    assert all(status_of(conn, task_id) is None for task_id in seeded.dead)
    assert status_of(conn, seeded.hostile) == "failed"
    expect(page.locator("#dead-letters .empty")).to_have_text("No dead letter matches this filter.")


def test_pausing_and_resuming_a_queue_from_the_overview(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    sign_in(page, server)
    button = page.locator('#queues button[data-queue="reports"]')
    expect(button).to_have_text("Pause")

    button.click()
    expect(page.locator("#confirm-title")).to_have_text("Pause queue reports?")
    expect(page.locator("#confirm-text")).to_contain_text("its 3 queued tasks until")
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_contain_text("Paused queue reports")
    wait_until(lambda: paused(conn, "reports"), 20, "the pause")
    expect(button).to_have_text("Resume")
    expect(page.locator('#queues tr[data-queue="reports"] .badge.paused')).to_be_visible()
    screenshot(page, "dashboard-overview-paused", full_page=True)

    button.click()
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_contain_text("Resumed queue reports")
    wait_until(lambda: not paused(conn, "reports"), 20, "the resume")
    expect(button).to_have_text("Pause")


def test_cancelling_a_queued_task_from_its_page(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    task = pgqueue.enqueue(conn, "report.build", {"month": "2026-10"}, queue="reports")
    sign_in(page, server, f"#/tasks/{task.id}")

    page.click('#task button[data-action="cancel"]')
    expect(page.locator("#confirm-text")).to_contain_text("it will never run")
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_contain_text("Cancelled task")
    wait_until(lambda: status_of(conn, task.id) == "cancelled", 20, "the cancel")
    expect(page.locator('#task [data-field="status"]')).to_have_text("cancelled")
    expect(page.locator('#task button[data-action="cancel"]')).to_have_count(0)


def test_cancelling_a_running_task_asks_its_handler_to_stop(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any], connect: Any
) -> None:
    """The task stays running under its lease, flagged, and the worker holding it is told at
    once: a notification on pgqueue_cancel naming it and the task."""

    def state() -> tuple[Any, ...]:
        found = conn.execute(
            "SELECT status, cancel_requested, finished_at, lease_owner, lease_token"
            " FROM pgqueue.tasks WHERE id = %s",
            (seeded.running,),
        ).fetchone()
        assert found is not None
        return tuple(found)

    status, requested, finished, owner, token = state()
    assert (status, requested, finished, owner) == ("running", False, None, dashboard.WORKER)
    listener = connect()
    listener.execute("LISTEN pgqueue_cancel")
    sign_in(page, server, f"#/tasks/{seeded.running}")

    page.click('#task button[data-action="cancel"]')
    expect(page.locator("#confirm-text")).to_contain_text("its handler is asked to stop")
    page.click("#confirm-ok")

    expect(page.locator("#notice")).to_contain_text("still running until its handler does")
    wait_until(lambda: state()[1], 20, "the cancel to be requested")
    assert state() == ("running", True, None, owner, token), "still running, under its lease"
    told = [n.payload for n in listener.notifies(timeout=20, stop_after=1)]
    assert told == [f"{dashboard.WORKER} {seeded.running}"]
    expect(page.locator('#task [data-field="status"]')).to_have_text("running")
    expect(page.locator('#task [data-field="cancel"]')).to_have_text("yes")


def test_replaying_one_dead_letter_from_its_row_names_it_first(
    page: Any, server: Server, seeded: Seeded, conn: psycopg.Connection[Any]
) -> None:
    sign_in(page, server, "#/dead-letters")
    row(page, "dead-letters", seeded.dead[2]).locator("button.replay").click()
    expect(page.locator("#confirm-text")).to_contain_text("payment.capture, queue payments")
    page.click("#confirm-ok")

    wait_until(lambda: status_of(conn, seeded.dead[2]) == "queued", 20, "the replay")
    assert status_of(conn, seeded.dead[0]) == "failed"
