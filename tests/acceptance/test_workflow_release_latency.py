"""A released dependant is claimed as soon as its parent's commit wakes the worker, not at the
worker's next full walk of the claim index.

The release NOTIFYs the queue, and the woken claim walks the index from where this worker's
last claim ended (pgqueue/worker/claim_starts.py): a dependant keeps the ``created_at`` of its
workflow's enqueue, so once the worker has claimed a task created later (any other traffic on
the queue) and the dependant is older than the walk's margin (1 s), the woken claim steps past
it. It then waits for the next full walk: up to the poll interval, or
20 times a full walk's cost (seconds while an old snapshot is held). Found by bench.chaos's
workflow scenario (release delay p50 0.65 s with --poll-interval 0.5). Fixed: the release also
NOTIFYs ``pgqueue_released``, on which the worker forgets that queue's starts."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_worker_processes import Workers, wait_until
from workflow_handlers import wf_add, wf_after, wf_nap

import pgqueue

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

REGISTRY = "workflow_handlers:tasks"
# Seconds between the worker's full walks of the claim index (and about how long an idle
# claimer sleeps): the walk that takes the parent is a full one, so without the release's wake
# the dependant waits for the next, POLL after the parent's claim: about POLL - NAP (56 s)
# after its release.
POLL = 60.0
# The parent's run: its dependant is then older than the walk's 1 s margin, and the newer task
# (newer_traffic) is claimed long before the run ends, on a busy machine too.
NAP = 4.0
# The claim that a release's NOTIFY wakes comes within this of the parent's commit, on a busy
# machine too; far below POLL - NAP, so that it cannot be the next full walk's.
PROMPT = 10.0


def listening(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN pgqueue'"
        " AND datname = current_database()"
    ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize(
    "newer_traffic", [False, True], ids=["quiet_queue", "newer_task_claimed_meanwhile"]
)
def test_a_released_dependant_starts_when_its_parent_commits(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers, newer_traffic: bool
):
    w = workers.start(
        database_url,
        *("--poll-interval", str(POLL), "--sweep-interval", "0.5", "--concurrency", "4"),
        registry=REGISTRY,
    )
    wait_until(lambda: listening(conn), timeout=60, what="the worker to listen", alive=[w])
    handle = pgqueue.chain(wf_nap.s(NAP), wf_after.s()).enqueue(conn)
    parent_id, child_id = (t.id for t in handle.tasks)
    wait_until(
        lambda: pgqueue.get_task(conn, parent_id).status is pgqueue.TaskStatus.RUNNING,
        timeout=30,
        what="the parent to run",
        alive=[w],
    )
    newer = wf_add.enqueue(conn, 1, 2) if newer_traffic else None  # a free slot: claimed now
    wait_until(
        lambda: pgqueue.get_task(conn, parent_id).status is pgqueue.TaskStatus.COMPLETED,
        timeout=30,
        what="the parent to complete",
        alive=[w],
    )
    parent = pgqueue.get_task(conn, parent_id)
    assert parent.finished_at is not None
    if newer is not None:  # the case needs the newer task claimed before the release
        claimed = pgqueue.get_task(conn, newer.id).started_at
        assert claimed is not None and claimed < parent.finished_at, (
            f"the newer task was not claimed while the parent ran (claimed at {claimed}, "
            f"parent finished at {parent.finished_at})"
        )
    child = wait_until(
        lambda: (c := pgqueue.get_task(conn, child_id)).started_at is not None and c,
        timeout=PROMPT,
        what=f"the dependant's claim within {PROMPT} s of its release (the next full walk of "
        f"the claim index is {POLL} s away)",
        alive=[w],
    )
    assert child.started_at is not None
    delay = (child.started_at - parent.finished_at).total_seconds()
    assert delay < PROMPT, f"released at the parent's commit, claimed {delay:.2f} s later"
