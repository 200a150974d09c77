-- The pgqueue schema as `alembic upgrade head` (`pgqueue migrate`) leaves an empty database.
-- Generated from the system catalogs by tests/migrations/snapshot.py: do not edit by hand.
-- Regenerate after adding a migration (the URL may name any database on the server):
--     python tests/migrations/snapshot.py postgresql://USER@HOST:PORT/DBNAME
-- View definitions are shown without column qualifiers (PostgreSQL 16+ omits them, 15 not).

CREATE SCHEMA pgqueue;

-- alembic revision in pgqueue.pgqueue_alembic_version: 0017_task_progress

CREATE TABLE pgqueue.lease_starts (
    owner text NOT NULL,
    started_through timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE pgqueue.lease_starts ADD CONSTRAINT lease_starts_pkey PRIMARY KEY (owner);
CREATE UNIQUE INDEX lease_starts_pkey ON pgqueue.lease_starts USING btree (owner);

CREATE TABLE pgqueue.limits (
    kind text NOT NULL,
    name text NOT NULL,
    max_running integer,
    rate_limit integer,
    rate_period double precision,
    recent_starts timestamp with time zone[] NOT NULL DEFAULT '{}'::timestamp with time zone[],
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    per_key_max_running integer,
    rate_burst integer,
    rate_next timestamp with time zone,
    declared_by text
);
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_kind_check CHECK ((kind = ANY (ARRAY['type'::text, 'queue'::text])));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_max_running_check CHECK ((max_running >= 0));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200)));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_per_key_check CHECK ((per_key_max_running >= 0));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_pkey PRIMARY KEY (kind, name);
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_rate_burst_check CHECK (((rate_burst IS NULL) OR ((rate_limit IS NOT NULL) AND ((rate_burst >= 1) AND (rate_burst <= 10000)))));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_rate_check CHECK ((((rate_limit IS NULL) = (rate_period IS NULL)) AND ((rate_limit >= 0) AND (rate_limit <= 10000)) AND (rate_period > (0)::double precision)));
ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_some_check CHECK (((max_running IS NOT NULL) OR (rate_limit IS NOT NULL) OR (per_key_max_running IS NOT NULL)));
CREATE UNIQUE INDEX limits_pkey ON pgqueue.limits USING btree (kind, name);

CREATE TABLE pgqueue.pgqueue_alembic_version (
    version_num character varying(32) NOT NULL
);
ALTER TABLE pgqueue.pgqueue_alembic_version ADD CONSTRAINT pgqueue_alembic_version_pkc PRIMARY KEY (version_num);
CREATE UNIQUE INDEX pgqueue_alembic_version_pkc ON pgqueue.pgqueue_alembic_version USING btree (version_num);

CREATE TABLE pgqueue.queues (
    name text NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    paused_at timestamp with time zone,
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    completed_retention double precision,
    dead_retention double precision
);
ALTER TABLE pgqueue.queues ADD CONSTRAINT queues_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200)));
ALTER TABLE pgqueue.queues ADD CONSTRAINT queues_paused_at_check CHECK ((paused = (paused_at IS NOT NULL)));
ALTER TABLE pgqueue.queues ADD CONSTRAINT queues_pkey PRIMARY KEY (name);
ALTER TABLE pgqueue.queues ADD CONSTRAINT queues_retention_check CHECK (((completed_retention > (0)::double precision) AND (dead_retention > (0)::double precision)));
CREATE UNIQUE INDEX queues_pkey ON pgqueue.queues USING btree (name);

CREATE TABLE pgqueue.schedules (
    name text NOT NULL,
    cron text NOT NULL,
    timezone text NOT NULL,
    type text NOT NULL,
    queue text NOT NULL,
    last_tick timestamp with time zone,
    next_tick timestamp with time zone,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE pgqueue.schedules ADD CONSTRAINT schedules_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200)));
ALTER TABLE pgqueue.schedules ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);
CREATE UNIQUE INDEX schedules_pkey ON pgqueue.schedules USING btree (name);

