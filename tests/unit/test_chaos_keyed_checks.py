"""The chaos run's keyed-scenario check (bench.chaos.check_keyed) on made-up journal lines:
it must count a key running more handlers than its limit, end a killed handler at its kill,
and never take an execution without an end for one that ended."""

from __future__ import annotations

from typing import Any

from bench.chaos import check_keyed


def execution(
    task: str, key: str, start: float, end: float | None, pid: int = 1, attempt: int = 1
) -> list[dict[str, Any]]:
    ident = {"task_id": task, "lease": f"lease-{task}-{attempt}", "attempt": attempt, "pid": pid}
    lines = [{"e": "start", "key": key, "at": start, **ident}]
    if end is not None:
        lines.append({"e": "end", "key": key, "at": end, **ident})
    return lines


def test_handlers_of_one_key_within_its_limit_are_no_violation():
    lines = execution("a", "k", 0, 2) + execution("b", "k", 1, 3) + execution("c", "k", 2, 4)
    got = check_keyed(lines, 2, {}, [])
    assert got["violations"] == []
    assert (got["peak"], got["executions"], got["keys"]) == (2, 3, 1)
    assert got["at_limit_s"] == 2.0  # two ran from 1 to 3


def test_more_handlers_of_a_key_than_its_limit_at_once_is_a_violation():
    lines = execution("a", "k", 0, 3) + execution("b", "k", 1, 2) + execution("c", "j", 1, 2)
    [v] = check_keyed(lines, 1, {}, [])["violations"]
    assert (v["key"], v["at"], v["seconds"], v["peak"]) == ("k", 1, 1, 2)
    assert v["executions"] == ["a attempt 1 pid 1", "b attempt 1 pid 1"]


def test_a_handler_killed_with_its_process_ended_at_the_kill():
    lines = execution("a", "k", 0, None, pid=7) + execution("a", "k", 5, 6, pid=8, attempt=2)
    got = check_keyed(lines, 1, {7: 4.0}, [])
    assert got["violations"] == []
    assert got["ended_by_kill"] == 1
    started_before_the_kill = execution("b", "k", 3, 3.5, pid=8)
    assert len(check_keyed(lines + started_before_the_kill, 1, {7: 4.0}, [])["violations"]) == 1


def test_a_process_that_died_unkilled_ends_its_handler_at_its_death():
    lines = execution("a", "k", 0, None, pid=7) + execution("a", "k", 5, 6, pid=8, attempt=2)
    got = check_keyed(lines, 1, {}, [(2.0, 7, 137)])
    assert (got["violations"], got["ended_by_death"]) == ([], 1)


def test_an_execution_without_an_end_or_a_death_runs_to_the_end():
    lines = execution("a", "k", 0, None, pid=7) + execution("b", "k", 100, 101, pid=8)
    got = check_keyed(lines, 1, {}, [])
    assert got["unended"] == 1
    assert len(got["violations"]) == 1
