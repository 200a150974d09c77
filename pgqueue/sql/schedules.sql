-- Periodic tasks: a schedule's lock, its fence after the ticks, the list
-- (pgqueue/queries/schedules.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: schedule_lock
-- Upsert a schedule's definition and lock its row: concurrent schedulers (every worker may run
-- one) queue up here, and each then sees the last tick the previous one enqueued. cron holds
-- the rule as people read it: the expression, or an interval's "every 30s" (Schedule.text).
INSERT INTO pgqueue.schedules AS s (name, cron, timezone, type, queue, updated_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(type)s, %(queue)s, now())
ON CONFLICT (name) DO UPDATE
   SET cron = excluded.cron, timezone = excluded.timezone, type = excluded.type,
       queue = excluded.queue, updated_at = excluded.updated_at
RETURNING s.last_tick;

-- name: schedule_advance
-- Move the fence on, in the transaction that enqueued the ticks.
UPDATE pgqueue.schedules
   SET last_tick = %(last_tick)s, next_tick = %(next_tick)s
 WHERE name = %(name)s;

-- name: schedule_list
-- Every schedule a worker has declared, by name (pgqueue.list_schedules).
SELECT name, cron, timezone, type, queue, last_tick, next_tick, updated_at
  FROM pgqueue.schedules
 ORDER BY name;
