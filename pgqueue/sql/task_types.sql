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

-- name: task_types_declare_limits
-- The rate limits a worker's registry declares (rate_limit on a task type's decorator), with
-- its task types, as limits on those types: a declaration fills in where no operator set a
-- limit on the type, and follows the code (a changed rate is written, a rate removed from
-- the code removes the declared limit), but never touches a limit an operator set
-- (declared_by NULL; `pgqueue limit set` makes a declared limit the operator's). The latest
-- worker to start wins, as for the task types; an unchanged row is not written, so the
-- bucket's state survives a restart.
WITH declared AS (
    SELECT v.type, v.rate, v.period, v.burst
      FROM unnest(%(types)s::text[], %(rates)s::integer[], %(periods)s::float8[],
                  %(bursts)s::integer[]) AS v(type, rate, period, burst)
),
saved AS (
    INSERT INTO pgqueue.limits AS l (kind, name, rate_limit, rate_period, rate_burst,
                                     declared_by, updated_at)
    SELECT 'type', d.type, d.rate, d.period, d.burst, %(owner)s,
           coalesce(%(now)s::timestamptz, now())
      FROM declared AS d
     WHERE d.rate IS NOT NULL
    ON CONFLICT (kind, name) DO UPDATE
       SET rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
           rate_burst = excluded.rate_burst, declared_by = excluded.declared_by,
           -- As limit_set: a raised rate applies within one of its intervals.
           rate_next = CASE WHEN l.rate_next IS NOT NULL
                            THEN least(l.rate_next, excluded.updated_at + excluded.rate_burst
                                       * excluded.rate_period / excluded.rate_limit
                                       * interval '1 second') END,
           updated_at = excluded.updated_at
     WHERE l.declared_by IS NOT NULL
       AND (l.rate_limit, l.rate_period, l.rate_burst)
           IS DISTINCT FROM (excluded.rate_limit, excluded.rate_period, excluded.rate_burst)
    RETURNING l.name
),
removed AS (
    DELETE FROM pgqueue.limits AS l
     USING declared AS d
     WHERE l.kind = 'type' AND l.name = d.type AND d.rate IS NULL
       AND l.declared_by IS NOT NULL
    RETURNING l.name
)
SELECT (SELECT count(*) FROM saved) AS saved, (SELECT count(*) FROM removed) AS removed;
