"""The schema's version (every worker, client and command checks it) and the
statements of the workers' maintenance that are about the table rather than tasks: the
maintenance lock, and ANALYZE when the statistics went stale. Statements: sql/maintenance.sql.
"""

from __future__ import annotations

from pgqueue.queries.driver import Op, Query


def analyze_if_stale(min_changes: int = 1000, fraction: float = 0.2) -> Op[int]:
    """ANALYZE pgqueue.tasks when at least ``min_changes`` rows and ``fraction`` of the rows the
    planner believes in changed since the last time; the changes counted, or 0 if none ran."""
    rows = yield Query("stats_staleness", {})
    if not rows:
        return 0
    changed = int(rows[0]["changed"] or 0)
    if changed < max(min_changes, fraction * float(rows[0]["estimated_rows"])):
        return 0
    yield Query("tasks_analyze", {})
    return changed


def maintenance_try_lock() -> Op[bool]:
    rows = yield Query("maintenance_try_lock", {})
    return bool(rows[0]["locked"])


def schema_version() -> Op[str | None]:
    rows = yield Query("schema_version", {})
    return str(rows[0]["version_num"]) if rows else None


def schema_revision() -> Op[str | None]:
    """The revision pgqueue's migrations recorded, or None when they never ran here (no
    version table: looked for first, so that asking never fails the caller's transaction)."""
    rows = yield Query("schema_version_table", {})
    if rows[0]["version_table"] is None:
        return None
    return (yield from schema_version())
