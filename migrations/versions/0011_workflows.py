"""Dependencies between tasks (workflows, issue 16): a 'waiting' status, the edges, and the
release of a task in the same transaction that finishes its last parent.

Revision ID: 0011_workflows
Revises: 0010_function_tasks
Create Date: 2026-12-03

A task enqueued with ``depends_on`` is 'waiting' until every parent is final. Waiting costs
nothing: the claim, the poll and the sweep read only 'queued' and 'running' rows (their
indexes are partial on those statuses), so a waiting row is never read until it is released.

Two small tables hold the graph, without foreign keys (none on the hot table):
``task_dependencies`` one row per edge, ``task_dependency_buckets`` the count of unfinished
parents per group of 64 parents of a child. A parent's completion decrements its bucket; only
the completion that empties a bucket touches the child's row (``parents_pending``, the open
buckets), and the one that closes the last bucket releases the child. So the 10,000 members of
a chord lock 157 different bucket rows, not one hot row, and the callback is released once.

On a large table: the new columns are nullable without a default (nothing is rewritten), the
partial index on workflow_id is empty on an existing table, and the status CHECK is replaced
in two steps, so no step holds a long lock:

    -- 1. instant: the new constraint, checked for new rows only
    ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_status_check_v2 CHECK (status IN
        ('queued', 'running', 'completed', 'failed', 'cancelled', 'waiting')) NOT VALID;
    -- 2. reads the table under SHARE UPDATE EXCLUSIVE: reads and writes go on meanwhile
    ALTER TABLE pgqueue.tasks VALIDATE CONSTRAINT tasks_status_check_v2;
    -- 3. instant
    ALTER TABLE pgqueue.tasks DROP CONSTRAINT tasks_status_check;
    ALTER TABLE pgqueue.tasks RENAME CONSTRAINT tasks_status_check_v2 TO tasks_status_check;

and build the index beforehand without blocking writes (the migration then finds it):

    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_workflow_idx ON pgqueue.tasks (workflow_id)
        WHERE workflow_id IS NOT NULL;

The migration runs the same steps, but in its one transaction, where the lock of step 1 is
held through step 2: on a table of millions of rows, run the steps above by hand first (the
migration then finds the constraint valid and the index there, and its steps are instant).
"""

from alembic import op

revision = "0011_workflows"
down_revision = "0010_function_tasks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- workflow_id: the workflow the task belongs to (all tasks of one chain/group/chord share
    -- it); NULL for a plain task. parents_pending: how many dependency buckets of this task
    -- are still open (NULL: it never had parents); 0 once every parent is final.
    -- cancelled_by: the parent whose failure or cancellation cancelled this task.
    ALTER TABLE pgqueue.tasks
        ADD COLUMN workflow_id uuid,
        ADD COLUMN parents_pending integer,
        ADD COLUMN cancelled_by uuid;

    -- The status CHECK gains 'waiting', in the steps of the docstring; skipped where a DBA
    -- ran them by hand already (the constraint then names 'waiting').
    DO $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                        WHERE conrelid = 'pgqueue.tasks'::regclass
                          AND conname = 'tasks_status_check'
                          AND position('waiting' in pg_get_constraintdef(oid)) > 0) THEN
            ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_status_check_v2 CHECK (status IN
                ('queued', 'running', 'completed', 'failed', 'cancelled', 'waiting'))
                NOT VALID;
            ALTER TABLE pgqueue.tasks VALIDATE CONSTRAINT tasks_status_check_v2;
            ALTER TABLE pgqueue.tasks DROP CONSTRAINT tasks_status_check;
            ALTER TABLE pgqueue.tasks RENAME CONSTRAINT tasks_status_check_v2
                TO tasks_status_check;
        END IF;
    END
    $$;

    -- A workflow's tasks (pgqueue.workflows, WorkflowInfo): only tasks that belong to one.
    CREATE INDEX IF NOT EXISTS tasks_workflow_idx ON pgqueue.tasks (workflow_id)
        WHERE workflow_id IS NOT NULL;

    -- One row per edge: child_id waits for parent_id. position: the parent's place in the
    -- child's depends_on (0-based; what ctx.parents keeps). bucket: position / 64.
    -- outcome: the parent's final status once its finish was counted (NULL until then), so
    -- each edge is counted exactly once, and a replay can take it back.
    CREATE TABLE pgqueue.task_dependencies (
        child_id    uuid    NOT NULL,
        parent_id   uuid    NOT NULL,
        position    integer NOT NULL,
        run_anyway  boolean NOT NULL DEFAULT false,
        bucket      integer NOT NULL,
        outcome     text,
        PRIMARY KEY (child_id, parent_id)
    );
    -- A parent's dependants, read by every statement that finishes a task that has some.
    CREATE INDEX task_dependencies_parent_idx ON pgqueue.task_dependencies (parent_id);

    -- The parents of a child not yet final, 64 to a bucket: the lock a member's completion
    -- takes, shared with 63 others at most (not with all the members of a chord).
    CREATE TABLE pgqueue.task_dependency_buckets (
        child_id    uuid    NOT NULL,
        bucket      integer NOT NULL,
        pending     integer NOT NULL CHECK (pending >= 0),
        PRIMARY KEY (child_id, bucket)
    );
    """)


def downgrade() -> None:
    op.execute("""
    DROP TABLE pgqueue.task_dependency_buckets;
    DROP TABLE pgqueue.task_dependencies;
    DROP INDEX pgqueue.tasks_workflow_idx;
    -- Waiting tasks cannot exist without the graph: they are cancelled, as a downgrade must
    -- leave every row valid under the old constraint.
    UPDATE pgqueue.tasks SET status = 'cancelled', finished_at = now(),
           last_error = 'waiting when the workflows migration was downgraded'
     WHERE status = 'waiting';
    ALTER TABLE pgqueue.tasks DROP CONSTRAINT tasks_status_check;
    ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_status_check
        CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled'));
    ALTER TABLE pgqueue.tasks
        DROP COLUMN cancelled_by,
        DROP COLUMN parents_pending,
        DROP COLUMN workflow_id;
    """)
