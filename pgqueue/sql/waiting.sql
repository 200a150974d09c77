-- Waiting for a task to finish: the waiter's registration and removal, one at a time
-- and batched for the API's hub (pgqueue/queries/waiting.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: task_waiter_add
-- Wait for a task's result (pgqueue.wait): register, so that the statement finishing the task
-- notifies 'pgqueue_done' (task_waiters_wake), and read the task in the same statement. FOR
-- SHARE closes the race with a finish in flight: an UPDATE already holding the row makes this
-- wait for its commit and read the final row; one that comes later waits for this commit,
-- and its wake-up then sees the registration. Rows of waiters that died (expired) go here too.
WITH gone AS (
    DELETE FROM pgqueue.task_waiters WHERE expires_at < now()
),
registered AS (
    -- Nothing to wait for (TaskNotFound) registers nothing.
    INSERT INTO pgqueue.task_waiters (task_id, waiter_id, expires_at)
    SELECT %(id)s, %(waiter)s, now() + %(seconds)s * interval '1 second'
     WHERE EXISTS (SELECT 1 FROM pgqueue.tasks WHERE id = %(id)s)
)
SELECT * FROM pgqueue.tasks WHERE id = %(id)s FOR SHARE;

-- name: task_waiter_remove
-- The wait is over (answered, timed out or interrupted): stop notifying for it.
DELETE FROM pgqueue.task_waiters WHERE task_id = %(id)s AND waiter_id = %(waiter)s;

-- name: task_waiter_add_many
-- task_waiter_add for many waiters at once: the API's waiter hub gathers the requests that
-- arrive together. The tasks are locked in id order, as every statement that locks many does.
WITH gone AS (
    DELETE FROM pgqueue.task_waiters WHERE expires_at < now()
),
v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(waiters)s::uuid[], %(seconds)s::float8[])
                 AS v(id, waiter, seconds)),
registered AS (
    INSERT INTO pgqueue.task_waiters (task_id, waiter_id, expires_at)
    SELECT v.id, v.waiter, now() + v.seconds * interval '1 second' FROM v
     WHERE EXISTS (SELECT 1 FROM pgqueue.tasks WHERE id = v.id)
)
SELECT * FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR SHARE;

-- name: task_get_many
-- The waiter hub's reads of the tasks its waiters were woken for, in one statement.
SELECT * FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]);

-- name: task_statuses
-- The waiter hub's poll, behind a pooler with nothing to LISTEN on: which of the waited tasks
-- are final. Only the status, however large their payloads and results: a woken request
-- reads its own task afterwards.
SELECT id, status FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]);

-- name: task_waiter_remove_many
-- task_waiter_remove for many waits at once: the API's waiter hub, as task_waiter_add_many.
DELETE FROM pgqueue.task_waiters AS w
 USING unnest(%(ids)s::uuid[], %(waiters)s::uuid[]) AS v(id, waiter)
 WHERE w.task_id = v.id AND w.waiter_id = v.waiter;
