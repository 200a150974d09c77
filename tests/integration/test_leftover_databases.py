"""A session starting drops the databases an interrupted run left on the shared server, and
never one of a run still going (tests/session_databases.py names them after their maker).

The runs here are real processes: each makes its database the way the suite's fixtures do,
from its own pid; one is then killed (SIGKILL: no teardown runs), the other keeps running."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from session_databases import (
    STALE_AFTER,
    Maker,
    database_name,
    drop_leftovers,
    here,
    is_leftover,
    maker_of,
    process_exists,
)

TESTS = Path(__file__).resolve().parents[1]

# A pytest run as far as its databases go: makes one, says its name, waits to be ended.
SESSION = """
import sys
import psycopg
from session_databases import database_name

name = database_name("t")
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'CREATE DATABASE "{name}"')
print(name, flush=True)
sys.stdin.read()
"""


class Session:
    def __init__(self, server_url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SESSION, server_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(TESTS)},
        )
        assert self.proc.stdout is not None
        self.database = self.proc.stdout.readline().strip()
        assert self.database, f"the session made no database (exit {self.proc.wait(30)})"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.communicate("", timeout=30)


def databases(server_url: str) -> set[str]:
    with psycopg.connect(server_url, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


@pytest.fixture
def made(server_url: str) -> Iterator[list[str]]:
    """Databases this test makes; whichever are left are dropped at its end."""
    names: list[str] = []
    yield names
    with psycopg.connect(server_url, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def test_a_starting_session_drops_an_interrupted_runs_databases_and_keeps_a_running_ones(
    server_url: str, database_url: str, made: list[str]
) -> None:
    interrupted, running = Session(server_url), Session(server_url)
    made += [interrupted.database, running.database]
    orphan = None
    try:
        interrupted.kill()
        assert not process_exists(interrupted.proc.pid)
        # A worker the interrupted run had started still holds a connection to its database.
        orphan = psycopg.connect(make_conninfo(server_url, dbname=interrupted.database))
        # A database of a maker still alive (this process) but older than any run, and a
        # recent one of a run on another host (a pid there cannot be looked up from here).
        old = create(server_url, database_name("t", created=time.time() - STALE_AFTER - 60))
        elsewhere = "0" * 8 if here() != "0" * 8 else "1" * 8
        recent_elsewhere = create(server_url, database_name("t", where=elsewhere, pid=1))
        made += [old, recent_elsewhere]
        assert {interrupted.database, running.database, old, recent_elsewhere} <= databases(
            server_url
        )

        dropped = drop_leftovers(server_url)

        left = databases(server_url)
        assert interrupted.database not in left, "the interrupted run's database is still there"
        assert old not in left, "a database older than any run is still there"
        assert set(dropped) >= {interrupted.database, old}
        assert running.database in left, "the database of a running session was dropped"
        assert recent_elsewhere in left, "a recent database of another host's run was dropped"
        own = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
        assert own in left, "this session's own database was dropped"
        with pytest.raises(psycopg.OperationalError):
            orphan.execute("SELECT 1")  # its connection went with it
    finally:
        if orphan is not None:
            orphan.close()
        running.end()
        interrupted.kill()


def test_a_name_says_who_made_the_database_and_when() -> None:
    name = database_name("tpl", pid=4321, created=1_700_000_000.9)
    assert name.startswith("pgqueue_tpl_")
    assert maker_of(name) == Maker(here(), 4321, 1_700_000_000.0)
    # The suite's names before these, and anyone else's databases, are nobody's leftovers.
    for other in ("pgqueue_t_0123456789ab", "pgqueue_tpl_4321_abcdef", "pgqueue_fm_x", "app"):
        assert maker_of(other) is None


@pytest.mark.parametrize(
    ("where", "alive", "age", "leftover"),
    [
        ("same", False, 60, True),  # its run was interrupted
        ("same", True, 60, False),  # its run is going
        ("other", False, 60, False),  # a pid of another host cannot be looked up
        ("other", True, STALE_AFTER + 60, True),  # older than any run
        ("same", True, STALE_AFTER + 60, True),  # the pid is someone else's by now
    ],
)
def test_a_database_is_a_leftover_when_its_maker_is_gone_or_it_is_a_day_old(
    where: str, alive: bool, age: float, leftover: bool
) -> None:
    now = 1_800_000_000.0
    maker = Maker("aaaaaaaa" if where == "same" else "bbbbbbbb", 4321, now - age)
    seen: list[int] = []

    def exists(pid: int) -> bool:
        seen.append(pid)
        return alive

    assert is_leftover(maker, where="aaaaaaaa", now=now, exists=exists) is leftover
    if where == "other":
        assert seen == [], "looked up a pid from another host"