CREATE TABLE pgqueue.task_dependencies (
    child_id uuid NOT NULL,
    parent_id uuid NOT NULL,
    position integer NOT NULL,
    run_anyway boolean NOT NULL DEFAULT false,
    bucket integer NOT NULL,
    outcome text
);
ALTER TABLE pgqueue.task_dependencies ADD CONSTRAINT task_dependencies_pkey PRIMARY KEY (child_id, parent_id);
CREATE INDEX task_dependencies_parent_idx ON pgqueue.task_dependencies USING btree (parent_id);
CREATE UNIQUE INDEX task_dependencies_pkey ON pgqueue.task_dependencies USING btree (child_id, parent_id);

CREATE TABLE pgqueue.task_dependency_buckets (
    child_id uuid NOT NULL,
    bucket integer NOT NULL,
    pending integer NOT NULL
);
ALTER TABLE pgqueue.task_dependency_buckets ADD CONSTRAINT task_dependency_buckets_pending_check CHECK ((pending >= 0));
ALTER TABLE pgqueue.task_dependency_buckets ADD CONSTRAINT task_dependency_buckets_pkey PRIMARY KEY (child_id, bucket);
CREATE UNIQUE INDEX task_dependency_buckets_pkey ON pgqueue.task_dependency_buckets USING btree (child_id, bucket);

CREATE TABLE pgqueue.task_types (
    type text NOT NULL,
    max_attempts integer,
    backoff_base real,
    backoff_factor real,
    backoff_cap real,
    declared_by text NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    queue text,
    priority smallint,
    timeout real,
    parameters jsonb
);
ALTER TABLE pgqueue.task_types ADD CONSTRAINT task_types_backoff_check CHECK (((backoff_base >= (0)::double precision) AND (backoff_factor >= (1)::double precision) AND (backoff_cap >= (0)::double precision)));
ALTER TABLE pgqueue.task_types ADD CONSTRAINT task_types_max_attempts_check CHECK ((max_attempts >= 1));
ALTER TABLE pgqueue.task_types ADD CONSTRAINT task_types_pkey PRIMARY KEY (type);
CREATE UNIQUE INDEX task_types_pkey ON pgqueue.task_types USING btree (type);

CREATE TABLE pgqueue.task_waiters (
    task_id uuid NOT NULL,
    waiter_id uuid NOT NULL,
    expires_at timestamp with time zone NOT NULL
);
ALTER TABLE pgqueue.task_waiters ADD CONSTRAINT task_waiters_pkey PRIMARY KEY (task_id, waiter_id);
CREATE INDEX task_waiters_expires_idx ON pgqueue.task_waiters USING btree (expires_at);
CREATE UNIQUE INDEX task_waiters_pkey ON pgqueue.task_waiters USING btree (task_id, waiter_id);

