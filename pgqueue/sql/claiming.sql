-- Taking tasks to run: the claims, the limits they obey, the lease start marks, and the
-- take-back of expired leases, of a dead worker process's tasks and of expired tasks
-- (pgqueue/queries/claiming.py). The hottest file.
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

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
                   WHERE status = 'queued' AND concurrency_key IS NULL
                     AND queue = w.queue AND priority = level.priority
                     AND (created_at, id) > (level.after_created, level.after_id)
                     AND visible_after <= clock.now
                     -- Never start an expired task: maintenance cancels it.
                     -- A filter on the row the walk reads anyway, not a new range.
                     AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
                     AND NOT EXISTS (SELECT 1 FROM pgqueue.limits AS l
                                      WHERE l.kind = 'type' AND l.name = tasks.type
                                        AND (l.max_running IS NOT NULL
                                             OR l.rate_limit IS NOT NULL))
                   ORDER BY created_at, id
                   LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED
                  ) AS walk
            LIMIT %(limit)s
           ) AS c
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queues AS p WHERE p.name = w.queue AND p.paused)
       AND NOT EXISTS (SELECT 1 FROM pgqueue.limits AS l
                        WHERE l.kind = 'queue' AND l.name = w.queue
                          AND (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL))
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
          -- columns of the row the claim updates anyway (no read more).
          t.parents_pending IS NOT NULL AS has_parents, t.workflow_id, t.concurrency_key;

-- name: limits_probe
-- Whether any limit exists (and any token bucket: a rate with a burst), whether a task under
-- one may be waiting in these queues, and whether a task with a concurrency key is: one index
-- probe per limit and queue (the type index for a type, the claim index for a queue) and one
-- per queue (the keyed claim index),
-- so a limit with nothing waiting costs a claimer this statement, not the limited claim.
-- Each probe is a scalar subquery for the first task in index order: PostgreSQL drops ORDER
-- BY and LIMIT inside EXISTS, and may then bet on a sequential scan finding a row early, and
-- read the whole table when there is none. Scheduled tasks count as waiting here (the claim
-- itself looks at their time).
-- With lock true (claim_round, in the claim's transaction), it also takes the limits lock the
-- claim that follows needs: waited for when keyed tasks wait (limits_lock says why), tried
-- otherwise when limited ones do (limits_try_lock); and where keyed tasks wait, the fair
-- claim that follows is planned once per connection (a generic plan; planning it costs more
-- than running it).
WITH probe AS MATERIALIZED (
SELECT EXISTS (SELECT 1 FROM pgqueue.limits) AS limited,
       EXISTS (SELECT 1 FROM pgqueue.limits WHERE rate_burst IS NOT NULL) AS buckets,
       EXISTS (SELECT 1
                 FROM pgqueue.limits AS l, unnest(%(queues)s::text[]) AS q(name)
                WHERE (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL)
                  AND CASE l.kind
                      WHEN 'type' THEN (
                          SELECT t.id FROM pgqueue.tasks AS t
                           WHERE t.status = 'queued' AND t.concurrency_key IS NULL
                             AND t.type = l.name AND t.queue = q.name
                           ORDER BY t.priority, t.created_at, t.id
                           LIMIT 1) IS NOT NULL
                      ELSE l.name = q.name AND (
                          SELECT t.id FROM pgqueue.tasks AS t
                           WHERE t.status = 'queued' AND t.concurrency_key IS NULL
                             AND t.queue = q.name
                           ORDER BY t.priority, t.created_at, t.id
                           LIMIT 1) IS NOT NULL
                      END) AS waiting,
       EXISTS (SELECT 1
                 FROM unnest(%(queues)s::text[]) AS q(name)
                WHERE (SELECT t.id FROM pgqueue.tasks AS t
                        WHERE t.status = 'queued' AND t.concurrency_key IS NOT NULL
                          AND t.queue = q.name
                        ORDER BY t.priority, t.concurrency_key, t.created_at, t.id
                        LIMIT 1) IS NOT NULL) AS keyed
)
SELECT probe.limited, probe.buckets, probe.waiting, probe.keyed,
       CASE WHEN NOT %(lock)s THEN false
            WHEN probe.keyed THEN (
                SELECT true FROM pg_advisory_xact_lock(hashtext('pgqueue.limits')::bigint),
                                 set_config('plan_cache_mode', 'force_generic_plan', true))
            WHEN probe.waiting THEN pg_try_advisory_xact_lock(hashtext('pgqueue.limits')::bigint)
            ELSE false END AS locked
  FROM probe;

-- name: limits_try_lock
-- Tasks under a limit are claimed by one claimer at a time, fleet-wide: whoever gets this
-- transaction-level lock (released at commit) counts what runs and what started, then claims
-- within the limits; the others skip limited tasks this round instead of waiting. The key is
-- hashtext('pgqueue.limits').
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.limits')::bigint) AS locked;

-- name: limits_lock
-- The same lock, waited for, for a caller that probed outside the claim's transaction (see
-- limits_probe with lock true, which takes it in the same statement): a claim of keyed tasks
-- must not leave a slot idle while a key under its limit has a ready task, and every holder
-- commits within a statement or two, so the wait is short. The fair claim that follows is
-- planned once per connection, as limits_probe says.
SELECT true AS locked
  FROM pg_advisory_xact_lock(hashtext('pgqueue.limits')::bigint),
       set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: task_claim_limited
