"""Running pgqueue's alembic revisions from code, and checking a database's schema without.

The revisions ship inside the package (``pgqueue/_migrations`` in a wheel, ``migrations/`` in
a checkout) and record their version in ``pgqueue.pgqueue_alembic_version``, apart from any
alembic history the application keeps. An application with its own alembic can call
:func:`upgrade` with its migration's connection (``op.get_bind()``) from one of its revisions.

Only :func:`upgrade` and :func:`downgrade` import alembic and SQLAlchemy (1.2 s together):
the check every worker, every ``Client`` and every command makes before its first statement
(:func:`check`, :func:`current`, :func:`head`) reads the version with psycopg and knows the
revisions from their files' ``revision = ...`` lines, which a test compares with alembic's.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgqueue import db
from pgqueue.config import resolve_database_url
from pgqueue.errors import SchemaNotReady
from pgqueue.queries import driver, maintenance

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection

SCHEMA = "pgqueue"
VERSION_TABLE = "pgqueue_alembic_version"


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise SchemaNotReady(f"pgqueue's migrations are not installed next to {here}")


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


# A revision file's own lines: `revision = "0002_queues"`, `down_revision = "0001_tasks"` (or
# None), as script.py.mako writes them (an annotation, `revision: str = ...`, is allowed too).
_IDENTITY = re.compile(
    r"""^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(?:["']([^"'\n]+)["']|None)\s*$""", re.M
)


@functools.cache
def revisions() -> dict[str, str | None]:
    """Each revision this pgqueue ships, and the one it revises (None for the first)."""
    out: dict[str, str | None] = {}
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        fields = {m[1]: m[2] for m in _IDENTITY.finditer(path.read_text(encoding="utf-8"))}
        if fields.get("revision"):
            out[fields["revision"]] = fields.get("down_revision")
    return out


def head() -> str:
    """The newest revision this version of pgqueue knows: the one no other revises."""
    known_revisions = revisions()
    heads = set(known_revisions) - set(known_revisions.values())
    if len(heads) != 1:
        raise SchemaNotReady(
            f"pgqueue's migrations in {migrations_dir()} have {len(heads)} heads, not one"
        )
    return heads.pop()


def known(revision: str) -> bool:
    """Whether this version of pgqueue has ``revision`` among its migrations."""
    return revision in revisions()


def unknown_revision(at: str) -> SchemaNotReady:
    return SchemaNotReady(
        f"the pgqueue schema is at revision {at}, which this pgqueue ({head()} is its newest) "
        "does not know: the database was probably migrated by a newer pgqueue; upgrade "
        "pgqueue here (`pgqueue migrate` cannot go back to an older revision)"
    )


def _with_connection(target: Connection | str | None, fn: Any) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import Connection
    from sqlalchemy.pool import NullPool

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
    """The revision the database is at, or None when pgqueue was never migrated there.

    ``target`` is a URL (default: the configured one), read on a connection of its own, or
    an application's SQLAlchemy connection (an alembic revision's ``op.get_bind()``), read in
    its transaction."""
    if target is not None and not isinstance(target, str):
        return driver.run(target, maintenance.schema_revision())
    with db.connect(resolve_database_url(target), autocommit=True) as conn:
        return driver.run(conn, maintenance.schema_revision())


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

    from alembic import command

    def run(conn: Connection) -> None:
        with _preserve_callers_alembic():
            command.upgrade(alembic_config(conn), revision)

    _with_connection(target, run)


def downgrade(target: Connection | str | None = None, revision: str = "base") -> None:
    from alembic import command

    def run(conn: Connection) -> None:
        with _preserve_callers_alembic():
            command.downgrade(alembic_config(conn), revision)

    _with_connection(target, run)


def check(target: Connection | str | None = None) -> None:
    """Raise SchemaNotReady unless the database is at this pgqueue's head revision."""
    check_revision(current(target))


def check_revision(at: str | None) -> None:
    """Raise SchemaNotReady unless ``at``, the revision a database is at (None: never
    migrated), is this pgqueue's head: :func:`check` once the revision is read (the worker
    reads it on a connection of its own)."""
    want = head()
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
