"""The fair-claim benchmark's checks (bench.fair_keys) on made-up executions: each must count
what breaks its rule, and only that, so a run that reports 0 has looked."""

from __future__ import annotations

import pytest

from bench.fair_keys import Enqueued, Execution, fairness, idle_slots, jain, limit_violations


def run(key: str, start: float, end: float, task: str = "") -> Execution:
    return Execution(task or f"{key}-{start}", key, start, end, 1)


def test_more_handlers_of_a_key_than_its_limit_at_once_is_a_violation():
    runs = [run("a", 0, 10), run("a", 1, 5), run("a", 2, 3), run("b", 2, 3)]
    [v] = limit_violations(runs, limit=2)
    assert (v["key"], v["at"], v["seconds"], v["peak"]) == ("a", 2, 1, 3)


def test_a_start_at_the_moment_another_handler_of_its_key_ends_is_no_violation():
    runs = [run("a", 0, 1), run("a", 1, 2), run("a", 2, 3)]
    assert limit_violations(runs, limit=1) == []


def test_unkeyed_tasks_have_no_per_key_limit():
    runs = [run("-", 0, 10), run("-", 0, 10), run("-", 0, 10)]
    assert limit_violations(runs, limit=1) == []


def test_jain_is_one_when_every_key_gets_the_same_and_one_over_n_when_one_gets_all():
    assert jain([5, 5, 5, 5]) == 1
    assert jain([8, 0, 0, 0]) == pytest.approx(0.25)
    assert jain([]) is None


def test_an_idle_slot_counts_while_a_key_under_its_limit_has_a_ready_task():
    # Two slots, limit 1: key a has two tasks ready at 0; the first runs 1-2, the second
    # 2.5-3. Usable idle slots: 1 from 0 to 1 (a is under its limit), none while a runs (at
    # its limit, and nothing else waits), 1 from 2 to 2.5.
    runs = [run("a", 1, 2), run("a", 2.5, 3)]
    got, _ = idle_slots(
        runs,
        [Enqueued("a", 2, 0.0)],
        slots=2,
        limit=1,
        windows={"w": (0.0, 3.0)},
        tolerance=0.75,
    )
    w = got["w"]
    assert sorted(w.ages) == [(0.5, 1), (1.0, 1)]
    assert w.busy_share == pytest.approx(0.5)
    assert w.longest_busy_s == pytest.approx(1.0)
    assert w.lost_share == pytest.approx(1.5 / 6)
    assert w.lost_beyond_share == pytest.approx(0.25 / 6)  # the first waited 0.25 s too long
    assert w.running_mean == pytest.approx(1.5 / 3)


def test_no_idle_slot_is_counted_when_every_slot_runs_or_no_key_under_its_limit_waits():
    # One slot: busy from 1 to 3 while b waits (no free slot), then b runs.
    runs = [run("a", 0, 3), run("b", 3, 4)]
    got, _ = idle_slots(
        runs,
        [Enqueued("a", 1, 0.0), Enqueued("b", 1, 1.0)],
        slots=1,
        limit=4,
        windows={"w": (0.0, 4.0)},
        tolerance=0.0,
    )
    assert got["w"].lost_share == 0
    assert got["w"].ages == [(0.0, 1), (0.0, 1)]


def test_a_commit_acknowledged_after_its_handler_started_makes_no_idle_slot():
    runs = [run("a", 1.0, 2.0)]
    got, _ = idle_slots(
        runs,
        [Enqueued("a", 1, 1.001)],
        slots=4,
        limit=4,
        windows={"w": (0.0, 3.0)},
        tolerance=0.0,
    )
    assert got["w"].lost_share == 0


def test_the_unkeyed_tasks_fill_every_free_slot():
    got, _ = idle_slots(
        [],
        [Enqueued("-", 10, 0.0)],
        slots=4,
        limit=1,
        windows={"w": (0.0, 1.0)},
        tolerance=0.0,
    )
    assert got["w"].lost_share == 1.0  # 4 slots could run unkeyed tasks all along


def test_only_keys_backlogged_all_through_a_window_count_for_jain():
    runs = [run("a", t, t + 0.1) for t in (1, 2, 3)] + [run("b", t, t + 0.1) for t in (1, 2)]
    runs += [run("c", 5, 5.1)]
    _, waiting = idle_slots(
        runs,
        [Enqueued("a", 5, 0.0), Enqueued("b", 2, 0.0), Enqueued("c", 1, 0.0)],
        slots=4,
        limit=4,
        windows={"w": (0.0, 10.0)},
        tolerance=0.0,
        snapshots=[0.0],
    )
    [w] = fairness(runs, waiting, [(0.0, 10.0)])
    assert w["keys"] == 1  # a had tasks left at the end; b and c ran out
    assert w["jain"] == 1.0
