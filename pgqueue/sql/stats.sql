-- Reads for people and monitors; none of them writes (pgqueue/queries/stats.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: queue_depth
-- Depth per queue, priority and status over every task, the finished ones kept included
-- (pgqueue.queue_stats): it reads the whole table; what is asked often reads queue_overview.
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

-- name: key_busiest
-- The busiest concurrency keys now, per queue: most running tasks plus ready ones (queued and
-- due: what a key holds of the workers and what it asks for; a scheduled task asks for
-- nothing yet), at most `limit` of them (`pgqueue stats`, GET /api/v1/stats, /metrics and the
-- dashboard ask every few seconds). Running tasks are counted from the running ones (the
-- lease index: as many as the workers' slots). Queued ones from tasks_claim_key_idx, (queue,
-- priority, key, created_at, id), in chunks of `cap` entries in index order, one row a chunk
-- (arrays of its groups, in order): each chunk is counted per (queue, priority, key), and the
-- next starts at the chunk's last group, which the chunk may have cut short (so the next
-- counts it whole), or, when that group filled the whole chunk, after it. So a key with `cap`
-- or more queued tasks at a priority costs at most two chunks however long its backlog, and
-- the cost is the number of keys waiting, not the tasks; such a key is counted to `cap`
-- (ready_capped), its ready ones among the first `cap` in claim order.
WITH RECURSIVE clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
running AS (
    SELECT queue, concurrency_key AS key, count(*) AS running
      FROM pgqueue.tasks
     WHERE status = 'running' AND concurrency_key IS NOT NULL
     GROUP BY queue, concurrency_key
),
chunks AS (
    -- A start before every entry: a chunk of one group (this one) is skipped past, and no
    -- queue is named ''.
    SELECT ARRAY[''::text] AS queues, ARRAY[(-1)::smallint] AS priorities,
           ARRAY[''::text COLLATE "C"] AS keys, ARRAY[0::bigint] AS queued,
           ARRAY[0::bigint] AS ready, %(cap)s::bigint AS entries
    UNION ALL
    SELECT s.queues, s.priorities, s.keys, s.queued, s.ready, s.entries
      FROM chunks AS w
     CROSS JOIN clock
     CROSS JOIN LATERAL (
           SELECT array_agg(g.queue) AS queues, array_agg(g.priority) AS priorities,
                  array_agg(g.key) AS keys, array_agg(g.queued) AS queued,
                  array_agg(g.ready) AS ready, sum(g.queued)::bigint AS entries
             FROM (SELECT c.queue, c.priority, c.concurrency_key AS key, count(*) AS queued,
                          count(*) FILTER (WHERE c.visible_after <= clock.now) AS ready
                     FROM (SELECT queue, priority, concurrency_key, visible_after
                             FROM pgqueue.tasks
                            WHERE status = 'queued' AND concurrency_key IS NOT NULL
                              AND (queue, priority, concurrency_key, created_at, id)
                                  > (w.queues[cardinality(w.queues)],
                                     w.priorities[cardinality(w.queues)],
                                     w.keys[cardinality(w.queues)],
                                     CASE WHEN cardinality(w.queues) = 1 THEN 'infinity'
                                          ELSE '-infinity' END::timestamptz,
                                     CASE WHEN cardinality(w.queues) = 1
                                          THEN 'ffffffff-ffff-ffff-ffff-ffffffffffff'
                                          ELSE '00000000-0000-0000-0000-000000000000' END::uuid)
                            ORDER BY queue, priority, concurrency_key
                            LIMIT %(cap)s) AS c
                    GROUP BY c.queue, c.priority, c.concurrency_key) AS g
           ) AS s
     -- A chunk short of `cap` entries reached the end.
     WHERE w.entries = %(cap)s AND s.entries IS NOT NULL
),
groups AS (
    -- A full chunk's last group is cut off (the next chunk counts it whole), unless it is the
    -- chunk's only one: then it has `cap` entries or more, and is counted to `cap`.
    SELECT g.queue, g.key, g.queued, g.ready,
           w.entries = %(cap)s AND g.nth = cardinality(w.queues) AS cut,
           cardinality(w.queues) = 1 AS alone
      FROM chunks AS w,
           unnest(w.queues, w.keys, w.queued, w.ready) WITH ORDINALITY
           AS g(queue, key, queued, ready, nth)
     WHERE w.priorities[1] >= 0  -- not the start
),
waiting AS (
    SELECT queue, key, least(sum(ready), %(cap)s)::bigint AS ready,
           bool_or(cut) OR sum(queued) > %(cap)s AS ready_capped
      FROM groups
     WHERE NOT cut OR alone
     GROUP BY queue, key
)
SELECT coalesce(w.queue, r.queue) AS queue, coalesce(w.key, r.key) AS key,
       coalesce(r.running, 0) AS running, coalesce(w.ready, 0) AS ready,
       coalesce(w.ready_capped, false) AS ready_capped
  FROM waiting AS w
  FULL JOIN running AS r ON r.queue = w.queue AND r.key = w.key
 ORDER BY coalesce(r.running, 0) + coalesce(w.ready, 0) DESC, coalesce(r.running, 0) DESC,
          1, 2
 LIMIT %(limit)s;
