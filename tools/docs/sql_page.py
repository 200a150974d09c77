"""The SQL reference: the views (and the few tables) a DBA reads, each with what it is for and
every column, its type read from the committed schema snapshot
(``tests/migrations/schema_snapshot.sql``, what ``alembic upgrade head`` leaves) and its meaning
from :data:`RELATIONS` below.

``tests/unit/test_docs_reference.py`` checks the catalogue against the snapshot both ways: a
column added by a migration without a line here fails it, as does a line for a column that is
gone.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[2] / "tests" / "migrations" / "schema_snapshot.sql"


@dataclasses.dataclass(frozen=True)
class Relation:
    name: str  # in the pgqueue schema
    about: str  # Markdown: what it is for and how to read it
    columns: dict[str, str]  # column -> what it holds
    example: str = ""  # a query worth copying


PRIORITY = "`high`, `normal` or `low`"
AGE = (
    "how long the oldest task that is due now has waited since it first became ready (its "
    "run time: `run_at`, `delay`, or its submission), not reset by a promotion, a retry, a lost "
    "lease or a release"
)

VIEWS = (
    Relation(
        "queue_depth",
        "Tasks per queue, priority and status: the whole table, grouped. Reads every row, so "
        "poll `backlog` instead where only queued and running tasks matter.",
        {
            "queue": "the queue",
            "priority": PRIORITY,
            "status": "`waiting`, `queued`, `running`, `completed`, `failed` or `cancelled`",
            "tasks": "tasks in this queue, priority and status",
            "ready": "queued tasks due now (the autoscaling signal)",
            "scheduled": "queued tasks not due yet: a later run time, or a retry's backoff",
            "oldest_ready_age": AGE,
        },
        "SELECT queue, sum(ready) AS ready, max(oldest_ready_age) AS oldest\n"
        "  FROM pgqueue.queue_depth WHERE status = 'queued' GROUP BY queue;",
    ),
    Relation(
        "backlog",
        "Per queue and priority, the work not done yet: it reads only queued and running rows "
        "(through their partial indexes), so it is cheap to poll, from an autoscaler or an "
        "alert.",
        {
            "queue": "the queue",
            "priority": PRIORITY,
            "ready": "queued tasks due now",
            "scheduled": "queued tasks not due yet",
            "running": "tasks a worker holds the lease of",
            "oldest_ready_age": AGE,
        },
        "SELECT * FROM pgqueue.backlog WHERE oldest_ready_age > interval '5 minutes';",
    ),
    Relation(
        "dead_letters",
        "The dead-letter queue: tasks whose attempts are spent (status `failed`), or whose "
        "result could not be stored, with their last error. `pgqueue dlq` and the API replay "
        "or discard them.",
        {
            "id": "the task's id",
            "queue": "the queue",
            "type": "the task type",
            "priority": PRIORITY,
            "attempts": "attempts spent",
            "max_attempts": "attempts it was allowed",
            "last_error": "the last attempt's error, with its traceback",
            "payload": "the task's payload",
            "idempotency_key": "its idempotency key, if it was given one",
            "created_at": "when it was submitted",
            "finished_at": "when it was dead-lettered",
        },
        "SELECT type, count(*), max(finished_at) FROM pgqueue.dead_letters GROUP BY type;",
    ),
    Relation(
        "running_tasks",
        "Who holds what: every running task with its lease. A lease that expired belongs to a "
        "worker that stopped renewing it; the next sweep puts the task back in its queue.",
        {
            "id": "the task's id",
            "queue": "the queue",
            "type": "the task type",
            "priority": PRIORITY,
            "attempts": "attempts spent, this one included",
            "max_attempts": "attempts it is allowed",
            "lease_owner": "the worker holding it (`HOST:PID:...`)",
            "lease_expires_at": "when the lease ends unless the worker renews it",
            "lease_expired": "whether that time has passed",
            "started_at": "when this attempt started",
            "running_for": "how long this attempt has run",
            "cancel_requested": "whether a cancel was asked for, which the handler is told of",
        },
        "SELECT lease_owner, count(*) FROM pgqueue.running_tasks GROUP BY lease_owner;",
    ),
    Relation(
        "workflows",
        "One row per workflow (chain, group, chord), its status derived from its tasks: "
        "`running` while any task is not final; then `completed` if all completed; else "
        "`failed` if one was dead-lettered; else `cancelled`. Filter by `workflow_id` to read "
        "one workflow's rows only, through the partial index on `tasks.workflow_id`.",
        {
            "workflow_id": "the workflow's id",
            "status": "`running`, `completed`, `failed` or `cancelled`",
            "tasks": "its tasks",
            "waiting": "tasks waiting for their parents",
            "queued": "tasks queued",
            "running": "tasks running",
            "completed": "tasks completed",
            "failed": "tasks dead-lettered",
            "cancelled": "tasks cancelled",
            "created_at": "when its first task was submitted",
            "finished_at": "when its last task became final; NULL while running",
        },
        "SELECT workflow_id, tasks, failed, cancelled, finished_at FROM pgqueue.workflows\n"
        " WHERE status = 'failed' AND finished_at > now() - interval '1 day'\n"
        " ORDER BY finished_at DESC;",
    ),
)

TABLES = (
    Relation(
        "tasks",
        "Every task, in one table. Statuses: `waiting` (enqueued with `depends_on`, some parent "
        "not final yet), `queued` (ready, or scheduled for `visible_after`), `running` (a "
        "worker holds the lease), `completed`, `failed` (attempts spent, or a result that "
        "cannot be stored: the dead-letter queue), `cancelled`. Read it freely; write it only "
        "through pgqueue, whose every update is guarded by status and lease.",
        {
            "id": "the task's id (a UUID)",
            "queue": "its queue",
            "type": "its task type, the name of its handler",
            "payload": "its arguments, a JSON object",
            "priority": "0 high, 1 normal, 2 low (`pgqueue.priority_name(priority)` spells it); "
            "raised by promotion when it waited too long",
            "status": "see above",
            "attempts": "attempts spent",
            "max_attempts": "attempts allowed before it is dead-lettered",
            "backoff_base": "the retry backoff's first delay, in seconds",
            "backoff_factor": "what each later delay is multiplied by",
            "backoff_cap": "the longest delay, in seconds",
            "visible_after": "when it may run: its run time, or the end of a retry's backoff",
            "idempotency_key": "its idempotency key, unique among tasks that have one",
            "lease_owner": "the worker holding it while running",
            "lease_token": "the lease's token, which every write of the holder must present",
            "lease_expires_at": "when the lease ends unless renewed",
            "cancel_requested": "a cancel was asked for while it ran",
            "result": "what the handler returned, as JSON",
            "last_error": "the last failed attempt's error and traceback",
            "created_at": "when it was submitted",
            "started_at": "when its latest attempt started",
            "finished_at": "when it became final",
            "trace_context": "the submitter's W3C trace context, when tracing is on",
            "ready_since": "when it first became ready, kept when a write moves "
            "`visible_after` again; NULL until then (`coalesce(ready_since, visible_after)`)",
            "submitted_priority": "the priority it was submitted with, written by its first "
            "promotion; NULL while never promoted",
            "policy_default": "it got the default retry policy because no declaration of its "
            "type existed yet; the first claim after one exists applies it",
            "snoozes": "how many times its handler snoozed it; NULL until the first",
            "expires_at": "if no attempt has started by then, it is never run: it ends "
            "cancelled, reason 'expired'",
            "workflow_id": "the workflow it belongs to; NULL for a plain task",
            "parents_pending": "how many groups of its parents are not final yet (NULL: it "
            "never had parents)",
            "cancelled_by": "the parent whose failure or cancellation cancelled it",
            "has_dependants": "some task waits for this one",
            "concurrency_key": "the tenant it works for: workers take a queue's keys in turns",
            "progress": "the handler's latest progress report, as JSON",
        },
        "SELECT id, type, status, attempts, last_error FROM pgqueue.tasks\n"
        " WHERE status = 'queued' AND attempts > 0 ORDER BY visible_after LIMIT 20;",
    ),
    Relation(
        "queues",
        "Per-queue settings, set with `pgqueue queue` or the API: a queue without a row has "
        "the defaults.",
        {
            "name": "the queue",
            "paused": "no worker claims its tasks while true",
            "paused_at": "when it was paused",
            "updated_at": "when a setting last changed",
            "completed_retention": "seconds its completed and cancelled tasks are kept; NULL: "
            "the workers' default",
            "dead_retention": "seconds its dead letters are kept; NULL: the workers' default",
        },
    ),
    Relation(
        "limits",
        "Limits across every worker, on a task type or a queue: how many run at once, how many "
        "start per period, and how many run at once per concurrency key.",
        {
            "kind": "`type` or `queue`",
            "name": "the task type or the queue",
            "max_running": "at most this many running at once; NULL: no such limit",
            "rate_limit": "at most this many starts per `rate_period`",
            "rate_period": "the rate's period, in seconds",
            "recent_starts": "the sliding window's start times (a rate without a burst)",
            "updated_at": "when it last changed",
            "per_key_max_running": "at most this many running at once per concurrency key",
            "rate_burst": "with a rate: starts are spaced evenly, and at most this many may "
            "start at once after a quiet spell; NULL: the sliding window",
            "rate_next": "the spaced rate's state: when its bucket would be full again",
            "declared_by": "the worker that declared it from the code (`rate_limit=` on a "
            "task); NULL: set by an operator, which a declaration never overwrites",
        },
        "SELECT kind, name, max_running, rate_limit, rate_period FROM pgqueue.limits;",
    ),
    Relation(
        "task_types",
        "The task types workers declared at start, with their policies.",
        {
            "type": "the task type",
            "max_attempts": "its declared attempts",
            "backoff_base": "its retry backoff's first delay, in seconds",
            "backoff_factor": "its backoff's multiplier",
            "backoff_cap": "its longest delay, in seconds",
            "declared_by": "the worker that last declared it",
            "updated_at": "when it was last declared",
            "queue": "its default queue",
            "priority": "its default priority (0 high, 1 normal, 2 low)",
            "timeout": "the seconds an attempt may run (informational: the worker enforces it)",
            "parameters": "a function task's parameters, as JSON (what `--arg` checks against)",
        },
    ),
    Relation(
        "schedules",
        "Periodic tasks the workers declared. A row stays when the code stops declaring it, "
        "until deleted; `pgqueue schedules` marks such rows stale.",
        {
            "name": "the schedule's name",
            "cron": "its cron expression, or its interval",
            "timezone": "the time zone its cron expression is read in",
            "type": "the task type it submits",
            "queue": "the queue it submits to",
            "last_tick": "the last run time it submitted a task for",
            "next_tick": "the next run time",
            "updated_at": "when a worker last declared it",
        },
    ),
    Relation(
        "task_dependencies",
        "The edges of workflows: `child_id` waits for `parent_id`.",
        {
            "child_id": "the task that waits",
            "parent_id": "the task it waits for",
            "position": "the parent's place in the child's `depends_on` (0-based: the order of "
            "`ctx.parents`)",
            "run_anyway": "the child runs even if this parent failed or was cancelled",
            "bucket": "`position / 64`: parents are counted in groups, so that a chord's many "
            "members do not all lock one row",
            "outcome": "the parent's final status, once counted",
        },
    ),
)

RELATIONS = VIEWS + TABLES

INTRO = """\
# SQL views and tables

