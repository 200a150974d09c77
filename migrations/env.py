"""Alembic environment for pgqueue's own revisions.

pgqueue keeps everything in the ``pgqueue`` schema, including its version table
(``pgqueue.pgqueue_alembic_version``), so it never collides with an application's own alembic
history in the same database. Revisions are raw SQL: the revisions are the only description
of the schema, and they are frozen once released.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection

SCHEMA = "pgqueue"
VERSION_TABLE = "pgqueue_alembic_version"


def _run(connection: Connection) -> None:
    # The version table lives in our schema, so the schema must exist before alembic looks.
    # Only created when missing: CREATE SCHEMA IF NOT EXISTS still needs CREATE on the
    # database, which an owner role given a schema the DBA made beforehand need not have.
    exists = connection.execute(text("SELECT to_regnamespace(:s)"), {"s": SCHEMA}).scalar()
    if exists is None:
        connection.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        # Called from pgqueue.migrate (or from a user's own revision) with a live connection.
        _run(connection)
        return
    from pgqueue.config import resolve_database_url, sqlalchemy_url

    url = config.get_main_option("sqlalchemy.url") or resolve_database_url(None)
    engine = create_engine(sqlalchemy_url(url))
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("pgqueue migrations run online only: use `pgqueue migrate`.")
run_migrations_online()
