-- Putting tasks in: one by INSERT, many by binary COPY, keyed ones by one INSERT over
-- arrays, and what a taken key reads back (pgqueue/queries/submitting.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: task_insert
-- One task; with a taken idempotency key nothing is inserted and no row comes back.
-- pg_notify is transactional: idle workers wake only if (and when) the caller commits; not at
-- all with %(notify)s false (PGQUEUE_NOTIFY=off: producers' commits then never queue for the
-- cluster-wide lock a NOTIFY takes, and workers poll).
-- The retry policy, field by field: the caller's, else the type's declaration (one primary-key
-- read of pgqueue.task_types), else the default (see task_insert_plain). So are the queue and
-- the priority: NULL from the caller means "not given". The concurrency key is the caller's
-- (NULL: none).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
inserted AS (
    INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                               backoff_factor, backoff_cap, idempotency_key, visible_after,
                               created_at, trace_context, policy_default, expires_at,
                               workflow_id, concurrency_key)
    SELECT %(id)s, coalesce(%(queue)s::text, d.queue, %(default_queue)s), %(type)s,
           %(payload)s::jsonb,
           coalesce(%(priority)s::smallint, d.priority, %(default_priority)s::smallint),
           coalesce(%(max_attempts)s::integer, d.max_attempts, %(default_max_attempts)s),
           coalesce(%(backoff_base)s::real, d.backoff_base, %(default_backoff_base)s),
           coalesce(%(backoff_factor)s::real, d.backoff_factor, %(default_backoff_factor)s),
           coalesce(%(backoff_cap)s::real, d.backoff_cap, %(default_backoff_cap)s),
           %(idempotency_key)s,
           coalesce(%(run_at)s::timestamptz, clock.now + %(delay)s * interval '1 second'),
           clock.now, %(trace_context)s::jsonb,
           CASE WHEN %(explicit)s::boolean IS NOT TRUE AND d.type IS NULL THEN true END,
           -- The expiry: an absolute time, or seconds from the server's clock.
           coalesce(%(expires_at)s::timestamptz,
                    clock.now + %(expires_in)s::double precision * interval '1 second'),
           %(workflow_id)s::uuid,  -- a workflow's root task with a key
           %(concurrency_key)s::text
      FROM clock LEFT JOIN pgqueue.task_types AS d ON d.type = %(type)s
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, priority, visible_after, created_at, max_attempts, expires_at
)
SELECT inserted.id, inserted.visible_after, inserted.created_at, inserted.max_attempts,
       inserted.queue, inserted.priority, inserted.expires_at,
       CASE WHEN %(notify)s::boolean AND inserted.visible_after <= clock.now
            THEN pg_notify('pgqueue', inserted.queue) END AS notified
  FROM inserted, clock;

-- name: task_insert_plain
-- One task without an idempotency key: nothing can conflict, so a plain INSERT (no CTE, no
-- ON CONFLICT arbiter) does it, about a sixth cheaper than task_insert. Wakes idle workers on
-- commit, as task_insert does (unless %(notify)s is false). The retry policy, field by field: the caller's, else the
-- type's declaration (one primary-key read of pgqueue.task_types, in this statement: no round
-- trip more), else the default. policy_default marks a task that got the default for want of
-- both, so that the first claim after its type is declared applies the declaration. The queue
-- and the priority: the caller's, else the type's, else the default (never applied later: the
-- queue decides which workers may claim the task). The concurrency key is the caller's (NULL:
-- none, which puts the task in the plain claim index, as before keys existed).
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                           backoff_factor, backoff_cap, visible_after, created_at, trace_context,
                           policy_default, expires_at, concurrency_key)
