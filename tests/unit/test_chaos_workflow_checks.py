"""The chaos run's workflow checks (bench.chaos.check_dependants) on made-up rows: each rule
must count the dependant that breaks it, so a run that counts 0 has looked."""

from __future__ import annotations

import random
import uuid
from typing import Any

from bench.chaos import check_dependants, plan_workflows

A, B, C, D = (uuid.UUID(int=n) for n in range(1, 5))


def task(status: str, finished_at: float | None = None, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "type": "chaos.step",
        "status": status,
        "finished_at": finished_at,
        "cancelled_by": None,
        "last_error": None,
        "result": None,
        "collect": None,
    }
    row.update(fields)
    if status == "completed" and "result" not in fields:
        row["result"] = {"task": "x", "i": 0}
    return row


def test_a_chain_step_that_started_after_its_parent_finished_is_fine_and_its_delay_reported():
    tasks = {A: task("completed", 10.0), B: task("completed", 12.0, ready_at=10.0)}
    out = check_dependants(tasks, [(B, A, 0, False)], {B: [(10.5, [tasks[A]["result"]])]})
    assert [out[k] for k in ("started_early", "stalled", "cancel_rule", "results_wrong")] == [
        [],
        [],
        [],
        [],
    ]
    assert out["dependants"] == 1 and out["releases"] == [0.5] and out["release_lags"] == [0.0]


def test_a_dependant_that_started_before_a_parent_finished_is_counted():
    tasks = {A: task("completed", 10.0), B: task("completed", 11.0), C: task("completed", 12)}
    edges = [(C, A, 0, False), (C, B, 1, False)]
    runs = {C: [(10.5, [tasks[A]["result"], tasks[B]["result"]])]}
    assert check_dependants(tasks, edges, runs)["started_early"] == [C]


def test_a_run_anyway_step_that_started_before_its_failed_parent_was_final_is_counted():
    tasks = {A: task("failed", 10.0), B: task("completed", 11.0)}
    out = check_dependants(tasks, [(B, A, 0, True)], {B: [(9.0, [None])]})
    assert out["started_early"] == [B]


def test_a_dependant_still_waiting_once_every_parent_is_final_is_stalled():
    tasks = {A: task("completed", 10.0), B: task("failed", 10.0), C: task("waiting")}
    out = check_dependants(tasks, [(C, A, 0, True), (C, B, 1, True)], {})
    assert out["stalled"] == [C]
    tasks[B] = task("running")
    assert check_dependants(tasks, [(C, A, 0, True), (C, B, 1, True)], {})["stalled"] == []


def test_a_dependant_of_a_dead_lettered_parent_must_be_cancelled_by_it_with_its_name():
    right = task("cancelled", 11.0, cancelled_by=A, last_error=f"parent {A} (chaos.poison) failed")
    tasks = {A: task("failed", 10.0, type="chaos.poison"), B: right}
    out = check_dependants(tasks, [(B, A, 0, False)], {})
    assert out["cancel_rule"] == [] and out["cancelled_by_parent"] == {B}
    for wrong in (
        task("completed", 11.0),  # ran
        task("cancelled", 11.0, cancelled_by=C, last_error=f"parent {C} failed"),  # not it
        task("cancelled", 11.0, cancelled_by=A, last_error="cancelled"),  # no reason naming it
        task("waiting"),  # never cancelled
    ):
        tasks[B] = wrong
        assert check_dependants(tasks, [(B, A, 0, False)], {})["cancel_rule"] == [B], wrong
    tasks[B] = right  # cancelled, but an execution of it started anyway
    assert check_dependants(tasks, [(B, A, 0, False)], {B: [(12.0, [None])]})["cancel_rule"] == [B]


def test_a_cancelled_parent_cascades_and_a_run_anyway_dependant_must_complete():
    tasks = {
        A: task("cancelled", 10.0, cancelled_by=D, last_error=f"parent {D} failed"),
        B: task("cancelled", 10.0, cancelled_by=A, last_error=f"parent {A} cancelled"),
        C: task("completed", 12.0),
    }
    edges = [(B, A, 0, False), (C, A, 0, True)]
    out = check_dependants(tasks, edges, {C: [(11.0, [None])]})
    assert out["cancel_rule"] == [] and out["ran_anyway"] == 1
    tasks[C] = task("cancelled", 10.0, cancelled_by=A, last_error=f"parent {A} cancelled")
    assert check_dependants(tasks, edges, {})["cancel_rule"] == [C]


def test_a_dependant_cancelled_by_a_parent_that_did_not_fail_breaks_the_rule():
    tasks = {A: task("completed", 10.0), B: task("cancelled", 11.0, cancelled_by=A)}
    out = check_dependants(tasks, [(B, A, 0, False)], {})
    assert out["cancel_rule"] == [B] and out["cancelled_by_parent"] == set()


def test_a_chord_callback_must_receive_every_member_result_in_order():
    members = {
        m: task("completed", 10.0, result={"task": str(m), "i": i}) for i, m in enumerate((A, B, C))
    }
    expected = [members[m]["result"] for m in (A, B, C)]
    tasks = {**members, D: task("completed", 12.0, collect=3)}
    edges = [(D, m, i, False) for i, m in enumerate((A, B, C))]
    assert check_dependants(tasks, edges, {D: [(11.0, expected)]})["results_wrong"] == []
    for got in (expected[:2], [expected[1], expected[0], expected[2]], [*expected[:2], None]):
        out = check_dependants(tasks, edges, {D: [(11.0, expected), (11.5, got)]})
        assert out["results_wrong"] == [D], got
    # Positions that disagree with the members' own order (the plan's) are caught too.
    swapped = [(D, A, 1, False), (D, B, 0, False), (D, C, 2, False)]
    got = [expected[1], expected[0], expected[2]]
    assert check_dependants(tasks, swapped, {D: [(11.0, got)]})["results_wrong"] == [D]


def test_the_workflow_plan_has_every_kind_and_about_one_poison_in_a_hundred_tasks():
    for n in (30, 3000):
        flows = plan_workflows("workflow", n, random.Random(1))
        kinds = [f.kind for f in flows]
        assert {"chain", "group", "chord", "dag", "doomed"} <= set(kinds)
        assert sum(f.tasks for f in flows) >= n
        assert kinds.count("doomed") == max(2, round(n / 100))
