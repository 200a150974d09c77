-- Tasks with parents: their insert with the edges, the settling of dependants when a
-- parent finishes, parents, children and workflows (pgqueue/queries/dependencies.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: task_dependants_settle
-- Settle the dependants of tasks already final (task_insert_dependent: a task of the batch
-- inserted cancelled, whose children in the same statement could not see it so).
SELECT pgqueue.task_dependants_settle(%(ids)s::uuid[]) AS released;

-- name: task_outcomes
-- What became of tasks just inserted, read again after task_dependants_settle moved them.
SELECT id, status, parents_pending, cancelled_by, last_error, finished_at
  FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]);

-- name: task_insert_dependent
-- Tasks with parents (depends_on) or a workflow, in one statement: all or nothing.
-- The parents already in the table (committed, or inserted earlier in this transaction) are
-- locked in id order and marked has_dependants, so that none can finish between this read
-- and the commit, and the statement that finishes it settles these edges
-- (task_dependants_settle); one already final is counted here (and marked all the same: a
-- dead letter's replay revives the dependants it doomed, task_dependants_revive). A parent
-- inserted by this statement is marked as it is inserted. The lock is FOR NO KEY UPDATE, the
-- one the mark's UPDATE needs: two inserts sharing a parent take turns instead of
-- deadlocking on an upgrade from a shared lock. A task is inserted
-- 'waiting' (some parent not final), 'queued' (every parent completed, or final for a
-- run-anyway task) or 'cancelled' (a parent failed or was cancelled). A parent not found
-- makes the statement insert nothing and name it (missing). A task queued at once wakes idle
-- workers on commit, unless %(notify)s is false (PGQUEUE_NOTIFY=off).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
e AS (
    SELECT * FROM unnest(%(edge_children)s::uuid[], %(edge_parents)s::uuid[],
                         %(edge_positions)s::integer[], %(edge_run_anyway)s::boolean[],
                         %(edge_in_batch)s::boolean[])
             AS e(child_id, parent_id, position, run_anyway, in_batch)
),
parents AS MATERIALIZED (
    SELECT t.id, t.type, t.status, t.has_dependants FROM pgqueue.tasks AS t
     WHERE t.id IN (SELECT parent_id FROM e)
     ORDER BY t.id
       FOR NO KEY UPDATE
),
-- bucket: the parents of a child that share a pending count (task_dependency_buckets), 64
-- at most, dealt out by position modulo the number of buckets: neighbours (which workers
-- claim and complete at the same time) share none.
edges AS MATERIALIZED (
    SELECT e.*, p.type AS parent_type,
           e.position %% ((count(*) OVER (PARTITION BY e.child_id) + 63) / 64) AS bucket,
           CASE WHEN p.status IN ('completed', 'failed', 'cancelled') THEN p.status END
               AS outcome,
           (e.in_batch OR p.id IS NOT NULL) AS known
      FROM e LEFT JOIN parents AS p ON p.id = e.parent_id
),
missing AS MATERIALIZED (SELECT array_agg(parent_id) AS ids FROM edges WHERE NOT known),
marked AS (
    UPDATE pgqueue.tasks AS t SET has_dependants = true
      FROM parents AS p
     WHERE t.id = p.id AND p.has_dependants IS NOT TRUE
       AND (SELECT ids FROM missing) IS NULL
),
children AS MATERIALIZED (
    SELECT child_id,
           bool_or(outcome IN ('failed', 'cancelled') AND NOT run_anyway) AS doomed,
           count(DISTINCT bucket) FILTER (WHERE outcome IS NULL) AS open_buckets,
           (array_agg(format('parent %%s (%%s) %%s', parent_id, parent_type, outcome)
                      ORDER BY position)
                FILTER (WHERE outcome IN ('failed', 'cancelled') AND NOT run_anyway))[1]
               AS reason,
           (array_agg(parent_id ORDER BY position)
                FILTER (WHERE outcome IN ('failed', 'cancelled') AND NOT run_anyway))[1]
               AS cancelled_by
      FROM edges GROUP BY child_id
),
inserted AS (
    INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                               backoff_factor, backoff_cap, visible_after, created_at,
                               trace_context, policy_default, expires_at, status,
                               parents_pending, workflow_id, cancelled_by, last_error,
                               finished_at, has_dependants, concurrency_key)
    SELECT v.id, coalesce(v.queue, d.queue, %(default_queue)s), v.type, v.payload::jsonb,
           coalesce(v.priority, d.priority, %(default_priority)s::smallint),
           coalesce(v.max_attempts, d.max_attempts, %(default_max_attempts)s),
           coalesce(v.backoff_base, d.backoff_base, %(default_backoff_base)s),
           coalesce(v.backoff_factor, d.backoff_factor, %(default_backoff_factor)s),
           coalesce(v.backoff_cap, d.backoff_cap, %(default_backoff_cap)s),
           coalesce(v.run_at, clock.now + v.delay * interval '1 second'), clock.now,
           %(trace_context)s::jsonb,
           CASE WHEN NOT v.explicit AND d.type IS NULL THEN true END,
           coalesce(v.expires_at, clock.now + v.expires_in * interval '1 second'),
           CASE WHEN c.doomed THEN 'cancelled'
                WHEN coalesce(c.open_buckets, 0) = 0 THEN 'queued' ELSE 'waiting' END,
           c.open_buckets, v.workflow_id,
           CASE WHEN c.doomed THEN c.cancelled_by END,
           CASE WHEN c.doomed THEN c.reason END,
           CASE WHEN c.doomed THEN clock.now END,
           CASE WHEN v.id IN (SELECT parent_id FROM e) THEN true END,
           v.concurrency_key
      FROM clock,
           unnest(%(ids)s::uuid[], %(queues)s::text[], %(types)s::text[], %(payloads)s::text[],
                  %(priorities)s::smallint[], %(max_attempts)s::integer[],
                  %(backoff_bases)s::real[], %(backoff_factors)s::real[],
                  %(backoff_caps)s::real[], %(run_ats)s::timestamptz[],
                  %(delays)s::double precision[], %(explicits)s::boolean[],
                  %(expires_ats)s::timestamptz[], %(expires_ins)s::double precision[],
                  %(workflow_ids)s::uuid[], %(concurrency_keys)s::text[])
           WITH ORDINALITY
           AS v(id, queue, type, payload, priority, max_attempts, backoff_base, backoff_factor,
                backoff_cap, run_at, delay, explicit, expires_at, expires_in, workflow_id,
                concurrency_key, n)
           LEFT JOIN children AS c ON c.child_id = v.id
           LEFT JOIN pgqueue.task_types AS d ON d.type = v.type
     WHERE (SELECT ids FROM missing) IS NULL
     ORDER BY v.n
    RETURNING id, status, queue, priority, visible_after, created_at, max_attempts, expires_at,
              parents_pending, cancelled_by, last_error, finished_at, workflow_id
),
edges_in AS (
    INSERT INTO pgqueue.task_dependencies (child_id, parent_id, position, run_anyway, bucket,
                                           outcome)
    SELECT child_id, parent_id, position, run_anyway, bucket, outcome FROM edges
     WHERE (SELECT ids FROM missing) IS NULL
),
buckets_in AS (
    INSERT INTO pgqueue.task_dependency_buckets (child_id, bucket, pending)
    SELECT child_id, bucket, count(*) FROM edges
     WHERE outcome IS NULL AND (SELECT ids FROM missing) IS NULL
     GROUP BY child_id, bucket
)
SELECT m.ids AS missing, i.*,
       CASE WHEN %(notify)s::boolean AND i.status = 'queued' AND i.visible_after <= i.created_at
            THEN pg_notify('pgqueue', i.queue) END AS notified
  FROM missing AS m LEFT JOIN inserted AS i ON true;