CREATE TABLE pgqueue.tasks (
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    queue text NOT NULL DEFAULT 'default'::text,
    type text NOT NULL,
    payload jsonb NOT NULL,
    priority smallint NOT NULL DEFAULT 1,
    status text NOT NULL DEFAULT 'queued'::text,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3,
    backoff_base real NOT NULL DEFAULT 1,
    backoff_factor real NOT NULL DEFAULT 2,
    backoff_cap real NOT NULL DEFAULT 300,
    visible_after timestamp with time zone NOT NULL DEFAULT now(),
    idempotency_key text,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    cancel_requested boolean NOT NULL DEFAULT false,
    result jsonb,
    last_error text,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    trace_context jsonb,
    ready_since timestamp with time zone,
    submitted_priority smallint,
    policy_default boolean,
    snoozes integer,
    expires_at timestamp with time zone,
    workflow_id uuid,
    parents_pending integer,
    cancelled_by uuid,
    has_dependants boolean,
    concurrency_key text COLLATE "C",
    progress jsonb
) WITH (autovacuum_analyze_scale_factor=0.02, autovacuum_vacuum_cost_delay=1, autovacuum_vacuum_insert_scale_factor=0.01, autovacuum_vacuum_scale_factor=0.01, fillfactor=90);
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_attempts_check CHECK ((attempts >= 0));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_backoff_check CHECK (((backoff_base >= (0)::double precision) AND (backoff_factor >= (1)::double precision) AND (backoff_cap >= (0)::double precision)));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_concurrency_key_check CHECK (((length(concurrency_key) >= 1) AND (length(concurrency_key) <= 200))) NOT VALID;
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_lease_check CHECK (((status = 'running'::text) = ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL))));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_max_attempts_check CHECK ((max_attempts >= 1));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (id);
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_priority_check CHECK (((priority >= 0) AND (priority <= 9)));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_queue_check CHECK (((length(queue) >= 1) AND (length(queue) <= 200)));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'running'::text, 'completed'::text, 'failed'::text, 'cancelled'::text, 'waiting'::text])));
ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_type_check CHECK (((length(type) >= 1) AND (length(type) <= 200)));
CREATE INDEX tasks_claim_idx ON pgqueue.tasks USING btree (queue, priority, created_at, id) WHERE ((status = 'queued'::text) AND (concurrency_key IS NULL));
CREATE INDEX tasks_claim_key_idx ON pgqueue.tasks USING btree (queue, priority, concurrency_key, created_at, id) WHERE ((status = 'queued'::text) AND (concurrency_key IS NOT NULL));
CREATE INDEX tasks_claim_type_idx ON pgqueue.tasks USING btree (type, queue, priority, created_at, id) WHERE ((status = 'queued'::text) AND (concurrency_key IS NULL));
CREATE INDEX tasks_expiry_idx ON pgqueue.tasks USING btree (expires_at) WHERE ((status = 'queued'::text) AND (attempts = 0) AND (expires_at IS NOT NULL));
CREATE UNIQUE INDEX tasks_idempotency_key_idx ON pgqueue.tasks USING btree (idempotency_key) WHERE (idempotency_key IS NOT NULL);
CREATE INDEX tasks_lease_idx ON pgqueue.tasks USING btree (lease_expires_at) WHERE (status = 'running'::text);
CREATE UNIQUE INDEX tasks_pkey ON pgqueue.tasks USING btree (id);
CREATE INDEX tasks_retention_idx ON pgqueue.tasks USING btree (status, queue, finished_at) WHERE (status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text]));
CREATE INDEX tasks_retrying_idx ON pgqueue.tasks USING btree (visible_after) WHERE ((status = 'queued'::text) AND (attempts > 0));
CREATE INDEX tasks_running_key_idx ON pgqueue.tasks USING btree (concurrency_key) WHERE ((status = 'running'::text) AND (concurrency_key IS NOT NULL));
CREATE INDEX tasks_waiting_idx ON pgqueue.tasks USING btree (queue, priority) WHERE (status = 'waiting'::text);
CREATE INDEX tasks_workflow_idx ON pgqueue.tasks USING btree (workflow_id) WHERE (workflow_id IS NOT NULL);

-- pgqueue.backlog reads pgqueue.tasks: concurrency_key, priority, queue, ready_since, status, visible_after
CREATE VIEW pgqueue.backlog (
    queue text,
    priority text,
    ready bigint,
    scheduled bigint,
    running bigint,
    oldest_ready_age interval
) AS
 SELECT queue,
    pgqueue.priority_name(priority) AS priority,
    count(*) FILTER (WHERE status = 'queued'::text AND visible_after <= now()) AS ready,
    count(*) FILTER (WHERE status = 'queued'::text AND visible_after > now()) AS scheduled,
    count(*) FILTER (WHERE status = 'running'::text) AS running,
    now() - min(COALESCE(ready_since, visible_after)) FILTER (WHERE status = 'queued'::text AND visible_after <= now()) AS oldest_ready_age
   FROM ( SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'queued'::text AND concurrency_key IS NULL
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'queued'::text AND concurrency_key IS NOT NULL
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'running'::text) t
  GROUP BY queue, priority;

-- pgqueue.dead_letters reads pgqueue.tasks: attempts, created_at, finished_at, id, idempotency_key, last_error, max_attempts, payload, priority, queue, status, type
CREATE VIEW pgqueue.dead_letters (
    id uuid,
    queue text,
    type text,
    priority text,
    attempts integer,
    max_attempts integer,
    last_error text,
    payload jsonb,
    idempotency_key text,
    created_at timestamp with time zone,
    finished_at timestamp with time zone
) AS
 SELECT id,
    queue,
    type,
    pgqueue.priority_name(priority) AS priority,
    attempts,
    max_attempts,
    last_error,
    payload,
    idempotency_key,
    created_at,
    finished_at
   FROM pgqueue.tasks
  WHERE status = 'failed'::text;

