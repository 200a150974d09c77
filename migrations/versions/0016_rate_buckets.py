"""Rate limits that space starts evenly (a token bucket with a burst), and limits declared by
the code (``@tasks.task(rate_limit="10/m")``) beside those an operator sets.

Revision ID: 0016_rate_buckets
Revises: 0015_concurrency_keys
Create Date: 2026-12-05

``limits`` gains three columns, all NULL on the rows that exist, which keep their meaning:

- ``rate_burst``: with a rate, the starts are spaced evenly, one every ``rate_period /
  rate_limit`` seconds, and at most ``rate_burst`` may start at once after a quiet spell (a
  token bucket of that size). NULL: the sliding window as before (up to ``rate_limit`` starts
  in any window of ``rate_period`` seconds, all at once if they wait).
- ``rate_next``: the bucket's state, as the generic cell rate algorithm keeps it: the time at
  which the bucket would be full again had no start been taken since. One timestamp per
  limit, moved forward by each claim that starts tasks under it (under the limits lock).
- ``declared_by``: the worker that wrote this limit from its registry at start (a
  ``rate_limit`` on the task type's decorator); NULL: set by an operator (``pgqueue limit
  set``, ``pgqueue.set_limit``, HTTP), which a declaration never overwrites.

Adding nullable columns without a default rewrites nothing.
"""

from alembic import op

revision = "0016_rate_buckets"
down_revision = "0015_concurrency_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE pgqueue.limits ADD COLUMN rate_burst integer;
    ALTER TABLE pgqueue.limits ADD COLUMN rate_next timestamptz;
    ALTER TABLE pgqueue.limits ADD COLUMN declared_by text;
    ALTER TABLE pgqueue.limits ADD CONSTRAINT limits_rate_burst_check
        CHECK (rate_burst IS NULL OR (rate_limit IS NOT NULL AND rate_burst BETWEEN 1 AND 10000));
    """)


def downgrade() -> None:
    op.execute("""
    ALTER TABLE pgqueue.limits DROP CONSTRAINT limits_rate_burst_check;
    ALTER TABLE pgqueue.limits DROP COLUMN declared_by;
    ALTER TABLE pgqueue.limits DROP COLUMN rate_next;
    ALTER TABLE pgqueue.limits DROP COLUMN rate_burst;
    """)
