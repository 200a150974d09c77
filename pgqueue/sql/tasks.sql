-- Every statement pgqueue runs, by name. Each starts with "-- name: NAME" and a line saying why.
-- Parameters use psycopg's %(name)s style; %(now)s is NULL in production and a fixed time in
-- tests, so tests control the clock instead of sleeping.

-- name: task_insert
-- One task; with a taken idempotency key nothing is inserted and no row comes back.
-- pg_notify is transactional: idle workers wake only if (and when) the caller commits.
-- The retry policy, field by field: the caller's, else the type's declaration (one primary-key
-- read of pgqueue.task_types), else the default (see task_insert_plain). So are the queue and
-- the priority: NULL from the caller means "not given" (issue 15).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
inserted AS (
    INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                               backoff_factor, backoff_cap, idempotency_key, visible_after,
                               created_at, trace_context, policy_default, expires_at,
                               workflow_id)
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
           -- The expiry (issue 15): an absolute time, or seconds from the server's clock.
           coalesce(%(expires_at)s::timestamptz,
                    clock.now + %(expires_in)s::double precision * interval '1 second'),
           %(workflow_id)s::uuid  -- a workflow's root task with a key (issue 16)
      FROM clock LEFT JOIN pgqueue.task_types AS d ON d.type = %(type)s
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, priority, visible_after, created_at, max_attempts, expires_at
)
SELECT inserted.id, inserted.visible_after, inserted.created_at, inserted.max_attempts,
       inserted.queue, inserted.priority, inserted.expires_at,
       CASE WHEN inserted.visible_after <= clock.now
            THEN pg_notify('pgqueue', inserted.queue) END AS notified
  FROM inserted, clock;

-- name: task_insert_plain
-- One task without an idempotency key: nothing can conflict, so a plain INSERT (no CTE, no
-- ON CONFLICT arbiter) does it, about a sixth cheaper than task_insert. Wakes idle workers on
-- commit, as task_insert does. The retry policy, field by field: the caller's, else the
-- type's declaration (one primary-key read of pgqueue.task_types, in this statement: no round
-- trip more), else the default. policy_default marks a task that got the default for want of
-- both, so that the first claim after its type is declared applies the declaration. The queue
-- and the priority: the caller's, else the type's, else the default (never applied later: the
-- queue decides which workers may claim the task).
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                           backoff_factor, backoff_cap, visible_after, created_at, trace_context,
                           policy_default, expires_at)
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
       -- The expiry (issue 15), as in task_insert.
       coalesce(%(expires_at)s::timestamptz,
                coalesce(%(now)s::timestamptz, now())
                + %(expires_in)s::double precision * interval '1 second')
  FROM (SELECT) AS one LEFT JOIN pgqueue.task_types AS d ON d.type = %(type)s
RETURNING visible_after, created_at, max_attempts, queue, priority, expires_at,
          CASE WHEN visible_after <= created_at THEN pg_notify('pgqueue', queue) END AS notified;

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

-- name: task_insert_many
-- Many tasks with idempotency keys in one statement (arrays, one element per task); taken
-- keys are skipped. The retry policy, queue and priority as in task_insert (explicit: the
-- caller gave a policy).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO pgqueue.tasks (id, queue, type, payload, priority, max_attempts, backoff_base,
                           backoff_factor, backoff_cap, idempotency_key, visible_after,
                           created_at, trace_context, policy_default, expires_at, workflow_id)
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
       coalesce(v.expires_at, clock.now + v.expires_in * interval '1 second'),  -- issue 15
       v.workflow_id  -- a workflow's root task with a key (issue 16)
  FROM clock,
       unnest(%(ids)s::uuid[], %(queues)s::text[], %(types)s::text[], %(payloads)s::text[],
              %(priorities)s::smallint[], %(max_attempts)s::integer[], %(backoff_bases)s::real[],
              %(backoff_factors)s::real[], %(backoff_caps)s::real[],
              %(idempotency_keys)s::text[], %(run_ats)s::timestamptz[],
              %(delays)s::double precision[], %(explicits)s::boolean[],
              %(expires_ats)s::timestamptz[], %(expires_ins)s::double precision[],
              %(workflow_ids)s::uuid[])
       WITH ORDINALITY
       AS v(id, queue, type, payload, priority, max_attempts, backoff_base, backoff_factor,
            backoff_cap, idempotency_key, run_at, delay, explicit, expires_at, expires_in,
            workflow_id, n)
       LEFT JOIN pgqueue.task_types AS d ON d.type = v.type
 -- In the caller's order, whatever the join: of two tasks in one batch with the same key,
 -- the first is the one created.
 ORDER BY v.n
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, visible_after, created_at, max_attempts, queue, priority, expires_at;

-- name: task_dependants_settle
-- Settle the dependants of tasks already final (task_insert_dependent: a task of the batch
-- inserted cancelled, whose children in the same statement could not see it so).
SELECT pgqueue.task_dependants_settle(%(ids)s::uuid[]) AS released;

-- name: task_outcomes
-- What became of tasks just inserted, read again after task_dependants_settle moved them.
SELECT id, status, parents_pending, cancelled_by, last_error, finished_at
  FROM pgqueue.tasks WHERE id = ANY(%(ids)s::uuid[]);

-- name: queue_notify
-- Wake idle workers of these queues (once per queue, after a bulk insert).
SELECT pg_notify('pgqueue', q) FROM unnest(%(queues)s::text[]) AS q;

-- name: queue_notify_released
-- Wake the workers of these queues for tasks older than where their claims got to (replayed
-- dead letters): pgqueue_released first, so that a worker walks the queue's claim index from
-- its start (worker/claim_starts.py), then the wake-up every worker listens for.
SELECT pg_notify('pgqueue_released', q), pg_notify('pgqueue', q)
  FROM unnest(%(queues)s::text[]) AS q;

-- name: task_get
SELECT * FROM pgqueue.tasks WHERE id = %(id)s;

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

-- name: task_waiter_remove_many
DELETE FROM pgqueue.task_waiters AS w
 USING unnest(%(ids)s::uuid[], %(waiters)s::uuid[]) AS v(id, waiter)
 WHERE w.task_id = v.id AND w.waiter_id = v.waiter;

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

