"""Concurrency keys: a task may name the tenant (account, customer, partner) it works for, a
limit may cap how many run per key, and claims go round the keys instead of first come.

Revision ID: 0015_concurrency_keys
Revises: 0014_waiting_index
Create Date: 2026-12-05

``tasks.concurrency_key`` (text in the "C" collation, so PostgreSQL orders keys byte by
byte, as the worker's rotation does) is NULL for a task without a key. ``limits`` gains
``per_key_max_running``: at most that many tasks of the limit's type or queue run at once
per key, fleet-wide.

The claim indexes are split by whether a task has a key. ``tasks_claim_idx`` and
``tasks_claim_type_idx`` keep only the unkeyed waiting tasks, so the ordinary claim never
steps over a tenant's backlog of 100,000 keyed tasks to find the next unkeyed one;
``tasks_claim_key_idx`` holds the keyed waiting tasks by (queue, priority, key, created_at,
id): the fair claim walks its keys one index probe each and reads each key's next tasks from
it. ``tasks_running_key_idx`` holds the running tasks with a key, by key: the fair claim counts
a visited key's running tasks from it, instead of reading every running task's lease entry
(which a busy queue fills with entries of tasks done since the last vacuum). Statements that
read every waiting task (the backlog view, the promotion, the queue list) read both claim
indexes. A task without a key is written to the same number of indexes as before.

Adding the column rewrites nothing (nullable, no default). On a large table build the new
indexes beforehand, without blocking writes (the column first: that is instant); the
migration then finds them, drops the two old indexes (a moment each) and renames the new
ones to the old names:

    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS concurrency_key text COLLATE "C";
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_claim_unkeyed_idx ON pgqueue.tasks
        (queue, priority, created_at, id) WHERE status = 'queued' AND concurrency_key IS NULL;
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_claim_type_unkeyed_idx ON pgqueue.tasks
        (type, queue, priority, created_at, id)
        WHERE status = 'queued' AND concurrency_key IS NULL;
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_claim_key_idx ON pgqueue.tasks
        (queue, priority, concurrency_key, created_at, id)
        WHERE status = 'queued' AND concurrency_key IS NOT NULL;
    CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_running_key_idx ON pgqueue.tasks
        (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;

(A CONCURRENTLY build that failed leaves an invalid index of that name: DROP INDEX
CONCURRENTLY it, and build it again.)
"""

from alembic import op

revision = "0015_concurrency_keys"
down_revision = "0014_waiting_index"
branch_labels = None
depends_on = None

BACKLOG_VIEW = """
    -- What waits and runs, per queue and priority: the waiting tasks from both claim indexes
    -- (without and with a key), the running ones from the lease index. Ages count from the
    -- first ready time (ready_since), as before.
    CREATE OR REPLACE VIEW pgqueue.backlog AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM (SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NULL
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NOT NULL
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'running') AS t
     GROUP BY queue, priority;

    -- Every task per queue, priority and status, one branch per partial index (the statuses
    -- the CHECK allows, the waiting ones split by key): a reader asking for one status (as
    -- autoscalers do every few seconds) reads its indexes, and the other branches' indexes
    -- find nothing at once, instead of reading the table.
    CREATE OR REPLACE VIEW pgqueue.queue_depth AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM (SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NULL
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued' AND concurrency_key IS NOT NULL
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'running'
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'waiting'
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status IN ('completed', 'failed', 'cancelled')) AS t
     GROUP BY queue, priority, status;
"""


