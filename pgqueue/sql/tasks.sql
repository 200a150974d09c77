-- One task or a page of them: read, list, cancel; dead letters replayed, discarded,
-- counted (pgqueue/queries/tasks.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: queue_notify_released
-- Wake the workers of these queues for tasks older than where their claims got to (replayed
-- dead letters): pgqueue_released first, so that a worker walks the queue's claim index from
-- its start (worker/claim_starts.py), then the wake-up every worker listens for.
SELECT pg_notify('pgqueue_released', q), pg_notify('pgqueue', q)
  FROM unnest(%(queues)s::text[]) AS q;

-- name: task_get
-- One task by id (the primary key): pgqueue.get_task, and the re-read after a change.
SELECT * FROM pgqueue.tasks WHERE id = %(id)s;

-- name: task_list
-- Newest first, with keyset pagination on (created_at, id) so deep pages stay cheap.
SELECT * FROM pgqueue.tasks
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(type)s::text IS NULL OR type = %(type)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(before_created)s::timestamptz IS NULL
        OR (created_at, id) < (%(before_created)s::timestamptz, %(before_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: task_list_summary
-- task_list's page without the payload and the result: the same filters, cursor and order (so
-- the same index walk), naming the other columns a Task reads. pg_column_size reads a value's stored size
-- from its header or TOAST pointer, so neither value is fetched from TOAST, decompressed or
-- printed: a page costs its rows, not what was submitted. last_error is cut to the 8,000
-- characters every write keeps (error_text.MAX_ERROR_LENGTH), whoever wrote the row.
SELECT id, queue, type, priority, status, attempts, max_attempts, visible_after,
       idempotency_key, left(last_error, 8000) AS last_error, cancel_requested, lease_owner,
       lease_expires_at, created_at, started_at, finished_at, submitted_priority, ready_since,
       snoozes, expires_at, workflow_id, parents_pending, cancelled_by, concurrency_key,
       progress,  -- a handler's report, at most 4 KiB (pgqueue/progress.py): read whole
       pg_column_size(payload) AS payload_stored_bytes,
       pg_column_size(result) AS result_stored_bytes
  FROM pgqueue.tasks
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(type)s::text IS NULL OR type = %(type)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(before_created)s::timestamptz IS NULL
        OR (created_at, id) < (%(before_created)s::timestamptz, %(before_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: task_cancel
-- Cancel by id: a queued task is cancelled at once; a running one is flagged, and its
-- handler sees the flag through its context (cooperative cancellation).
-- The worker holding a running task's lease is told at once, on commit: a NOTIFY
-- on pgqueue_cancel, "OWNER TASK_ID", which its listener turns into the handler's stop flag
-- within milliseconds instead of at its next heartbeat (a third of the lease later). The
-- heartbeat still reads the flag: a notification lost while the listener reconnects is only
-- late, never missed.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = CASE WHEN t.status IN ('queued', 'waiting') THEN 'cancelled' ELSE t.status END,
       finished_at = CASE WHEN t.status IN ('queued', 'waiting') THEN clock.now
                          ELSE t.finished_at END,
       cancel_requested = true
  FROM clock
 WHERE t.id = %(id)s AND t.status IN ('queued', 'running', 'waiting')
RETURNING t.*,
          CASE WHEN t.status = 'running'
               THEN pg_notify('pgqueue_cancel', t.lease_owner || ' ' || t.id::text) END
              AS cancel_notified
),
-- Wake whoever waits on the tasks this made final (see task_waiter_add).
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished WHERE status = 'cancelled'
),
settled AS MATERIALIZED (  -- a cancel is final
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status = 'cancelled'
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_replay
-- Dead letters back to queued with fresh attempts, by id or by filter, one batch at a time:
-- queue by queue, oldest first within each (the order of tasks_retention_idx, so a batch
-- never sorts the whole dead-letter queue).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
picked AS (
    SELECT id FROM pgqueue.tasks
     WHERE status = 'failed'
       AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
       AND (%(type)s::text IS NULL OR type = %(type)s)
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, finished_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
),
replayed AS (
UPDATE pgqueue.tasks AS t
   SET status = 'queued', attempts = 0, visible_after = clock.now, finished_at = NULL,
       started_at = NULL, result = NULL, cancel_requested = false,
       ready_since = NULL  -- a replay is a new wait, which starts now
  FROM picked, clock
 WHERE t.id = picked.id
RETURNING t.id, t.queue, t.has_dependants
),
-- The dependants its failure cancelled wait for it again.
revived AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_revive(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM replayed
)
SELECT r.id, r.queue FROM replayed AS r, revived;

-- name: task_dead_count
-- How many dead letters a bulk replay or discard by this filter would take, said before it
-- is confirmed (the dashboard asks "replay 142 tasks?"); read from tasks_retention_idx's
-- range for status 'failed' (and the queue, when given).
SELECT count(*) AS count FROM pgqueue.tasks
 WHERE status = 'failed'
   AND (%(type)s::text IS NULL OR type = %(type)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s);

-- name: task_discard
-- Delete dead letters, by id or by filter, one batch at a time.
WITH picked AS (
    SELECT id FROM pgqueue.tasks
     WHERE status = 'failed'
       AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
       AND (%(type)s::text IS NULL OR type = %(type)s)
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue.tasks AS t USING picked WHERE t.id = picked.id
RETURNING t.id;