-- name: task_claim
-- The heart of the queue. The CTE picks the next visible tasks in (priority, created_at)
-- order and SKIP LOCKED lets concurrent claimers pass each other's rows instead of waiting;
-- doing it in a CTE stops the planner from updating more rows than LIMIT. Each queue and
-- priority is read by its own LATERAL walk of the claim index, whose order is (queue,
-- priority, created_at, id): `queue = ANY(...)` would instead read and sort the whole backlog
-- on every claim (27 ms at 60,000 tasks, growing with the backlog). The few rows per walk are
-- then merged. A paused queue (pgqueue.queues, one primary-key probe per queue) is skipped.
-- Tasks under a limit (pgqueue.limits: their type or their queue has one) are left to
-- task_claim_limited. Each claim counts an attempt and issues a fresh lease token, so a
-- previous holder's writes are fenced.
-- Each walk starts after (after_created, after_id), '-infinity' for the whole range: every
-- claimed task leaves a claim-index entry that only vacuum removes, and while an old snapshot
-- is open (an idle transaction, a report, pg_dump) vacuum cannot, so a walk from the start
-- steps over every task claimed since; a worker starts its walks where its last claim ended
-- (see pgqueue/worker/claim_starts.py).
-- The limits are probed by primary key (NOT EXISTS), not compared with an array of their
-- names: for `type <> ALL(array)` the planner guesses that almost no task passes, and then
-- reads and sorts the whole backlog instead of walking the index.
-- Committed without waiting for the WAL flush (synchronous_commit off for this transaction
-- only), as the start mark is: a claim is a lease, not a promise. Only a crash of the server
-- within a moment of it can forget it, and then the task is simply queued again, with that
-- execution uncounted; any durable commit after it (the handler's own, its completion) makes
-- it durable too, since the WAL is flushed in order. The flush was one of the two an idle
-- pickup waited for; the submit's, which must stay, is the other.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                      set_config('synchronous_commit', 'off', true) AS async_commit),
next AS (
    SELECT c.id
      FROM clock,
           unnest(%(queues)s::text[],
                  %(high_after)s::timestamptz[], %(high_after_id)s::uuid[],
                  %(normal_after)s::timestamptz[], %(normal_after_id)s::uuid[],
                  %(low_after)s::timestamptz[], %(low_after_id)s::uuid[])
           AS w(queue, high_after, high_after_id, normal_after, normal_after_id, low_after,
                low_after_id)
     CROSS JOIN LATERAL (
           -- The levels in turn, each walk pulled only as far as the batch still needs, so
           -- no more rows are locked than are claimed.
           SELECT walk.*
             FROM unnest(ARRAY[0, 1, 2]::smallint[],
                         ARRAY[w.high_after, w.normal_after, w.low_after],
                         ARRAY[w.high_after_id, w.normal_after_id, w.low_after_id])
                  AS level(priority, after_created, after_id)
            CROSS JOIN LATERAL (
                  SELECT id, priority, created_at FROM pgqueue.tasks
                   WHERE status = 'queued' AND queue = w.queue AND priority = level.priority
                     AND (created_at, id) > (level.after_created, level.after_id)
                     AND visible_after <= clock.now
                     -- Never start an expired task (issue 15): maintenance cancels it.
                     -- A filter on the row the walk reads anyway, not a new range.
                     AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
                     AND NOT EXISTS (SELECT 1 FROM pgqueue.limits AS l
                                      WHERE l.kind = 'type' AND l.name = tasks.type)
                   ORDER BY created_at, id
                   LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED
                  ) AS walk
            LIMIT %(limit)s
           ) AS c
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queues AS p WHERE p.name = w.queue AND p.paused)
       AND NOT EXISTS (SELECT 1 FROM pgqueue.limits AS l
                        WHERE l.kind = 'queue' AND l.name = w.queue)
     ORDER BY c.priority, c.created_at, c.id
     LIMIT %(limit)s
)
UPDATE pgqueue.tasks AS t
   SET status = 'running',
       attempts = t.attempts + 1,
       lease_owner = %(owner)s,
       lease_token = gen_random_uuid(),
       lease_expires_at = clock.now + %(lease_seconds)s * interval '1 second',
       -- The claim's time: the owner's start mark (lease_starts_mark) says whether this
       -- claim's handlers started, should the lease be lost.
       started_at = clock.now,
       -- A task enqueued before its type was declared takes the declaration now, so that the
       -- handler, the logs and every reader see one max_attempts. CASE evaluates the lookups
       -- only for such a task (policy_default): every other claim reads nothing more.
       max_attempts = CASE WHEN t.policy_default THEN coalesce(
           (SELECT d.max_attempts FROM pgqueue.task_types AS d WHERE d.type = t.type),
           t.max_attempts) ELSE t.max_attempts END,
       backoff_base = CASE WHEN t.policy_default THEN coalesce(
           (SELECT d.backoff_base FROM pgqueue.task_types AS d WHERE d.type = t.type),
           t.backoff_base) ELSE t.backoff_base END,
       backoff_factor = CASE WHEN t.policy_default THEN coalesce(
           (SELECT d.backoff_factor FROM pgqueue.task_types AS d WHERE d.type = t.type),
           t.backoff_factor) ELSE t.backoff_factor END,
       backoff_cap = CASE WHEN t.policy_default THEN coalesce(
           (SELECT d.backoff_cap FROM pgqueue.task_types AS d WHERE d.type = t.type),
           t.backoff_cap) ELSE t.backoff_cap END,
       policy_default = CASE WHEN t.policy_default
           AND EXISTS (SELECT FROM pgqueue.task_types AS d WHERE d.type = t.type)
           THEN NULL ELSE t.policy_default END
  FROM next, clock
 WHERE t.id = next.id
RETURNING t.id, t.queue, t.type, t.payload, t.priority, t.attempts, t.max_attempts,
          t.lease_token, t.lease_expires_at, t.created_at, t.trace_context,
          -- Issue 16: columns of the row the claim updates anyway (no read more).
          t.parents_pending IS NOT NULL AS has_parents, t.workflow_id;

