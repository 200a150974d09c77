"""Periodic tasks: one row per schedule, the fence that makes each tick enqueue once.

Revision ID: 0003_schedules
Revises: 0002_queues
Create Date: 2026-12-01
"""

from alembic import op

revision = "0003_schedules"
down_revision = "0002_queues"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- Schedules are declared in code (TaskRegistry.periodic); every worker that has them
    -- upserts its definition here. last_tick is the fence: a scheduler locks the row, enqueues
    -- the ticks after it and moves it on, so however many workers run the scheduler, each
    -- tick is enqueued once. next_tick is for people (`pgqueue schedules`).
    CREATE TABLE pgqueue.schedules (
        name       text        PRIMARY KEY,
        cron       text        NOT NULL,
        timezone   text        NOT NULL,
        type       text        NOT NULL,
        queue      text        NOT NULL,
        last_tick  timestamptz,
        next_tick  timestamptz,
        updated_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT schedules_name_check CHECK (length(name) BETWEEN 1 AND 200)
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE pgqueue.schedules;")
