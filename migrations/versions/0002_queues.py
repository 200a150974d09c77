"""Per-queue settings, starting with pausing.

Revision ID: 0002_queues
Revises: 0001_tasks
Create Date: 2026-12-01
"""

from alembic import op

revision = "0002_queues"
down_revision = "0001_tasks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- One row per queue that has a setting; a queue without a row has the defaults (running).
    -- Pausing lives here, not in worker memory, so it holds across every worker process and
    -- host and survives restarts; the claim reads it by primary key for each queue it serves.
    CREATE TABLE pgqueue.queues (
        name       text        PRIMARY KEY,
        paused     boolean     NOT NULL DEFAULT false,
        paused_at  timestamptz,
        updated_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT queues_name_check CHECK (length(name) BETWEEN 1 AND 200),
        CONSTRAINT queues_paused_at_check CHECK (paused = (paused_at IS NOT NULL))
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE pgqueue.queues;")