-- name: limits_probe
-- Whether any limit exists, and whether a task under one may be waiting in these queues: one
-- index probe per limit and queue (the type index for a type, the claim index for a queue),
-- so a limit with nothing waiting costs a claimer this statement, not the limited claim.
-- Each probe is a scalar subquery for the first task in index order: PostgreSQL drops ORDER
-- BY and LIMIT inside EXISTS, and may then bet on a sequential scan finding a row early, and
-- read the whole table when there is none. Scheduled tasks count as waiting here (the claim
-- itself looks at their time).
SELECT EXISTS (SELECT 1 FROM pgqueue.limits) AS limited,
       EXISTS (SELECT 1
                 FROM pgqueue.limits AS l, unnest(%(queues)s::text[]) AS q(name)
                WHERE CASE l.kind
                      WHEN 'type' THEN (
                          SELECT t.id FROM pgqueue.tasks AS t
                           WHERE t.status = 'queued' AND t.type = l.name AND t.queue = q.name
                           ORDER BY t.priority, t.created_at, t.id
                           LIMIT 1) IS NOT NULL
                      ELSE l.name = q.name AND (
                          SELECT t.id FROM pgqueue.tasks AS t
                           WHERE t.status = 'queued' AND t.queue = q.name
                           ORDER BY t.priority, t.created_at, t.id
                           LIMIT 1) IS NOT NULL
                      END) AS waiting;

-- name: limits_try_lock
-- Tasks under a limit are claimed by one claimer at a time, fleet-wide: whoever gets this
-- transaction-level lock (released at commit) counts what runs and what started, then claims
-- within the limits; the others skip limited tasks this round instead of waiting. The key is
-- hashtext('pgqueue.limits').
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.limits')::bigint) AS locked;

-- name: task_claim_limited
-- Claim tasks under a limit, after limits_try_lock, in the same transaction: this statement's
-- snapshot is taken after the lock, so it sees every claim the previous holder committed.
-- room: how many more each limit allows now, the least of its free slots (max_running minus
-- the tasks of its type or queue running now, expired leases included until swept) and the
-- starts left in its sliding window (recent_starts). Then, per queue served, the first tasks
-- in claim order that some open limit covers and no full one blocks; each limit's share is
-- cut to its room by rank; what is claimed is appended to the rate limits' logs.
-- Committed without waiting for the WAL flush, as task_claim is (a server crash may then
-- forget a start in a rate limit's log as well).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                      set_config('synchronous_commit', 'off', true) AS async_commit),
running AS MATERIALIZED (
    SELECT type, queue FROM pgqueue.tasks WHERE status = 'running'
),
room AS MATERIALIZED (
    SELECT l.kind, l.name,
           least(l.max_running - (SELECT count(*) FROM running AS r
                                   WHERE CASE l.kind WHEN 'type' THEN r.type ELSE r.queue END
                                         = l.name),
                 l.rate_limit - (SELECT count(*) FROM unnest(l.recent_starts) AS s(at)
                                  WHERE s.at > clock.now - l.rate_period * interval '1 second'),
                 %(limit)s) AS room
      FROM pgqueue.limits AS l, clock
),
served AS (
    -- The queues this claimer serves that are not paused, and whether each has a limit.
    SELECT q.name, ql.room AS queue_room
      FROM unnest(%(queues)s::text[]) AS q(name)
      LEFT JOIN room AS ql ON ql.kind = 'queue' AND ql.name = q.name
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queues AS p WHERE p.name = q.name AND p.paused)
),
candidates AS (
    -- A limited queue with room: its first tasks in claim order (tasks_claim_idx), but for
    -- types whose own limit is full. A whole batch of them, not just the queue's room: the
    -- tasks of a type with a limit of its own may be cut to that type's room below.
    SELECT c.*
      FROM clock, served
     CROSS JOIN LATERAL (
           SELECT id, type, queue, priority, created_at FROM pgqueue.tasks
            WHERE status = 'queued' AND queue = served.name AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)  -- issue 15
              AND NOT EXISTS (SELECT 1 FROM room AS full_type
                               WHERE full_type.kind = 'type' AND full_type.name = tasks.type
                                 AND full_type.room <= 0)
            ORDER BY priority, created_at, id
            LIMIT %(limit)s
           ) AS c
     WHERE served.queue_room > 0
    UNION ALL
    -- A limited type with room, in each served queue without a limit of its own: its first
    -- tasks there, read from tasks_claim_type_idx (type, queue, priority, created_at).
    SELECT c.*
      FROM clock, served, room AS open_type
     CROSS JOIN LATERAL (
           SELECT id, type, queue, priority, created_at FROM pgqueue.tasks
            WHERE status = 'queued' AND type = open_type.name AND queue = served.name
              AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)  -- issue 15
            ORDER BY priority, created_at, id
            LIMIT open_type.room
           ) AS c
     WHERE served.queue_room IS NULL AND open_type.kind = 'type' AND open_type.room > 0
),
by_type AS (
    -- Each type's share, cut to its room; then each queue's share of what is left.
    SELECT c.*
      FROM (SELECT c.*, row_number() OVER (PARTITION BY c.type
                                           ORDER BY c.priority, c.created_at, c.id) AS nth
              FROM candidates AS c) AS c
      LEFT JOIN room ON room.kind = 'type' AND room.name = c.type
     WHERE room.name IS NULL OR c.nth <= room.room
),
chosen AS (
    SELECT c.id, c.priority, c.created_at
      FROM (SELECT c.*, row_number() OVER (PARTITION BY c.queue
                                           ORDER BY c.priority, c.created_at, c.id) AS nth_q
              FROM by_type AS c) AS c
      LEFT JOIN room ON room.kind = 'queue' AND room.name = c.queue
     WHERE room.name IS NULL OR c.nth_q <= room.room
     ORDER BY c.priority, c.created_at, c.id
     LIMIT %(limit)s
),
locked AS (
    -- Only the lock holder claims these tasks, but a cancel may hold one: skip it.
    SELECT t.id FROM pgqueue.tasks AS t JOIN chosen USING (id)
     WHERE t.status = 'queued'
       FOR UPDATE OF t SKIP LOCKED
),
claimed AS (
    UPDATE pgqueue.tasks AS t
       SET status = 'running',
           attempts = t.attempts + 1,
           lease_owner = %(owner)s,
           lease_token = gen_random_uuid(),
           lease_expires_at = clock.now + %(lease_seconds)s * interval '1 second',
           started_at = clock.now,  -- the claim's time, as in task_claim
           -- The declaration of a task enqueued before it, as in task_claim.
           max_attempts = CASE WHEN t.policy_default THEN coalesce(
               (SELECT d.max_attempts FROM pgqueue.task_types AS d WHERE d.type = t.type),
               t.max_attempts) ELSE t.max_attempts END,
           backoff_base = CASE WHEN t.policy_default THEN coalesce(
               (SELECT d.backoff_base FROM pgqueue.task_types AS d WHERE d.type = t.type),
               t.backoff_base) ELSE t.backoff_base END,
           backoff_factor = CASE WHEN t.policy_default THEN coalesce(
               (SELECT d.backoff_factor FROM pgqueue.task_types AS d WHERE d.type = t.type),
               t.backoff_factor) ELSE t.backoff_factor END,
           backoff_cap = CASE WHEN t.policy_default THEN coalesce(
               (SELECT d.backoff_cap FROM pgqueue.task_types AS d WHERE d.type = t.type),
               t.backoff_cap) ELSE t.backoff_cap END,
           policy_default = CASE WHEN t.policy_default
               AND EXISTS (SELECT FROM pgqueue.task_types AS d WHERE d.type = t.type)
               THEN NULL ELSE t.policy_default END
      FROM locked, clock
     WHERE t.id = locked.id
    RETURNING t.id, t.queue, t.type, t.payload, t.priority, t.attempts, t.max_attempts,
              t.lease_token, t.lease_expires_at, t.created_at, t.trace_context,
              t.parents_pending IS NOT NULL AS has_parents, t.workflow_id  -- issue 16
),
started AS (
    SELECT 'type' AS kind, type AS name, count(*) AS n FROM claimed GROUP BY type
    UNION ALL
    SELECT 'queue', queue, count(*) FROM claimed GROUP BY queue
),
logged AS (
    UPDATE pgqueue.limits AS l
       -- Trimmed with a second to spare: a claim whose transaction began a moment before
       -- the previous holder's may stamp its starts a little earlier, and must still see
       -- every start within its own window.
       SET recent_starts = ARRAY(SELECT s.at FROM unnest(l.recent_starts) AS s(at)
                                  WHERE s.at > clock.now - (l.rate_period + 1) * interval '1 second'
                                  ORDER BY s.at)
                           || array_fill(clock.now, ARRAY[started.n::integer])
      FROM started, clock
     WHERE l.kind = started.kind AND l.name = started.name AND l.rate_limit IS NOT NULL
)
SELECT * FROM claimed;

