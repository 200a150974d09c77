"""Workflows through real ``pgqueue worker`` processes: a chain and a chord of
function tasks, enqueued in one transaction, run by two worker processes (which of them runs
what is theirs to decide); each step gets its parents' results, and the chord's callback
starts only after every member completed, and runs once."""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg
import pytest
from test_worker_processes import FAST, Workers, wait_until
from workflow_handlers import wf_add, wf_collect, wf_slow, wf_square

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


def running(conn: psycopg.Connection[Any], ids: list[Any]) -> bool:
    statuses = [pgqueue.get_task(conn, i).status for i in ids]
    return pgqueue.TaskStatus.RUNNING in statuses and pgqueue.TaskStatus.COMPLETED in statuses


@pytest.mark.slow
def test_a_chord_survives_a_worker_killed_with_sigkill_and_its_callback_runs_once(
    database_url: str, conn: psycopg.Connection[Any], workers: Workers
):
    settings = ("--concurrency", "2", "--lease-seconds", "2", *FAST)
    members = 8
    handle = pgqueue.chord(
        [wf_slow.s(i) for i in range(members)], wf_collect.s(label="after a crash")
    ).enqueue(conn)
    header = [t.id for t in handle.tasks[:members]]
    a = workers.start(database_url, *settings, name="a", registry=REGISTRY)
    wait_until(lambda: running(conn, header), timeout=60, what="members to run on A", alive=[a])
    os.kill(a.pid, signal.SIGKILL)
    a.proc.wait(timeout=10)
    assert pgqueue.get_task(conn, handle.tasks[-1].id).status is pgqueue.TaskStatus.WAITING

    b = workers.start(database_url, *settings, name="b", registry=REGISTRY)
    wait_until(lambda: finished(conn, handle), timeout=90, what="the chord to finish", alive=[b])

    callback = pgqueue.get_task(conn, handle.tasks[-1].id)
    assert callback.status is pgqueue.TaskStatus.COMPLETED
    assert callback.attempts == 1  # released once, run once
    assert callback.result["squares"] == list(range(members))  # every member, in order
    tasks = [pgqueue.get_task(conn, i) for i in header]
    assert max(t.attempts for t in tasks) == 2, "a member killed with A ran again on B"
    assert all(t.finished_at is not None and t.finished_at <= callback.started_at for t in tasks)
