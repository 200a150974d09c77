-- What workers declare about the task types they run, and its reads
-- (pgqueue/queries/task_types.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: task_types_declare
-- A worker's registry, recorded at its start (before its first claim): each handler's type
-- with its retry policy, queue, priority, timeout and (function tasks) parameters (NULLs: none
-- declared), what enqueue reads when the caller gives none and what the CLI and the API check
-- a payload against. The latest worker to start wins, as for schedules; an unchanged row is
-- not written.
INSERT INTO pgqueue.task_types AS d (type, max_attempts, backoff_base, backoff_factor,
                                     backoff_cap, queue, priority, timeout, parameters,
                                     declared_by, updated_at)
SELECT v.type, v.max_attempts, v.base, v.factor, v.cap, v.queue, v.priority, v.timeout,
       v.parameters::jsonb, %(owner)s, coalesce(%(now)s::timestamptz, now())
  FROM unnest(%(types)s::text[], %(max_attempts)s::integer[], %(bases)s::real[],
              %(factors)s::real[], %(caps)s::real[], %(queues)s::text[],
              %(priorities)s::smallint[], %(timeouts)s::real[], %(parameters)s::text[])
       AS v(type, max_attempts, base, factor, cap, queue, priority, timeout, parameters)
ON CONFLICT (type) DO UPDATE
   SET max_attempts = excluded.max_attempts, backoff_base = excluded.backoff_base,
       backoff_factor = excluded.backoff_factor, backoff_cap = excluded.backoff_cap,
       queue = excluded.queue, priority = excluded.priority, timeout = excluded.timeout,
       parameters = excluded.parameters,
       declared_by = excluded.declared_by, updated_at = excluded.updated_at
 WHERE (d.max_attempts, d.backoff_base, d.backoff_factor, d.backoff_cap, d.queue, d.priority,
        d.timeout, d.parameters)
       IS DISTINCT FROM (excluded.max_attempts, excluded.backoff_base,
                         excluded.backoff_factor, excluded.backoff_cap, excluded.queue,
                         excluded.priority, excluded.timeout, excluded.parameters);

-- name: task_types_list
-- The declared task types, for `pgqueue types`-like readers and tests.
SELECT type, max_attempts, backoff_base, backoff_factor, backoff_cap, queue, priority, timeout,
       parameters, declared_by, updated_at
  FROM pgqueue.task_types
 ORDER BY type;

-- name: task_type_parameters
-- A function task's recorded parameters (one primary-key read), which the CLI and the HTTP
-- API check a payload against before they insert it: they never import the user's code.
SELECT parameters FROM pgqueue.task_types WHERE type = %(type)s;