-- name: task_parents
-- A task's parents in depends_on order, with their outcome so far (pgqueue.parents).
SELECT d.parent_id AS task_id, t.type, t.status, d.position, d.run_anyway, t.result,
       t.last_error AS error
  FROM pgqueue.task_dependencies AS d
  LEFT JOIN pgqueue.tasks AS t ON t.id = d.parent_id
 WHERE d.child_id = %(id)s
 ORDER BY d.position;

-- name: task_parents_many
-- The parents of many claimed tasks at once: the worker's one query per claimed batch.
SELECT d.child_id, d.parent_id AS task_id, t.type, t.status, d.position, d.run_anyway,
       t.result, t.last_error AS error
  FROM pgqueue.task_dependencies AS d
  LEFT JOIN pgqueue.tasks AS t ON t.id = d.parent_id
 WHERE d.child_id = ANY(%(ids)s::uuid[])
 ORDER BY d.child_id, d.position;

-- name: task_children
-- A task's dependants (pgqueue.children), oldest first.
SELECT d.child_id AS task_id, t.type, t.status, d.position, d.run_anyway, t.result,
       t.last_error AS error
  FROM pgqueue.task_dependencies AS d
  LEFT JOIN pgqueue.tasks AS t ON t.id = d.child_id
 WHERE d.parent_id = %(id)s
 ORDER BY t.created_at, d.child_id;

-- name: workflow_tasks
-- A workflow's tasks in build order with their edges (pgqueue.workflow): parents in
-- depends_on order, children in id order. Reads the workflow through tasks_workflow_idx.
SELECT t.*,
       ARRAY(SELECT d.parent_id FROM pgqueue.task_dependencies AS d
              WHERE d.child_id = t.id ORDER BY d.position) AS parent_ids,
       ARRAY(SELECT d.child_id FROM pgqueue.task_dependencies AS d
              WHERE d.parent_id = t.id ORDER BY d.child_id) AS child_ids
  FROM pgqueue.tasks AS t
 WHERE t.workflow_id = %(id)s
 ORDER BY t.created_at, t.id;

-- name: workflow_cancel
-- Cancel every unfinished task of a workflow (pgqueue.cancel_workflow), as task_cancel does
-- one: waiting and queued ones at once, running ones flagged and their workers notified
-- (cooperative). The rows are locked in id order first, which is build order (uuid7), so
-- parents before children, the order task_dependants_settle locks them in.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
locked AS (
    SELECT id FROM pgqueue.tasks
     WHERE workflow_id = %(id)s AND status IN ('queued', 'running', 'waiting')
     ORDER BY id
       FOR UPDATE
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = CASE WHEN t.status IN ('queued', 'waiting') THEN 'cancelled' ELSE t.status END,
       finished_at = CASE WHEN t.status IN ('queued', 'waiting') THEN clock.now
                          ELSE t.finished_at END,
       cancel_requested = true
  FROM clock, locked
 WHERE t.id = locked.id AND t.status IN ('queued', 'running', 'waiting')
RETURNING t.id, t.status, t.has_dependants,
          CASE WHEN t.status = 'running'
               THEN pg_notify('pgqueue_cancel', t.lease_owner || ' ' || t.id::text) END
              AS cancel_notified
),
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished WHERE status = 'cancelled'
),
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status = 'cancelled'
)
SELECT f.id, f.status FROM finished AS f, woken, settled;
