"""A registry with a schedule ticking every two seconds, for the interval-schedule acceptance
test (a module of its own: the schedule would enqueue into every other test's database)."""

from datetime import timedelta
from typing import Any

import pgqueue

tasks = pgqueue.TaskRegistry()
tasks.periodic("pulse", every=timedelta(seconds=2), type="pulse", queue="interval")


@tasks.handler("pulse")
def pulse(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    return None