-- pgqueue.queue_depth reads pgqueue.tasks: concurrency_key, priority, queue, ready_since, status, visible_after
CREATE VIEW pgqueue.queue_depth (
    queue text,
    priority text,
    status text,
    tasks bigint,
    ready bigint,
    scheduled bigint,
    oldest_ready_age interval
) AS
 SELECT queue,
    pgqueue.priority_name(priority) AS priority,
    status,
    count(*) AS tasks,
    count(*) FILTER (WHERE status = 'queued'::text AND visible_after <= now()) AS ready,
    count(*) FILTER (WHERE status = 'queued'::text AND visible_after > now()) AS scheduled,
    now() - min(COALESCE(ready_since, visible_after)) FILTER (WHERE status = 'queued'::text AND visible_after <= now()) AS oldest_ready_age
   FROM ( SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'queued'::text AND concurrency_key IS NULL
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'queued'::text AND concurrency_key IS NOT NULL
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'running'::text
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = 'waiting'::text
        UNION ALL
         SELECT queue,
            priority,
            status,
            visible_after,
            ready_since
           FROM pgqueue.tasks
          WHERE status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])) t
  GROUP BY queue, priority, status;

-- pgqueue.running_tasks reads pgqueue.tasks: attempts, cancel_requested, id, lease_expires_at, lease_owner, max_attempts, priority, queue, started_at, status, type
CREATE VIEW pgqueue.running_tasks (
    id uuid,
    queue text,
    type text,
    priority text,
    attempts integer,
    max_attempts integer,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    lease_expired boolean,
    started_at timestamp with time zone,
    running_for interval,
    cancel_requested boolean
) AS
 SELECT id,
    queue,
    type,
    pgqueue.priority_name(priority) AS priority,
    attempts,
    max_attempts,
    lease_owner,
    lease_expires_at,
    lease_expires_at < now() AS lease_expired,
    started_at,
    now() - started_at AS running_for,
    cancel_requested
   FROM pgqueue.tasks
  WHERE status = 'running'::text;

-- pgqueue.workflows reads pgqueue.tasks: created_at, finished_at, status, workflow_id
CREATE VIEW pgqueue.workflows (
    workflow_id uuid,
    status text,
    tasks bigint,
    waiting bigint,
    queued bigint,
    running bigint,
    completed bigint,
    failed bigint,
    cancelled bigint,
    created_at timestamp with time zone,
    finished_at timestamp with time zone
) AS
 SELECT workflow_id,
        CASE
            WHEN bool_or(status <> ALL (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])) THEN 'running'::text
            WHEN bool_and(status = 'completed'::text) THEN 'completed'::text
            WHEN bool_or(status = 'failed'::text) THEN 'failed'::text
            ELSE 'cancelled'::text
        END AS status,
    count(*) AS tasks,
    count(*) FILTER (WHERE status = 'waiting'::text) AS waiting,
    count(*) FILTER (WHERE status = 'queued'::text) AS queued,
    count(*) FILTER (WHERE status = 'running'::text) AS running,
    count(*) FILTER (WHERE status = 'completed'::text) AS completed,
    count(*) FILTER (WHERE status = 'failed'::text) AS failed,
    count(*) FILTER (WHERE status = 'cancelled'::text) AS cancelled,
    min(created_at) AS created_at,
        CASE
            WHEN bool_and(status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])) THEN max(finished_at)
            ELSE NULL::timestamp with time zone
        END AS finished_at
   FROM pgqueue.tasks
  WHERE workflow_id IS NOT NULL
  GROUP BY workflow_id;

CREATE OR REPLACE FUNCTION pgqueue.priority_name(p smallint)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
RETURN CASE p WHEN 0 THEN 'high'::text WHEN 1 THEN 'normal'::text WHEN 2 THEN 'low'::text ELSE (p)::text END;

CREATE OR REPLACE FUNCTION pgqueue.retry_delay(attempts integer, base real, factor real, cap real)
 RETURNS double precision
 LANGUAGE sql
 PARALLEL SAFE
RETURN (LEAST((cap)::double precision, ((base)::double precision * power((factor)::double precision, (GREATEST((attempts - 1), 0))::double precision))) * ((1.0)::double precision - (random() * (0.5)::double precision)));

