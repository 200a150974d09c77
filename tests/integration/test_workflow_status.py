"""Operating workflows: the pgqueue.workflows view and pgqueue.workflow() derive the
same status from the tasks, cancel_workflow cancels what has not finished, and wait_workflow
returns the final result or raises, against real PostgreSQL.

Waits use a poll interval of an hour: a wait that returns before its two-minute timeout was
woken by the notification of a finishing task, not by a poll.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg
import pytest
from processes import wait_until

import pgqueue
import pgqueue.aio
from pgqueue.enqueue import new_task_id
from pgqueue.models import TaskStatus, WorkflowStatus

NO_POLL = 3600.0
LONG = 120.0


def build(conn: psycopg.Connection[Any], *, members: int = 2, **options: Any) -> dict[str, Any]:
    """A chord in one enqueue_many: ``members`` tasks 'm', then 'cb' depending on all."""
    wf = new_task_id()
    heads = [pgqueue.prepare("m", {"i": i}, workflow_id=wf, **options) for i in range(members)]
    callback = pgqueue.prepare("cb", {}, depends_on=heads, workflow_id=wf)
    pgqueue.enqueue_many(conn, [*heads, callback])
    return {"id": wf, "heads": [h.id for h in heads], "callback": callback.id}


def claim(conn: psycopg.Connection[Any], type: str | None = None) -> list[pgqueue.ClaimedTask]:
    tasks = pgqueue.claim(conn, ["default"], limit=100, worker_id="w")
    return [t for t in tasks if type is None or t.type == type]


def view(conn: psycopg.Connection[Any], wf: uuid.UUID) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    row = cur.execute("SELECT * FROM pgqueue.workflows WHERE workflow_id = %s", [wf]).fetchone()
    assert row is not None
    return row


def assert_view_agrees(conn: psycopg.Connection[Any], info: pgqueue.WorkflowInfo) -> None:
    row = view(conn, info.id)
    assert row["status"] == info.status.value
    assert row["tasks"] == len(info.tasks)
    for status in TaskStatus:
        assert row[status.value] == info.counts[status.value], status
    assert row["created_at"] == info.created_at
    assert row["finished_at"] == info.finished_at


def test_a_workflow_with_waiting_tasks_is_running_with_its_edges(conn: Any) -> None:
    wf = build(conn)
    info = pgqueue.workflow(conn, wf["id"])
    assert info.status is WorkflowStatus.RUNNING
    assert info.counts["queued"] == 2 and info.counts["waiting"] == 1
    assert [t.id for t in info.tasks] == [*wf["heads"], wf["callback"]]  # build order
    cb = info.task(wf["callback"])
    assert cb.parents == tuple(wf["heads"]) and cb.children == ()
    assert info.task(wf["heads"][0]).children == (wf["callback"],)
    assert info.finished_at is None
    assert_view_agrees(conn, info)


def test_completed_workflow_has_the_sinks_result_and_a_finish_time(conn: Any) -> None:
    wf = build(conn)
    for t in claim(conn):
        pgqueue.complete(conn, t.lease, t.payload["i"] * 10)
    (cb,) = claim(conn)
    assert cb.id == wf["callback"]
    pgqueue.complete(conn, cb.lease, {"sum": 10})
    info = pgqueue.workflow(conn, str(wf["id"]))
    assert info.status is WorkflowStatus.COMPLETED
    assert info.result == {"sum": 10}
    assert info.finished_at is not None
    assert_view_agrees(conn, info)


def test_several_sinks_give_the_list_of_their_results_in_build_order(conn: Any) -> None:
    wf = new_task_id()
    a = pgqueue.prepare("a", {}, workflow_id=wf)
    b = pgqueue.prepare("b", {}, depends_on=[a], workflow_id=wf)
    c = pgqueue.prepare("c", {}, depends_on=[a], workflow_id=wf)
    pgqueue.enqueue_many(conn, [a, b, c])
    (ta,) = claim(conn)
    pgqueue.complete(conn, ta.lease, "a")
    for t in sorted(claim(conn), key=lambda t: t.type, reverse=True):
        pgqueue.complete(conn, t.lease, t.type)
    info = pgqueue.workflow(conn, wf)
    assert [t.id for t in info.sinks] == [b.id, c.id]
    assert info.result == ["b", "c"]


def test_a_dead_lettered_member_makes_the_workflow_failed(conn: Any) -> None:
    wf = build(conn, max_attempts=1)
    first, second = claim(conn)
    pgqueue.fail(conn, first.lease, "boom")
    info = pgqueue.workflow(conn, wf["id"])
    # The callback was cancelled with it, but the other member still runs.
    assert info.task(wf["callback"]).status is TaskStatus.CANCELLED
    assert info.status is WorkflowStatus.RUNNING
    assert_view_agrees(conn, info)
    pgqueue.complete(conn, second.lease, 1)
    info = pgqueue.workflow(conn, wf["id"])
    assert info.status is WorkflowStatus.FAILED
    assert info.counts == {**info.counts, "failed": 1, "completed": 1, "cancelled": 1}
    assert_view_agrees(conn, info)


def test_cancel_workflow_cancels_queued_and_waiting_and_asks_running_ones_to_stop(
    conn: Any,
) -> None:
    wf = build(conn, members=3)
    running, done = pgqueue.claim(conn, ["default"], limit=2, worker_id="w")
    pgqueue.complete(conn, done.lease, "kept")
    info = pgqueue.cancel_workflow(conn, wf["id"])
    by_id = {t.id: t.task for t in info.tasks}
    assert by_id[done.id].status is TaskStatus.COMPLETED  # finished: left as it is
    assert by_id[running.id].status is TaskStatus.RUNNING
    assert by_id[running.id].cancel_requested  # cooperative, as DELETE /tasks
    assert by_id[wf["callback"]].status is TaskStatus.CANCELLED
    assert [t.status for t in by_id.values()].count(TaskStatus.CANCELLED) == 2
    assert info.status is WorkflowStatus.RUNNING
    pgqueue.cancel_leased(conn, running.lease, "asked to stop")
    info = pgqueue.workflow(conn, wf["id"])
    assert info.status is WorkflowStatus.CANCELLED
    assert_view_agrees(conn, info)
    # Cancelling a finished workflow changes nothing.
    assert pgqueue.cancel_workflow(conn, wf["id"]) == info


def test_cancel_workflow_notifies_the_worker_holding_a_running_task(
    conn: Any, connect: Any
) -> None:
    wf = build(conn, members=1)
    (running,) = claim(conn)
    listener = connect(direct=True)
    listener.execute("LISTEN pgqueue_cancel")
    pgqueue.cancel_workflow(conn, wf["id"])
    notes = list(listener.notifies(timeout=LONG, stop_after=1))
    assert [n.payload for n in notes] == [f"w {running.id}"]


def test_unknown_or_malformed_workflow_id_is_workflow_not_found(conn: Any) -> None:
    ghost = uuid.uuid4()
    for call in (pgqueue.workflow, pgqueue.cancel_workflow):
        with pytest.raises(pgqueue.WorkflowNotFound, match=str(ghost)):
            call(conn, ghost)
    with pytest.raises(pgqueue.WorkflowNotFound):
        pgqueue.workflow(conn, "not-a-uuid")
    with pytest.raises(pgqueue.WorkflowNotFound):
        pgqueue.wait_workflow(conn, ghost, timeout=1)
    # A plain task's id is not a workflow's.
    plain = pgqueue.enqueue(conn, "p", {})
    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.workflow(conn, plain.id)


# --- waiting ---------------------------------------------------------------------------------


class Waiting:
    """wait_workflow in a thread on its own autocommit connection."""

    def __init__(self, url: str, wf: uuid.UUID, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", LONG)
        kwargs.setdefault("poll_interval", NO_POLL)
        self.result: Any = None
        self.error: BaseException | None = None
        self._conn = psycopg.connect(url, autocommit=True)
        self._thread = threading.Thread(target=self._run, args=(wf, kwargs))
        self._thread.start()

    def _run(self, wf: uuid.UUID, kwargs: dict[str, Any]) -> None:
        try:
            self.result = pgqueue.wait_workflow(self._conn, wf, **kwargs)
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(LONG + 30)
        assert not self._thread.is_alive()
        self._conn.close()


def registered(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.task_waiters").fetchone()
    assert row is not None
    return int(row[0])


def test_wait_workflow_returns_the_final_result_when_woken(conn: Any, database_url: str) -> None:
    wf = build(conn)
    waiting = Waiting(database_url, wf["id"])
    wait_until(lambda: registered(conn) > 0, LONG, "the wait's registration")
    for t in claim(conn):
        pgqueue.complete(conn, t.lease, t.payload["i"])
    (cb,) = claim(conn)
    pgqueue.complete(conn, cb.lease, [0, 1])
    waiting.join()
    assert waiting.error is None
    assert waiting.result == [0, 1]
    assert registered(conn) == 0  # the waiter removed its rows


def test_wait_workflow_raises_workflow_failed_naming_the_dead_task(
    conn: Any, database_url: str
) -> None:
    wf = build(conn, members=1, max_attempts=1)
    waiting = Waiting(database_url, wf["id"])
    wait_until(lambda: registered(conn) > 0, LONG, "the wait's registration")
    (t,) = claim(conn)
    pgqueue.fail(conn, t.lease, "ValueError: boom")
    waiting.join()
    assert isinstance(waiting.error, pgqueue.WorkflowFailed)
    assert waiting.error.task.id == t.id
    assert str(t.id) in str(waiting.error) and "boom" in str(waiting.error)


def test_wait_workflow_raises_workflow_cancelled(conn: Any, database_url: str) -> None:
    wf = build(conn)
    waiting = Waiting(database_url, wf["id"])
    wait_until(lambda: registered(conn) > 0, LONG, "the wait's registration")
    pgqueue.cancel_workflow(conn, wf["id"])
    waiting.join()
    assert isinstance(waiting.error, pgqueue.WorkflowCancelled)
    assert waiting.error.info.status is WorkflowStatus.CANCELLED


def test_wait_workflow_times_out_with_a_wait_timeout(conn: Any) -> None:
    wf = build(conn)
    with pytest.raises(pgqueue.WaitTimeout, match=str(wf["id"])) as info:
        pgqueue.wait_workflow(conn, wf["id"], timeout=0.2)
    assert isinstance(info.value, pgqueue.WorkflowWaitTimeout)
    assert info.value.info.status is WorkflowStatus.RUNNING
    assert registered(conn) == 0
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.wait_workflow(conn, wf["id"], timeout=-1)


def test_wait_workflow_inside_a_transaction_is_refused(connect: Any, conn: Any) -> None:
    wf = build(conn)
    tx = connect(autocommit=False)
    tx.execute("SELECT 1")
    with pytest.raises(pgqueue.WaitInTransaction):
        pgqueue.wait_workflow(tx, wf["id"], timeout=1)


def test_async_twins(conn: Any, database_url: str) -> None:
    wf = build(conn, members=1)

    async def scenario() -> Any:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            info = await pgqueue.aio.workflow(aconn, wf["id"])
            assert info.status is WorkflowStatus.RUNNING
            waiting = asyncio.create_task(
                pgqueue.aio.wait_workflow(aconn, wf["id"], timeout=LONG, poll_interval=NO_POLL)
            )
            while not registered(conn):
                await asyncio.sleep(0.02)
            await asyncio.to_thread(
                lambda: [pgqueue.complete(conn, t.lease, 1) for t in claim(conn)]
            )
            await asyncio.to_thread(
                lambda: [pgqueue.complete(conn, t.lease, 2) for t in claim(conn)]
            )
            result = await asyncio.wait_for(waiting, LONG + 30)
            again = await pgqueue.aio.cancel_workflow(aconn, wf["id"])
            return result, again

    result, again = asyncio.run(scenario())
    assert result == 2
    assert again.status is WorkflowStatus.COMPLETED


# --- HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def http(database_url: str) -> Any:
    from test_api import halt, launch

    from pgqueue.api import ApiSettings

    live = launch(ApiSettings(database_url=database_url))
    yield live.client
    halt([live])


def test_http_get_workflow_and_the_task_edges(conn: Any, http: Any) -> None:
    wf = build(conn)
    body = http.get(f"/api/v1/workflows/{wf['id']}").json()
    assert body["status"] == "running" and body["counts"]["waiting"] == 1
    assert [t["task_id"] for t in body["tasks"]] == [str(i) for i in [*wf["heads"], wf["callback"]]]
    assert body["tasks"][2]["parents"] == [str(h) for h in wf["heads"]]
    cb = http.get(f"/api/v1/tasks/{wf['callback']}").json()
    assert cb["status"] == "waiting" and cb["workflow_id"] == str(wf["id"])
    assert [(p["task_id"], p["type"], p["status"]) for p in cb["parents"]] == [
        (str(h), "m", "queued") for h in wf["heads"]
    ]
    assert cb["children"] == []
    head = http.get(f"/api/v1/tasks/{wf['heads'][0]}").json()
    assert head["parents"] == [] and head["children"] == [
        {"task_id": str(wf["callback"]), "type": "cb", "status": "waiting"}
    ]
    # A plain task keeps its old answer, with the new fields empty.
    plain = http.get(f"/api/v1/tasks/{pgqueue.enqueue(conn, 'p', {}).id}").json()
    assert (plain["workflow_id"], plain["parents"], plain["children"]) == (None, [], [])
    assert plain["cancelled_by"] is None


def test_http_task_names_the_parent_that_cancelled_it(conn: Any, http: Any) -> None:
    parent = pgqueue.enqueue(conn, "p", {})
    child = pgqueue.enqueue(conn, "c", {}, depends_on=[parent])
    conn.commit()
    pgqueue.cancel(conn, parent.id)
    conn.commit()
    body = http.get(f"/api/v1/tasks/{child.id}").json()
    assert (body["status"], body["cancelled_by"]) == ("cancelled", str(parent.id))
    assert body["last_error"] == f"parent {parent.id} (p) cancelled"


def test_http_delete_workflow_cancels_it_202_while_a_task_runs(conn: Any, http: Any) -> None:
    wf = build(conn)
    running = pgqueue.claim(conn, ["default"], limit=1, worker_id="w")[0]
    response = http.delete(f"/api/v1/workflows/{wf['id']}")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "running"
    pgqueue.cancel_leased(conn, running.lease, "stopped")
    response = http.delete(f"/api/v1/workflows/{wf['id']}")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_http_unknown_workflow_is_404(http: Any) -> None:
    for method in ("GET", "DELETE"):
        for wid in (str(uuid.uuid4()), "nope"):
            response = http.request(method, f"/api/v1/workflows/{wid}")
            assert response.status_code == 404, (method, wid, response.text)
            assert "no workflow" in response.json()["message"]


def test_the_dba_pages_workflow_queries_run_and_show_the_parents(conn: Any) -> None:
    """The workflow queries of the DBA how-to ("Follow a workflow"), run as printed (with an
    id)."""
    import pathlib
    import re

    page = pathlib.Path(__file__).parents[2] / "docs" / "how-to" / "dba.md"
    text = page.read_text(encoding="utf-8")
    section = text[text.index("## Follow a workflow") :]
    block = section[section.index("```sql") + 6 : section.index("```", section.index("```sql") + 6)]
    wf = build(conn, max_attempts=1)
    first, _ = claim(conn)
    pgqueue.fail(conn, first.lease, "boom")
    statements = [s for s in re.split(r";\s*\n", block) if s.strip()]
    assert len(statements) == 4
    rows = []
    for sql in statements:
        sql = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
        rows.append(conn.execute(sql.replace("0193...", str(wf["id"]))).fetchall())
    assert rows[0][0][1] == "running"
    tasks = {r[0]: r for r in rows[2]}
    assert tasks[wf["callback"]][5] == list(wf["heads"])
    assert sorted(tasks[wf["callback"]][6]) == ["failed", "running"]
    assert [r[0] for r in rows[3]] == [wf["callback"]]
