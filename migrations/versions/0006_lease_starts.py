"""Start marks per lease owner: whether a lost claim's handlers had started.

Revision ID: 0006_lease_starts
Revises: 0005_tracing_dashboard
Create Date: 2026-12-02

A worker killed between a claim and its handlers' start must not spend the claimed tasks'
attempts, while a task that kills its worker once started must still be counted
every time (the poison-task rule). The worker says which of its claims it has started in one
row of its own, one write per claim whatever the batch, instead of writing every claimed task
a second time: that second write per task cost a no-op drain a fifth of its speed.
"""

from alembic import op

revision = "0006_lease_starts"
down_revision = "0005_tracing_dashboard"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- owner: a worker's id, its leases' owner (pgqueue.claim callers, who start what they
    -- claim at once, write no row). started_through: every task this owner claimed at or
    -- before this time (its started_at, which a claim sets) had its handler started. A worker
    -- writes its row before its first claim (-infinity: nothing started yet) and after each
    -- claim, before its handlers run. The sweep gives back the attempt of an expired lease
    -- claimed after its owner's mark; a lease whose owner has no row (a worker from before
    -- this revision, a library claim, a row pruned) is counted, as every lost lease was
    -- before: a missing mark never frees a poison task.
    CREATE TABLE pgqueue.lease_starts (
        owner text PRIMARY KEY,
        started_through timestamptz NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE pgqueue.lease_starts;")
