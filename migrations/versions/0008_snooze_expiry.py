"""A task's snooze count and its expiry.

Revision ID: 0008_snooze_expiry
Revises: 0007_task_types
Create Date: 2026-12-02

Cheap on a large table: two nullable columns without a default (nothing is rewritten and an
insert without them writes nothing more), and a partial index holding only the waiting tasks
that were given an expiry, which is empty on an existing table. Building it still reads the
table once; on a large one, add the columns (instant) and build the index without blocking
writes first, by hand (the migration then finds all three):

    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS snoozes integer,
        ADD COLUMN IF NOT EXISTS expires_at timestamptz;
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_expiry_idx ON pgqueue.tasks
        (expires_at) WHERE status = 'queued' AND attempts = 0 AND expires_at IS NOT NULL;
"""

from alembic import op

revision = "0008_snooze_expiry"
down_revision = "0007_task_types"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- snoozes: how many times a handler raised Snooze for this task (each put it back to
    -- queued without spending an attempt); NULL until the first. Bounded by the worker's
    -- max_snoozes: past it, a snooze counts as a failed attempt.
    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS snoozes integer;

    -- expires_at: if no attempt has been spent by then (attempts = 0), the task is never run:
    -- the claim skips it and maintenance cancels it with the reason 'expired'. NULL: never.
    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS expires_at timestamptz;

    -- What the maintenance pass reads to find expired tasks, oldest expiry first: only
    -- waiting tasks with an expiry and no attempt spent, so it is as small as they are, and
    -- a task leaves it at its first claim.
    CREATE INDEX IF NOT EXISTS tasks_expiry_idx ON pgqueue.tasks (expires_at)
        WHERE status = 'queued' AND attempts = 0 AND expires_at IS NOT NULL;
    """)


def downgrade() -> None:
    op.execute("""
    DROP INDEX pgqueue.tasks_expiry_idx;
    ALTER TABLE pgqueue.tasks DROP COLUMN expires_at;
    ALTER TABLE pgqueue.tasks DROP COLUMN snoozes;
    """)