SELECT %(id)s, coalesce(%(queue)s::text, d.queue, %(default_queue)s), %(type)s,
       %(payload)s::jsonb,
       coalesce(%(priority)s::smallint, d.priority, %(default_priority)s::smallint),
       coalesce(%(max_attempts)s::integer, d.max_attempts, %(default_max_attempts)s),
       coalesce(%(backoff_base)s::real, d.backoff_base, %(default_backoff_base)s),
       coalesce(%(backoff_factor)s::real, d.backoff_factor, %(default_backoff_factor)s),
       coalesce(%(backoff_cap)s::real, d.backoff_cap, %(default_backoff_cap)s),
       coalesce(%(run_at)s::timestamptz,
                coalesce(%(now)s::timestamptz, now()) + %(delay)s * interval '1 second'),
       coalesce(%(now)s::timestamptz, now()), %(trace_context)s::jsonb,
       CASE WHEN %(explicit)s::boolean IS NOT TRUE AND d.type IS NULL THEN true END,
       -- The expiry, as in task_insert.
       coalesce(%(expires_at)s::timestamptz,
                coalesce(%(now)s::timestamptz, now())
                + %(expires_in)s::double precision * interval '1 second'),
       %(concurrency_key)s::text
  FROM (SELECT) AS one LEFT JOIN pgqueue.task_types AS d ON d.type = %(type)s
RETURNING visible_after, created_at, max_attempts, queue, priority, expires_at,
          CASE WHEN %(notify)s::boolean AND visible_after <= created_at
               THEN pg_notify('pgqueue', queue) END AS notified;

-- name: task_insert_simple
-- task_insert_plain for the most common submit: no retry policy, run_at, delay, expiry,
-- concurrency key or trace context given (the queue and the priority may be). The same row,
-- from 13 parameters instead of 24, with 5 columns back instead of 7 (visible_after is
-- created_at; expires_at is NULL): each parameter and column costs the client more than it
-- costs the server, about a tenth of a submit's own instructions in all. Wakes idle workers
-- on commit unless %(notify)s is false, as task_insert_plain does.
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                           backoff_factor, backoff_cap, visible_after, created_at,
                           policy_default)
SELECT %(id)s, coalesce(%(queue)s::text, d.queue, %(default_queue)s), %(type)s,
       %(payload)s::jsonb,
       coalesce(%(priority)s::smallint, d.priority, %(default_priority)s::smallint),
       coalesce(d.max_attempts, %(default_max_attempts)s),
       coalesce(d.backoff_base, %(default_backoff_base)s),
       coalesce(d.backoff_factor, %(default_backoff_factor)s),
       coalesce(d.backoff_cap, %(default_backoff_cap)s),
       coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
       CASE WHEN d.type IS NULL THEN true END
  FROM (SELECT) AS one LEFT JOIN pgqueue.task_types AS d ON d.type = %(type)s
RETURNING created_at, max_attempts, queue, priority,
          CASE WHEN %(notify)s::boolean THEN pg_notify('pgqueue', queue) END AS notified;

-- name: clock
-- The transaction's time (or the tests' clock): what a bulk COPY stamps on its rows.
SELECT coalesce(%(now)s::timestamptz, now()) AS now;

-- name: task_copy_clock
-- A bulk COPY's time (as "clock") and the declarations of its types, in one round trip: COPY
-- cannot read pgqueue.task_types, so the client applies them (the precedence of task_insert).
SELECT coalesce(%(now)s::timestamptz, now()) AS now,
       (SELECT coalesce(jsonb_object_agg(type, jsonb_build_array(max_attempts, backoff_base,
                                                                 backoff_factor, backoff_cap,
                                                                 queue, priority)),
                        '{}'::jsonb)
          FROM pgqueue.task_types WHERE type = ANY(%(types)s::text[])) AS declared;

-- name: task_copy
-- Bulk enqueue of tasks without idempotency keys (nothing can conflict): binary COPY, the
-- server's fastest way in. Times come from the "clock" statement, so they are the server's.
COPY pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                    backoff_factor, backoff_cap, visible_after, created_at, trace_context,
                    policy_default, expires_at)
FROM STDIN (FORMAT BINARY);

-- name: task_copy_keyed
-- task_copy for a batch in which some task has a concurrency key: the same columns and the
-- key, so that a batch without keys sends no column of NULLs more.
COPY pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                    backoff_factor, backoff_cap, visible_after, created_at, trace_context,
                    policy_default, expires_at, concurrency_key)