-- Claim tasks under a limit, after limits_try_lock, in the same transaction: this statement's
-- snapshot is taken after the lock, so it sees every claim the previous holder committed.
-- room: how many more each limit allows now, the least of its free slots (max_running minus
-- the tasks of its type or queue running now, expired leases included until swept) and the
-- starts its rate allows now: with a burst (rate_burst), what its token bucket holds, one
-- start every rate_period / rate_limit seconds and at most rate_burst at once; without, the
-- starts left in its sliding window (recent_starts). Then, per queue served, the first tasks
-- in claim order that some open limit covers and no full one blocks; each limit's share is
-- cut to its room by rank; what is claimed is appended to the rate limits' logs and taken
-- from their buckets (rate_next moves one interval per start, from now at the earliest, so
-- a quiet spell saves up no more than the burst).
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
                 CASE WHEN l.rate_burst IS NULL THEN
                      l.rate_limit - (SELECT count(*) FROM unnest(l.recent_starts) AS s(at)
                                       WHERE s.at > clock.now - l.rate_period * interval '1 second')
                      WHEN l.rate_limit = 0 THEN 0
                      -- A bucket (rate_burst set): the starts it holds now, from rate_next,
                      -- the time it would be full again (the generic cell rate algorithm).
                      ELSE greatest(0, floor(l.rate_burst - extract(epoch FROM
                               greatest(l.rate_next, clock.now) - clock.now)
                               * l.rate_limit / l.rate_period))::integer END,
                 %(limit)s) AS room
      FROM pgqueue.limits AS l, clock
     -- A per-key limit alone does not ration the tasks without a key: they are ordinary.
     WHERE l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL
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
            WHERE status = 'queued' AND concurrency_key IS NULL AND queue = served.name
              AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
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
            WHERE status = 'queued' AND concurrency_key IS NULL AND type = open_type.name
              AND queue = served.name AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
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
              t.parents_pending IS NOT NULL AS has_parents, t.workflow_id, t.concurrency_key
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
                           || array_fill(clock.now, ARRAY[started.n::integer]),
           rate_next = CASE WHEN l.rate_burst IS NULL OR l.rate_limit = 0 THEN l.rate_next
                            ELSE greatest(l.rate_next, clock.now) + started.n * l.rate_period
                                 / l.rate_limit * interval '1 second' END
      FROM started, clock
     WHERE l.kind = started.kind AND l.name = started.name AND l.rate_limit IS NOT NULL
)
SELECT * FROM claimed;

