"""A claim's rows become ClaimedTasks without their __init__ (pgqueue.models.built): the
result must be the task the __init__ makes, every field, and its lease made once."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from pgqueue.models import ClaimedTask, Lease, Priority
from pgqueue.queries.claiming import _claimed


def test_a_claimed_task_built_from_its_row_is_the_one_its_init_makes():
    now = datetime.now(UTC)
    task_id, token, workflow = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    row = (task_id, "q", "t", {"n": 1}, 0, 2, 5, token, now, now, {"tp": "x"}, True, workflow,
           "acct-1")  # fmt: skip
    (task,) = _claimed([row])
    made = ClaimedTask(
        id=task_id,
        queue="q",
        type="t",
        payload={"n": 1},
        priority=Priority.HIGH,
        attempts=2,
        max_attempts=5,
        lease_token=token,
        lease_expires_at=now,
        created_at=now,
        trace_context={"tp": "x"},
        has_parents=True,
        workflow_id=workflow,
        concurrency_key="acct-1",
    )
    assert task == made and repr(task) == repr(made)
    assert list(vars(task)) == [f.name for f in dataclasses.fields(ClaimedTask)]  # every field
    assert type(task.priority) is Priority
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.queue = "other"  # type: ignore[misc]
    assert task.lease == Lease(task_id, token) and task.lease is task.lease
    assert dataclasses.replace(task, parents=()).lease == task.lease  # a copy makes its own
