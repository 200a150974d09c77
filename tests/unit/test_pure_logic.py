"""Pure logic: no database."""

import asyncio
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

import pgqueue
import pgqueue.models
from pgqueue.config import redact, validate_database_url
from pgqueue.enqueue import encode_payload, new_task_id
from pgqueue.errors import InvalidDatabaseURL


def test_task_ids_are_uuid7_and_strictly_increase_within_a_process():
    ids = [new_task_id() for _ in range(10_000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids, key=lambda i: i.int)
    assert len(set(ids)) == len(ids)


def test_retry_policy_delay_grows_exponentially_up_to_the_cap():
    policy = pgqueue.RetryPolicy(max_attempts=10, base=2, factor=3, cap=50)
    assert [policy.max_delay(n) for n in range(1, 6)] == [2, 6, 18, 50, 50]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 2**31},
        {"max_attempts": True},
        {"base": -1},
        {"base": math.nan},
        {"factor": 0.5},
        {"cap": math.inf},
    ],
)
def test_retry_policy_refuses_values_the_database_cannot_hold(kwargs):
    with pytest.raises(pgqueue.ValidationError):
        pgqueue.RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("HIGH", "high"),
        ("high", "high"),
        (" Normal ", "normal"),
        (" low ", "low"),
        (0, "high"),
        (1, "normal"),
        (2, "low"),
        (pgqueue.Priority.LOW, "low"),
    ],
)
def test_priority_parses_names_and_numbers(value, expected):
    assert pgqueue.Priority.parse(value).label == expected


def test_priorities_are_stored_as_numbers_where_lower_runs_first():
    """The numbers are what the database holds and the claim orders by: high is 0, low 2."""
    assert [(p.label, int(p)) for p in sorted(pgqueue.Priority)] == [
        ("high", 0),
        ("normal", 1),
        ("low", 2),
    ]


def test_payload_size_counts_utf8_bytes():
    text = encode_payload({"s": "é" * 10})
    assert len(text.encode()) == len('{"s": ""}') + 20


def test_redact_hides_the_password_and_nothing_else():
    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def test_sqlalchemy_style_urls_are_normalised_for_libpq():
    assert validate_database_url("postgresql+psycopg://u@h/db") == "postgresql://u@h/db"


# --- handler timeouts ------------------------------------------------------------------------


def _claimed(type_: str = "t") -> pgqueue.models.ClaimedTask:
    now = datetime.now(UTC)
    return pgqueue.models.ClaimedTask(
        id=uuid.uuid4(),
        queue="default",
        type=type_,
        payload={},
        priority=pgqueue.Priority.NORMAL,
        attempts=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        lease_expires_at=now,
        created_at=now,
    )


def _run_handler(fn, timeout):
    from pgqueue.executor import DaemonThreadPool, Executor, TaskContext

    registry = pgqueue.TaskRegistry()
    registry.handler("t", timeout=timeout)(fn)
    task = _claimed()
    ctx = TaskContext(task, worker_id="w")

    async def go():
        threads = DaemonThreadPool(1)
        try:
            return await Executor(threads).run(task, ctx, registry.get("t"))
        finally:
            threads.shutdown()

    return asyncio.run(go()), ctx


def test_async_handler_past_its_timeout_fails_as_timed_out_and_is_told_to_stop():
    async def slow(payload, ctx):
        await asyncio.sleep(10)

    outcome, ctx = _run_handler(slow, timeout=0.05)

    assert outcome.error == "timed out after 0.05 s"
    assert ctx.timed_out and ctx.should_stop()


def test_a_timeout_error_raised_by_the_handler_itself_is_an_ordinary_failure():
    async def upstream(payload, ctx):
        raise TimeoutError("upstream took too long")

    for timeout in (None, 30):
        outcome, ctx = _run_handler(upstream, timeout=timeout)

        assert "TimeoutError: upstream took too long" in outcome.error
        assert not ctx.timed_out


def test_a_forked_child_does_not_reuse_the_parents_entropy_for_task_ids():
    import multiprocessing

    new_task_id()  # the parent has drawn (and buffered) entropy before the fork
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        children = pool.map(_ids_in_a_child, [200, 200])
    parent = [new_task_id() for _ in range(200)]

    everyone = [i for ids in children for i in ids] + [str(i) for i in parent]
    assert len(set(everyone)) == len(everyone)
    # the random bits differ too, not just the time or sequence bits
    rand_bits = [uuid.UUID(i).int & ((1 << 62) - 1) for i in everyone]
    assert len(set(rand_bits)) == len(rand_bits)


def _ids_in_a_child(n: int) -> list[str]:
    return [str(new_task_id()) for _ in range(n)]


# --- JSON nesting depth ------------------------------------------------------------------------


def _nested(levels: int) -> Any:
    """A JSON value ``levels`` deep: objects inside objects around a number."""
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("value", "too_deep"),
    [
        pytest.param(_nested(100), False, id="exactly-the-limit"),
        pytest.param(_nested(101), True, id="one-past-the-limit"),
        pytest.param([_nested(99)], False, id="arrays-count-too"),
        pytest.param([[_nested(99)]], True, id="arrays-count-too-past"),
        pytest.param([[1]] * 300, False, id="many-brackets-shallow"),
        pytest.param({"s": "[{" * 300}, False, id="brackets-in-strings"),
        pytest.param({"s": "]]" * 60, "t": [_nested(99)]}, True, id="closing-brackets-in-strings"),
        pytest.param({'k"[': '\\"]]]', "t": [_nested(99)]}, True, id="escaped-quotes"),
        pytest.param({'k"[': '\\"]]]', "t": [_nested(98)]}, False, id="escaped-quotes-shallow"),
    ],
)
def test_json_depth_counts_nesting_not_brackets_in_strings(value: Any, too_deep: bool) -> None:
    from pgqueue.enqueue import json_depth_exceeds

    raw = json.dumps(value, separators=(",", ":")).encode()
    assert json_depth_exceeds(raw, limit=100) is too_deep


def test_a_payload_nested_past_100_levels_is_invalid_and_so_is_one_past_recursion() -> None:
    encode_payload(_nested(100))  # the outer object is level 1, so 99 inside it: accepted
    for value in (_nested(101), _nested(5000)):
        with pytest.raises(pgqueue.InvalidPayload, match="nests deeper than 100 levels"):
            encode_payload(value)


def test_the_embedded_server_says_when_running_as_root_creates_a_system_user():
    from pgqueue.embedded import system_user_note

    assert system_user_note(1000, user_exists=False) is None
    creating = system_user_note(0, user_exists=False)
    assert creating is not None and "creating system user 'pgserver'" in creating
    existing = system_user_note(0, user_exists=True)
    assert existing is not None and "creating" not in existing and "'pgserver'" in existing


def test_urls_naming_a_primary_and_its_standbys_are_accepted_as_libpq_reads_them():
    """Every spelling of several hosts that libpq takes (a failover setup) is taken as it is."""
    for url in (
        "postgresql://u@db1:5432,db2:5433/app?target_session_attrs=read-write",
        "postgresql://u@db1,db2/app?port=5432,5433&target_session_attrs=read-write",
        "host=db1,db2 port=5432,5433 dbname=app target_session_attrs=read-write",
    ):
        assert validate_database_url(url) == url


def test_a_bad_port_among_several_hosts_is_named():
    with pytest.raises(InvalidDatabaseURL, match="db2:x"):
        validate_database_url("postgresql://u@db1:5432,db2:x/app")
    with pytest.raises(InvalidDatabaseURL):
        validate_database_url("host=db1 port=5432 = broken")
