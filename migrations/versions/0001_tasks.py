"""The tasks table, its indexes and the DBA views.

Revision ID: 0001_tasks
Revises:
Create Date: 2026-11-30
"""

from alembic import op

revision = "0001_tasks"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- Only when missing: CREATE SCHEMA IF NOT EXISTS checks CREATE on the database before it
    -- looks, and an owner given the schema by the DBA (docs/security.md) need not have that.
    DO $$
    BEGIN
        IF to_regnamespace('pgqueue') IS NULL THEN
            CREATE SCHEMA pgqueue;
        END IF;
    END
    $$;

    -- One row per task. No foreign keys: this is the hot table, and every status change is an
    -- UPDATE on it. Text + CHECK rather than enum types so a new status is a cheap migration.
    CREATE TABLE pgqueue.tasks (
        id                uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
        queue             text        NOT NULL DEFAULT 'default',
        type              text        NOT NULL,
        payload           jsonb       NOT NULL,
        priority          smallint    NOT NULL DEFAULT 1,
        status            text        NOT NULL DEFAULT 'queued',
        attempts          integer     NOT NULL DEFAULT 0,
        max_attempts      integer     NOT NULL DEFAULT 3,
        backoff_base      real        NOT NULL DEFAULT 1,
        backoff_factor    real        NOT NULL DEFAULT 2,
        backoff_cap       real        NOT NULL DEFAULT 300,
        visible_after     timestamptz NOT NULL DEFAULT now(),
        idempotency_key   text,
        lease_owner       text,
        lease_token       uuid,
        lease_expires_at  timestamptz,
        cancel_requested  boolean     NOT NULL DEFAULT false,
        result            jsonb,
        last_error        text,
        created_at        timestamptz NOT NULL DEFAULT now(),
        started_at        timestamptz,
        finished_at       timestamptz,
        CONSTRAINT tasks_status_check
            CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
        CONSTRAINT tasks_priority_check CHECK (priority BETWEEN 0 AND 9),
        CONSTRAINT tasks_max_attempts_check CHECK (max_attempts >= 1),
        CONSTRAINT tasks_attempts_check CHECK (attempts >= 0),
        CONSTRAINT tasks_type_check CHECK (length(type) BETWEEN 1 AND 200),
        CONSTRAINT tasks_queue_check CHECK (length(queue) BETWEEN 1 AND 200),
        CONSTRAINT tasks_backoff_check
            CHECK (backoff_base >= 0 AND backoff_factor >= 1 AND backoff_cap >= 0),
        -- A running task always holds a complete lease; nothing else holds one.
        CONSTRAINT tasks_lease_check CHECK (
            (status = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
        )
    );

    -- Idempotency keys hold across every status until the task is pruned.
    CREATE UNIQUE INDEX tasks_idempotency_key_idx
        ON pgqueue.tasks (idempotency_key) WHERE idempotency_key IS NOT NULL;

    -- Serves the claim: the next queued tasks of a queue in (priority, created_at, id) order;
    -- id breaks ties between tasks enqueued in one statement (ids are time-ordered).
    -- Partial, so it holds only waiting rows and stays small however many tasks are kept.
    CREATE INDEX tasks_claim_idx
        ON pgqueue.tasks (queue, priority, created_at, id) WHERE status = 'queued';

    -- Serves the expired-lease sweep.
    CREATE INDEX tasks_lease_idx
        ON pgqueue.tasks (lease_expires_at) WHERE status = 'running';

    -- Serves retention pruning and the dead-letter listing.
    CREATE INDEX tasks_finished_idx
        ON pgqueue.tasks (status, finished_at)
        WHERE status IN ('completed', 'failed', 'cancelled');

    -- Every claim and completion updates a row: vacuum early and often so dead tuples do not
    -- pile up in the claim index (the peers' most reported slowdown).
    ALTER TABLE pgqueue.tasks SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01,
        autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 1,
        fillfactor = 90
    );

    -- The wait before the next attempt after failed attempt number `attempts`: exponential,
    -- capped, with up to half taken off at random so tasks that failed together spread out.
    -- One definition, used by task_fail and by the expired-lease sweep alike.
    CREATE FUNCTION pgqueue.retry_delay(attempts integer, base real, factor real, cap real)
        RETURNS double precision
        LANGUAGE sql VOLATILE PARALLEL SAFE
        RETURN least(cap::double precision,
                     base::double precision
                     * power(factor::double precision, greatest(attempts - 1, 0)))
               * (1.0 - random() * 0.5);

    CREATE FUNCTION pgqueue.priority_name(p smallint) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        RETURN CASE p WHEN 0 THEN 'high' WHEN 1 THEN 'normal' WHEN 2 THEN 'low'
                      ELSE p::text END;

    -- Depth of each queue by status and priority. "ready" counts queued tasks that are due now
    -- (the autoscaling signal); "scheduled" those waiting for their run time or a retry backoff.
    CREATE VIEW pgqueue.queue_depth AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           now() - min(visible_after) FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM pgqueue.tasks
     GROUP BY queue, priority, status;

    -- The dead-letter queue: tasks whose attempts are spent (add ORDER BY finished_at DESC
    -- for the newest first; a view's own order is not guaranteed to survive a query on it).
    CREATE VIEW pgqueue.dead_letters AS
    SELECT id, queue, type, pgqueue.priority_name(priority) AS priority, attempts,
           max_attempts, last_error, payload, idempotency_key, created_at, finished_at
      FROM pgqueue.tasks
     WHERE status = 'failed';

    -- Running tasks with their worker and lease, for "what is stuck?" questions.
    CREATE VIEW pgqueue.running_tasks AS
    SELECT id, queue, type, pgqueue.priority_name(priority) AS priority, attempts,
           max_attempts, lease_owner, lease_expires_at,
           lease_expires_at < now() AS lease_expired, started_at,
           now() - started_at AS running_for, cancel_requested
      FROM pgqueue.tasks
     WHERE status = 'running';
    """)


def downgrade() -> None:
    op.execute("""
    DROP VIEW pgqueue.running_tasks;
    DROP VIEW pgqueue.dead_letters;
    DROP VIEW pgqueue.queue_depth;
    DROP FUNCTION pgqueue.priority_name(smallint);
    DROP FUNCTION pgqueue.retry_delay(integer, real, real, real);
    DROP TABLE pgqueue.tasks;
    """)
