"""Workflows through real ``pgqueue worker`` processes (issue 16): a chain and a chord of
function tasks, enqueued in one transaction, run by two worker processes (which of them runs
what is theirs to decide); each step gets its parents' results, and the chord's callback
starts only after every member completed, and runs once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, wait_until
from workflow_handlers import wf_add, wf_collect, wf_square

import pgqueue

pytestmark = [pytest.mark.timeout(180)]

REGISTRY = "workflow_handlers:tasks"


def finished(conn: psycopg.Connection[Any], handle: pgqueue.WorkflowHandle) -> bool:
    final = {pgqueue.TaskStatus.COMPLETED, pgqueue.TaskStatus.FAILED, pgqueue.TaskStatus.CANCELLED}
    return all(pgqueue.get_task(conn, t.id).status in final for t in handle.tasks)


def test_worker_processes_run_a_chain_and_a_chord_with_results_passed(
    database_url: str, conn: psycopg.Connection[Any], connect: Any, workers: Workers
):
    procs = [workers.start(database_url, *FAST, registry=REGISTRY) for _ in range(2)]
    tx = connect(autocommit=False)
    chain = pgqueue.chain(wf_add.s(1, 2), wf_add.s(10), wf_add.s(100)).enqueue(tx)
    members = 40
    chord = pgqueue.chord(
        [wf_square.s(i) for i in range(members)], wf_collect.s(label="squares")
    ).enqueue(tx)
    tx.commit()

    wait_until(
        lambda: finished(conn, chain) and finished(conn, chord),
        timeout=120,
        what="the workflows to finish",
        alive=procs,
    )

    assert [pgqueue.get_task(conn, t.id).result for t in chain.tasks] == [3, 13, 113]
    assert chain.wait(conn, timeout=5) == 113
    header = [pgqueue.get_task(conn, t.id) for t in chord.tasks[:members]]
    callback = pgqueue.get_task(conn, chord.tasks[-1].id)
    assert callback.status is pgqueue.TaskStatus.COMPLETED and callback.attempts == 1
    assert callback.result["squares"] == [i * i for i in range(members)]  # in order
    assert callback.result["parents"] == [str(t.id) for t in header]
    assert callback.started_at is not None
    assert all(m.finished_at is not None and m.finished_at <= callback.started_at for m in header)
    assert {m.workflow_id for m in header} == {chord.id} != {chain.id}
