-- The privileges of pgqueue's application role: what workers, the HTTP API, pgqueue.Client and
-- the operator commands (enqueue, status, list, cancel, stats, dlq, migrate --check) need to do
-- their work, and nothing more. No DDL: the role cannot create, alter, drop or truncate
-- anything. `pgqueue migrate` runs as the owner of the pgqueue schema instead (docs/security.md).
--
-- Run it as the schema's owner (the role that ran `pgqueue migrate`), after every migrate:
--
--     pgqueue --database-url "$OWNER_URL" grant pgqueue_app
--     psql "$OWNER_URL" -v app_role=pgqueue_app -f grants.sql
--
-- :"app_role" is the placeholder for the role's name (psql quotes it as an identifier, and
-- `pgqueue grant` with psycopg.sql; `pgqueue grant ROLE --print` prints this file for ROLE).
-- The role must exist (CREATE ROLE pgqueue_app LOGIN PASSWORD '...'). Granting twice changes
-- nothing. pgqueue needs no privilege on anything outside its schema: LISTEN, NOTIFY, advisory
-- locks, current_setting() and the statistics views are open to every role.
\set ON_ERROR_STOP on

-- Reach the objects in the schema at all (USAGE only: CREATE stays with the owner).
GRANT USAGE ON SCHEMA pgqueue TO :"app_role";

-- The queue itself. INSERT: enqueue and its bulk COPY. UPDATE: claim (with its row locks, FOR
-- UPDATE SKIP LOCKED), heartbeat, complete, fail, release, cancel, replay and the expired-lease
-- sweep. SELECT: status, list and every WHERE above. DELETE: discarding dead letters,
-- retention pruning, and undoing the rows of a bulk enqueue refused for a reused idempotency
-- key (key_reuse='refuse'). Not TRUNCATE, REFERENCES or TRIGGER.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.tasks TO :"app_role";

-- Per-queue settings. SELECT: every claim checks whether its queues are paused, and pruning
-- reads their retention. INSERT and UPDATE: pausing, resuming and setting retention (`pgqueue
-- queue`, the API), an upsert. DELETE: removing a queue's settings (`pgqueue queue remove`,
-- DELETE /api/v1/queues/{name}), the undoing of what the role may pause and set; the row holds
-- settings only, never tasks.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.queues TO :"app_role";

-- Periodic tasks. INSERT and UPDATE: workers upsert their schedules and move each one's last
-- tick (under a row lock: the once-per-tick fence). SELECT: `pgqueue schedules`. Not DELETE.
GRANT SELECT, INSERT, UPDATE ON TABLE pgqueue.schedules TO :"app_role";

-- Limits per type or queue. SELECT: every claim. UPDATE: a claim appends to a rate limit's
-- log of recent starts. INSERT and DELETE: setting and removing limits (`pgqueue limit`, the
-- API), which an application may do at run time (say, to throttle a struggling downstream).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.limits TO :"app_role";

-- Start marks per lease owner. INSERT and UPDATE: a worker marks its claims started (an
-- upsert of its own row). SELECT: the expired-lease sweep. DELETE: maintenance forgets the
-- marks of stopped workers.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.lease_starts TO :"app_role";

-- Declared task types. INSERT and UPDATE: a worker records its registry's types at start (an
-- upsert). SELECT: every enqueue reads its type's declaration; claims read it for a task
-- enqueued before the declaration. Not DELETE.
GRANT SELECT, INSERT, UPDATE ON TABLE pgqueue.task_types TO :"app_role";

-- Waiters on a task's result (pgqueue.wait, GET /api/v1/tasks/{id}?wait=). INSERT and DELETE:
-- a waiter registers for as long as it waits, and removes its row (or an expired one of a
-- waiter that died). SELECT: every statement that finishes tasks looks for their waiters.
GRANT SELECT, INSERT, DELETE ON TABLE pgqueue.task_waiters TO :"app_role";

-- Dependencies between tasks. INSERT: an enqueue with depends_on writes the edges
-- and buckets. UPDATE: every statement that finishes a parent counts it (outcome, pending).
-- SELECT: the worker reads a claimed task's parents. DELETE: pruning.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgqueue.task_dependencies,
                                              pgqueue.task_dependency_buckets
    TO :"app_role";

-- Read-only views: stats (CLI, API, /metrics) read queue_depth; operators and dashboards
-- read all of them (workflows: one row per workflow).
GRANT SELECT ON TABLE pgqueue.queue_depth, pgqueue.dead_letters, pgqueue.running_tasks,
                      pgqueue.backlog, pgqueue.workflows
    TO :"app_role";

-- Workers, pgqueue.Client, the CLI and the API's /readyz check the schema revision before
-- they work (they refuse a schema behind the code). Read-only: only migrations write it.
GRANT SELECT ON TABLE pgqueue.pgqueue_alembic_version TO :"app_role";

-- Failing a task and the sweep compute the retry delay with retry_delay; the views call
-- priority_name. PUBLIC may execute functions by default, but not where a DBA revoked that.
GRANT EXECUTE ON FUNCTION pgqueue.retry_delay(integer, real, real, real),
                          pgqueue.priority_name(smallint)
    TO :"app_role";

-- Every statement that makes tasks final wakes their waiters through task_waiters_wake.
GRANT EXECUTE ON FUNCTION pgqueue.task_waiters_wake(uuid[]) TO :"app_role";
-- ... and releases or cancels their dependants through task_dependants_settle.
GRANT EXECUTE ON FUNCTION pgqueue.task_dependants_settle(uuid[]) TO :"app_role";
-- ... and a replay revives the dependants its dead letter cancelled (task_dependants_revive).
GRANT EXECUTE ON FUNCTION pgqueue.task_dependants_revive(uuid[]) TO :"app_role";

-- Hand the role's name to the DO block below (psql substitutes nothing inside $$ quotes).
SELECT set_config('pgqueue.app_role', :'app_role', false);

-- Workers ANALYZE pgqueue.tasks after a burst of changes, so that the claim keeps walking its
-- index instead of sorting the backlog. On PostgreSQL 17 and newer that takes MAINTAIN (which
-- also allows VACUUM, REINDEX, CLUSTER and LOCK TABLE on this one table; still no DDL). Before
-- 17 only the table's or the database's owner may analyze: nothing is granted, workers log
-- maintenance.analyze_not_permitted once and stop trying, and autovacuum keeps the statistics
-- (the migration makes it analyze after 2 % of the rows changed).
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 170000 THEN
        EXECUTE format('GRANT MAINTAIN ON TABLE pgqueue.tasks TO %I',
                       current_setting('pgqueue.app_role'));
    END IF;
END
$$;
