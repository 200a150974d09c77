"""docs/hooks.md's Sentry recipe, run as written, with a real worker and sentry-sdk.

The recipe's block is read from the page and run against this module's registry at import,
as an application's tasks module would. Sentry's transport is replaced by one that appends
each event to a file (no network): the process executor's children, spawned, import this
module and report from their own process, and their events reach the test the same way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import run_worker_until

import pgqueue
from pgqueue.executor import TaskContext

sentry_sdk = pytest.importorskip("sentry_sdk")
from sentry_sdk.envelope import Envelope  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
EVENTS_FILE = "PGQUEUE_TEST_SENTRY_EVENTS"  # where the events go (set by the test)


class FileTransport(Transport):
    """Each Sentry event as a line of JSON in the file ``EVENTS_FILE`` names."""

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.data_category == "error" and item.payload.json is not None:
                with open(os.environ[EVENTS_FILE], "a", encoding="utf-8") as f:
                    f.write(json.dumps(item.payload.json, default=str) + "\n")


def init_sentry() -> None:
    # No default integrations: the logging one would report pgqueue's ERROR logs as well.
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1", transport=FileTransport, default_integrations=False
    )


def recipe() -> str:
    found = re.search(r"<!-- sentry recipe -->\s*```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, "docs/hooks.md has no block after <!-- sentry recipe -->"
    return found.group(1)


tasks = pgqueue.TaskRegistry()
exec(compile(recipe(), str(DOC), "exec"), {"tasks": tasks, "__name__": "sentry_recipe"})

if os.environ.get(EVENTS_FILE):  # a spawned child process of the process executor
    init_sentry()


class CardServiceDown(Exception):
    pass


def _charge(payload: dict[str, Any], ctx: TaskContext) -> None:
    raise CardServiceDown(f"card service down (attempt {ctx.attempt})")


async def _charge_async(payload: dict[str, Any], ctx: TaskContext) -> None:
    raise CardServiceDown(f"card service down (attempt {ctx.attempt})")


def _retry_once(payload: dict[str, Any], ctx: TaskContext) -> str:
    if ctx.attempt == 1:
        raise pgqueue.Retry("not yet", after=0)
    return "done"


RETRY_AT_ONCE = pgqueue.RetryPolicy(2, base=0, cap=0)
for _executor in ("thread", "async", "process"):
    tasks.handler(f"charge.{_executor}", executor=_executor, retry=RETRY_AT_ONCE)(
        _charge_async if _executor == "async" else _charge
    )
tasks.handler("retry_once", retry=RETRY_AT_ONCE)(_retry_once)


@pytest.mark.parametrize("executor", ["thread", "async", "process"])
def test_a_failing_tasks_sentry_events_carry_its_id_type_and_attempt(
    database_url: str,
    conn: psycopg.Connection[Any],
    executor: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events_file = tmp_path / "events.jsonl"
    monkeypatch.setenv(EVENTS_FILE, str(events_file))

    def events() -> list[dict[str, Any]]:
        if not events_file.exists():
            return []
        return [json.loads(line) for line in events_file.read_text().splitlines()]

    init_sentry()
    try:
        task_id = pgqueue.enqueue(conn, f"charge.{executor}", {}).id
        retried_id = pgqueue.enqueue(conn, "retry_once", {}).id
        run_worker_until(
            database_url,
            tasks,
            lambda: (
                len(events()) >= 2
                and pgqueue.get_task(conn, task_id).status is pgqueue.TaskStatus.FAILED
                and pgqueue.get_task(conn, retried_id).status is pgqueue.TaskStatus.COMPLETED
            ),
        )
    finally:
        sentry_sdk.get_client().close()

    reported = sorted(events(), key=lambda e: int(e["tags"]["pgqueue.attempt"]))
    assert len(reported) == 2  # one per failed attempt; the Retry is not an error
    for attempt, event in enumerate(reported, start=1):
        tags = {k: str(v) for k, v in event["tags"].items()}
        assert tags["pgqueue.task_id"] == str(task_id)
        assert tags["pgqueue.type"] == f"charge.{executor}"
        assert tags["pgqueue.attempt"] == str(attempt)
        assert tags["pgqueue.last_attempt"] == str(attempt == 2)
        [exception] = event["exception"]["values"]
        assert exception["type"] == "CardServiceDown"
        assert exception["value"] == f"card service down (attempt {attempt})"
        # The real traceback, from where the handler raised it.
        frames = exception["stacktrace"]["frames"]
        assert frames[-1]["function"] in ("_charge", "_charge_async")
