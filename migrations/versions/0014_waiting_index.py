"""An index of the waiting tasks, so that what operators ask every few seconds
counts and lists them without reading the table.

Revision ID: 0014_waiting_index
Revises: 0013_dependants_flag
Create Date: 2026-12-04

The overview behind `pgqueue stats`, GET /api/v1/stats, /metrics and the dashboard, the queue
list and the queue probe read each status through a partial index of its rows. No index held
the 'waiting' rows (a task whose parents are not final yet), so none of them counted those
tasks: a queue whose only tasks waited was not listed, and could not be paused without
--create. ``tasks_waiting_idx`` holds those rows only, by (queue, priority): the overview counts
them per queue and priority, the queue list walks it once per queue, the probe reads one entry.

A plain task never enters it (it is inserted 'queued'), so the claim, the completions and the
sweep write nothing more; a dependant is written to it once when inserted and leaves it when
released or cancelled.

On a large table (one with many waiting tasks), build the index beforehand without blocking
writes; the migration then finds it and is instant:

    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_waiting_idx ON pgqueue.tasks
        (queue, priority) WHERE status = 'waiting';

(A CONCURRENTLY build that failed leaves an invalid index of that name: DROP INDEX
CONCURRENTLY pgqueue.tasks_waiting_idx, and build it again.)
"""

from alembic import op

revision = "0014_waiting_index"
down_revision = "0013_dependants_flag"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- The waiting tasks by queue and priority: read by queue_overview, queue_list and
    -- queue_known (pgqueue/sql/tasks.sql), never by the claim.
    CREATE INDEX IF NOT EXISTS tasks_waiting_idx ON pgqueue.tasks (queue, priority)
        WHERE status = 'waiting';
    """)


def downgrade() -> None:
    op.execute("DROP INDEX pgqueue.tasks_waiting_idx;")
