"""The databases a test session creates on a shared server, named so that a later session can
tell the leftovers of an interrupted run from the databases of a run still going.

Several pytest runs share one server (CI runs two passes at once, engineers run the suite in
parallel worktrees), and a run that is interrupted (a second Ctrl-C, a kill, a crash) leaves
its template and per-test databases behind. So each name says who made it and when::

    pgqueue_<kind>_<where>_<pid>_<created>_<random>

``where`` stands for the place a process id means something: this boot of the kernel and the
pid namespace (the host name where there is no /proc); ``pid`` is the pytest process that made
the database and ``created`` the Unix time it did. A session starting drops a database of
that form (:func:`drop_leftovers`) whose maker is gone: the same ``where`` and no process with
that pid; and any older than ``STALE_AFTER``, whoever made it (a pid from another host or
container cannot be looked up, and no session runs for a day). Every other database is left
alone, this suite's older names included: a session on an older checkout may be using one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import socket
import time
import uuid
from collections.abc import Callable

import psycopg

STALE_AFTER = 24 * 3600.0  # seconds
_NAME = re.compile(r"^pgqueue_([a-z]+)_([0-9a-f]{8})_([0-9]+)_([0-9]+)_([0-9a-f]{6})$")


@functools.cache
def here() -> str:
    """Eight hex digits for where this process's pid means something (see the module)."""
    parts: list[str] = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts = [socket.gethostname()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]


def database_name(
    kind: str, *, where: str | None = None, pid: int | None = None, created: float | None = None
) -> str:
    """A name for a database this process makes (``kind``: ``t``, ``tpl``; lowercase letters);
    the keywords are for tests that pose as another session."""
    where = here() if where is None else where
    pid = os.getpid() if pid is None else pid
    created = time.time() if created is None else created
    name = f"pgqueue_{kind}_{where}_{pid}_{int(created)}_{uuid.uuid4().hex[:6]}"
    assert _NAME.match(name) and len(name) <= 63, name
    return name


@dataclasses.dataclass(frozen=True)
class Maker:
    """Who made a database, read from its name."""

    where: str
    pid: int
    created: float


def maker_of(name: str) -> Maker | None:
    """The maker named in ``name``; None for any other database."""
    match = _NAME.match(name)
    if match is None:
        return None
    return Maker(match[2], int(match[3]), float(match[4]))


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists here (one of another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_leftover(
    maker: Maker,
    *,
    where: str,
    now: float,
    exists: Callable[[int], bool] = process_exists,
) -> bool:
    """Whether a database with this maker is a leftover, seen from ``where`` at ``now``."""
    if now - maker.created > STALE_AFTER:
        return True
    return maker.where == where and not exists(maker.pid)


def drop_leftovers(server_url: str) -> list[str]:
    """Drop the leftover databases on the server (see the module); their names. A database
    that cannot be dropped (another session dropped it first, or it is not ours to drop) is
    left."""
    dropped = []
    with psycopg.connect(server_url, autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                r"SELECT datname FROM pg_database WHERE datname LIKE 'pgqueue\_%' ORDER BY 1"
            )
        ]
        now = time.time()
        for name in names:
            maker = maker_of(name)
            if maker is None or not is_leftover(maker, where=here(), now=now):
                continue
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.Error:
                continue
            dropped.append(name)
    return dropped