-- name: lease_starts_mark
-- A worker is about to start the handlers of everything it has claimed so far: from now on
-- a lost lease of those claims counts the attempt. A worker writes this after each claim,
-- and awaits it, before any handler starts, so a task that kills its worker every time is
-- counted every time; a claim that never got this far (the worker was killed in between) is
-- later than the mark, and gives its attempt back when swept. One row per owner, whatever
-- the batch: marking each claimed task instead cost every task a second row write.
-- started false: the worker's start-up, which makes its first claims refundable (an owner
-- without a row is counted, see the table). The time is this transaction's, later than
-- every claim the owner has committed, so the mark covers them and none after it; it only
-- moves forward. Committed without waiting for the WAL flush (synchronous_commit off for this
-- transaction only): the mark must outlive its worker, which it does once committed, not a
-- crash of the server; waiting for the flush cost each claim a second durable commit before
-- its handlers could start.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                      set_config('synchronous_commit', 'off', true) AS async_commit)
INSERT INTO pgqueue.lease_starts AS s (owner, started_through, updated_at)
SELECT %(owner)s, CASE WHEN %(started)s THEN clock.now ELSE '-infinity' END, clock.now
  FROM clock
    ON CONFLICT (owner) DO UPDATE
   SET started_through = greatest(s.started_through, excluded.started_through),
       updated_at = excluded.updated_at;

-- name: lease_starts_prune
-- Forget the marks of owners that hold no lease and have not claimed for an hour (workers
-- that stopped, one row per process ever started). Forgetting errs on the safe side: a lost
-- lease whose owner has no mark counts its attempt.
DELETE FROM pgqueue.lease_starts AS s
 WHERE s.updated_at < coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
   AND NOT EXISTS (SELECT 1 FROM pgqueue.tasks AS t
                    WHERE t.status = 'running' AND t.lease_owner = s.owner)
RETURNING s.owner;

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
v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(results)s::text[])
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
-- Count the finish on the dependants' edges, releasing or cancelling them (issue 16).
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
-- Count the finish on the dependants' edges (issue 16); a retry (queued) counts nothing.
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
-- Count the finish on the dependants' edges, releasing or cancelling them (issue 16).
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_snooze
-- A handler raised Snooze(after=...) (issue 15): back to queued, visible `after` seconds
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
settled AS MATERIALIZED (  -- issue 16: a cancel is final
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
v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS v(id, token)),
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

