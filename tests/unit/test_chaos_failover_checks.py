"""The chaos run's failover checks (bench.chaos.check_failover) on made-up journals and logs:
each must count what breaks its rule, in the mode that forbids it, so a run that counts 0 has
looked."""

from __future__ import annotations

from typing import Any

from bench.chaos import STALLED_AFTER, check_failover

REQUESTED, PROMOTED = 99.9, 100.0  # the promotion was requested at t=99.9, done at t=100
LIVE = {"worker-0": (True, 0.2), "worker-1": (True, 0.4)}


def check(synchronous: bool = False, **given: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "acked": {},
        "missing": (),
        "executions": (),
        "completions": (),
        "workers": ("worker-0", "worker-1"),
        "sessions": LIVE,
        "probes": (),
    }
    args.update(given)
    return check_failover(synchronous, REQUESTED, PROMOTED, **args)


def test_an_enqueue_acknowledged_before_the_promotion_and_missing_is_lost_as_the_mode_allows():
    given = {"acked": {"a": 98.0, "b": 99.5}, "missing": ["b"]}
    loose = check(False, **given)
    assert loose["lost_acked_before"] == ["b"] and loose["violations"] == {}
    strict = check(True, **given)
    assert strict["violations"] == {"acknowledged enqueues lost with synchronous replication": 1}


def test_an_enqueue_acknowledged_after_the_promotion_must_never_be_lost():
    out = check(False, acked={"a": 101.0, "b": 99.95}, missing=["a", "b"])
    assert out["lost_acked_after"] == ["a", "b"]  # b: the promoted standby's, just before done
    assert out["violations"] == {"enqueues acknowledged after the promotion lost": 2}


def test_a_lost_enqueue_that_had_run_is_counted_apart():
    out = check(False, acked={"a": 99.0}, missing=["a"], executions=[("a", 99.1, 7)])
    assert out["lost_acked_before_had_run"] == ["a"]


def test_a_completion_acknowledged_before_the_promotion_then_run_again():
    given = {
        "executions": [("a", 99.0, 7), ("a", 103.0, 8)],
        "completions": [("a", 99.2, "worker-0"), ("a", 103.1, "worker-1")],
    }
    loose = check(False, **given)
    assert loose["completed_rerun_before"] == ["a"] and loose["running_rerun"] == []
    assert loose["violations"] == {}
    strict = check(True, **given)
    assert strict["violations"] == {
        "completions acknowledged with synchronous replication run again": 1
    }


def test_a_completion_acknowledged_after_the_promotion_must_never_run_again():
    out = check(
        False,
        executions=[("a", 100.5, 7), ("a", 102.0, 8)],
        completions=[("a", 100.6, "worker-0")],
    )
    assert out["completed_rerun_after"] == ["a"]
    assert out["violations"] == {"completions acknowledged after the promotion run again": 1}


def test_a_task_running_at_the_failover_may_run_again_in_either_mode():
    # Its first execution's completion was never acknowledged: its claim was lost, or its
    # lease ran out while the primary was down.
    given = {
        "executions": [("a", 99.0, 7), ("a", 101.0, 8)],
        "completions": [("a", 101.1, "worker-1")],
    }
    for synchronous in (False, True):
        out = check(synchronous, **given)
        assert out["running_rerun"] == ["a"] and out["violations"] == {}


def test_poison_tasks_run_several_times_by_design():
    out = check(True, executions=[("p", 98.0, 7), ("p", 99.0, 7), ("p", 101.0, 8)], poison={"p"})
    assert out["running_rerun"] == [] and out["violations"] == {}


def test_a_worker_not_listening_or_silent_on_the_promoted_standby_did_not_carry_on():
    sessions = {"worker-0": (False, 0.1), "worker-1": (True, STALLED_AFTER + 1)}
    out = check(True, sessions=sessions, workers=("worker-0", "worker-1", "worker-2"))
    assert out["stalled_workers"] == ["worker-0", "worker-1", "worker-2"]
    assert len(out["violations"]) == 1 and next(iter(out["violations"].values())) == 3


def test_workers_back_is_each_ones_first_completion_after_the_promotion():
    completions = [("a", 99.0, "worker-0"), ("b", 100.7, "worker-0"), ("c", 100.4, "worker-0")]
    out = check(True, completions=completions, executions=[("a", 98.9, 7)])
    assert out["worker_back_s"] == {"worker-0": 0.4}


def test_a_long_task_submitted_after_the_promotion_must_run_exactly_once():
    executions = [("p1", 100.5, 7), ("p2", 100.5, 8), ("p2", 104.0, 7)]
    out = check(False, executions=executions, probes=["p1", "p2", "p3"])
    assert out["probes_rerun"] == ["p2", "p3"]  # p3 never ran
    assert len(out["violations"]) == 1 and next(iter(out["violations"].values())) == 2