-- name: limits_rate_wait
-- How long until a token bucket that is empty now holds a start again (seconds; NULL: none is
-- empty, or no bucket), after task_claim_limited in the same transaction, so that it counts
-- what that claim took. A worker sleeps no longer than this before its next claim: nothing
-- announces a start coming due, and a poll at its usual interval would start far fewer than
-- the rate allows. A claimer that did not get the limits lock (%(locked)s false) reads the
-- buckets before the holder's claim commits: where one holds a start now, the holder is
-- likely taking it, and the next is due within one interval.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
bucket AS (
    SELECT l.rate_period / l.rate_limit AS interval_seconds,
           extract(epoch FROM greatest(l.rate_next, clock.now) - clock.now)::float8
               - (l.rate_burst - 1) * l.rate_period / l.rate_limit AS due_in
      FROM pgqueue.limits AS l, clock
     WHERE l.rate_burst IS NOT NULL AND l.rate_limit > 0
)
SELECT min(CASE WHEN due_in > 0 THEN due_in
                WHEN NOT %(locked)s THEN interval_seconds END)::float8 AS seconds
  FROM bucket;

-- name: task_claim_keyed
-- The fair claim, when tasks with a concurrency key wait in the served queues: after
-- limits_probe (or limits_lock) has taken the limits lock, and task_claim_limited has run, in
-- the same transaction, so that this statement's snapshot sees every claim committed before
-- it and the per-key counts are exact fleet-wide. It claims the keyed tasks and the unkeyed
-- ones of the same queues (but for those under a limit, which task_claim_limited took).
-- Strict priority first: every high task before any normal one. Within a queue and priority
-- (a lane), the keys take turns: the rotation walks the keys with waiting tasks from the one
-- after where this claimer's previous claim stopped (the *_after parameters, '' for the
-- beginning), one probe of tasks_claim_key_idx each, round to the end, where the unkeyed
-- tasks take their turn as one more key (''), then from the first key up to where it
-- started; at most `visit` keys per lane.
-- Each key offers its next tasks in claim order (turns), one each where a priority has keys
-- enough to fill the batch, else as many as it may (depth). Then every limit cuts what it
-- must, in the fair order: a key's per-key room in its queue and for each task's type
-- (per_key_max_running minus its tasks of that queue or type running now, expired leases
-- included until swept), then each limited type's and queue's own room (max_running and the
-- rate, as task_claim_limited counts them). The batch is filled in rounds: the first task of
-- every key in turn, then the second of each, and so on (round, then position in the
-- rotation).
-- Committed without waiting for the WAL flush, as task_claim is.
WITH RECURSIVE clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                      set_config('synchronous_commit', 'off', true) AS async_commit),
room AS MATERIALIZED (
    -- Each limit's room (NULL: unbounded) and its per-key cap. A max_running counts the
    -- running tasks of its type or queue (the lease index); a per-key cap alone counts
    -- nothing here: a key's running tasks are counted below, for the keys visited only,
    -- from tasks_running_key_idx (the whole lease index is read only for a max_running).
    SELECT l.kind, l.name, l.per_key_max_running AS per_key,
           least(CASE WHEN l.max_running IS NOT NULL THEN
                     l.max_running - (SELECT count(*) FROM pgqueue.tasks AS r
                                       WHERE r.status = 'running'
                                         AND CASE l.kind WHEN 'type' THEN r.type ELSE r.queue END
                                             = l.name) END,
                 CASE WHEN l.rate_burst IS NULL THEN
                      l.rate_limit - (SELECT count(*) FROM unnest(l.recent_starts) AS s(at)
                                       WHERE s.at > clock.now - l.rate_period * interval '1 second')
                      WHEN l.rate_limit = 0 THEN 0
                      ELSE greatest(0, floor(l.rate_burst - extract(epoch FROM
                               greatest(l.rate_next, clock.now) - clock.now)
                               * l.rate_limit / l.rate_period))::integer END)
               AS room
      FROM pgqueue.limits AS l, clock
),
lanes AS (
    -- The served queues that are not paused, at each priority, with where the rotation was.
    SELECT q.name AS queue, lv.priority, lv.after
      FROM unnest(%(queues)s::text[], %(high_after)s::text[], %(normal_after)s::text[],
                  %(low_after)s::text[]) AS q(name, high_after, normal_after, low_after)
     CROSS JOIN LATERAL (VALUES (0::smallint, q.high_after), (1::smallint, q.normal_after),
                                (2::smallint, q.low_after)) AS lv(priority, after)
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queues AS p WHERE p.name = q.name AND p.paused)
),
rotation AS (
    -- key NULL ends a lane's walk; wrapped: past the last key (the unkeyed turn was given).
    SELECT l.queue, l.priority, l.after, coalesce(k.first, '') AS key,
           k.first IS NULL AS wrapped, 1 AS position
      FROM lanes AS l
     CROSS JOIN LATERAL (
           SELECT min(concurrency_key) AS first FROM pgqueue.tasks
            WHERE status = 'queued' AND concurrency_key IS NOT NULL
              AND queue = l.queue AND priority = l.priority AND concurrency_key > l.after
           ) AS k
    UNION ALL
    SELECT r.queue, r.priority, r.after,
           CASE WHEN r.wrapped THEN n.next ELSE coalesce(n.next, '') END,
           r.wrapped OR n.next IS NULL, r.position + 1
      FROM rotation AS r
     CROSS JOIN LATERAL (
           SELECT CASE WHEN r.wrapped THEN
                       (SELECT min(concurrency_key) FROM pgqueue.tasks
                         WHERE status = 'queued' AND concurrency_key IS NOT NULL
                           AND queue = r.queue AND priority = r.priority
                           AND concurrency_key > r.key AND concurrency_key <= r.after)
                  ELSE
                       (SELECT min(concurrency_key) FROM pgqueue.tasks
                         WHERE status = 'queued' AND concurrency_key IS NOT NULL
                           AND queue = r.queue AND priority = r.priority
                           AND concurrency_key > r.key)
                  END AS next
           ) AS n
     WHERE r.key IS NOT NULL AND r.position < %(visit)s
),
turns AS MATERIALIZED (
    -- Each key's turn, and how many tasks it may offer: the least of the batch and of what its
    -- queue's per-key limit and the queue's own limit leave. The unkeyed turn offers none
    -- where its queue has a max_running or a rate (task_claim_limited claims those; a
    -- per-key limit alone leaves the tasks without a key ordinary).
    SELECT r.queue, r.priority, r.key, r.position,
           CASE WHEN r.key = '' THEN
                CASE WHEN EXISTS (SELECT 1 FROM room AS q
                                   WHERE q.kind = 'queue' AND q.name = r.queue
                                     AND q.room IS NOT NULL)
                     THEN 0 ELSE %(limit)s END
           ELSE greatest(0, least(
                %(limit)s,
                (SELECT q.per_key - (SELECT count(*) FROM pgqueue.tasks AS x
                                      WHERE x.status = 'running' AND x.concurrency_key = r.key
                                        AND x.queue = r.queue)
                   FROM room AS q WHERE q.kind = 'queue' AND q.name = r.queue),
                (SELECT q.room FROM room AS q WHERE q.kind = 'queue' AND q.name = r.queue)))
           END AS room
      FROM rotation AS r
     WHERE r.key IS NOT NULL
),
depth AS (
    -- Per priority: with keys enough to fill the batch one task each, each offers one (its
    -- next); with fewer, each offers what it may, so that no slot is left idle for want of a
    -- turn, and a priority's few keys fill the batch before any lower priority's.
    SELECT priority,
           CASE WHEN count(*) FILTER (WHERE room > 0) < %(limit)s THEN %(limit)s ELSE 1 END
               AS per_turn
      FROM turns
     GROUP BY priority
),
offered AS (
    -- Each key's next tasks; the unkeyed turn's next tasks, none of a limited type.
    -- row_number over a LATERAL ... LIMIT keeps the walk's order.
    SELECT t.queue, t.priority, t.key, t.position, h.id, h.type, h.created_at,
           row_number() OVER (PARTITION BY t.queue, t.priority, t.key
                              ORDER BY h.created_at, h.id) AS round
      FROM turns AS t JOIN depth USING (priority), clock
     CROSS JOIN LATERAL (
           SELECT id, type, created_at FROM pgqueue.tasks
            WHERE status = 'queued' AND concurrency_key IS NOT NULL
              AND queue = t.queue AND priority = t.priority AND concurrency_key = t.key
              AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
            ORDER BY created_at, id
            LIMIT least(t.room, depth.per_turn)
           ) AS h
     WHERE t.key <> '' AND t.room > 0
    UNION ALL
    SELECT t.queue, t.priority, t.key, t.position, h.id, h.type, h.created_at,
           row_number() OVER (PARTITION BY t.queue, t.priority ORDER BY h.created_at, h.id)
      FROM turns AS t JOIN depth USING (priority), clock
     CROSS JOIN LATERAL (
           SELECT id, type, created_at FROM pgqueue.tasks
            WHERE status = 'queued' AND concurrency_key IS NULL
              AND queue = t.queue AND priority = t.priority
              AND visible_after <= clock.now
              AND (expires_at IS NULL OR expires_at > clock.now OR attempts > 0)
              AND NOT EXISTS (SELECT 1 FROM pgqueue.limits AS l
                               WHERE l.kind = 'type' AND l.name = tasks.type
                                 AND (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL))
            ORDER BY created_at, id
            LIMIT least(t.room, depth.per_turn)
           ) AS h
     WHERE t.key = '' AND t.room > 0
),
per_queue_key AS (
    -- A key's tasks at every priority share its queue's per-key room, highest first.
    SELECT o.*
      FROM (SELECT o.*, row_number() OVER (PARTITION BY o.queue, o.key
                                           ORDER BY o.priority, o.round, o.position) AS nth_key
              FROM offered AS o) AS o
      LEFT JOIN room AS q ON q.kind = 'queue' AND q.name = o.queue AND o.key <> ''
     WHERE q.per_key IS NULL
        OR o.nth_key <= q.per_key - (SELECT count(*) FROM pgqueue.tasks AS x
                                      WHERE x.status = 'running' AND x.concurrency_key = o.key
                                        AND x.queue = o.queue)
),
per_type_key AS (
    -- Each key's room under its task type's per-key limit, in the fair order.
    SELECT o.*
      FROM (SELECT o.*, row_number() OVER (PARTITION BY o.type, o.key
                                           ORDER BY o.priority, o.round, o.position,
                                                    o.queue) AS nth_type_key
              FROM per_queue_key AS o) AS o
      LEFT JOIN room AS t ON t.kind = 'type' AND t.name = o.type AND o.key <> ''
     WHERE t.per_key IS NULL
        OR o.nth_type_key <= t.per_key - (SELECT count(*) FROM pgqueue.tasks AS x
                                           WHERE x.status = 'running'
                                             AND x.concurrency_key = o.key AND x.type = o.type)
),
per_type AS (
    -- Then each limited type's own room, and each limited queue's.
    SELECT o.*
      FROM (SELECT o.*, row_number() OVER (PARTITION BY o.type
                                           ORDER BY o.priority, o.round, o.position,
                                                    o.queue) AS nth_type
              FROM per_type_key AS o) AS o
      LEFT JOIN room AS t ON t.kind = 'type' AND t.name = o.type
     WHERE t.room IS NULL OR o.nth_type <= t.room
),
chosen AS (
    SELECT o.id
      FROM (SELECT o.*, row_number() OVER (PARTITION BY o.queue
                                           ORDER BY o.priority, o.round, o.position) AS nth
              FROM per_type AS o) AS o
      LEFT JOIN room AS q ON q.kind = 'queue' AND q.name = o.queue
     WHERE q.room IS NULL OR o.nth <= q.room
     ORDER BY o.priority, o.round, o.position, o.queue
     LIMIT %(limit)s
),
locked AS (
    -- The lock holder alone claims keyed tasks, but a cancel may hold one, and an ordinary
    -- claim an unkeyed one: skip it.
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
              t.parents_pending IS NOT NULL AS has_parents, t.workflow_id, t.concurrency_key
),
started AS (
    SELECT 'type' AS kind, type AS name, count(*) AS n FROM claimed GROUP BY type
    UNION ALL
    SELECT 'queue', queue, count(*) FROM claimed GROUP BY queue
),
logged AS (
    -- The rate limits' logs, as task_claim_limited appends to them.
    UPDATE pgqueue.limits AS l
       SET recent_starts = ARRAY(SELECT s.at FROM unnest(l.recent_starts) AS s(at)
                                  WHERE s.at > clock.now - (l.rate_period + 1) * interval '1 second'
                                  ORDER BY s.at)
                           || array_fill(clock.now, ARRAY[started.n::integer]),
           rate_next = CASE WHEN l.rate_burst IS NULL OR l.rate_limit = 0 THEN l.rate_next
                            ELSE greatest(l.rate_next, clock.now) + started.n * l.rate_period
                                 / l.rate_limit * interval '1 second' END
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
-- But with %(durable)s (the claim took tasks with a concurrency key), it waits for the flush,
-- at the server's synchronous_commit: the WAL is flushed in order, so the claims are durable
-- before their handlers start. A crash that forgot a claim whose handler runs would queue
-- the task again, and its rerun would run beside it, one more than its key's limit allows.
-- The claim itself still commits without waiting, so the limits lock is held no longer.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                      set_config('synchronous_commit',
                                 CASE WHEN %(durable)s::boolean
                                      THEN current_setting('synchronous_commit') ELSE 'off' END,
                                 true) AS commit_mode)
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
-- Count the finish on the dependants' edges; a retry (queued) counts nothing.
settled AS MATERIALIZED (
    SELECT CASE WHEN bool_or(has_dependants) THEN pgqueue.task_dependants_settle(
               array_agg(id) FILTER (WHERE has_dependants)) END
      FROM finished WHERE status <> 'queued'
)
SELECT f.* FROM finished AS f, woken, settled;