-- name: task_release
-- Hand tasks back untouched (graceful shutdown): queued at once, the attempt not counted.
-- A task whose cancellation was requested is cancelled instead of going back.
-- Rows locked in id order first, as task_complete says why.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS v(id, token)),
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
settled AS MATERIALIZED (  -- issue 16: a cancel is final
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status = 'cancelled'
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_sweep_expired
-- Take back tasks whose worker stopped renewing its lease (crashed, killed, hung, cut off).
-- The lost run counts as an attempt, so a task that kills its worker every time ends in the
-- dead-letter queue instead of looping forever. A claim whose handler never started (claimed
-- after its owner's last start mark: see lease_starts_mark) gives its attempt back and is
-- ready again at once.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
lost AS (
    SELECT id, cancel_requested, attempts, max_attempts,
           EXISTS (SELECT 1 FROM pgqueue.lease_starts AS s
                    WHERE s.owner = tasks.lease_owner
                      AND s.started_through < tasks.started_at) AS never_started
      FROM pgqueue.tasks, clock
     WHERE status = 'running' AND lease_expires_at < clock.now
     ORDER BY lease_expires_at
     LIMIT %(limit)s
     FOR UPDATE OF tasks SKIP LOCKED
),
expired AS (
    SELECT id, never_started,
           CASE WHEN cancel_requested THEN 'cancelled'
                WHEN never_started THEN 'queued'
                WHEN attempts >= max_attempts THEN 'failed'
                ELSE 'queued' END AS next_status
      FROM lost
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = e.next_status,
       attempts = CASE WHEN e.never_started THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
       visible_after = CASE WHEN e.next_status <> 'queued' THEN t.visible_after
                            WHEN e.never_started THEN clock.now
                            ELSE clock.now + pgqueue.retry_delay(t.attempts, t.backoff_base,
                                   t.backoff_factor, t.backoff_cap) * interval '1 second' END,
       finished_at = CASE WHEN e.next_status <> 'queued' THEN clock.now END,
       ready_since = coalesce(t.ready_since, t.visible_after),  -- its wait began then
       -- A claim that never started leaves the task as it was: no attempt, no error.
       last_error = CASE WHEN e.never_started THEN t.last_error
           ELSE format('lease expired on attempt %%s of %%s: worker %%s stopped renewing it '
                       '(crashed, killed, hung or disconnected)',
                       t.attempts, t.max_attempts, coalesce(t.lease_owner, '?')) END,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM expired AS e, clock
 WHERE t.id = e.id
RETURNING t.id, t.status, t.type, t.attempts, t.has_dependants
),
-- Wake whoever waits on the tasks this made final (see task_waiter_add).
woken AS MATERIALIZED (
    SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM finished WHERE status <> 'queued'
),
-- Count the finish on the dependants' edges (issue 16); a retry (queued) counts nothing.
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status <> 'queued'
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_expire
-- Waiting tasks whose expiry passed before any attempt was spent (issue 15) end cancelled,
-- with the reason 'expired', and are never run: the claim already skips them, and this pass
-- (maintenance, every sweep) makes them final, so they do not sit queued for ever. Read
-- from tasks_expiry_idx (only waiting tasks with an expiry and no attempt spent), oldest
-- expiry first, in bounded batches.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
due AS (
    SELECT id FROM pgqueue.tasks, clock
     WHERE status = 'queued' AND attempts = 0 AND expires_at IS NOT NULL
       AND expires_at <= clock.now
     ORDER BY expires_at
     LIMIT %(limit)s
       FOR UPDATE OF tasks SKIP LOCKED
),
expired AS (
    UPDATE pgqueue.tasks AS t
       SET status = 'cancelled', finished_at = clock.now, last_error = 'expired'
      FROM due, clock
     WHERE t.id = due.id
    RETURNING t.id, t.type, t.queue, t.attempts, t.expires_at, t.has_dependants
),
-- Wake whoever waits on them (see task_waiter_add): an expiry is a final status too.
woken AS MATERIALIZED (SELECT pgqueue.task_waiters_wake(array_agg(id)) FROM expired),
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM expired
)
SELECT e.* FROM expired AS e, woken, settled;

-- name: task_cancel
-- Cancel by id: a queued task is cancelled at once; a running one is flagged, and its
-- handler sees the flag through its context (cooperative cancellation).
-- The worker holding a running task's lease is told at once, on commit (issue 15): a NOTIFY
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
settled AS MATERIALIZED (  -- issue 16: a cancel is final
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
-- The dependants its failure cancelled wait for it again (issue 16).
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

-- name: task_promote
-- The starvation policy: a queued task that has been ready for `after_seconds` moves up one
-- priority (low to normal, normal to high) and its promotion clock (visible_after) restarts,
-- so it climbs one level per period, while ready_since keeps when it first became ready (the
-- age every reader shows) and submitted_priority the priority it was submitted with; once high, it is older than the high tasks behind it and goes first (FIFO). Each
-- queue (found by a loose walk of the claim index) and level is read by its own range of the
-- claim index: (queue, priority, created_at), bounded by the cutoff, since a task is never
-- ready before it was created. Running and scheduled tasks are left alone.
WITH RECURSIVE clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           coalesce(%(now)s::timestamptz, now()) - %(after_seconds)s * interval '1 second' AS cutoff
),
queues AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'queued') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'queued' AND queue > q.name)
      FROM queues AS q
     WHERE q.name IS NOT NULL
),
aged AS (
    SELECT a.id
      FROM queues, clock, (VALUES (1), (2)) AS level(priority)
     CROSS JOIN LATERAL (
           SELECT id FROM pgqueue.tasks
            WHERE status = 'queued' AND queue = queues.name AND priority = level.priority
              AND created_at < clock.cutoff AND visible_after < clock.cutoff
            ORDER BY created_at
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED
           ) AS a
     WHERE queues.name IS NOT NULL
     LIMIT %(limit)s
)
UPDATE pgqueue.tasks AS t
   SET priority = t.priority - 1, visible_after = clock.now,
       ready_since = coalesce(t.ready_since, t.visible_after),
       submitted_priority = coalesce(t.submitted_priority, t.priority)
  FROM aged, clock
 WHERE t.id = aged.id
RETURNING t.id, t.queue, t.type, t.priority;

-- name: task_prune
-- Delete finished tasks of one status older than their queue's retention (pgqueue.queues, or
-- older_than_seconds where the queue has none), oldest first, in bounded batches so no
-- statement holds many locks or writes one huge transaction. Each queue (found by a loose
-- walk of tasks_retention_idx) is read as a range of that index, (status, queue, finished_at)
-- up to its own cutoff, so a queue kept for a month is never re-read to prune one kept for a
-- day. Idempotency keys go with their task.
WITH RECURSIVE clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
finished AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = %(status)s) AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = %(status)s AND queue > f.name)
      FROM finished AS f
     WHERE f.name IS NOT NULL
),
cutoffs AS (
    SELECT f.name,
           clock.now - coalesce(CASE WHEN %(status)s = 'failed' THEN s.dead_retention
                                     ELSE s.completed_retention END,
                                %(older_than_seconds)s) * interval '1 second' AS cutoff
      FROM finished AS f CROSS JOIN clock
      LEFT JOIN pgqueue.queues AS s ON s.name = f.name
     WHERE f.name IS NOT NULL
),
doomed AS (
    SELECT d.id
      FROM cutoffs
     CROSS JOIN LATERAL (
           SELECT id FROM pgqueue.tasks
            WHERE status = %(status)s AND queue = cutoffs.name AND finished_at < cutoffs.cutoff
            ORDER BY finished_at
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED
           ) AS d
     LIMIT %(limit)s
),
-- Issue 16: a pruned task's own edges and buckets go with it (primary-key ranges, by
-- child_id); its edges as a parent stay until its dependants are pruned in turn.
edges_gone AS (
    DELETE FROM pgqueue.task_dependencies AS d USING doomed WHERE d.child_id = doomed.id
),
buckets_gone AS (
    DELETE FROM pgqueue.task_dependency_buckets AS b USING doomed WHERE b.child_id = doomed.id
)
DELETE FROM pgqueue.tasks AS t USING doomed WHERE t.id = doomed.id
RETURNING t.id;

