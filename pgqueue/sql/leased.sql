-- What the holder of a lease writes about its task, each statement fenced by the lease:
-- complete, fail, cancel, snooze, heartbeat, release, progress; and the one thing it reads, whether
-- someone asked it to cancel (pgqueue/queries/leased.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping. The arrays of ids and lease tokens go as %(name)b, in binary:
-- psycopg dumps a list of UUIDs about seven times faster so (0.09 ms against 0.68 for 500),
-- and a worker's completion batch sends two of them.

-- name: task_complete
-- Record results for many tasks at once, each only where the caller still holds the lease.
-- Every statement that writes many leased rows (this one, task_heartbeat, task_release)
-- locks them first in id order: two of them over the same rows, each locking
-- in its own order, would deadlock (a worker's heartbeat and its completions did). Each row
-- is looked up by its id alone, in a lateral that LIMIT 1 keeps from being flattened into a
-- join, and without naming its status (tasks_lease_check makes a token imply 'running'):
-- otherwise the planner may read the running-tasks index (status = 'running'), which it
-- believes tiny and which, while an old snapshot is open, holds an entry for every task
-- finished since (a second per statement).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
v AS (SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(results)s::text[])
                 AS v(id, token, result)),
locked AS MATERIALIZED (
    SELECT t.id
      FROM (SELECT id, token FROM v ORDER BY id) AS w
     CROSS JOIN LATERAL (
           SELECT id FROM pgqueue.tasks
            WHERE id = w.id AND lease_token = w.token  -- a token is only ever on a running task
            LIMIT 1
              FOR UPDATE
           ) AS t
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = 'completed', result = v.result::jsonb, finished_at = clock.now,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM clock, locked, v
 WHERE t.id = locked.id AND v.id = locked.id
RETURNING t.id, t.has_dependants
),
-- Wake whoever waits on the tasks this made final (see task_waiter_add).
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished
),
-- Count the finish on the dependants' edges, releasing or cancelling them.
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_fail
-- A failed attempt: queued again after a backoff, or dead-lettered when attempts are spent.
-- An explicit delay (a handler's Retry(after=...)) replaces the computed backoff. A retry
-- policy given here (the task type's, from the worker's registry) replaces the row's and is
-- stored, so the sweep applies it too.
-- `dead` dead-letters it now, attempts left or not: a failure no retry can mend (a result
-- too large to store), which would otherwise fail every attempt in turn.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
policy AS (
    SELECT id,
           coalesce(%(max_attempts)s::integer, max_attempts) AS max_attempts,
           coalesce(%(backoff_base)s::real, backoff_base) AS base,
           coalesce(%(backoff_factor)s::real, backoff_factor) AS factor,
           coalesce(%(backoff_cap)s::real, backoff_cap) AS cap
      FROM pgqueue.tasks
     WHERE id = %(id)s
),
decision AS (
    -- Cancellation was requested: this attempt was the last, whatever its attempts say.
    SELECT p.*, CASE WHEN t.cancel_requested THEN 'cancelled'
                     WHEN %(dead)s::boolean OR t.attempts >= p.max_attempts THEN 'failed'
                     ELSE 'queued' END AS next_status
      FROM policy AS p JOIN pgqueue.tasks AS t USING (id)
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = p.next_status,
       visible_after = CASE WHEN p.next_status <> 'queued' THEN t.visible_after
                            ELSE clock.now + coalesce(%(delay)s::double precision,
                                   pgqueue.retry_delay(t.attempts, p.base, p.factor, p.cap))
                                 * interval '1 second' END,
       finished_at = CASE WHEN p.next_status <> 'queued' THEN clock.now END,
       -- A retry waits again, but its age keeps counting from when it first became ready.
       ready_since = coalesce(t.ready_since, t.visible_after),
       max_attempts = p.max_attempts, backoff_base = p.base, backoff_factor = p.factor,
       backoff_cap = p.cap,
       last_error = left(%(error)s, 8000),
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM clock, decision AS p
 WHERE t.id = p.id AND t.lease_token = %(token)s AND t.status = 'running'
RETURNING t.id, t.status, t.attempts, t.visible_after, t.has_dependants
),
-- Wake whoever waits on the tasks this made final (see task_waiter_add).
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished WHERE status <> 'queued'
),
-- Count the finish on the dependants' edges; a retry (queued) counts nothing.
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status <> 'queued'
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_cancel_leased
-- A handler asked to cancel its own task: final, no retry.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = 'cancelled', finished_at = clock.now, last_error = left(%(reason)s, 8000),
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM clock
 WHERE t.id = %(id)s AND t.lease_token = %(token)s AND t.status = 'running'
