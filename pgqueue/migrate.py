"""Running pgqueue's alembic revisions from code.

The revisions ship inside the package (``pgqueue/_migrations`` in a wheel, ``migrations/`` in
a checkout) and record their version in ``pgqueue.pgqueue_alembic_version``, apart from any
alembic history the application keeps. An application with its own alembic can call
:func:`upgrade` with its migration's connection (``op.get_bind()``) from one of its revisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from pgqueue import db
from pgqueue.config import resolve_database_url
from pgqueue.errors import SchemaNotReady

SCHEMA = "pgqueue"
VERSION_TABLE = "pgqueue_alembic_version"


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise SchemaNotReady(f"pgqueue's migrations are not installed next to {here}")


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """The newest revision this version of pgqueue knows."""
    script = ScriptDirectory.from_config(alembic_config())
    rev = script.get_current_head()
    assert rev is not None
    return rev


def known(revision: str) -> bool:
    """Whether this version of pgqueue has ``revision`` among its migrations."""
    script = ScriptDirectory.from_config(alembic_config())
    try:
        return script.get_revision(revision) is not None
    except Exception:  # alembic's CommandError/ResolutionError for an unknown id
        return False


def unknown_revision(at: str) -> SchemaNotReady:
    return SchemaNotReady(
        f"the pgqueue schema is at revision {at}, which this pgqueue ({head()} is its newest) "
        "does not know: the database was probably migrated by a newer pgqueue; upgrade "
        "pgqueue here (`pgqueue migrate` cannot go back to an older revision)"
    )


def _with_connection(target: Connection | str | None, fn: Any) -> Any:
    if isinstance(target, Connection):
        return fn(target)
    url = resolve_database_url(target)
    # Connect through pgqueue.db so an unreachable server is a DatabaseUnavailable that names
    # the server (without its password), not a SQLAlchemy traceback.
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: db.connect(url), poolclass=NullPool
    )
    try:
        with engine.begin() as conn:
            return fn(conn)
    finally:
        engine.dispose()


def current(target: Connection | str | None = None) -> str | None:
    """The revision the database is at, or None when pgqueue was never migrated there."""

    def read(conn: Connection) -> str | None:
        exists = conn.execute(
            text("SELECT to_regclass(:name)"), {"name": f"{SCHEMA}.{VERSION_TABLE}"}
        ).scalar()
        if exists is None:
            return None
        ctx = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "version_table_schema": SCHEMA}
        )
        return ctx.get_current_revision()

    return _with_connection(target, read)  # type: ignore[no-any-return]


@contextlib.contextmanager
def _preserve_callers_alembic() -> Iterator[None]:
    """Keep an enclosing alembic run working when ours runs inside one of its revisions.

    alembic exposes the running migration through module-level proxies (``alembic.context``,
    ``alembic.op``); a nested run replaces them and clears them when it ends, which would
    break every ``op.*`` call the application's revision makes after ours.
    """
    import alembic.context
    import alembic.op

    saved = [
        proxy
        for proxy in (getattr(alembic.context, "_proxy", None), getattr(alembic.op, "_proxy", None))
        if proxy is not None
    ]
    try:
        yield
    finally:
        for proxy in saved:
            proxy._install_proxy()


def upgrade(target: Connection | str | None = None, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (default: head). Idempotent.

    From an application's own alembic revision: ``pgqueue.migrate.upgrade(op.get_bind())``.
    """

    def run(conn: Connection) -> None:
        with _preserve_callers_alembic():
            command.upgrade(alembic_config(conn), revision)

    _with_connection(target, run)


def downgrade(target: Connection | str | None = None, revision: str = "base") -> None:
    def run(conn: Connection) -> None:
        with _preserve_callers_alembic():
            command.downgrade(alembic_config(conn), revision)

    _with_connection(target, run)


def check(target: Connection | str | None = None) -> None:
    """Raise SchemaNotReady unless the database is at this pgqueue's head revision."""
    at, want = current(target), head()
    if at is None:
        raise SchemaNotReady(
            "the pgqueue schema is not installed in this database; run `pgqueue migrate`"
        )
    if at != want and not known(at):
        raise unknown_revision(at)
    if at != want:
        raise SchemaNotReady(
            f"the pgqueue schema is at revision {at} but this pgqueue needs {want}; "
            "run `pgqueue migrate`"
        )