-- name: task_fail_owner
-- A worker process died (its supervisor saw it exit on a signal or an error code): fail at
-- once every task still running under its lease owner, instead of leaving each to wait for
-- its lease to expire. As task_fail decides: the lost run counts as an attempt, and the task
-- is queued again after the row's backoff, dead-lettered when its attempts are spent, or
-- cancelled if that was requested meanwhile; waiters are woken and dependants settled. As
-- task_sweep_expired does, a claim whose handlers never started (later than the owner's
-- last start mark, see lease_starts_mark) gives its attempt back and is ready at once.
-- Fenced on the owner and status 'running': a task whose outcome the process wrote before
-- it died is left alone, and nothing another worker claims since is touched (its owner is
-- another). The owner's rows are found through the running-tasks index and locked in id
-- order (as task_complete says why); one statement per dead process, over a few rows.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
lost AS (
    SELECT id, cancel_requested, attempts, max_attempts,
           EXISTS (SELECT 1 FROM pgqueue.lease_starts AS s
                    WHERE s.owner = tasks.lease_owner
                      AND s.started_through < tasks.started_at) AS never_started
      FROM pgqueue.tasks
     WHERE status = 'running' AND lease_owner = %(owner)s
     ORDER BY id
       FOR UPDATE
),
decision AS (
    SELECT id, never_started,
           CASE WHEN cancel_requested THEN 'cancelled'
                WHEN never_started THEN 'queued'
                WHEN attempts >= max_attempts THEN 'failed'
                ELSE 'queued' END AS next_status
      FROM lost
),
finished AS (
UPDATE pgqueue.tasks AS t
   SET status = d.next_status,
       attempts = CASE WHEN d.never_started THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
       visible_after = CASE WHEN d.next_status <> 'queued' THEN t.visible_after
                            WHEN d.never_started THEN clock.now
                            ELSE clock.now + pgqueue.retry_delay(t.attempts, t.backoff_base,
                                   t.backoff_factor, t.backoff_cap) * interval '1 second' END,
       finished_at = CASE WHEN d.next_status <> 'queued' THEN clock.now END,
       ready_since = coalesce(t.ready_since, t.visible_after),  -- its wait began then
       -- A claim that never started leaves the task as it was: no attempt, no error.
       last_error = CASE WHEN d.never_started THEN t.last_error
           ELSE left(format('%%s on attempt %%s of %%s (pid %%s, worker %%s)', %(cause)s::text,
                            t.attempts, t.max_attempts, %(pid)s::integer, t.lease_owner),
                     8000) END,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
  FROM decision AS d, clock
 WHERE t.id = d.id AND t.status = 'running' AND t.lease_owner = %(owner)s
RETURNING t.id, t.type, t.status, t.attempts, t.max_attempts, d.never_started,
          t.has_dependants
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
SELECT f.id, f.type, f.status, f.attempts, f.max_attempts, f.never_started
  FROM finished AS f, woken, settled
 ORDER BY f.id;

-- name: task_expire
-- Waiting tasks whose expiry passed before any attempt was spent end cancelled,
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