CREATE OR REPLACE FUNCTION pgqueue.task_dependants_revive(parent_ids uuid[])
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
    DECLARE
        ids uuid[] := parent_ids;
        revived integer := 0;
        r_child uuid[];
        r_bucket integer[];
        k_child uuid[];
        k_opened integer[];
        was_cancelled uuid[];
    BEGIN
        WHILE ids IS NOT NULL AND cardinality(ids) > 0 LOOP
            -- The edges that may be taken back, read unlocked; then their buckets and their
            -- children are locked in that order, each in key order, as task_dependants_settle
            -- locks them (parents are held by the caller), so the two cannot deadlock. The
            -- statement below reads the children's statuses after these locks.
            SELECT array_agg(child_id ORDER BY child_id, bucket),
                   array_agg(bucket ORDER BY child_id, bucket)
              INTO r_child, r_bucket
              FROM pgqueue.task_dependencies
             WHERE parent_id = ANY(ids) AND outcome IN ('failed', 'cancelled');
            EXIT WHEN r_child IS NULL;
            PERFORM 1 FROM pgqueue.task_dependency_buckets AS b
             WHERE (b.child_id, b.bucket) IN (SELECT * FROM unnest(r_child, r_bucket))
             ORDER BY b.child_id, b.bucket
               FOR UPDATE;
            SELECT array_agg(id) FILTER (WHERE status = 'cancelled') INTO was_cancelled FROM (
                SELECT id, status FROM pgqueue.tasks WHERE id = ANY(r_child)
                 ORDER BY id FOR UPDATE
            ) AS l;
            WITH taken AS (  -- each child read by its id alone (see task_dependants_settle)
                UPDATE pgqueue.task_dependencies AS d SET outcome = NULL
                  FROM pgqueue.task_dependencies AS e
                 CROSS JOIN LATERAL (SELECT status, cancelled_by FROM pgqueue.tasks
                                      WHERE id = e.child_id LIMIT 1) AS c
                 WHERE e.parent_id = ANY(ids) AND e.outcome IN ('failed', 'cancelled')
                   AND d.child_id = e.child_id AND d.parent_id = e.parent_id
                   AND (c.status = 'waiting'
                        OR (c.status = 'cancelled' AND c.cancelled_by = e.parent_id))
                RETURNING d.child_id, d.bucket
            )
            SELECT array_agg(child_id ORDER BY child_id, bucket),
                   array_agg(bucket ORDER BY child_id, bucket)
              INTO r_child, r_bucket
              FROM taken;
            EXIT WHEN r_child IS NULL;

            -- Buckets pending again (one emptied re-opens: the child's parents_pending counts
            -- it once more).
            WITH g AS (
                SELECT child_id, bucket, count(*) AS k
                  FROM unnest(r_child, r_bucket) AS x(child_id, bucket)
                 GROUP BY child_id, bucket
            ),
            -- A bucket whose parents were all final when the child was inserted (it was
            -- inserted cancelled) has no row yet: it is made here.
            opened AS (
                INSERT INTO pgqueue.task_dependency_buckets AS b (child_id, bucket, pending)
                SELECT child_id, bucket, k FROM g
                    ON CONFLICT (child_id, bucket)
                    DO UPDATE SET pending = b.pending + EXCLUDED.pending
                RETURNING b.child_id, b.bucket, b.pending
            )
            SELECT array_agg(child_id ORDER BY child_id), array_agg(n ORDER BY child_id)
              INTO k_child, k_opened
              FROM (SELECT o.child_id, count(*) FILTER (WHERE o.pending = g.k)::integer AS n
                      FROM opened AS o JOIN g USING (child_id, bucket)
                     GROUP BY o.child_id) AS o;

            WITH c AS (
                SELECT * FROM unnest(k_child, k_opened) AS c(child_id, opened)
            ),
            still AS (  -- another parent that still dooms the child, first in depends_on order
                SELECT DISTINCT ON (d.child_id) d.child_id, d.parent_id,
                       format('parent %s (%s) %s', p.id, p.type, d.outcome) AS reason
                  FROM pgqueue.task_dependencies AS d
                  JOIN c USING (child_id)
                  LEFT JOIN pgqueue.tasks AS p ON p.id = d.parent_id
                 WHERE d.outcome IN ('failed', 'cancelled') AND NOT d.run_anyway
                 ORDER BY d.child_id, d.position
            ),
            moved AS (
                UPDATE pgqueue.tasks AS t
                   SET parents_pending = coalesce(t.parents_pending, 0) + c.opened,
                       status = CASE WHEN t.status = 'cancelled' AND s.child_id IS NULL
                                     THEN 'waiting' ELSE t.status END,
                       cancelled_by = CASE WHEN t.status <> 'cancelled' THEN t.cancelled_by
                                           ELSE s.parent_id END,
                       last_error = CASE WHEN t.status <> 'cancelled' THEN t.last_error
                                         ELSE s.reason END,
                       finished_at = CASE WHEN t.status = 'cancelled' AND s.child_id IS NULL
                                          THEN NULL ELSE t.finished_at END
                  FROM c LEFT JOIN still AS s USING (child_id)
                 WHERE t.id = c.child_id
                RETURNING t.id, t.status
            )
            SELECT array_agg(id) FILTER (WHERE status = 'waiting'
                                           AND id = ANY(coalesce(was_cancelled, '{}')))
              INTO ids FROM moved;
            -- Those revived take back what their cancellation counted, in the next round.
            revived := revived + coalesce(cardinality(ids), 0);
        END LOOP;
        RETURN revived;
    END
    $function$;

