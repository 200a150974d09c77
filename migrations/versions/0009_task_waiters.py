"""Waiters on a task's result: who to notify when a task finishes.

Revision ID: 0009_task_waiters
Revises: 0008_snooze_expiry
Create Date: 2026-12-02

Waiting for a result. ``pgqueue.wait`` (and ``GET /api/v1/tasks/{id}?wait=``)
registers a row here for as long as it waits; every statement that makes a task final sends
``pg_notify('pgqueue_done', id)`` only for the ids it finds here. A task nobody waits on costs
one probe of this almost always empty table per finishing statement, and no NOTIFY (whose
commit takes a database-wide lock) at all.

A new small table: nothing on the hot table changes. No foreign key to pgqueue.tasks (none on
the hot table, and a waiter may register for a task that is pruned meanwhile). ``expires_at``
lets the next waiter delete the rows of a waiter that died without removing its own.
"""

from alembic import op

revision = "0009_task_waiters"
down_revision = "0008_snooze_expiry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE pgqueue.task_waiters (
        task_id     uuid NOT NULL,
        waiter_id   uuid NOT NULL,
        expires_at  timestamptz NOT NULL,
        PRIMARY KEY (task_id, waiter_id)
    );
    CREATE INDEX task_waiters_expires_idx ON pgqueue.task_waiters (expires_at);

    -- Called once by each statement that makes tasks final, with the ids it finished: a
    -- notification on 'pgqueue_done' (the id as payload) for each one somebody waits on.
    -- VOLATILE plpgsql on purpose: its query takes a fresh snapshot after the calling UPDATE
    -- has locked its rows, so it sees a waiter whose registration (which locks the task's row
    -- FOR SHARE, task_waiter_add) committed while the UPDATE waited for that lock; a snapshot
    -- from the start of the statement would miss it, and that waiter would sleep until its
    -- poll. plpgsql also keeps the query's plan for the session.
    CREATE FUNCTION pgqueue.task_waiters_wake(ids uuid[]) RETURNS integer
        LANGUAGE plpgsql VOLATILE AS $$
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
    $$;
    """)


def downgrade() -> None:
    op.execute("""
    DROP FUNCTION pgqueue.task_waiters_wake(uuid[]);
    DROP TABLE pgqueue.task_waiters;
    """)
