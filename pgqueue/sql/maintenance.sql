-- The schema's version, the maintenance lock, and ANALYZE when the statistics went
-- stale (pgqueue/queries/maintenance.py).
-- Each statement starts with "-- name: NAME" and a line saying why; the names are unique across
-- the files of this directory (the loader refuses a duplicate). Parameters use psycopg's
-- %(name)s style; %(now)s is NULL in production and a fixed time in tests, so tests control the
-- clock instead of sleeping.

-- name: schema_version
-- The revision pgqueue's migrations recorded: what every worker, client and command checks.
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