def upgrade() -> None:
    op.execute(
        """
    ALTER TABLE pgqueue.tasks ADD COLUMN IF NOT EXISTS concurrency_key text COLLATE "C";
    ALTER TABLE pgqueue.tasks ADD CONSTRAINT tasks_concurrency_key_check
        CHECK (length(concurrency_key) BETWEEN 1 AND 200) NOT VALID;

    -- The waiting tasks without a key, in claim order per queue (the ordinary claim).
    CREATE INDEX IF NOT EXISTS tasks_claim_unkeyed_idx ON pgqueue.tasks
        (queue, priority, created_at, id) WHERE status = 'queued' AND concurrency_key IS NULL;
    DROP INDEX pgqueue.tasks_claim_idx;
    ALTER INDEX pgqueue.tasks_claim_unkeyed_idx RENAME TO tasks_claim_idx;

    -- The waiting tasks without a key of a limited type (the claim under limits).
    CREATE INDEX IF NOT EXISTS tasks_claim_type_unkeyed_idx ON pgqueue.tasks
        (type, queue, priority, created_at, id)
        WHERE status = 'queued' AND concurrency_key IS NULL;
    DROP INDEX pgqueue.tasks_claim_type_idx;
    ALTER INDEX pgqueue.tasks_claim_type_unkeyed_idx RENAME TO tasks_claim_type_idx;

    -- The waiting tasks with a key, per queue and priority by key (the fair claim walks the
    -- keys one probe each), then in claim order within the key.
    CREATE INDEX IF NOT EXISTS tasks_claim_key_idx ON pgqueue.tasks
        (queue, priority, concurrency_key, created_at, id)
        WHERE status = 'queued' AND concurrency_key IS NOT NULL;

    -- The running tasks with a key, by key: the fair claim counts each visited key's here.
    CREATE INDEX IF NOT EXISTS tasks_running_key_idx ON pgqueue.tasks (concurrency_key)
        WHERE status = 'running' AND concurrency_key IS NOT NULL;

    -- At most this many tasks of the limit's type or queue run at once per concurrency key.
    ALTER TABLE pgqueue.limits ADD COLUMN per_key_max_running integer;
    ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_per_key_check
        CHECK (per_key_max_running >= 0);
    ALTER TABLE pgqueue.limits DROP CONSTRAINT limits_some_check;
    ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_some_check CHECK (
        max_running IS NOT NULL OR rate_limit IS NOT NULL OR per_key_max_running IS NOT NULL);
    """
        + BACKLOG_VIEW
    )


def downgrade() -> None:
    op.execute("""
    CREATE OR REPLACE VIEW pgqueue.backlog AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM (SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'queued'
            UNION ALL
            SELECT queue, priority, status, visible_after, ready_since
              FROM pgqueue.tasks WHERE status = 'running') AS t
     GROUP BY queue, priority;

    CREATE OR REPLACE VIEW pgqueue.queue_depth AS
    SELECT queue,
           pgqueue.priority_name(priority) AS priority,
           status,
           count(*) AS tasks,
           count(*) FILTER (WHERE status = 'queued' AND visible_after <= now()) AS ready,
           count(*) FILTER (WHERE status = 'queued' AND visible_after > now()) AS scheduled,
           now() - min(coalesce(ready_since, visible_after))
                   FILTER (WHERE status = 'queued' AND visible_after <= now())
               AS oldest_ready_age
      FROM pgqueue.tasks
     GROUP BY queue, priority, status;

    DELETE FROM pgqueue.limits WHERE max_running IS NULL AND rate_limit IS NULL;
    ALTER TABLE pgqueue.limits DROP CONSTRAINT limits_some_check;
    ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_some_check
        CHECK (max_running IS NOT NULL OR rate_limit IS NOT NULL);
    ALTER TABLE pgqueue.limits DROP CONSTRAINT limits_per_key_check;
    ALTER TABLE pgqueue.limits DROP COLUMN per_key_max_running;

    DROP INDEX pgqueue.tasks_claim_key_idx;
    DROP INDEX pgqueue.tasks_running_key_idx;
    CREATE INDEX tasks_claim_all_idx ON pgqueue.tasks (queue, priority, created_at, id)
        WHERE status = 'queued';
    DROP INDEX pgqueue.tasks_claim_idx;
    ALTER INDEX pgqueue.tasks_claim_all_idx RENAME TO tasks_claim_idx;
    CREATE INDEX tasks_claim_type_all_idx ON pgqueue.tasks (type, queue, priority, created_at, id)
        WHERE status = 'queued';
    DROP INDEX pgqueue.tasks_claim_type_idx;
    ALTER INDEX pgqueue.tasks_claim_type_all_idx RENAME TO tasks_claim_type_idx;

    ALTER TABLE pgqueue.tasks DROP CONSTRAINT tasks_concurrency_key_check;
    ALTER TABLE pgqueue.tasks DROP COLUMN concurrency_key;
    """)