RETURNING t.id, t.has_dependants
),
-- Wake whoever waits on the tasks this made final (see task_waiter_add).
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished
),
-- Count the finish on the dependants' edges, releasing or cancelling them.
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_snooze
-- A handler raised Snooze(after=...): back to queued, visible `after` seconds
-- from now, without spending the attempt (the claim's is given back) and one snooze more.
-- Its wait keeps counting from when it first became ready, as a retry's does: a downstream
-- that answers 429 for an hour is a backlog growing old. Only below the bound: at
-- max_snoozes no row comes back, and the caller records a failed attempt instead
-- (task_fail), so a task cannot snooze forever. A cancellation requested meanwhile wins.
-- Fenced by the lease, as every outcome write. A task cancelled so is final: its waiters are
-- woken (see task_waiter_add).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
snoozed AS (
    UPDATE pgqueue.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'queued' END,
           finished_at = CASE WHEN t.cancel_requested THEN clock.now END,
           visible_after = CASE WHEN t.cancel_requested THEN t.visible_after
                                ELSE clock.now + %(after)s * interval '1 second' END,
           ready_since = coalesce(t.ready_since, t.visible_after),
           attempts = greatest(t.attempts - 1, 0),
           snoozes = coalesce(t.snoozes, 0) + 1,
           lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
      FROM clock
     WHERE t.id = %(id)s AND t.lease_token = %(token)s AND t.status = 'running'
       AND coalesce(t.snoozes, 0) < %(max_snoozes)s
    RETURNING t.id, t.status, t.attempts, t.snoozes, t.visible_after, t.has_dependants
),
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM snoozed WHERE status = 'cancelled'
),
settled AS MATERIALIZED (  -- a cancel is final
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM snoozed WHERE status = 'cancelled'
)
SELECT s.* FROM snoozed AS s, woken, settled;

-- name: task_heartbeat
-- Extend the leases the caller still holds; the answer says which are still held and
-- whether someone asked for cooperative cancellation.
-- Rows locked in id order first, as task_complete says why.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
v AS (SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS v(id, token)),
locked AS MATERIALIZED (
    SELECT t.id
      FROM (SELECT id, token FROM v ORDER BY id) AS w
     CROSS JOIN LATERAL (
           SELECT id FROM pgqueue.tasks
            WHERE id = w.id AND lease_token = w.token  -- a token is only ever on a running task
            LIMIT 1
              FOR UPDATE
           ) AS t
)
UPDATE pgqueue.tasks AS t
   SET lease_expires_at = clock.now + %(lease_seconds)s * interval '1 second'
  FROM clock, locked, v
 WHERE t.id = locked.id AND v.id = locked.id
RETURNING t.id, t.cancel_requested, t.lease_expires_at;

-- name: task_progress
-- A handler's progress report (ctx.set_progress), written where the caller still holds the
-- lease: a worker that lost its task writes nothing over its successor's. The row by its id
-- alone, as task_complete says why. No index names the column: a HOT update when the page
-- has room. The worker coalesces a handler's reports (pgqueue/progress.py), so this runs at
-- most twice a second per running task.
UPDATE pgqueue.tasks
   SET progress = %(progress)s::jsonb
 WHERE id = %(id)s AND lease_token = %(token)s  -- a token is only ever on a running task
RETURNING id;

-- name: task_cancel_requested
-- Which of the caller's leased tasks someone asked to cancel: what a worker that hears no
-- pgqueue_cancel notification (behind a transaction pooler, without a LISTEN URL) asks twice
-- a second while it runs tasks, instead of waiting for its next heartbeat. A read, no lock,
-- each row by its id in a lateral (as task_complete says why), fenced by the token: a lease
-- lost meanwhile is left out (the heartbeat's to report).
SELECT t.id
  FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS v(id, token)
 CROSS JOIN LATERAL (
       SELECT id FROM pgqueue.tasks
        WHERE id = v.id AND lease_token = v.token AND cancel_requested
        LIMIT 1
       ) AS t;

-- name: task_release
-- Hand tasks back untouched (graceful shutdown): queued at once, the attempt not counted.
-- A task whose cancellation was requested is cancelled instead of going back.
-- Rows locked in id order first, as task_complete says why.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
v AS (SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS v(id, token)),
locked AS MATERIALIZED (
    SELECT t.id
      FROM (SELECT id, token FROM v ORDER BY id) AS w
     CROSS JOIN LATERAL (
           SELECT id FROM pgqueue.tasks
            WHERE id = w.id AND lease_token = w.token  -- a token is only ever on a running task
            LIMIT 1
              FOR UPDATE
           ) AS t
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'queued' END,
       finished_at = CASE WHEN t.cancel_requested THEN clock.now END,
       attempts = greatest(t.attempts - 1, 0), visible_after = clock.now,
       ready_since = coalesce(t.ready_since, t.visible_after),  -- still waiting since then
       started_at = NULL, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM clock, locked, v
 WHERE t.id = locked.id AND v.id = locked.id
RETURNING t.id, t.queue, t.status, t.has_dependants
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
