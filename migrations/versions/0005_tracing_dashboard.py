"""Trace context on tasks, an index of the tasks waiting for a retry, and the backlog view.

Revision ID: 0005_tracing_dashboard
Revises: 0004_limits_retention
Create Date: 2026-12-01

On a large table, build the index first without blocking writes (the migration then finds it):

    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_retrying_idx ON pgqueue.tasks
        (visible_after) WHERE status = 'queued' AND attempts > 0;
"""

from alembic import op

revision = "0005_tracing_dashboard"
down_revision = "0004_limits_retention"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- The W3C trace context (traceparent, tracestate) of the span that submitted the task, when
    -- tracing is on: the worker's execution span is linked to it, so one trace follows a task
    -- from the request that submitted it to the worker that ran it. NULL when tracing is off.
    -- A nullable column without a default: adding it rewrites nothing.
    ALTER TABLE pgqueue.tasks ADD COLUMN trace_context jsonb;

    -- Tasks waiting for their next attempt after a failure (queued, attempts spent > 0): the
    -- dashboard's recent failures, newest first, without reading the backlog. Tiny: a task
    -- enters it only when an attempt fails, and leaves it when claimed again.
    CREATE INDEX IF NOT EXISTS tasks_retrying_idx
        ON pgqueue.tasks (visible_after) WHERE status = 'queued' AND attempts > 0;

    -- The backlog per queue and priority: ready and scheduled tasks, the age of the oldest
    -- ready one, and the running ones. Unlike queue_depth, it reads only waiting and running
    -- rows (through their partial indexes), never the finished tasks kept for a day, so it
    -- is what scrapers, dashboards and autoscalers (KEDA) may ask every few seconds.
    CREATE VIEW pgqueue.backlog AS
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
    """)


def downgrade() -> None:
    op.execute("""
    DROP VIEW pgqueue.backlog;
    DROP INDEX pgqueue.tasks_retrying_idx;
    ALTER TABLE pgqueue.tasks DROP COLUMN trace_context;
    """)