FROM STDIN (FORMAT BINARY);

-- name: task_insert_many
-- Many tasks with idempotency keys in one statement (arrays, one element per task); taken
-- keys are skipped. The retry policy, queue and priority as in task_insert (explicit: the
-- caller gave a policy).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                           backoff_factor, backoff_cap, idempotency_key, visible_after,
                           created_at, trace_context, policy_default, expires_at, workflow_id,
                           concurrency_key)
SELECT v.id, coalesce(v.queue, d.queue, %(default_queue)s), v.type, v.payload::jsonb,
       coalesce(v.priority, d.priority, %(default_priority)s::smallint),
       coalesce(v.max_attempts, d.max_attempts, %(default_max_attempts)s),
       coalesce(v.backoff_base, d.backoff_base, %(default_backoff_base)s),
       coalesce(v.backoff_factor, d.backoff_factor, %(default_backoff_factor)s),
       coalesce(v.backoff_cap, d.backoff_cap, %(default_backoff_cap)s),
       v.idempotency_key,
       coalesce(v.run_at, clock.now + v.delay * interval '1 second'), clock.now,
       %(trace_context)s::jsonb,
       CASE WHEN NOT v.explicit AND d.type IS NULL THEN true END,
       coalesce(v.expires_at, clock.now + v.expires_in * interval '1 second'),
       v.workflow_id,  -- a workflow's root task with a key
       v.concurrency_key
  FROM clock,
       unnest(%(ids)s::uuid[], %(queues)s::text[], %(types)s::text[], %(payloads)s::text[],
              %(priorities)s::smallint[], %(max_attempts)s::integer[], %(backoff_bases)s::real[],
              %(backoff_factors)s::real[], %(backoff_caps)s::real[],
              %(idempotency_keys)s::text[], %(run_ats)s::timestamptz[],
              %(delays)s::double precision[], %(explicits)s::boolean[],
              %(expires_ats)s::timestamptz[], %(expires_ins)s::double precision[],
              %(workflow_ids)s::uuid[], %(concurrency_keys)s::text[])
       WITH ORDINALITY
       AS v(id, queue, type, payload, priority, max_attempts, backoff_base, backoff_factor,
            backoff_cap, idempotency_key, run_at, delay, explicit, expires_at, expires_in,
            workflow_id, concurrency_key, n)
       LEFT JOIN pgqueue.task_types AS d ON d.type = v.type
 -- In the caller's order, whatever the join: of two tasks in one batch with the same key,
 -- the first is the one created.
 ORDER BY v.n
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, visible_after, created_at, max_attempts, queue, priority, expires_at;

-- name: queue_notify
-- Wake idle workers of these queues (once per queue, after a bulk insert); not sent at all
-- when enqueues do not notify (PGQUEUE_NOTIFY=off).
SELECT pg_notify('pgqueue', q) FROM unnest(%(queues)s::text[]) AS q;

-- name: task_get_by_keys
-- The existing tasks behind idempotency keys that an insert found taken.
SELECT * FROM pgqueue.tasks WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: task_get_by_keys_compared
-- The existing tasks behind idempotency keys that an insert found taken, each compared with
-- what was submitted under its key (key_reuse='refuse'; n: the submit's position). jsonb
-- equality, so key order and spacing do not matter. Run only after a conflict: an insert that
-- succeeds pays nothing for the comparison.
SELECT t.*, t.payload = v.payload::jsonb AS same_payload, v.n
  FROM unnest(%(keys)s::text[], %(payloads)s::text[]) WITH ORDINALITY AS v(key, payload, n)
  JOIN pgqueue.tasks AS t ON t.idempotency_key = v.key
 ORDER BY v.n;

-- name: task_delete_created
-- Undo the tasks a bulk enqueue inserted in this transaction when one of its items is refused
-- (key_reuse='refuse'): the batch is all or nothing, and deleting its own uncommitted rows
-- (by the ids it inserted, never others) leaves the caller's transaction usable, which a
-- savepoint would too but at two round trips on every batch, refused or not.
DELETE FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]);
