"""A view of workflows: one row per workflow, its status derived from its tasks.

Revision ID: 0012_workflow_views
Revises: 0011_workflows
Create Date: 2026-12-03

Only a view: nothing is written or locked beyond the instant of CREATE VIEW. Read one
workflow with ``WHERE workflow_id = ...``: the predicate reaches the grouped scan, which then
reads only that workflow's rows through the partial index on tasks (workflow_id).
"""

from alembic import op

revision = "0012_workflow_views"
down_revision = "0011_workflows"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- A workflow's status, the same rule as pgqueue.workflow() (WorkflowInfo.status):
    -- running while any task is not final (waiting, queued, running); then completed if all
    -- completed; else failed if any was dead-lettered; else cancelled. finished_at: when the
    -- last task finished, once all have (NULL while running).
    CREATE OR REPLACE VIEW pgqueue.workflows AS
    SELECT workflow_id,
           CASE WHEN bool_or(status NOT IN ('completed', 'failed', 'cancelled')) THEN 'running'
                WHEN bool_and(status = 'completed') THEN 'completed'
                WHEN bool_or(status = 'failed') THEN 'failed'
                ELSE 'cancelled' END AS status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'waiting') AS waiting,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           min(created_at) AS created_at,
           CASE WHEN bool_and(status IN ('completed', 'failed', 'cancelled'))
                THEN max(finished_at) END AS finished_at
      FROM pgqueue.tasks
     WHERE workflow_id IS NOT NULL
     GROUP BY workflow_id;
    """)


def downgrade() -> None:
    op.execute("DROP VIEW pgqueue.workflows;")
