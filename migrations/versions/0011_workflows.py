"""Dependencies between tasks (workflows): a 'waiting' status, the edges, and the
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

and build the index beforehand without blocking writes (the migration then finds it), on the
columns added first by hand (instant: nullable, no default; the migration adds them IF NOT
EXISTS):

    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS workflow_id uuid,
        ADD COLUMN IF NOT EXISTS parents_pending integer,
        ADD COLUMN IF NOT EXISTS cancelled_by uuid;
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
        ADD COLUMN IF NOT EXISTS workflow_id uuid,
        ADD COLUMN IF NOT EXISTS parents_pending integer,
        ADD COLUMN IF NOT EXISTS cancelled_by uuid;

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

    -- Called once by every statement that makes tasks final, with the ids it finished (the
    -- others are ignored): counts each of their edges not counted yet (its outcome), empties
    -- buckets, and for a child whose last bucket this emptied, releases it ('waiting' ->
    -- 'queued', and a NOTIFY that wakes the workers of its queue on commit). A parent that
    -- failed or was cancelled cancels its waiting dependants (the reason names it,
    -- cancelled_by), but for a run-anyway one, and so on down the graph. Locks in the order
    -- parent (held by the caller) -> bucket -> child, each kind in key order, so that two
    -- of these, or a cancel of a child, cannot deadlock. VOLATILE: each query sees the
    -- caller's UPDATE of the parents (see task_waiters_wake).
    CREATE FUNCTION pgqueue.task_dependants_settle(parent_ids uuid[]) RETURNS integer
        LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
        ids uuid[] := parent_ids;
        released integer := 0;
        n integer;
    BEGIN
        WHILE ids IS NOT NULL AND cardinality(ids) > 0 LOOP
            -- A plain task (no dependants) costs one probe of the parent index.
            EXIT WHEN NOT EXISTS (SELECT 1 FROM pgqueue.task_dependencies
                                   WHERE parent_id = ANY(ids) AND outcome IS NULL);
            CREATE TEMP TABLE IF NOT EXISTS pgqueue_settled (
                child_id uuid, bucket integer, doom boolean, parent_id uuid, reason text
            ) ON COMMIT DROP;
            TRUNCATE pgqueue_settled;
            WITH counted AS (
                UPDATE pgqueue.task_dependencies AS d SET outcome = p.status
                  FROM pgqueue.tasks AS p
                 WHERE d.parent_id = ANY(ids) AND d.outcome IS NULL AND p.id = d.parent_id
                   AND p.status IN ('completed', 'failed', 'cancelled')
                RETURNING d.child_id, d.bucket, d.position, d.run_anyway, p.id, p.type,
                          p.status
            )
            INSERT INTO pgqueue_settled
            SELECT child_id, bucket,
                   status IN ('failed', 'cancelled') AND NOT run_anyway, id,
                   format('parent %s (%s) %s', id, type, status)
              FROM counted;
            GET DIAGNOSTICS n = ROW_COUNT;
            EXIT WHEN n = 0;
            -- Buckets, locked in key order, then emptied by the edges counted.
            PERFORM 1 FROM pgqueue.task_dependency_buckets AS b
              JOIN (SELECT DISTINCT child_id, bucket FROM pgqueue_settled) AS s
                USING (child_id, bucket)
             ORDER BY b.child_id, b.bucket FOR UPDATE OF b;
            WITH g AS (SELECT child_id, bucket, count(*) AS k FROM pgqueue_settled
                        GROUP BY child_id, bucket),
            emptied AS (
                UPDATE pgqueue.task_dependency_buckets AS b SET pending = b.pending - g.k
                  FROM g WHERE b.child_id = g.child_id AND b.bucket = g.bucket
                RETURNING b.child_id, b.pending
            ),
            per_child AS (
                SELECT c.child_id,
                       (SELECT count(*) FROM emptied AS e
                         WHERE e.child_id = c.child_id AND e.pending = 0) AS closed,
                       (SELECT s.parent_id FROM pgqueue_settled AS s
                         WHERE s.child_id = c.child_id AND s.doom LIMIT 1) AS doomed_by,
                       (SELECT s.reason FROM pgqueue_settled AS s
                         WHERE s.child_id = c.child_id AND s.doom LIMIT 1) AS reason
                  FROM (SELECT DISTINCT child_id FROM pgqueue_settled) AS c
            ),
            locked AS MATERIALIZED (
                SELECT t.id FROM pgqueue.tasks AS t JOIN per_child AS c ON c.child_id = t.id
                 ORDER BY t.id FOR UPDATE OF t
            ),
            moved AS (
                UPDATE pgqueue.tasks AS t
                   SET parents_pending = t.parents_pending - c.closed,
                       status = CASE WHEN t.status <> 'waiting' THEN t.status
                                     WHEN c.doomed_by IS NOT NULL THEN 'cancelled'
                                     WHEN t.parents_pending - c.closed = 0 THEN 'queued'
                                     ELSE t.status END,
                       cancelled_by = CASE WHEN t.status = 'waiting' AND c.doomed_by IS NOT NULL
                                           THEN c.doomed_by ELSE t.cancelled_by END,
                       last_error = CASE WHEN t.status = 'waiting' AND c.doomed_by IS NOT NULL
                                         THEN c.reason ELSE t.last_error END,
                       finished_at = CASE WHEN t.status = 'waiting' AND c.doomed_by IS NOT NULL
                                          THEN now() ELSE t.finished_at END,
                       visible_after = CASE WHEN t.status = 'waiting' AND c.doomed_by IS NULL
                                             AND t.parents_pending - c.closed = 0
                                            THEN greatest(t.visible_after, now())
                                            ELSE t.visible_after END
                  FROM per_child AS c, locked AS l
                 WHERE t.id = c.child_id AND l.id = c.child_id
                RETURNING t.id, t.queue, t.status, t.visible_after,
                          t.status = 'cancelled' AND t.finished_at = now() AS just_cancelled
            ),
            woke AS (
                SELECT count(pg_notify('pgqueue', q.queue)) AS k
                  FROM (SELECT DISTINCT queue FROM moved WHERE status = 'queued') AS q
            )
            SELECT array_agg(id) FILTER (WHERE just_cancelled),
                   count(*) FILTER (WHERE status = 'queued') + max(woke.k) * 0
              INTO ids, n
              FROM moved, woke;
            released := released + coalesce(n, 0);
            PERFORM pgqueue.task_waiters_wake(ids);
        END LOOP;
        RETURN released;
    END
    $$;
    """)


def downgrade() -> None:
    op.execute("""
    DROP FUNCTION pgqueue.task_dependants_settle(uuid[]);
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