-- name: queue_pause
-- Pause a queue: claims skip it from the next one on, in every worker process and host, and
-- it stays paused across restarts. Tasks already running finish. Pausing twice keeps the
-- first paused_at.
INSERT INTO pgqueue.queues AS q (name, paused, paused_at, updated_at)
VALUES (%(name)s, true, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
   SET paused = true,
       paused_at = coalesce(q.paused_at, excluded.paused_at),
       updated_at = excluded.updated_at
RETURNING name, paused, paused_at, updated_at, completed_retention, dead_retention;

-- name: queue_resume
-- Resume a queue and wake idle workers at once (on commit), instead of at their next poll.
-- A queue without a settings row is not paused: nothing to write (resuming a typo must not
-- leave a row behind).
WITH resumed AS (
    UPDATE pgqueue.queues
       SET paused = false, paused_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE name = %(name)s
    RETURNING name, paused, paused_at, updated_at, completed_retention, dead_retention
)
SELECT resumed.*, pg_notify('pgqueue', resumed.name) IS NULL AS notified FROM resumed;

-- name: queue_remove
-- Forget a queue's settings row: a paused queue runs again (idle workers are woken on
-- commit), its retention is the workers' default again. Its tasks are not touched.
WITH removed AS (
    DELETE FROM pgqueue.queues WHERE name = %(name)s RETURNING name, paused
)
SELECT removed.name,
       (SELECT pg_notify('pgqueue', removed.name) WHERE removed.paused) IS NULL AS notified
  FROM removed;

-- name: queue_known
-- Whether a queue exists for pgqueue: it has a settings row or any task. Each probe reads
-- one index (the claim index, the running tasks', the retention index, the waiting tasks'),
-- never the table.
SELECT EXISTS (SELECT 1 FROM pgqueue.queues WHERE name = %(name)s)
    OR EXISTS (SELECT 1 FROM pgqueue.tasks WHERE status = 'queued' AND queue = %(name)s)
    OR EXISTS (SELECT 1 FROM pgqueue.tasks WHERE status = 'running' AND queue = %(name)s)
    OR EXISTS (SELECT 1 FROM pgqueue.tasks
                WHERE status IN ('completed', 'failed', 'cancelled') AND queue = %(name)s)
    OR EXISTS (SELECT 1 FROM pgqueue.tasks WHERE status = 'waiting' AND queue = %(name)s)
       AS known;

-- name: queue_list
-- Every queue with tasks (in any status) or a setting, and whether it is paused (stats and
-- every /metrics scrape ask). The queues come from loose walks of the claim index, of the
-- retention index (one per finished status, each a literal the partial index's predicate is
-- proved by) and of the waiting tasks' index, one probe per queue each, not from reading the
-- tasks; running tasks are few (as many as the workers' slots).
WITH RECURSIVE backlog AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'queued') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'queued' AND queue > b.name)
      FROM backlog AS b
     WHERE b.name IS NOT NULL
),
completed AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed' AND queue > c.name)
      FROM completed AS c
     WHERE c.name IS NOT NULL
),
failed AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed' AND queue > f.name)
      FROM failed AS f
     WHERE f.name IS NOT NULL
),
cancelled AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'cancelled') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'cancelled' AND queue > c.name)
      FROM cancelled AS c
     WHERE c.name IS NOT NULL
),
waiting AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'waiting') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'waiting' AND queue > w.name)
      FROM waiting AS w
     WHERE w.name IS NOT NULL
)
SELECT n.name, coalesce(q.paused, false) AS paused, q.paused_at, q.updated_at,
       q.completed_retention, q.dead_retention
  FROM (SELECT name FROM backlog WHERE name IS NOT NULL
        UNION SELECT name FROM completed WHERE name IS NOT NULL
        UNION SELECT name FROM failed WHERE name IS NOT NULL
        UNION SELECT name FROM cancelled WHERE name IS NOT NULL
        UNION SELECT name FROM waiting WHERE name IS NOT NULL
        UNION SELECT queue FROM pgqueue.tasks WHERE status = 'running'
        UNION SELECT name FROM pgqueue.queues) AS n
  LEFT JOIN pgqueue.queues AS q USING (name)
 ORDER BY n.name;

