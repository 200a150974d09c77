"""Workflows cost plain tasks nothing; a chord's members share no row;
a replayed parent revives the dependants its failure cancelled.

Revision ID: 0013_dependants_flag
Revises: 0012_workflow_views
Create Date: 2026-12-03

``tasks.has_dependants`` is true on a task once a dependant of it was inserted
(task_insert_dependent sets it, under the row lock it takes anyway). The statements
that finish tasks call ``task_dependants_settle`` only for rows that carry it, so a plain
task's completion runs what it ran before workflows existed: no function call, no probe of
task_dependencies. The column is nullable without a default, so adding it rewrites nothing;
the backfill touches only the parents with an edge not yet counted (none on a table that
never had a workflow).

``task_dependants_settle`` is replaced: it no longer creates a temporary table per settling
transaction (catalog writes on every completion of a member), and it writes a child's row
only when one of the child's buckets empties or a parent dooms it. Before, every member's
completion updated the callback's row, the one hot row the design forbids: the members'
completions queued on it across workers.

``task_dependants_revive`` is new: task_replay calls it for replayed dead letters, so the
dependants cancelled because of them wait again (see its comment).
"""

from alembic import op

revision = "0013_dependants_flag"
down_revision = "0012_workflow_views"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE pgqueue.tasks ADD COLUMN has_dependants boolean;

    UPDATE pgqueue.tasks AS t SET has_dependants = true
     WHERE t.id IN (SELECT parent_id FROM pgqueue.task_dependencies)
       AND t.has_dependants IS NULL;

    -- Called by every statement that makes tasks final, with the finished ids that carry
    -- has_dependants. Counts each of their edges not counted yet (its outcome), empties
    -- buckets, and touches a child only when this emptied one of its buckets or a parent
    -- that failed or was cancelled dooms it: a child whose last bucket this emptied is
    -- released ('waiting' -> 'queued', and a NOTIFY that wakes its queue's workers on
    -- commit); a doomed one is cancelled, the reason naming the parent (cancelled_by), but
    -- for a run-anyway dependant, and so on down the graph. Locks in the order parent (held
    -- by the caller) -> bucket -> child, each kind in key order, so that two of these, or a
    -- cancel of a child, cannot deadlock. The rows counted travel between the statements in
    -- arrays: no temporary table. VOLATILE: each statement sees the caller's UPDATE of the
    -- parents (see task_waiters_wake).
    CREATE OR REPLACE FUNCTION pgqueue.task_dependants_settle(parent_ids uuid[]) RETURNS integer
        LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
        ids uuid[] := parent_ids;
        released integer := 0;
        n integer;
        e_child uuid[];      -- the edges counted now: child, bucket, dooming parent, reason
        e_bucket integer[];
        e_doom uuid[];
        e_reason text[];
        k_child uuid[];      -- the children to touch: buckets closed, doomed by, reason
        k_closed integer[];
        k_doom uuid[];
        k_reason text[];
        k_waiting uuid[];    -- of those, the ones still waiting (locked)
        k_cancelled uuid[];  -- of those, the ones this cancelled
    BEGIN
        WHILE ids IS NOT NULL AND cardinality(ids) > 0 LOOP
            -- Each parent is read by its id alone (a lateral LIMIT 1): joined on the status,
            -- the planner, whose statistics may say that few tasks are final, reads every
            -- final task once per edge (a quadratic drain of a chord).
            WITH p AS (
                SELECT p.* FROM unnest(ids) AS i(id)
                 CROSS JOIN LATERAL (SELECT id, type, status FROM pgqueue.tasks
                                      WHERE id = i.id LIMIT 1) AS p
            ),
            counted AS (
                UPDATE pgqueue.task_dependencies AS d SET outcome = p.status
                  FROM p
                 WHERE d.parent_id = p.id AND d.outcome IS NULL
                   AND p.status IN ('completed', 'failed', 'cancelled')
                RETURNING d.child_id, d.bucket, d.position,
                          CASE WHEN p.status IN ('failed', 'cancelled') AND NOT d.run_anyway
                               THEN p.id END AS doom,
                          format('parent %s (%s) %s', p.id, p.type, p.status) AS reason
            )
            SELECT array_agg(child_id ORDER BY child_id, position),
                   array_agg(bucket ORDER BY child_id, position),
                   array_agg(doom ORDER BY child_id, position),
                   array_agg(reason ORDER BY child_id, position)
              INTO e_child, e_bucket, e_doom, e_reason
              FROM counted;
            EXIT WHEN e_child IS NULL;

            -- Buckets, locked in key order, then emptied by the edges counted.
            PERFORM 1 FROM pgqueue.task_dependency_buckets AS b
             WHERE (b.child_id, b.bucket) IN (SELECT * FROM unnest(e_child, e_bucket))
             ORDER BY b.child_id, b.bucket
               FOR UPDATE;
            WITH g AS (
                SELECT child_id, bucket, count(*) AS k
                  FROM unnest(e_child, e_bucket) AS x(child_id, bucket)
                 GROUP BY child_id, bucket
            ),
            emptied AS (
                UPDATE pgqueue.task_dependency_buckets AS b SET pending = b.pending - g.k
                  FROM g WHERE b.child_id = g.child_id AND b.bucket = g.bucket
                RETURNING b.child_id, b.pending
            ),
            closed AS (
                SELECT child_id, count(*)::integer AS closed FROM emptied
                 WHERE pending = 0 GROUP BY child_id
            ),
            doomed AS (  -- the first dooming parent of each child, in depends_on order
                SELECT DISTINCT ON (child_id) child_id, doom, reason
                  FROM unnest(e_child, e_doom, e_reason) WITH ORDINALITY
                       AS x(child_id, doom, reason, ord)
                 WHERE doom IS NOT NULL
                 ORDER BY child_id, ord
            ),
            touched AS (
                SELECT child_id, coalesce(c.closed, 0) AS closed, d.doom, d.reason
                  FROM closed AS c FULL JOIN doomed AS d USING (child_id)
            )
            SELECT array_agg(child_id ORDER BY child_id), array_agg(closed ORDER BY child_id),
                   array_agg(doom ORDER BY child_id), array_agg(reason ORDER BY child_id)
              INTO k_child, k_closed, k_doom, k_reason
              FROM touched;
            EXIT WHEN k_child IS NULL;

            -- The children, locked in id order; only a waiting one changes status.
            SELECT array_agg(id) INTO k_waiting FROM (
                SELECT id, status FROM pgqueue.tasks WHERE id = ANY(k_child)
                 ORDER BY id FOR UPDATE
            ) AS l WHERE status = 'waiting';
            WITH c AS (
                SELECT c.*, c.child_id = ANY(coalesce(k_waiting, '{}')) AS waiting
                  FROM unnest(k_child, k_closed, k_doom, k_reason)
                       AS c(child_id, closed, doomed_by, reason)
            ),
            moved AS (
                UPDATE pgqueue.tasks AS t
                   SET parents_pending = t.parents_pending - c.closed,
                       status = CASE WHEN NOT c.waiting THEN t.status
                                     WHEN c.doomed_by IS NOT NULL THEN 'cancelled'
                                     WHEN t.parents_pending - c.closed = 0 THEN 'queued'
                                     ELSE t.status END,
                       cancelled_by = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                           THEN c.doomed_by ELSE t.cancelled_by END,
                       last_error = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                         THEN c.reason ELSE t.last_error END,
                       finished_at = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                          THEN now() ELSE t.finished_at END,
                       visible_after = CASE WHEN c.waiting AND c.doomed_by IS NULL
                                             AND t.parents_pending - c.closed = 0
                                            THEN greatest(t.visible_after, now())
                                            ELSE t.visible_after END
                  FROM c
                 WHERE t.id = c.child_id
                RETURNING t.id, t.queue, t.status, c.waiting
            ),
            -- pgqueue_released first: a worker then walks the queue's claim index from
            -- its start (a released task is older than where its last walk ended).
            woke AS (
                SELECT count(pg_notify('pgqueue_released', q.queue))
                       + count(pg_notify('pgqueue', q.queue)) AS k
                  FROM (SELECT DISTINCT queue FROM moved
                         WHERE waiting AND status = 'queued') AS q
            )
            SELECT array_agg(id) FILTER (WHERE waiting AND status = 'cancelled'),
                   count(*) FILTER (WHERE waiting AND status = 'queued') + max(woke.k) * 0
              INTO k_cancelled, n
              FROM moved, woke;
            released := released + coalesce(n, 0);
            PERFORM pgqueue.task_waiters_wake(k_cancelled);
            -- The cancelled ones settle their own dependants in the next round.
            ids := k_cancelled;
        END LOOP;
        RETURN released;
    END
    $$;

    -- Called by task_replay with the dead letters it made queued again: each of their edges
    -- counted as failed is taken back (its bucket pending again), but only towards a child
    -- that still waits (a run-anyway one: it will see the new outcome) or that this parent's
    -- failure cancelled (cancelled_by): that child waits again, unless another parent that
    -- failed or was cancelled still dooms it (then that one is named). A revived child takes
    -- back, in turn, the edges its own cancellation counted (its dependants cancelled
    -- because of it), and so on down the graph. A child that already ran keeps its edge:
    -- what it saw stays true of the run it made. Locks as task_dependants_settle does.
    CREATE FUNCTION pgqueue.task_dependants_revive(parent_ids uuid[]) RETURNS integer
        LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
        ids uuid[] := parent_ids;
        revived integer := 0;
        r_child uuid[];
        r_bucket integer[];
        k_child uuid[];
        k_opened integer[];
        was_cancelled uuid[];
    BEGIN
        WHILE ids IS NOT NULL AND cardinality(ids) > 0 LOOP
            -- The edges that may be taken back, read unlocked; then their buckets and their
            -- children are locked in that order, each in key order, as task_dependants_settle
            -- locks them (parents are held by the caller), so the two cannot deadlock. The
            -- statement below reads the children's statuses after these locks.
            SELECT array_agg(child_id ORDER BY child_id, bucket),
                   array_agg(bucket ORDER BY child_id, bucket)
              INTO r_child, r_bucket
              FROM pgqueue.task_dependencies
             WHERE parent_id = ANY(ids) AND outcome IN ('failed', 'cancelled');
            EXIT WHEN r_child IS NULL;
            PERFORM 1 FROM pgqueue.task_dependency_buckets AS b
             WHERE (b.child_id, b.bucket) IN (SELECT * FROM unnest(r_child, r_bucket))
             ORDER BY b.child_id, b.bucket
               FOR UPDATE;
            SELECT array_agg(id) FILTER (WHERE status = 'cancelled') INTO was_cancelled FROM (
                SELECT id, status FROM pgqueue.tasks WHERE id = ANY(r_child)
                 ORDER BY id FOR UPDATE
            ) AS l;
            WITH taken AS (  -- each child read by its id alone (see task_dependants_settle)
                UPDATE pgqueue.task_dependencies AS d SET outcome = NULL
                  FROM pgqueue.task_dependencies AS e
                 CROSS JOIN LATERAL (SELECT status, cancelled_by FROM pgqueue.tasks
                                      WHERE id = e.child_id LIMIT 1) AS c
                 WHERE e.parent_id = ANY(ids) AND e.outcome IN ('failed', 'cancelled')
                   AND d.child_id = e.child_id AND d.parent_id = e.parent_id
                   AND (c.status = 'waiting'
                        OR (c.status = 'cancelled' AND c.cancelled_by = e.parent_id))
                RETURNING d.child_id, d.bucket
            )
            SELECT array_agg(child_id ORDER BY child_id, bucket),
                   array_agg(bucket ORDER BY child_id, bucket)
              INTO r_child, r_bucket
              FROM taken;
            EXIT WHEN r_child IS NULL;

            -- Buckets pending again (one emptied re-opens: the child's parents_pending counts
            -- it once more).
            WITH g AS (
                SELECT child_id, bucket, count(*) AS k
                  FROM unnest(r_child, r_bucket) AS x(child_id, bucket)
                 GROUP BY child_id, bucket
            ),
            -- A bucket whose parents were all final when the child was inserted (it was
            -- inserted cancelled) has no row yet: it is made here.
            opened AS (
                INSERT INTO pgqueue.task_dependency_buckets AS b (child_id, bucket, pending)
                SELECT child_id, bucket, k FROM g
                    ON CONFLICT (child_id, bucket)
                    DO UPDATE SET pending = b.pending + EXCLUDED.pending
                RETURNING b.child_id, b.bucket, b.pending
            )
            SELECT array_agg(child_id ORDER BY child_id), array_agg(n ORDER BY child_id)
              INTO k_child, k_opened
              FROM (SELECT o.child_id, count(*) FILTER (WHERE o.pending = g.k)::integer AS n
                      FROM opened AS o JOIN g USING (child_id, bucket)
                     GROUP BY o.child_id) AS o;

            WITH c AS (
                SELECT * FROM unnest(k_child, k_opened) AS c(child_id, opened)
            ),
            still AS (  -- another parent that still dooms the child, first in depends_on order
                SELECT DISTINCT ON (d.child_id) d.child_id, d.parent_id,
                       format('parent %s (%s) %s', p.id, p.type, d.outcome) AS reason
                  FROM pgqueue.task_dependencies AS d
                  JOIN c USING (child_id)
                  LEFT JOIN pgqueue.tasks AS p ON p.id = d.parent_id
                 WHERE d.outcome IN ('failed', 'cancelled') AND NOT d.run_anyway
                 ORDER BY d.child_id, d.position
            ),
            moved AS (
                UPDATE pgqueue.tasks AS t
                   SET parents_pending = coalesce(t.parents_pending, 0) + c.opened,
                       status = CASE WHEN t.status = 'cancelled' AND s.child_id IS NULL
                                     THEN 'waiting' ELSE t.status END,
                       cancelled_by = CASE WHEN t.status <> 'cancelled' THEN t.cancelled_by
                                           ELSE s.parent_id END,
                       last_error = CASE WHEN t.status <> 'cancelled' THEN t.last_error
                                         ELSE s.reason END,
                       finished_at = CASE WHEN t.status = 'cancelled' AND s.child_id IS NULL
                                          THEN NULL ELSE t.finished_at END
                  FROM c LEFT JOIN still AS s USING (child_id)
                 WHERE t.id = c.child_id
                RETURNING t.id, t.status
            )
            SELECT array_agg(id) FILTER (WHERE status = 'waiting'
                                           AND id = ANY(coalesce(was_cancelled, '{}')))
              INTO ids FROM moved;
            -- Those revived take back what their cancellation counted, in the next round.
            revived := revived + coalesce(cardinality(ids), 0);
        END LOOP;
        RETURN revived;
    END
    $$;
    """)


def downgrade() -> None:
    # task_dependants_settle stays as this migration made it: it reads no has_dependants,
    # and it is correct for 0011's callers too (they pass every finished id).
    op.execute("""
    DROP FUNCTION pgqueue.task_dependants_revive(uuid[]);
    ALTER TABLE pgqueue.tasks DROP COLUMN has_dependants;
    """)
