"""Declared task types, and a waiting task's first ready time and submitted priority.

Revision ID: 0007_task_types
Revises: 0006_lease_starts
Create Date: 2026-12-02

The age of waiting work counted from the latest write to visible_after, which the
starvation policy's promotion and every retry move, so a task that had waited 900 s read as
0 s right after its promotion; and promotion overwrote the priority users had submitted. A
handler's max_attempts lived only in the worker's memory, so every reader before the first
failure (list, status, the API, the started log) showed the global default instead.

Every change here is cheap on a large table: nullable columns without a default rewrite
nothing and cost an insert nothing (the insert paths leave them NULL), a new small table, and
views replaced in place (CREATE OR REPLACE keeps their columns and grants).
"""

from alembic import op

revision = "0007_task_types"
down_revision = "0006_lease_starts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- ready_since: when the task first became ready, kept when a write moves visible_after
    -- again (task_promote, a retry, the sweep, a release); NULL until the first such write,
    -- and then visible_after is still the first ready time. Readers use
    -- coalesce(ready_since, visible_after). A replay starts a new wait: NULL again.
    ALTER TABLE pgqueue.tasks ADD COLUMN ready_since timestamptz;

    -- submitted_priority: the priority the task was submitted with, written by its first
    -- promotion (task_promote); NULL while never promoted (priority is then still the
    -- submitted one). Readers use coalesce(submitted_priority, priority).
    ALTER TABLE pgqueue.tasks ADD COLUMN submitted_priority smallint;

    -- policy_default: true when the task got the global default retry policy because neither
    -- the caller nor a declaration of its type gave one (enqueued before any worker declared
    -- the type). The first claim once a declaration exists applies it to the row and clears
    -- the flag, so every reader agrees from then on. NULL otherwise: the common case writes
    -- nothing more.
    ALTER TABLE pgqueue.tasks ADD COLUMN policy_default boolean;

    -- The task types workers declare (their registry's handlers), upserted by each worker at
    -- start, as schedules are. Enqueue reads a type's row by primary key in its INSERT when the
    -- caller gave no max_attempts or retry policy: per call > declared > global default, field
    -- by field. NULL fields declare nothing (the default applies). Room for more declarations
    -- (queue, priority, timeout) as nullable columns. Not on the hot table: no foreign key.
    CREATE TABLE pgqueue.task_types (
        type            text PRIMARY KEY,
        max_attempts    integer,
        backoff_base    real,
        backoff_factor  real,
        backoff_cap     real,
        declared_by     text NOT NULL,
        updated_at      timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT task_types_max_attempts_check CHECK (max_attempts >= 1),
        CONSTRAINT task_types_backoff_check
            CHECK (backoff_base >= 0 AND backoff_factor >= 1 AND backoff_cap >= 0)
    );

    -- The views' ages now count from the first ready time (see ready_since).
    CREATE OR REPLACE VIEW pgqueue.backlog AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM (SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued'
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'running') AS t
     GROUP BY queue, priority;

    CREATE OR REPLACE VIEW pgqueue.queue_depth AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM pgqueue.tasks
     GROUP BY queue, priority, status;
    """)


def downgrade() -> None:
    op.execute("""
    CREATE OR REPLACE VIEW pgqueue.queue_depth AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           now() - min(visible_after) FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM pgqueue.tasks
     GROUP BY queue, priority, status;

    CREATE OR REPLACE VIEW pgqueue.backlog AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           now() - min(visible_after) FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM (SELECT queue, priority, status, visible_after
              FROM pgqueue.tasks WHERE status = 'queued'
            UNION ALL
            SELECT queue, priority, status, visible_after
              FROM pgqueue.tasks WHERE status = 'running') AS t
     GROUP BY queue, priority;

    DROP TABLE pgqueue.task_types;
    ALTER TABLE pgqueue.tasks DROP COLUMN policy_default;
    ALTER TABLE pgqueue.tasks DROP COLUMN submitted_priority;
    ALTER TABLE pgqueue.tasks DROP COLUMN ready_since;
    """)