-- name: queue_set_retention
-- A queue's retention (seconds; NULL: the worker's default), both at once. Pruning reads it
-- at every batch, so it applies from the next prune round on, to tasks already finished too.
INSERT INTO pgqueue.queues AS q (name, completed_retention, dead_retention, updated_at)
VALUES (%(name)s, %(completed_retention)s, %(dead_retention)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
   SET completed_retention = excluded.completed_retention,
       dead_retention = excluded.dead_retention,
       updated_at = excluded.updated_at
RETURNING name, paused, paused_at, updated_at, completed_retention, dead_retention;

-- name: limit_set
-- Set a limit as a whole (a NULL part is no limit of that kind). Claims obey it from the next
-- one on; the sliding log of recent starts is kept, so lowering a rate takes effect at once.
-- Wakes idle workers, since a raised limit may free tasks for them.
WITH saved AS (
    INSERT INTO pgqueue.limits AS l (kind, name, max_running, rate_limit, rate_period, updated_at)
    VALUES (%(kind)s, %(name)s, %(max_running)s, %(rate_limit)s, %(rate_period)s,
            coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (kind, name) DO UPDATE
       SET max_running = excluded.max_running, rate_limit = excluded.rate_limit,
           rate_period = excluded.rate_period, updated_at = excluded.updated_at
    RETURNING kind, name, max_running, rate_limit, rate_period, updated_at
)
SELECT saved.*, pg_notify('pgqueue', '*') IS NULL AS notified FROM saved;

-- name: limit_clear
-- Remove a limit: its tasks go back to the ordinary claim. Wakes idle workers.
WITH removed AS (
    DELETE FROM pgqueue.limits WHERE kind = %(kind)s AND name = %(name)s
    RETURNING kind, name
)
SELECT removed.*, pg_notify('pgqueue', '*') IS NULL AS notified FROM removed;

-- name: limit_list
-- Every limit with what it is using now: tasks running under it (expired leases included
-- until swept) and starts within its rate window.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
running AS MATERIALIZED (
    SELECT type, queue FROM pgqueue.tasks WHERE status = 'running'
)
SELECT l.kind, l.name, l.max_running, l.rate_limit, l.rate_period, l.updated_at,
       (SELECT count(*) FROM running AS r
         WHERE CASE l.kind WHEN 'type' THEN r.type ELSE r.queue END = l.name) AS running,
       (SELECT count(*) FROM unnest(l.recent_starts) AS s(at)
         WHERE s.at > clock.now - l.rate_period * interval '1 second') AS recent_starts
  FROM pgqueue.limits AS l, clock
 ORDER BY l.kind, l.name;

-- name: schedule_lock
-- Upsert a schedule's definition and lock its row: concurrent schedulers (every worker may run
-- one) queue up here, and each then sees the last tick the previous one enqueued.
INSERT INTO pgqueue.schedules AS s (name, cron, timezone, type, queue, updated_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(type)s, %(queue)s, now())
ON CONFLICT (name) DO UPDATE
   SET cron = excluded.cron, timezone = excluded.timezone, type = excluded.type,
       queue = excluded.queue, updated_at = excluded.updated_at
RETURNING s.last_tick;

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

-- name: schedule_advance
-- Move the fence on, in the transaction that enqueued the ticks.
UPDATE pgqueue.schedules
   SET last_tick = %(last_tick)s, next_tick = %(next_tick)s
 WHERE name = %(name)s;

-- name: schedule_list
SELECT name, cron, timezone, type, queue, last_tick, next_tick, updated_at
  FROM pgqueue.schedules
 ORDER BY name;

-- name: queue_depth
SELECT queue, priority, status, tasks, ready, scheduled,
       extract(epoch FROM oldest_ready_age)::double precision AS oldest_ready_age_seconds
  FROM pgqueue.queue_depth
 ORDER BY queue, status, priority;

-- name: queue_throughput
-- Tasks of each queue that finished within the window ending now: completed, and
-- dead-lettered (failed). Each queue with finished tasks (a loose walk of tasks_retention_idx
-- per status) is counted as a range of that index, so the cost is the window's tasks, not the
-- 24 h kept. Cancelled tasks are not counted: a queue with only cancellations in the window
-- has no row.
WITH RECURSIVE clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           coalesce(%(now)s::timestamptz, now()) - %(window_seconds)s * interval '1 second' AS since
),
done AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed' AND queue > d.name)
      FROM done AS d
     WHERE d.name IS NOT NULL
),
dead AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed' AND queue > d.name)
      FROM dead AS d
     WHERE d.name IS NOT NULL
),
counted AS (
    SELECT q.name AS queue,
           (SELECT count(*) FROM pgqueue.tasks
             WHERE status = 'completed' AND queue = q.name
               AND finished_at >= clock.since AND finished_at <= clock.now) AS completed,
           (SELECT count(*) FROM pgqueue.tasks
             WHERE status = 'failed' AND queue = q.name
               AND finished_at >= clock.since AND finished_at <= clock.now) AS failed
      FROM clock, (SELECT name FROM done UNION SELECT name FROM dead) AS q
     WHERE q.name IS NOT NULL
)
SELECT queue, completed, failed FROM counted
 WHERE completed > 0 OR failed > 0
 ORDER BY queue;

-- name: schema_version
SELECT version_num FROM pgqueue.pgqueue_alembic_version;

-- name: schema_version_table
-- Whether pgqueue's migrations ever ran here, asked without an error: reading a missing
-- version table would abort the caller's transaction (an application's own alembic revision).
SELECT to_regclass('pgqueue.pgqueue_alembic_version') AS version_table;

-- name: maintenance_try_lock
-- One maintenance runner per database at a time: a transaction-level advisory lock, so it is
-- released at commit and never outlives a batch (and works behind PgBouncer's transaction mode).
-- The key is fixed: hashtext('pgqueue.maintenance').
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.maintenance')::bigint) AS locked;

-- name: stats_staleness
-- How many rows of pgqueue.tasks changed since its statistics were last gathered. A burst of
-- enqueues onto a table analyzed while small leaves the planner believing the backlog is tiny,
-- and it then reads and sorts the whole backlog on every claim instead of walking the index.
SELECT s.n_mod_since_analyze AS changed, greatest(c.reltuples, 0)::bigint AS estimated_rows
  FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
 WHERE s.relid = 'pgqueue.tasks'::regclass;

-- name: tasks_analyze
-- Refresh the statistics now rather than when autovacuum next looks (up to a minute, or never
-- with autovacuum off); cached plans are replanned. Without the right, it warns and skips.
ANALYZE pgqueue.tasks;

-- name: throughput_series
-- Tasks finished in each of the last `minutes` minutes (the current one included, UTC
-- minutes), completed and dead-lettered (failed), of one queue or of all: the dashboard's
-- chart. Each queue with finished tasks (a loose walk of tasks_retention_idx per status, as in
-- queue_throughput) is read as a range of that index from the first minute on, so the cost is
-- the window's tasks, never the 24 h of completed tasks (or 14 days of dead letters) kept.
-- Every minute has a row, zero when nothing finished.
WITH RECURSIVE clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           date_trunc('minute', coalesce(%(now)s::timestamptz, now()), 'UTC')
           - (%(minutes)s::integer - 1) * interval '1 minute' AS since
),
done AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'completed' AND queue > d.name)
      FROM done AS d
     WHERE d.name IS NOT NULL
),
dead AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed' AND queue > d.name)
      FROM dead AS d
     WHERE d.name IS NOT NULL
),
counted AS (
    SELECT 'completed' AS status, c.minute, c.n
      FROM clock, done
     CROSS JOIN LATERAL (
           SELECT date_trunc('minute', finished_at, 'UTC') AS minute, count(*) AS n
             FROM pgqueue.tasks
            WHERE status = 'completed' AND queue = done.name
              AND finished_at >= clock.since AND finished_at <= clock.now
            GROUP BY 1
           ) AS c
     WHERE done.name IS NOT NULL AND (%(queue)s::text IS NULL OR done.name = %(queue)s::text)
    UNION ALL
    SELECT 'failed', c.minute, c.n
      FROM clock, dead
     CROSS JOIN LATERAL (
           SELECT date_trunc('minute', finished_at, 'UTC') AS minute, count(*) AS n
             FROM pgqueue.tasks
            WHERE status = 'failed' AND queue = dead.name
              AND finished_at >= clock.since AND finished_at <= clock.now
            GROUP BY 1
           ) AS c
     WHERE dead.name IS NOT NULL AND (%(queue)s::text IS NULL OR dead.name = %(queue)s::text)
)
SELECT m.minute,
       coalesce(sum(c.n) FILTER (WHERE c.status = 'completed'), 0)::bigint AS completed,
       coalesce(sum(c.n) FILTER (WHERE c.status = 'failed'), 0)::bigint AS failed
  FROM clock
 CROSS JOIN generate_series(clock.since, clock.now, interval '1 minute') AS m(minute)
  LEFT JOIN counted AS c ON c.minute = m.minute
 GROUP BY m.minute
 ORDER BY m.minute;