Everything pgqueue stores lives in the `pgqueue` schema: the table `pgqueue.tasks`, a few
tables of settings, and read-only views over them. This page is generated from the schema as
`pgqueue migrate` leaves it, and lists what a DBA reads; for what to do with them, see
[DBA operations in plain SQL](../how-to/dba.md).

Every statement pgqueue itself runs is in a file of `pgqueue/sql/`, under a name, with a line
on why.
"""


def columns(snapshot: Path = SNAPSHOT) -> dict[str, list[tuple[str, str]]]:
    """Each table's and view's columns with their types, as the snapshot lists them."""
    text = snapshot.read_text(encoding="utf-8")
    out: dict[str, list[tuple[str, str]]] = {}
    for match in re.finditer(
        r"^CREATE (?:TABLE|VIEW) pgqueue\.(\w+) \(\n(.*?)\n\)", text, re.MULTILINE | re.DOTALL
    ):
        rows = []
        for line in match.group(2).splitlines():
            name, _, rest = line.strip().rstrip(",").partition(" ")
            kind = re.split(r" (?:NOT NULL|DEFAULT|COLLATE)\b", rest)[0]
            rows.append((name, kind))
        out[match.group(1)] = rows
    return out


def _relation(relation: Relation, kind: str, known: dict[str, list[tuple[str, str]]]) -> str:
    out = [f"### `pgqueue.{relation.name}` {{#{relation.name}}}", "", f"A {kind}. {relation.about}"]
    out += ["", "| column | type | |", "|---|---|---|"]
    for name, sql_type in known[relation.name]:
        out.append(f"| `{name}` | {sql_type} | {relation.columns.get(name, '')} |")
    if relation.example:
        out += ["", "```sql", relation.example, "```"]
    return "\n".join([*out, ""])


def render(snapshot: Path = SNAPSHOT) -> str:
    """The page's Markdown."""
    known = columns(snapshot)
    out = [INTRO, "## Views", ""]
    out += [_relation(r, "view", known) for r in VIEWS]
    out += ["## Tables", ""]
    out += [_relation(r, "table", known) for r in TABLES]
    return "\n".join(out)