CREATE OR REPLACE FUNCTION pgqueue.task_dependants_settle(parent_ids uuid[])
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
    DECLARE
        ids uuid[] := parent_ids;
        released integer := 0;
        n integer;
        e_child uuid[];      -- the edges counted now: child, bucket, dooming parent, reason
        e_bucket integer[];
        e_doom uuid[];
        e_reason text[];
        k_child uuid[];      -- the children to touch: buckets closed, doomed by, reason
        k_closed integer[];
        k_doom uuid[];
        k_reason text[];
        k_waiting uuid[];    -- of those, the ones still waiting (locked)
        k_cancelled uuid[];  -- of those, the ones this cancelled
    BEGIN
        WHILE ids IS NOT NULL AND cardinality(ids) > 0 LOOP
            -- Each parent is read by its id alone (a lateral LIMIT 1): joined on the status,
            -- the planner, whose statistics may say that few tasks are final, reads every
            -- final task once per edge (a quadratic drain of a chord).
            WITH p AS (
                SELECT p.* FROM unnest(ids) AS i(id)
                 CROSS JOIN LATERAL (SELECT id, type, status FROM pgqueue.tasks
                                      WHERE id = i.id LIMIT 1) AS p
            ),
            counted AS (
                UPDATE pgqueue.task_dependencies AS d SET outcome = p.status
                  FROM p
                 WHERE d.parent_id = p.id AND d.outcome IS NULL
                   AND p.status IN ('completed', 'failed', 'cancelled')
                RETURNING d.child_id, d.bucket, d.position,
                          CASE WHEN p.status IN ('failed', 'cancelled') AND NOT d.run_anyway
                               THEN p.id END AS doom,
                          format('parent %s (%s) %s', p.id, p.type, p.status) AS reason
            )
            SELECT array_agg(child_id ORDER BY child_id, position),
                   array_agg(bucket ORDER BY child_id, position),
                   array_agg(doom ORDER BY child_id, position),
                   array_agg(reason ORDER BY child_id, position)
              INTO e_child, e_bucket, e_doom, e_reason
              FROM counted;
            EXIT WHEN e_child IS NULL;

            -- Buckets, locked in key order, then emptied by the edges counted.
            PERFORM 1 FROM pgqueue.task_dependency_buckets AS b
             WHERE (b.child_id, b.bucket) IN (SELECT * FROM unnest(e_child, e_bucket))
             ORDER BY b.child_id, b.bucket
               FOR UPDATE;
            WITH g AS (
                SELECT child_id, bucket, count(*) AS k
                  FROM unnest(e_child, e_bucket) AS x(child_id, bucket)
                 GROUP BY child_id, bucket
            ),
            emptied AS (
                UPDATE pgqueue.task_dependency_buckets AS b SET pending = b.pending - g.k
                  FROM g WHERE b.child_id = g.child_id AND b.bucket = g.bucket
                RETURNING b.child_id, b.pending
            ),
            closed AS (
                SELECT child_id, count(*)::integer AS closed FROM emptied
                 WHERE pending = 0 GROUP BY child_id
            ),
            doomed AS (  -- the first dooming parent of each child, in depends_on order
                SELECT DISTINCT ON (child_id) child_id, doom, reason
                  FROM unnest(e_child, e_doom, e_reason) WITH ORDINALITY
                       AS x(child_id, doom, reason, ord)
                 WHERE doom IS NOT NULL
                 ORDER BY child_id, ord
            ),
            touched AS (
                SELECT child_id, coalesce(c.closed, 0) AS closed, d.doom, d.reason
                  FROM closed AS c FULL JOIN doomed AS d USING (child_id)
            )
            SELECT array_agg(child_id ORDER BY child_id), array_agg(closed ORDER BY child_id),
                   array_agg(doom ORDER BY child_id), array_agg(reason ORDER BY child_id)
              INTO k_child, k_closed, k_doom, k_reason
              FROM touched;
            EXIT WHEN k_child IS NULL;

            -- The children, locked in id order; only a waiting one changes status.
            SELECT array_agg(id) INTO k_waiting FROM (
                SELECT id, status FROM pgqueue.tasks WHERE id = ANY(k_child)
                 ORDER BY id FOR UPDATE
            ) AS l WHERE status = 'waiting';
            WITH c AS (
                SELECT c.*, c.child_id = ANY(coalesce(k_waiting, '{}')) AS waiting
                  FROM unnest(k_child, k_closed, k_doom, k_reason)
                       AS c(child_id, closed, doomed_by, reason)
            ),
            moved AS (
                UPDATE pgqueue.tasks AS t
                   SET parents_pending = t.parents_pending - c.closed,
                       status = CASE WHEN NOT c.waiting THEN t.status
                                     WHEN c.doomed_by IS NOT NULL THEN 'cancelled'
                                     WHEN t.parents_pending - c.closed = 0 THEN 'queued'
                                     ELSE t.status END,
                       cancelled_by = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                           THEN c.doomed_by ELSE t.cancelled_by END,
                       last_error = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                         THEN c.reason ELSE t.last_error END,
                       finished_at = CASE WHEN c.waiting AND c.doomed_by IS NOT NULL
                                          THEN now() ELSE t.finished_at END,
                       visible_after = CASE WHEN c.waiting AND c.doomed_by IS NULL
                                             AND t.parents_pending - c.closed = 0
                                            THEN greatest(t.visible_after, now())
                                            ELSE t.visible_after END
                  FROM c
                 WHERE t.id = c.child_id
                RETURNING t.id, t.queue, t.status, c.waiting
            ),
            -- pgqueue_released first: a worker then walks the queue's claim index from
            -- its start (a released task is older than where its last walk ended).
            woke AS (
                SELECT count(pg_notify('pgqueue_released', q.queue))
                       + count(pg_notify('pgqueue', q.queue)) AS k
                  FROM (SELECT DISTINCT queue FROM moved
                         WHERE waiting AND status = 'queued') AS q
            )
            SELECT array_agg(id) FILTER (WHERE waiting AND status = 'cancelled'),
                   count(*) FILTER (WHERE waiting AND status = 'queued') + max(woke.k) * 0
              INTO k_cancelled, n
              FROM moved, woke;
            released := released + coalesce(n, 0);
            PERFORM pgqueue.task_waiters_wake(k_cancelled);
            -- The cancelled ones settle their own dependants in the next round.
            ids := k_cancelled;
        END LOOP;
        RETURN released;
    END
    $function$;

CREATE OR REPLACE FUNCTION pgqueue.task_waiters_wake(ids uuid[])
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
    DECLARE
        woken integer;
    BEGIN
        IF ids IS NULL THEN
            RETURN 0;
        END IF;
        SELECT count(pg_notify('pgqueue_done', w.task_id::text)) INTO woken
          FROM (SELECT DISTINCT task_id FROM pgqueue.task_waiters
                 WHERE task_id = ANY(ids)) AS w;
        RETURN woken;
    END
    $function$;