-- name: task_failures
-- Recent failures, for the dashboard: the tasks waiting for a retry after a failed attempt,
-- latest next attempt first (tasks_retrying_idx, which holds only them), then the newest dead
-- letters (each queue's newest by a backward range of tasks_retention_idx, the queues found
-- by a loose walk, then merged). At most `limit` of each; never the backlog or the table.
WITH RECURSIVE dead_queues AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed') AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks WHERE status = 'failed' AND queue > d.name)
      FROM dead_queues AS d
     WHERE d.name IS NOT NULL
),
retrying AS (
    SELECT id, type, queue, priority, attempts, max_attempts, last_error, started_at,
           visible_after, finished_at
      FROM pgqueue.tasks
     WHERE status = 'queued' AND attempts > 0
     ORDER BY visible_after DESC
     LIMIT %(limit)s
),
dead AS (
    SELECT d.*
      FROM dead_queues AS q
     CROSS JOIN LATERAL (
           SELECT id, type, queue, priority, attempts, max_attempts, last_error, started_at,
                  visible_after, finished_at
             FROM pgqueue.tasks
            WHERE status = 'failed' AND queue = q.name
            ORDER BY finished_at DESC
            LIMIT %(limit)s
           ) AS d
     WHERE q.name IS NOT NULL
     ORDER BY d.finished_at DESC
     LIMIT %(limit)s
)
SELECT * FROM (SELECT 'retrying' AS kind, * FROM retrying
               UNION ALL
               SELECT 'dead', * FROM dead) AS f
 ORDER BY kind DESC, coalesce(finished_at, visible_after) DESC, id;

-- name: queue_backlog
-- The backlog per queue and priority (the pgqueue.backlog view, for these queues or all):
-- ready, scheduled, running, and the oldest ready task's age. It reads queued and running
-- rows only, through their partial indexes, so /metrics scrapes and dashboards may ask it
-- every few seconds however many finished tasks are kept.
SELECT queue, priority, ready, scheduled, running,
       extract(epoch FROM oldest_ready_age)::double precision AS oldest_ready_age_seconds
  FROM pgqueue.backlog
 WHERE %(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])
 ORDER BY queue, priority;

-- name: queue_overview
-- Depth per queue, priority and status for what is asked every few seconds (`pgqueue stats`,
-- GET /api/v1/stats, /metrics, the dashboard): queued and running tasks from the backlog
-- view, dead letters, and waiting tasks (their parents not final yet), each read through its
-- partial index. Completed and cancelled tasks are left out: they are most of the table (a
-- day of them, gigabytes at the design's rate), and counting them means reading it all; the
-- queue_depth view still does, for a DBA who asks once. Tasks finished recently are in
-- queue_throughput.
SELECT queue, priority, 'queued' AS status, ready + scheduled AS tasks, ready, scheduled,
       extract(epoch FROM oldest_ready_age)::double precision AS oldest_ready_age_seconds
  FROM pgqueue.backlog
 WHERE ready + scheduled > 0
UNION ALL
SELECT queue, priority, 'running', running, 0, 0, NULL
  FROM pgqueue.backlog
 WHERE running > 0
UNION ALL
SELECT queue, pgqueue.priority_name(priority), 'failed', count(*), 0, 0, NULL
  FROM pgqueue.tasks
 WHERE status = 'failed'
 GROUP BY queue, priority
UNION ALL
SELECT queue, pgqueue.priority_name(priority), 'waiting', count(*), 0, 0, NULL
  FROM pgqueue.tasks
 WHERE status = 'waiting'
 GROUP BY queue, priority
 ORDER BY 1, 3, 2;

-- name: oldest_snapshot
-- What holds back the cleanup of pgqueue.tasks longest: while a session of this database keeps
-- an old snapshot (an idle transaction, a report, pg_dump) or a replication slot or prepared
-- transaction keeps an old xmin, vacuum removes no row version newer than it, and the queue's
-- indexes fill with entries of tasks long done. Sessions are measured in time (their
-- transaction's age) and all in transactions (xids). A role without pg_read_all_stats (or
-- pg_monitor) sees only its own sessions' times; the others still count by their xids.
SELECT kind, holder, pid, state, seconds, xid_age
  FROM (SELECT 'session' AS kind,
               format('pid %%s (%%s%%s)', pid, coalesce(usename, '?'),
                      CASE WHEN application_name <> '' THEN ', ' || application_name ELSE '' END)
                 AS holder,
               pid, state,
               extract(epoch FROM clock_timestamp() - xact_start)::float8 AS seconds,
               greatest(age(backend_xmin), age(backend_xid)) AS xid_age
          FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
        UNION ALL
        SELECT 'replication slot', slot_name::text, active_pid, CASE WHEN active THEN 'active'
               ELSE 'inactive' END, NULL, greatest(age(xmin), age(catalog_xmin))
          FROM pg_replication_slots
         WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared transaction', gid, NULL, 'prepared',
               extract(epoch FROM clock_timestamp() - prepared)::float8, age(transaction)
          FROM pg_prepared_xacts
         WHERE database = current_database()) AS holders
 ORDER BY xid_age DESC, seconds DESC NULLS LAST
 LIMIT 1;

-- name: task_insert_dependent
-- Tasks with parents (depends_on) or a workflow (issue 16), in one statement: all or nothing.
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
-- makes the statement insert nothing and name it (missing).
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
                               finished_at, has_dependants)
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
           CASE WHEN v.id IN (SELECT parent_id FROM e) THEN true END
      FROM clock,
           unnest(%(ids)s::uuid[], %(queues)s::text[], %(types)s::text[], %(payloads)s::text[],
                  %(priorities)s::smallint[], %(max_attempts)s::integer[],
                  %(backoff_bases)s::real[], %(backoff_factors)s::real[],
                  %(backoff_caps)s::real[], %(run_ats)s::timestamptz[],
                  %(delays)s::double precision[], %(explicits)s::boolean[],
                  %(expires_ats)s::timestamptz[], %(expires_ins)s::double precision[],
                  %(workflow_ids)s::uuid[])
           WITH ORDINALITY
           AS v(id, queue, type, payload, priority, max_attempts, backoff_base, backoff_factor,
                backoff_cap, run_at, delay, explicit, expires_at, expires_in, workflow_id, n)
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
       CASE WHEN i.status = 'queued' AND i.visible_after <= i.created_at
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
