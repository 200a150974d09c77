"""A registry with a schedule ticking every second, for the periodic-task acceptance test (a
module of its own: the schedule would enqueue into every other test's database)."""

from typing import Any

import pgqueue

tasks = pgqueue.TaskRegistry()
tasks.periodic("beat", "* * * * * *", queue="periodic")


@tasks.handler("beat")
def beat(payload: dict[str, Any], ctx: pgqueue.TaskContext) -> None:
    return None
