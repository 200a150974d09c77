"""Progress reports: a running task's handler may store a small JSON object on its task
(``ctx.set_progress``), which status, the HTTP task view, waits and the dashboard show.

Revision ID: 0017_task_progress
Revises: 0016_rate_buckets
Create Date: 2026-12-05

``tasks.progress`` is jsonb, nullable, without a default: adding it rewrites nothing and
takes a moment's ACCESS EXCLUSIVE lock only. No index names it, so a progress write can be
a HOT update (no index entry written). The column is read only by the statements that read
a whole task (status, the task view, waits), never by a claim or a completion.
"""

from alembic import op

revision = "0017_task_progress"
down_revision = "0016_rate_buckets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS progress jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE pgqueue.tasks DROP COLUMN IF EXISTS progress")
