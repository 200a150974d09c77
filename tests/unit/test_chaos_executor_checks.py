"""The chaos run's executor-scenario checks (bench.chaos) on made-up executions: each must
count what breaks its rule, so a run that counts 0 has looked."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.chaos import Execution, find_overlaps, innocent_reruns, wrong_causes
from bench.chaos_handlers import proc_stat, still_running

KILLED = {900: 100.0}  # worker pid 900, SIGKILLed at t=100


def run(
    attempt: int, started: float, ended: float | None, worker: int = 1, pid: int = 0
) -> Execution:
    return Execution(attempt, pid or 10 + attempt, worker, started, ended)


def test_executions_one_after_the_other_do_not_overlap():
    runs = {"t": [run(1, 10.0, 11.0), run(2, 11.5, 12.0)]}
    assert find_overlaps(runs, KILLED) == []


def test_a_second_execution_before_the_first_recorded_end_overlaps():
    runs = {"t": [run(2, 10.5, 12.0), run(1, 10.0, 11.0)]}  # any order in
    [x] = find_overlaps(runs, KILLED)
    assert (x["first"], x["second"], x["how"], x["explained"]) == (
        "attempt 1 pid 11",
        "attempt 2 pid 12",
        "interval",
        False,
    )


def test_a_first_execution_without_an_end_overlaps_only_if_found_running():
    dead = {"t": [run(1, 10.0, None), run(2, 15.0, 15.1)]}
    assert find_overlaps(dead, KILLED) == []
    later = Execution(2, 12, 1, 15.0, 15.1, ("attempt 1 pid 11",))
    [x] = find_overlaps({"t": [run(1, 10.0, None), later]}, KILLED)
    assert x["how"] == "alive" and not x["explained"]


def test_an_overlap_is_explained_only_by_a_kill_of_the_first_ones_worker_before_the_second():
    later = Execution(2, 12, 2, 104.0, 104.1, ("attempt 1 pid 11",))
    [x] = find_overlaps({"t": [run(1, 99.0, None, worker=900), later]}, KILLED)
    assert x["explained"]
    early = Execution(2, 12, 2, 99.5, 99.6, ("attempt 1 pid 11",))
    [y] = find_overlaps({"t": [run(1, 99.0, None, worker=900), early]}, KILLED)
    assert not y["explained"]  # the second began before the kill
    [z] = find_overlaps({"t": [run(1, 99.0, None, worker=901), later]}, KILLED)
    assert not z["explained"]  # another worker: never killed


def test_an_innocent_extra_attempt_needs_a_lease_expiry_after_a_kill_of_its_worker():
    runs = {"t": [run(1, 99.0, None, worker=900), run(2, 104.0, 104.1)]}
    expired = {("t", 1): 103.5}
    assert innocent_reruns({"t": 2, "u": 1}, runs, {}, expired, KILLED, 3.0) == []
    [failed] = innocent_reruns({"t": 2}, runs, {("t", 1): "worker child died"}, {}, KILLED, 3.0)
    assert failed["why"].startswith("failed")
    [none] = innocent_reruns({"t": 2}, runs, {}, {}, KILLED, 3.0)
    assert none["why"] == "no task.lease_expired for it"
    [late] = innocent_reruns({"t": 2}, runs, {}, {("t", 1): 120.0}, KILLED, 3.0)
    assert late["why"] == "its lease expired with no SIGKILL before it"
    alive = {"t": [run(1, 99.0, None, worker=901)]}
    [other] = innocent_reruns({"t": 2}, alive, {}, expired, KILLED, 3.0)
    assert "not killed" in other["why"]
    # Claimed, never started in a child, its lease swept after the kill: explained.
    assert innocent_reruns({"t": 2}, {}, {}, expired, KILLED, 3.0) == []


def test_causes_each_fault_must_leave():
    poison = [
        ("a", "segv", "worker child died: SIGSEGV (pid 5, ...)", 50.0),
        ("b", "exit3", "worker child died: SIGSEGV (pid 6, ...)", 50.0),
        ("c", "hang", "timed out after 1 s", 50.0),  # not killed at the hard limit
        ("d", "memory", "lease expired on the last attempt", 102.0),  # lost to the kill
        ("e", "busy", "lease expired on the last attempt", 50.0),  # no kill before it
    ]
    flaky = {"f": "memory", "g": "exit3"}
    retried = {("f", 1): "memory limit exceeded (208 MB > 200 MB)", ("g", 1): "RuntimeError: x"}
    wrong, lost = wrong_causes(poison, flaky, retried, KILLED, 3.0)
    assert sorted(x["task_id"] for x in wrong) == ["b", "c", "e", "g"] and lost == 1


def test_still_running_knows_a_process_by_its_start_time_and_not_a_dead_one():
    me = proc_stat(os.getpid())
    assert me is not None and still_running(os.getpid(), me[1])
    assert not still_running(os.getpid(), me[1] + 1)  # a reused pid
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = proc_stat(child.pid)
    child.wait()
    assert started is None or not still_running(child.pid, started[1])
