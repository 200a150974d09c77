"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

Each test gets a fresh migrated database seeded with tasks in every state (queued at three
priorities and scheduled, running under a lease, completed, retrying after an error,
dead-lettered, and an hour of finished history for the chart) and a real ``pgqueue serve``
process with an API token. The browser signs in with the token and the tests check what the
page shows, click what a user clicks, and check the database: a replay must make the task
queued again, a discard must delete it. Every wait polls a condition against a deadline
(Playwright's ``expect``, or ``wait_until`` for the database).

Screenshots of the main pages are saved when ``PGQUEUE_SCREENSHOTS=DIR`` is set (the README's
come from here: ``PGQUEUE_SCREENSHOTS=docs/images pytest tests/browser``).

Without a Chromium executable the module is skipped, unless ``PGQUEUE_REQUIRE_BROWSER`` is
set: ``.ci/run`` installs Debian's chromium first and sets it, so CI fails rather than skip.
``PGQUEUE_CHROMIUM`` names another executable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from helpers import run_worker_until

import pgqueue
from pgqueue.executor import describe


def _chromium() -> str | None:
    candidates = [
        os.environ.get("PGQUEUE_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CHROMIUM = _chromium()
if CHROMIUM is None and os.environ.get("PGQUEUE_REQUIRE_BROWSER"):
    raise RuntimeError(
        "PGQUEUE_REQUIRE_BROWSER is set (as .ci/run sets it) but no Chromium executable was "
        "found: install Debian's chromium or set PGQUEUE_CHROMIUM"
    )
if CHROMIUM is None:
    pytest.skip(
        "no Chromium executable for the dashboard's browser test: install Debian's chromium "
        "(apt-get install chromium; .ci/run does) or set PGQUEUE_CHROMIUM",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in pgqueue-jobs[test]")
expect = sync_api.expect
expect.set_options(timeout=20_000)

TOKEN = "dash-browser-7f3a9c2e-1b4d6f8a0c2e4f60"
VIEWPORT = {"width": 1280, "height": 900}
SCREENSHOTS = os.environ.get("PGQUEUE_SCREENSHOTS")
HOSTILE_PAYLOAD = '<img src=x onerror="window.__pwned=1">'
HOSTILE_FIELD = "</pre><script>window.__pwned=2</script>"
HOSTILE_ERROR = '<img src=x onerror="window.__pwned=3"> ValueError: row 7 is not valid CSV'
CARD_ERROR = "ValueError: card ending 4242 was declined (insufficient_funds)"
HOOK_ERROR = "ConnectionError: POST https://hooks.example.com/orders timed out after 10 s"
WORKER = "web-7:4242"


# --- the data --------------------------------------------------------------------------------


def raised(exc: Exception) -> str:
    """The error a worker stores for a handler that raised ``exc``: really raised here, so
    the text has a real traceback, for the rows a worker cannot make (dated in the past, or
    retrying an hour from now)."""
    try:
        raise exc
    except Exception as caught:
        return describe(caught)


def capture_payment(payload: dict[str, Any], ctx: Any) -> None:
    raise ValueError(CARD_ERROR.removeprefix("ValueError: "))


@dataclasses.dataclass
class Seeded:
    running: uuid.UUID
    completed: list[uuid.UUID]
    retrying: uuid.UUID
    dead: list[uuid.UUID]  # payment.capture, in queue "payments"
    hostile: uuid.UUID  # a dead letter whose payload and error are markup
    completed_in_hour: int
    dead_in_hour: int


def history(conn: psycopg.Connection[Any], now: datetime) -> tuple[int, int]:
    """An hour of finished thumbnails for the chart: completed and dead-lettered tasks in the
    minutes 2 to 55 ago (well inside the hour however long the test takes)."""
    completed = dead = 0
    plan = []
    for ago in range(2, 56):
        done = 5 + (ago * 7) % 9 + (6 if 20 <= ago <= 30 else 0)
        failed = 2 if ago in (9, 33) else (1 if ago in (17, 18, 44) else 0)
        plan.append((now - timedelta(minutes=ago), done, failed))
    total = sum(d + f for _, d, f in plan)
    memory_error = raised(MemoryError("image too large"))
    pgqueue.enqueue_many(
        conn, [{"type": "thumbnail.render", "queue": "thumbnails", "max_attempts": 1}] * total
    )
    with conn.transaction():
        claimed = pgqueue.claim(conn, ["thumbnails"], limit=total, worker_id="web-3:77")
        assert len(claimed) == total
        leases = iter(claimed)
        for at, done, failed in plan:
            batch = [(next(leases).lease, {"width": 320}) for _ in range(done)]
            pgqueue.complete_many(conn, batch, now=at)
            for _ in range(failed):
                pgqueue.fail(conn, next(leases).lease, memory_error, now=at)
            completed += done
            dead += failed
    return completed, dead


def failed_by_a_worker(
    conn: psycopg.Connection[Any], database_url: str, queue: str, payloads: list[dict[str, Any]]
) -> list[uuid.UUID]:
    """Dead letters made as in production: a real worker runs ``capture_payment``, which
    raises ValueError, once each (max_attempts=1)."""
    made = pgqueue.enqueue_many(
        conn, [{"type": "payment.capture", "queue": queue, "payload": p} for p in payloads]
    )
    registry = pgqueue.TaskRegistry()
    registry.handler("payment.capture", max_attempts=1)(capture_payment)
    ids = [r.id for r in made]

    def all_dead() -> bool:
        return all(status_of(conn, task_id) == "failed" for task_id in ids)

    run_worker_until(database_url, registry, all_dead, queues=[queue])
    return ids


def seed(conn: psycopg.Connection[Any], database_url: str) -> Seeded:
    now = datetime.now(UTC)
    completed_before, dead_before = history(conn, now)
    # Queued: three priorities in "emails" (one due for two hours), and "reports" with one
    # scheduled an hour ahead.
    for priority, count in (("high", 2), ("normal", 2), ("low", 1)):
        for i in range(count):
            pgqueue.enqueue(conn, "send_email", {"to": f"user{i}@example.com"}, priority=priority)
    pgqueue.enqueue(conn, "send_email", {"to": "late@example.com"}, run_at=now - timedelta(hours=2))
    for _ in range(2):
        pgqueue.enqueue(conn, "report.build", {"month": "2026-11"}, queue="reports")
    pgqueue.enqueue(conn, "report.build", {"month": "2026-12"}, queue="reports", delay=3600)
    # Running, under a ten-minute lease.
    running = pgqueue.enqueue(conn, "video.transcode", {"video": "intro.mp4"}, queue="media")
    pgqueue.claim(conn, ["media"], limit=1, worker_id=WORKER, lease_seconds=600)
    # Waiting for its parent, the transcode, to finish.
    pgqueue.enqueue(
        conn, "video.publish", {"video": "intro.mp4"}, queue="media", depends_on=[running]
    )
    # Completed, with results.
    done = pgqueue.enqueue_many(
        conn,
        [
            {"type": "invoice.render", "queue": "billing", "payload": {"invoice": n}}
            for n in range(4)
        ],
    )
    with conn.transaction():
        for task in pgqueue.claim(conn, ["billing"], limit=4, worker_id="web-2:99"):
            number = task.payload["invoice"]
            pgqueue.complete(conn, task.lease, {"pdf": f"s3://invoices/{number}.pdf"})
    # Retrying after an error: the next attempt in an hour.
    retrying = pgqueue.enqueue(
        conn, "webhook.deliver", {"order": 1042}, queue="webhooks", max_attempts=5
    )
    with conn.transaction():
        (hook,) = pgqueue.claim(conn, ["webhooks"], limit=1, worker_id="web-2:99")
        error = raised(ConnectionError(HOOK_ERROR.removeprefix("ConnectionError: ")))
        pgqueue.fail(conn, hook.lease, error, retry_after=3600)
    # Dead letters: three a real worker failed, and one full of markup.
    dead = failed_by_a_worker(
        conn,
        database_url,
        "payments",
        [{"order": 1040 + n, "amount_cents": 4999, "card": "visa-4242"} for n in range(3)],
    )
    hostile = pgqueue.enqueue(
        conn,
        "csv.import",
        {"note": HOSTILE_PAYLOAD, "file": HOSTILE_FIELD},
        queue="imports",
        max_attempts=1,
    )
    with conn.transaction():
        (task,) = pgqueue.claim(conn, ["imports"], limit=1, worker_id="web-2:99")
        pgqueue.fail(conn, task.lease, HOSTILE_ERROR)
    return Seeded(
        running=running.id,
        completed=[r.id for r in done],
        retrying=retrying.id,
        dead=dead,
        hostile=hostile.id,
        completed_in_hour=completed_before + 4,
        dead_in_hour=dead_before + 4,
    )


# --- the server and the browser --------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Server:
    base: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


@contextlib.contextmanager
def serving(database_url: str, log: Path, tokens: str | None) -> Iterator[Server]:
    """``pgqueue serve`` as a real process on a free port, with ``tokens`` as its
    PGQUEUE_API_TOKENS (None: without tokens, on 127.0.0.1), until /healthz answers; stopped
    on leaving. Its output goes to ``log``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    env.pop("PGQUEUE_DATABASE_URL", None)
    if tokens is not None:
        env["PGQUEUE_API_TOKENS"] = tokens
    command = [sys.executable, "-m", "pgqueue", "--database-url", database_url, "serve"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    running = Server(f"http://127.0.0.1:{port}", process)

    def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(f"pgqueue serve exited with {process.returncode}: {log.read_text()}")
        try:
            return httpx.get(f"{running.base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 60, "pgqueue serve to answer /healthz")
        yield running
    finally:
        running.stop()


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """``pgqueue serve`` with a token, as a real process on a free port."""
    with serving(database_url, tmp_path / "serve.log", TOKEN) as running:
        yield running


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], database_url: str) -> Seeded:
    return seed(conn, database_url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab (its own sessionStorage); uncaught script errors and CSP violations fail
    the test."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    tab.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}")
            if "Content Security Policy" in message.text
            else None
        ),
    )
    yield tab
    context.close()
    assert problems == []


def sign_in(page: Any, server: Server, route: str = "") -> None:
    page.goto(f"{server.base}/dashboard{route}")
    page.fill("#token-input", TOKEN)
    page.click("#token-form button[type=submit]")
    expect(page.locator("#updated")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))


def screenshot(page: Any, name: str, *, full_page: bool = False) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.mouse.move(0, 0)  # no hover highlight in the picture
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=full_page)


def status_of(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str | None:
    row = conn.execute("SELECT status FROM pgqueue.tasks WHERE id = %s", (task_id,)).fetchone()
    return None if row is None else str(row[0])


def cell(page: Any, queue: str, priority: str, column: str) -> Any:
    return page.locator(
        f'tr[data-queue="{queue}"][data-priority="{priority}"] td[data-col="{column}"]'
    )


def row(page: Any, container: str, task_id: uuid.UUID) -> Any:
    return page.locator(f'#{container} tr[data-task-id="{task_id}"]')


# --- the tests -------------------------------------------------------------------------------


def test_the_running_list_marks_a_task_running_past_its_types_timeout(page, server, seeded, conn):
    """A running task older than its type's declared timeout (a sync handler's thread its
    worker waits for) is marked overrunning; the seeded one, with no timeout, is not."""
    from pgqueue.queries.driver import run
    from pgqueue.queries.task_types import TypeDeclaration, task_types_declare

    run(conn, task_types_declare(WORKER, [TypeDeclaration("video.thumbnail", timeout=30)]))
    two_minutes_ago = datetime.now(UTC) - timedelta(minutes=2)
    (stuck,) = pgqueue.enqueue_many(
        conn, [{"type": "video.thumbnail", "queue": "thumbs"}], now=two_minutes_ago
    )
    pgqueue.claim(
        conn, ["thumbs"], limit=1, worker_id=WORKER, lease_seconds=600, now=two_minutes_ago
    )

    sign_in(page, server)

    started = row(page, "running", stuck.id).locator('[data-col="started"]')
    expect(started.locator('[data-field="overrunning"]')).to_have_text(
        "overrunning its 30s timeout"
    )
    seeded_started = row(page, "running", seeded.running).locator('[data-col="started"]')
    expect(seeded_started).to_be_visible()
    expect(seeded_started.locator('[data-field="overrunning"]')).to_have_count(0)


def test_without_a_token_the_page_asks_for_one_and_shows_no_data(page, server, seeded):
    page.goto(f"{server.base}/dashboard")

    expect(page.locator("#token-form")).to_be_visible()
    assert page.url == f"{server.base}/dashboard/"  # the redirect that relative links need
    for section in ("#view-overview", "#view-dead-letters", "#view-task", "#nav"):
        expect(page.locator(section)).to_be_hidden()
    assert page.locator("tr[data-queue], tr[data-task-id], svg.throughput").count() == 0
    text = page.locator("body").inner_text()
    for seeded_name in ("send_email", "payment.capture", WORKER, "CardDeclined"):
        assert seeded_name not in text
    assert page.evaluate("sessionStorage.length") == 0

    # A wrong token is refused, and still nothing is shown.
    page.fill("#token-input", "not-the-token")
    page.click("#token-form button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("That token was refused.")
    expect(page.locator("#token-form")).to_be_visible()
    assert page.locator("tr[data-queue]").count() == 0

    # The right one opens the dashboard, and stays for this tab only (sessionStorage).
    page.fill("#token-input", TOKEN)
    page.click("#token-form button[type=submit]")
    expect(cell(page, "default", "high", "ready")).to_have_text("2")
    assert page.evaluate("sessionStorage.getItem('pgqueue.dashboard.token')") == TOKEN
    expect(page.locator("#token-form")).to_be_hidden()

    # Forgetting it clears the data along with the token.
    page.click("#forget")
    expect(page.locator("#token-form")).to_be_visible()
    assert page.locator("tr[data-queue]").count() == 0
    assert page.evaluate("sessionStorage.length") == 0


def test_the_overview_shows_depth_age_throughput_running_tasks_and_failures(page, server, seeded):
    sign_in(page, server)

    # Queues: depth by priority and status, and the age of the oldest ready task.
    expect(cell(page, "default", "high", "ready")).to_have_text("2")
    expect(cell(page, "default", "normal", "ready")).to_have_text("3")
    expect(cell(page, "default", "low", "ready")).to_have_text("1")
    expect(cell(page, "default", "normal", "oldest")).to_have_text(re.compile(r"^2h 0[01]m$"))
    expect(cell(page, "reports", "normal", "ready")).to_have_text("2")
    expect(cell(page, "reports", "normal", "scheduled")).to_have_text("1")
    expect(cell(page, "media", "normal", "running")).to_have_text("1")
    expect(cell(page, "media", "normal", "waiting")).to_have_text("1")
    expect(cell(page, "media", "normal", "ready")).to_have_text("·")
    # Completed tasks are not in the table (counting every one kept reads the whole table);
    # a queue with nothing queued, waiting, running or dead has no row at all.
    expect(page.locator('tr[data-queue="billing"]')).to_have_count(0)
    expect(page.locator('#queues td[data-col="completed"]')).to_have_count(0)
    expect(cell(page, "payments", "normal", "failed")).to_have_text("3")
    cards = page.locator("#cards")
    expect(cards.locator('[data-card="oldest"] .card-value')).to_have_text(
        re.compile(r"^2h 0[01]m$")
    )
    # Queued: ready and scheduled (tasks waiting for their parents are in the table only).
    expect(cards.locator('[data-card="queued"] .card-label')).to_have_text("Queued")
    expect(cards.locator('[data-card="queued"] .card-value')).to_have_text("10")
    expect(cards.locator('[data-card="oldest"] .card-label')).to_have_text("Oldest ready")
    expect(cards.locator('[data-card="running"] .card-value')).to_have_text("1")
    dead_total = str(seeded.dead_in_hour)
    expect(cards.locator('[data-card="dead"] .card-value')).to_have_text(dead_total)
    expect(page.locator("#dlq-count")).to_have_text(dead_total)

    # The chart: an SVG with a group per minute of the hour, bars where tasks finished, and
    # the same totals as the database.
    minutes = page.locator("#chart svg.throughput g.minute")
    expect(minutes).to_have_count(60)
    expect(page.locator("#chart svg rect.bar.completed").first).to_be_visible()
    assert page.locator("#chart svg rect.bar.failed").count() >= 5
    completed = sum(int(n) for n in minutes.evaluate_all("gs => gs.map(g => g.dataset.completed)"))
    failed = sum(int(n) for n in minutes.evaluate_all("gs => gs.map(g => g.dataset.failed)"))
    assert (completed, failed) == (seeded.completed_in_hour, seeded.dead_in_hour)
    rate = 100 * failed / (completed + failed)
    expect(page.locator("#chart-summary")).to_contain_text(f"failure rate {rate:.1f}%")

    # Running: the worker holding the lease, and when the lease runs out.
    running = row(page, "running", seeded.running)
    expect(running.locator('[data-col="worker"]')).to_have_text(WORKER)
    expect(running.locator('[data-col="type"]')).to_have_text("video.transcode")
    expect(running.locator('[data-col="lease"]')).to_contain_text(re.compile(r"in (9|10)m"))
    expect(running.locator('[data-col="attempt"]')).to_have_text("1 / 3")

    # Recent failures: the retrying task and the dead letters, each with its exception.
    retrying = row(page, "failures", seeded.retrying)
    expect(retrying).to_have_attribute("data-kind", "retrying")
    expect(retrying.locator('[data-field="error-summary"]')).to_have_text(HOOK_ERROR)
    expect(retrying.locator('[data-col="attempt"]')).to_have_text("1 / 5")
    expect(retrying.locator('[data-col="state"]')).to_contain_text(re.compile(r"next in (59|60)m"))
    for task_id in seeded.dead:
        dead = row(page, "failures", task_id)
        expect(dead).to_have_attribute("data-kind", "dead")
        expect(dead.locator('[data-field="error-summary"]')).to_have_text(CARD_ERROR)
    screenshot(page, "dashboard-overview", full_page=True)


def test_a_task_page_shows_payload_result_attempts_and_last_error(page, server, seeded):
    sign_in(page, server)

    # Reached by clicking the task in the recent failures.
    row(page, "failures", seeded.retrying).locator("a.id").click()

    expect(page).to_have_url(re.compile(rf"#/tasks/{seeded.retrying}$"))
    task = page.locator("#task")
    expect(task.locator("h2")).to_have_text(f"Task {seeded.retrying}")
    expect(task.locator('[data-field="attempts"]')).to_have_text("1 of 5")
    expect(task.locator('[data-field="status"]')).to_have_text("queued")
    expect(task.locator('[data-field="last-error"]')).to_have_text(HOOK_ERROR)
    expect(task.locator('[data-field="payload"]')).to_contain_text('"order": 1042')

    # A completed task: its result.
    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.completed[0]}")
    expect(task.locator('[data-field="status"]')).to_have_text("completed")
    expect(task.locator('[data-field="result"]')).to_contain_text(re.compile(r'"pdf": "s3://'))
    expect(task.locator('[data-field="attempts"]')).to_have_text("1 of 3")

    # A running task: its worker and lease.
    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.running}")
    expect(task.locator('[data-field="worker"]')).to_have_text(WORKER)
    expect(task.locator('[data-field="lease"]')).to_have_text(re.compile(r"^\d\d:\d\d:\d\d$"))

    # A dead letter: its error, and the buttons to replay or discard it.
    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.dead[0]}")
    expect(task.locator('[data-field="status"]')).to_have_text("failed (dead letter)")
    expect(task.locator('[data-field="last-error"]')).to_have_text(CARD_ERROR)
    expect(task.locator('[data-field="payload"]')).to_contain_text('"order": 1040')
    expect(task.locator("button.replay")).to_be_visible()
    screenshot(page, "dashboard-task")

    # An unknown id.
    page.goto(f"{server.base}/dashboard/#/tasks/{uuid.uuid4()}")
    expect(task.locator("h2")).to_have_text("No such task")


def test_a_real_failure_shows_its_exception_first_and_its_traceback_on_demand(
    page, server, seeded, conn
):
    """The dead letters a real worker made when capture_payment raised ValueError: every
    list shows the exception's type and message (not the start of a traceback), and the
    traceback opens on a click."""
    stored = pgqueue.get_task(conn, seeded.dead[0]).last_error
    assert stored is not None and stored.startswith(CARD_ERROR + "\nTraceback (most recent")
    sign_in(page, server)

    def check(where: Any) -> None:
        expect(
            where.locator('[data-field="error-summary"], [data-field="last-error"]')
        ).to_have_text(CARD_ERROR)
        trace = where.locator('[data-field="traceback"]')
        expect(trace.locator("pre")).to_be_hidden()  # on demand only
        trace.locator("summary").click()
        expect(trace.locator("pre")).to_be_visible()
        expect(trace.locator("pre")).to_contain_text("Traceback (most recent call last):")
        expect(trace.locator("pre")).to_contain_text("in capture_payment")
        expect(trace.locator("pre")).to_contain_text(re.compile(r"raise ValueError\("))

    check(row(page, "failures", seeded.dead[0]))
    page.goto(f"{server.base}/dashboard/#/dead-letters")
    check(row(page, "dead-letters", seeded.dead[1]))
    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.dead[2]}")
    check(page.locator("#task"))
    screenshot(page, "dashboard-traceback", full_page=True)


def test_replay_click_queues_the_dead_letter_again_and_it_leaves_the_list(
    page, server, seeded, conn
):
    sign_in(page, server, "#/dead-letters")
    target = row(page, "dead-letters", seeded.dead[0])
    expect(target.locator('[data-field="error-summary"]')).to_have_text(CARD_ERROR)
    expect(page.locator("#dead-letters tbody tr")).to_have_count(seeded.dead_in_hour)
    screenshot(page, "dashboard-dead-letters", full_page=True)

    target.locator("button.replay").click()
    expect(page.locator("#confirm-text")).to_contain_text(f"task …{str(seeded.dead[0])[-8:]}")
    page.click("#confirm-ok")

    wait_until(lambda: status_of(conn, seeded.dead[0]) == "queued", 20, "the replay")
    attempts = conn.execute(
        "SELECT attempts FROM pgqueue.tasks WHERE id = %s", (seeded.dead[0],)
    ).fetchone()
    assert attempts == (0,)
    expect(target).to_have_count(0)
    expect(page.locator("#notice")).to_contain_text("replayed")
    expect(page.locator("#dead-letters tbody tr")).to_have_count(seeded.dead_in_hour - 1)
    assert status_of(conn, seeded.dead[1]) == "failed"  # the others are untouched


def test_discard_asks_for_confirmation_and_then_deletes_the_dead_letter(page, server, seeded, conn):
    sign_in(page, server, "#/dead-letters")
    target = row(page, "dead-letters", seeded.dead[1])
    button = target.locator("button.discard")

    button.click()

    expect(page.locator("#confirm-title")).to_have_text("Discard 1 dead letter?")
    page.click("#confirm-cancel")
    expect(page.locator("#confirm")).to_be_hidden()
    assert status_of(conn, seeded.dead[1]) == "failed"  # cancelled: nothing changed

    button.click()
    expect(page.locator("#confirm-ok")).to_have_text("Discard 1 task")
    page.click("#confirm-ok")

    wait_until(lambda: status_of(conn, seeded.dead[1]) is None, 20, "the discard")
    expect(target).to_have_count(0)
    expect(page.locator("#notice")).to_contain_text("discarded")
    assert status_of(conn, seeded.dead[0]) == "failed"


def test_markup_in_payloads_and_errors_is_shown_as_text_and_never_runs(page, server, seeded):
    sign_in(page, server)
    hostile = row(page, "failures", seeded.hostile)
    expect(hostile.locator('[data-col="error"]')).to_have_text(HOSTILE_ERROR)

    page.goto(f"{server.base}/dashboard/#/tasks/{seeded.hostile}")

    task = page.locator("#task")
    expect(task.locator('[data-field="last-error"]')).to_have_text(HOSTILE_ERROR)
    payload = task.locator('[data-field="payload"]')
    expect(payload).to_contain_text(HOSTILE_PAYLOAD.replace('"', '\\"'))
    expect(payload).to_contain_text(HOSTILE_FIELD)
    assert page.locator('img[src="x"], #task script, #failures script').count() == 0
    assert page.evaluate("window.__pwned") is None


def test_the_page_refreshes_itself_and_says_so_when_a_refresh_fails(page, server, seeded, conn):
    sign_in(page, server)
    expect(cell(page, "default", "high", "ready")).to_have_text("2")
    assert page.locator('tr[data-queue="late-arrivals"]').count() == 0

    # New work shows up without a reload.
    pgqueue.enqueue(conn, "late", queue="late-arrivals", priority="low")
    expect(cell(page, "late-arrivals", "low", "ready")).to_have_text("1")
    expect(page.locator("#banner")).to_be_hidden()

    # The server goes away: the next refresh says it failed, and the data stays on screen.
    server.stop()
    expect(page.locator("#banner")).to_be_visible()
    expect(page.locator("#banner")).to_contain_text("Refresh failed")
    expect(cell(page, "late-arrivals", "low", "ready")).to_have_text("1")


def set_hidden(page: Any, hidden: bool) -> None:
    """What the browser does when the tab goes to the background (or comes back)."""
    page.evaluate(
        """hidden => {
            Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
            Object.defineProperty(document, "visibilityState",
                                  {configurable: true, get: () => hidden ? "hidden" : "visible"});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        hidden,
    )


def test_refreshing_pauses_while_the_tab_is_hidden_and_resumes_when_it_is_shown(
    page, server, seeded
):
    """The page's clock is Playwright's, moved by the test: each 5 s of it brings a refresh
    while the tab is visible, a minute of it brings none while hidden, and showing the tab
    again refreshes at once."""
    page.clock.install()
    sign_in(page, server)
    page.clock.pause_at(page.evaluate("Date.now()") + 1000)

    def is_stats(request: Any) -> bool:
        return "/api/v1/stats" in request.url

    with page.expect_request(is_stats):
        page.clock.run_for(5_000)

    set_hidden(page, True)
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    page.clock.run_for(60_000)
    page.evaluate("0")  # a round trip: any request made by now has been reported
    assert [url for url in seen if "/api/v1/" in url] == []
    expect(page.locator("#updated")).to_contain_text("paused while hidden")

    with page.expect_request(is_stats):
        set_hidden(page, False)
    expect(page.locator("#updated")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))
