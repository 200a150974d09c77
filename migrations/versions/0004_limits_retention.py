"""Fleet-wide limits per task type or queue, and retention per queue.

Revision ID: 0004_limits_retention
Revises: 0003_schedules
Create Date: 2026-12-01

On a large table, build the new indexes first without blocking writes (the migration then
finds them and only drops the old index, which takes a moment):

    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_retention_idx ON pgqueue.tasks
        (status, queue, finished_at) WHERE status IN ('completed', 'failed', 'cancelled');
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_claim_type_idx ON pgqueue.tasks
        (type, queue, priority, created_at, id) WHERE status = 'queued';
"""

from alembic import op

revision = "0004_limits_retention"
down_revision = "0003_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- A limit caps the tasks of one type (kind 'type') or one queue (kind 'queue') across the
    -- whole fleet: how many run at once (max_running), how many start in any window of
    -- rate_period seconds (rate_limit), or both. It lives here, not in worker memory, so every
    -- process and host obeys the same number. recent_starts is the rate limit's sliding log:
    -- the start times within the last window, never more than rate_limit of them.
    CREATE TABLE pgqueue.limits (
        kind          text        NOT NULL,
        name          text        NOT NULL,
        max_running   integer,
        rate_limit    integer,
        rate_period   double precision,
        recent_starts timestamptz[] NOT NULL DEFAULT '{}',
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (kind, name),
        CONSTRAINT limits_kind_check CHECK (kind IN ('type', 'queue')),
        CONSTRAINT limits_name_check CHECK (length(name) BETWEEN 1 AND 200),
        CONSTRAINT limits_some_check CHECK (max_running IS NOT NULL OR rate_limit IS NOT NULL),
        CONSTRAINT limits_max_running_check CHECK (max_running >= 0),
        CONSTRAINT limits_rate_check CHECK (
            (rate_limit IS NULL) = (rate_period IS NULL)
            AND rate_limit BETWEEN 0 AND 10000 AND rate_period > 0)
    );

    -- Retention per queue, in seconds; NULL keeps the worker's default (--completed-retention
    -- for completed and cancelled tasks, --dead-retention for dead letters).
    ALTER TABLE pgqueue.queues
        ADD COLUMN completed_retention double precision,
        ADD COLUMN dead_retention double precision,
        ADD CONSTRAINT queues_retention_check
            CHECK (completed_retention > 0 AND dead_retention > 0);

    -- Pruning with a retention per queue reads each queue's finished tasks as a range of this
    -- index (status, queue, finished_at); the old (status, finished_at) index would make the
    -- queues kept longest be re-read by every batch. Throughput and the dead-letter replay
    -- read it by queue too.
    CREATE INDEX IF NOT EXISTS tasks_retention_idx
        ON pgqueue.tasks (status, queue, finished_at)
        WHERE status IN ('completed', 'failed', 'cancelled');
    DROP INDEX pgqueue.tasks_finished_idx;

    -- The claim of tasks under a type limit reads that type's waiting tasks in claim order,
    -- per queue. Without it, it would walk the whole queue past every other type's tasks to
    -- find them (or to find there are none). Partial, like tasks_claim_idx: waiting rows only.
    CREATE INDEX IF NOT EXISTS tasks_claim_type_idx
        ON pgqueue.tasks (type, queue, priority, created_at, id) WHERE status = 'queued';
    """)


def downgrade() -> None:
    op.execute("""
    CREATE INDEX tasks_finished_idx
        ON pgqueue.tasks (status, finished_at)
        WHERE status IN ('completed', 'failed', 'cancelled');
    DROP INDEX pgqueue.tasks_retention_idx;
    DROP INDEX pgqueue.tasks_claim_type_idx;
    ALTER TABLE pgqueue.queues
        DROP CONSTRAINT queues_retention_check,
        DROP COLUMN completed_retention,
        DROP COLUMN dead_retention;
    DROP TABLE pgqueue.limits;
    """)
