-- Per-queue settings and what they govern: pause, resume, retention and the prune that
-- applies it, limits, promotion of tasks waiting too long (pgqueue/queries/queues.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: task_promote
-- The starvation policy: a queued task that has been ready for `after_seconds` moves up one
-- priority (low to normal, normal to high) and its promotion clock (visible_after) restarts,
-- so it climbs one level per period, while ready_since keeps when it first became ready (the
-- age every reader shows) and submitted_priority the priority it was submitted with; once
-- high, it is older than the high tasks behind it and goes first (FIFO). The queues are found
-- by loose walks of the two claim indexes (tasks without a key, tasks with one), and each
-- queue and level is read by its own range of each: of tasks_claim_idx, (queue, priority,
-- created_at), oldest first up to the cutoff, since a task is never ready before it was
-- created; of tasks_claim_key_idx, (queue, priority, key, created_at), the level's entries
-- whose created_at is before the cutoff, compared in the index (an entry too young costs no
-- read of the table), in the index's order: by key, each key's oldest first, so a batch that
-- cannot take every aged keyed task of a level takes the first keys', and the next round the
-- rest. That ORDER BY also keeps the plan on the range: without it, where most of the table
-- is aged keyed tasks, the planner may bet on a sequential scan finding a batch early (and
-- read 200,000 rows for 1,000). Running and scheduled tasks are left alone.
WITH RECURSIVE clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
-- Apart from clock and read once, so that the planner sees its expression (and, planning for
-- these values, how many tasks are older), not an opaque CTE's column.
cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - %(after_seconds)s * interval '1 second' AS at
),
unkeyed AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NULL) AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NULL AND queue > q.name)
      FROM unkeyed AS q
     WHERE q.name IS NOT NULL
),
keyed AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NOT NULL) AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NOT NULL AND queue > q.name)
      FROM keyed AS q
     WHERE q.name IS NOT NULL
),
queues AS (
    SELECT name FROM unkeyed WHERE name IS NOT NULL
    UNION
    SELECT name FROM keyed WHERE name IS NOT NULL
),
aged AS (
    -- Each queue and level: its aged tasks without a key, then with one (a locking clause
    -- goes in a subquery of a UNION's arm, not on the arm itself).
    SELECT a.id
      FROM queues, cutoff, (VALUES (1), (2)) AS level(priority)
     CROSS JOIN LATERAL (
           SELECT u.id
             FROM (SELECT id FROM pgqueue.tasks
                    WHERE status = 'queued' AND concurrency_key IS NULL
                      AND queue = queues.name AND priority = level.priority
                      AND created_at < cutoff.at AND visible_after < cutoff.at
                    ORDER BY created_at
                    LIMIT %(limit)s
                      FOR UPDATE SKIP LOCKED) AS u
           UNION ALL
           SELECT k.id
             FROM (SELECT id FROM pgqueue.tasks
                    WHERE status = 'queued' AND concurrency_key IS NOT NULL
                      AND queue = queues.name AND priority = level.priority
                      AND created_at < cutoff.at AND visible_after < cutoff.at
                    ORDER BY concurrency_key, created_at
                    LIMIT %(limit)s
                      FOR UPDATE SKIP LOCKED) AS k
           ) AS a
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
-- a pruned task's own edges and buckets go with it (primary-key ranges, by
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
-- one index (the two claim indexes, for tasks without and with a concurrency key, the
-- running tasks', the retention index once per finished status, the waiting tasks'), never
-- the table. Each is a scalar subquery for the first task in its index's order, not EXISTS:
-- PostgreSQL drops ORDER BY and LIMIT inside EXISTS and may then bet on a sequential scan
-- finding a row early (for a queue with many tasks), which reads every row before the first
-- one of the queue.
SELECT EXISTS (SELECT 1 FROM pgqueue.queues WHERE name = %(name)s)
    OR (SELECT id FROM pgqueue.tasks
         WHERE status = 'queued' AND concurrency_key IS NULL AND queue = %(name)s
         ORDER BY priority, created_at, id LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks
         WHERE status = 'queued' AND concurrency_key IS NOT NULL AND queue = %(name)s
         ORDER BY priority, concurrency_key, created_at, id LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks WHERE status = 'running' AND queue = %(name)s
         ORDER BY lease_expires_at LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks WHERE status = 'completed' AND queue = %(name)s
         ORDER BY finished_at LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks WHERE status = 'failed' AND queue = %(name)s
         ORDER BY finished_at LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks WHERE status = 'cancelled' AND queue = %(name)s
         ORDER BY finished_at LIMIT 1) IS NOT NULL
    OR (SELECT id FROM pgqueue.tasks WHERE status = 'waiting' AND queue = %(name)s
         ORDER BY priority LIMIT 1) IS NOT NULL
       AS known;

-- name: queue_list
-- Every queue with tasks (in any status) or a setting, and whether it is paused (stats and
-- every /metrics scrape ask). The queues come from loose walks of the two claim indexes
-- (tasks without and with a concurrency key), of the retention index (one per finished
-- status, each a literal the partial index's predicate is proved by) and of the waiting
-- tasks' index, one probe per queue each, not from reading the tasks; running tasks are few
-- (as many as the workers' slots).
WITH RECURSIVE backlog AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NULL) AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NULL AND queue > b.name)
      FROM backlog AS b
     WHERE b.name IS NOT NULL
),
keyed AS (
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NOT NULL) AS name
    UNION ALL
    SELECT (SELECT min(queue) FROM pgqueue.tasks
             WHERE status = 'queued' AND concurrency_key IS NOT NULL AND queue > k.name)
      FROM keyed AS k
     WHERE k.name IS NOT NULL
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
        UNION SELECT name FROM keyed WHERE name IS NOT NULL
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
-- Set a limit as a whole (a NULL part is no limit of that kind), as an operator: a limit the
-- workers declared from their code (declared_by) becomes the operator's, which no
-- declaration overwrites. Claims obey it from the next one on; the sliding log of recent
-- starts and the bucket's state are kept, so lowering a rate takes effect at once (a bucket's
-- from the start already due), and a bucket owes no more than it would empty under the new
-- rate, so raising one takes effect within one new interval (not after the old rate's).
-- Wakes idle workers, since a raised limit may free tasks for them.
WITH saved AS (
    INSERT INTO pgqueue.limits AS l (kind, name, max_running, rate_limit, rate_period,
                                     rate_burst, per_key_max_running, updated_at)
    VALUES (%(kind)s, %(name)s, %(max_running)s, %(rate_limit)s, %(rate_period)s,
            %(rate_burst)s, %(per_key_max_running)s, coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (kind, name) DO UPDATE
       SET max_running = excluded.max_running, rate_limit = excluded.rate_limit,
           rate_period = excluded.rate_period, rate_burst = excluded.rate_burst,
           per_key_max_running = excluded.per_key_max_running, declared_by = NULL,
           rate_next = CASE WHEN excluded.rate_burst IS NOT NULL AND excluded.rate_limit > 0
                                 AND l.rate_next IS NOT NULL
                            THEN least(l.rate_next, excluded.updated_at + excluded.rate_burst
                                       * excluded.rate_period / excluded.rate_limit
                                       * interval '1 second')
                            ELSE l.rate_next END,
           updated_at = excluded.updated_at
    RETURNING kind, name, max_running, rate_limit, rate_period, rate_burst, per_key_max_running,
              declared_by, updated_at
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
-- until swept), starts within its rate period (a bucket's too), and how many concurrency
-- keys have tasks running under it and how many of those are at its per-key cap (their next
-- tasks wait); and whether an operator set it or a worker declared it (declared_by).
-- All from the running tasks (the lease index: as many as the workers' slots), read once.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
running AS MATERIALIZED (
    SELECT type, queue, concurrency_key FROM pgqueue.tasks WHERE status = 'running'
)
SELECT l.kind, l.name, l.max_running, l.rate_limit, l.rate_period, l.rate_burst,
       l.per_key_max_running, l.declared_by, l.updated_at,
       (SELECT count(*) FROM running AS r
         WHERE CASE l.kind WHEN 'type' THEN r.type ELSE r.queue END = l.name) AS running,
       (SELECT count(*) FROM unnest(l.recent_starts) AS s(at)
         WHERE s.at > clock.now - l.rate_period * interval '1 second') AS recent_starts,
       k.keys_running, k.keys_at_cap
  FROM pgqueue.limits AS l
 CROSS JOIN clock
 CROSS JOIN LATERAL (
       SELECT count(*) AS keys_running,
              count(*) FILTER (WHERE per_key.n >= l.per_key_max_running) AS keys_at_cap
         FROM (SELECT count(*) AS n FROM running AS r
                WHERE r.concurrency_key IS NOT NULL
                  AND CASE l.kind WHEN 'type' THEN r.type ELSE r.queue END = l.name
                GROUP BY r.concurrency_key) AS per_key
       ) AS k
 ORDER BY l.kind, l.name;
