"""A declared type's queue, priority, timeout and parameters (function tasks).

Revision ID: 0010_function_tasks
Revises: 0009_task_waiters
Create Date: 2026-12-02

``@tasks.task(queue=..., priority=...)`` declares where and how urgently a type
runs; a task submitted by type name (library, CLI, HTTP) without a queue or priority takes
them from here, as max_attempts already does (per call > declared > default, field by field).
``parameters`` describes a function task's arguments (names, required or not, kinds, the JSON
types their annotations allow) so that the CLI and the HTTP API, which never import the
user's code, check a submitted payload before anything is written.

Cheap: four nullable columns without defaults on the small pgqueue.task_types table (one row
per declared type); pgqueue.tasks is not touched.
"""

from alembic import op

revision = "0010_function_tasks"
down_revision = "0009_task_waiters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- queue, priority: what a task of this type gets when its submitter gave none (NULL:
    -- 'default' and normal). timeout: the seconds an attempt may run, as the workers enforce
    -- it (informational: the worker holding the handler applies it). parameters: a function
    -- task's arguments, {"parameters": [{"name", "kind", "required", "types"}], "extra": bool}
    -- (pgqueue/function_tasks.py), NULL for a handler(payload, ctx) type (anything goes).
    ALTER TABLE pgqueue.task_types
        ADD COLUMN queue text,
        ADD COLUMN priority smallint,
        ADD COLUMN timeout real,
        ADD COLUMN parameters jsonb;
    """)


def downgrade() -> None:
    op.execute("""
    ALTER TABLE pgqueue.task_types
        DROP COLUMN parameters,
        DROP COLUMN timeout,
        DROP COLUMN priority,
        DROP COLUMN queue;
    """)
