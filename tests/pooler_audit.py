"""What reached the server through a transaction-mode pooler that must not have: a LISTEN, a
session advisory lock, a server-side prepared statement.

The pooler pass of the tests (tests/conftest.py) runs its own server, and PgBouncer's server
connections log in to it as a role of their own (``ROLE``), so everything that came through
the pooler tells itself apart on the server. Two witnesses watch that role:

- **the server's log.** ``log_min_duration_statement = 0`` is set on the role alone, so the
  server logs every statement the pooler's connections run, with each protocol step of the
  extended protocol named: ``parse <unnamed>: ...`` for an unnamed statement, ``parse
  _pg3_0: ...`` for a prepared one (a named Parse is logged even when its Bind never comes,
  which is what happens when the next transaction lands on another connection). The log is
  read as it grows. Found there: a named parse, bind or execute; an SQL ``PREPARE``; a
  ``prepared statement ... already exists / does not exist`` error; a ``LISTEN``; a call of
  ``pg_advisory_lock``, ``pg_try_advisory_lock`` or their ``_shared`` forms (the session ones:
  the ``_xact_`` ones end with the transaction).
- **pg_stat_activity and pg_locks**, sampled every ``interval`` seconds: a pooled backend
  whose latest query is a LISTEN; a granted advisory lock held by a pooled backend that was
  already ``idle`` (outside any transaction) before the locks were read: a transaction's
  locks are released before its backend reports idle, so only a session lock can be held
  there. (Reading the backend's state after the locks, and asking that it went idle before
  them, is what keeps a transaction that ended between the two reads from being taken for a
  session lock.)

Each finding names the database it was seen in; every test has a database of its own, so a
finding is charged to the test that owned the database (``claim``) and fails that test at
its teardown. Anything not charged to a test fails the session at its end.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.pgbouncer import PgBouncer, pgbouncer
from tests.private_server import Server, find_bindir, private_server

ROLE = "pgqueue_pooled"

# What the role's sessions log: every statement, without its parameters (the volume).
ROLE_SETTINGS = {
    "log_min_duration_statement": "0",
    "log_parameter_max_length": "0",
    "log_statement": "none",
}
# The owner of a database several tests share (``PoolerAudit.claim``).
ANY_TEST = "*"

# The server's: a prefix the reader parses (time, pid, user, database).
LOG_LINE_PREFIX = "%m [%p] %u@%d "

_RECORD = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+) \[(?P<pid>\d+)\] "
    r"(?P<user>\S*)@(?P<db>\S*) (?P<level>[A-Z]+):  (?P<message>.*)$"
)
_DURATION = re.compile(
    r"^duration: [\d.]+ ms  (?:(?P<step>parse|bind|execute) (?P<name>[^:]*?)|statement): "
    r"(?P<query>.*)$",
    re.DOTALL,
)
_LEADING_COMMENTS = re.compile(r"^(?:\s+|--[^\n]*\n|/\*.*?\*/)*", re.DOTALL)
_STATEMENT_START = re.compile(r"(?:^|;)\s*(?P<word>LISTEN|PREPARE)\b", re.IGNORECASE)
_SESSION_ADVISORY = re.compile(r"\bpg_(?:try_)?advisory_lock(?:_shared)?\s*\(", re.IGNORECASE)
_PREPARED_ERROR = re.compile(r'prepared statement "[^"]*" (?:already exists|does not exist)')


@dataclass(frozen=True)
class Finding:
    kind: str  # "LISTEN", "session advisory lock", "prepared statement"
    database: str
    pid: int
    seen: str  # what was seen, and by which witness

    def __str__(self) -> str:
        return f"{self.kind} (backend {self.pid}, database {self.database}): {self.seen}"


def findings_in_record(user: str, db: str, pid: int, level: str, message: str) -> list[Finding]:
    """What one log record of a pooled session shows (nothing for other users' records)."""
    if user != ROLE:
        return []
    found: list[Finding] = []
    if level == "ERROR" and _PREPARED_ERROR.search(message):
        found.append(Finding("prepared statement", db, pid, f"log: ERROR: {message}"))
        return found
    if level != "LOG":
        return found
    match = _DURATION.match(message)
    if match is None:
        return found
    name = (match["name"] or "").split("/", 1)[0]
    if match["step"] and name != "<unnamed>":
        found.append(Finding("prepared statement", db, pid, f"log: {_short(message)}"))
    query = _LEADING_COMMENTS.sub("", match["query"], count=1)
    for word in {m["word"].upper() for m in _STATEMENT_START.finditer(query)}:
        kind = "LISTEN" if word == "LISTEN" else "prepared statement"
        found.append(Finding(kind, db, pid, f"log: {_short(message)}"))
    # (A function that takes one, being created, takes none.)
    if _SESSION_ADVISORY.search(query) and not re.match(r"CREATE\b", query, re.IGNORECASE):
        found.append(Finding("session advisory lock", db, pid, f"log: {_short(message)}"))
    return found


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(re.sub(r"^duration: [\d.]+ ms  ", "", text).split())
    return text if len(text) <= limit else text[:limit] + "..."


class LogReader:
    """The records of a PostgreSQL stderr log (``LOG_LINE_PREFIX``) as the file grows; a
    record's continuation lines (a query over several lines) are joined to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.pending: list[str] | None = None

    def read(self) -> Iterator[tuple[str, str, int, str, str]]:
        """(user, database, pid, level, message) of each record completed since the last
        call; the last record is held back until a line that starts another one arrives."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            if _RECORD.match(line):
                if self.pending is not None:
                    yield from self._parsed(self.pending)
                self.pending = [line]
            elif self.pending is not None:
                self.pending.append(line)

    def flush(self) -> Iterator[tuple[str, str, int, str, str]]:
        """``read``, then the record held back."""
        yield from self.read()
        if self.pending is not None:
            yield from self._parsed(self.pending)
            self.pending = None

    @staticmethod
    def _parsed(lines: list[str]) -> Iterator[tuple[str, str, int, str, str]]:
        match = _RECORD.match(lines[0])
        assert match is not None
        message = "\n".join([match["message"], *lines[1:]])
        yield match["user"], match["db"], int(match["pid"]), match["level"], message


# A backend idle since before the locks were read still holds an advisory lock: a session one.
_ACTIVITY = f"""
SELECT pid, datname, state, state_change, query
FROM pg_stat_activity
WHERE usename = '{ROLE}'
"""
_ADVISORY_LOCKS = """
SELECT coalesce(array_agg(pid ORDER BY pid), '{}'),
       coalesce(array_agg(format('advisory lock %s/%s/%s (%s)', classid, objid, objsubid, mode)
                          ORDER BY pid), '{}')
FROM pg_locks
WHERE locktype = 'advisory' AND granted
"""


class PoolerAudit:
    """Watches ``admin_url``'s server (directly, as its superuser) and its log at
    ``log_file`` for what the pooler's role must never do; see the module."""

    def __init__(self, admin_url: str, log_file: Path, interval: float = 0.075) -> None:
        self.admin_url = admin_url
        self.log = LogReader(log_file)
        self.interval = interval
        self.lock = threading.Lock()
        self.log_lock = threading.Lock()
        self.findings: list[Finding] = []
        self.owners: dict[str, str] = {}  # database -> the test that owns it
        self.samples = 0
        self.records = 0  # the pooled role's log records read
        self.log_size = 0  # the log's size when the watch stopped
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pooler-audit", daemon=True)
        self.error: BaseException | None = None
        self._seen: set[Finding] = set()

    # --- the watch ----------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        self._read_log(final=True)
        self.log_size = self.log.path.stat().st_size if self.log.path.exists() else 0

    def _run(self) -> None:
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    self.sample(conn)
                    self._read_log()
                    self.stopping.wait(self.interval)
        except BaseException as error:  # reported by check(): a blind witness fails the pass
            self.error = error

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        """One look at pg_stat_activity and pg_locks (see the module)."""
        # The time before the locks are read, from a statement of its own: a clock_timestamp()
        # beside pg_locks is evaluated after the locks were gathered, and a transaction that
        # ended in between would pass for a session lock.
        before = conn.execute("SELECT clock_timestamp()").fetchone()
        row = conn.execute(_ADVISORY_LOCKS).fetchone()
        assert before is not None and row is not None
        locks_read_at = before[0]
        lock_pids, locks = row
        held: dict[int, list[str]] = {}
        for pid, lock in zip(lock_pids, locks, strict=True):
            held.setdefault(pid, []).append(lock)
        found: list[Finding] = []
        for pid, db, state, state_change, query in conn.execute(_ACTIVITY):
            text = _LEADING_COMMENTS.sub("", query or "", count=1)
            if re.match(r"LISTEN\b", text, re.IGNORECASE):
                found.append(Finding("LISTEN", db, pid, f"pg_stat_activity: {state}: {text}"))
            if (
                pid in held
                and state == "idle"
                and state_change is not None
                and state_change < locks_read_at
            ):
                seen = f"pg_locks: {', '.join(held[pid])} held while idle since {state_change}"
                found.append(Finding("session advisory lock", db, pid, seen))
        self.samples += 1
        self._add(found)

    def _read_log(self, final: bool = False) -> None:
        with self.log_lock:  # the watch's thread and a test's teardown both read
            records = list(self.log.flush() if final else self.log.read())
        self.records += sum(1 for record in records if record[0] == ROLE)
        self._add([f for record in records for f in findings_in_record(*record)])

    def _add(self, found: list[Finding]) -> None:
        with self.lock:
            for finding in found:
                # One backend seen idle after its LISTEN by many samples, or running one
                # prepared statement many times, is one finding.
                if finding in self._seen:
                    continue
                self._seen.add(finding)
                self.findings.append(finding)

    # --- charging findings to tests ------------------------------------------------------

    def claim(self, database: str, test: str = ANY_TEST) -> None:
        """Findings in ``database`` are ``test``'s; by default (a database several tests
        share) the test's whose teardown reads them."""
        with self.lock:
            self.owners[database] = test

    def settle(self, test: str) -> list[Finding]:
        """The log read to its end, and the findings charged to ``test`` (taken)."""
        self._read_log(final=True)
        with self.lock:
            mine = [f for f in self.findings if self.owners.get(f.database) in (test, ANY_TEST)]
            self.findings = [f for f in self.findings if f not in mine]
        return mine

    def unclaimed(self) -> list[Finding]:
        """The findings no test took (after ``stop``)."""
        with self.lock:
            return list(self.findings)

    def check(self) -> str | None:
        """Why the pass must fail at its end, or None."""
        problems = []
        if self.error is not None:
            problems.append(f"the pooler audit stopped watching: {self.error!r}")
        elif self.samples == 0:
            problems.append("the pooler audit never sampled the server")
        if self.log.offset != self.log_size or self.records == 0:
            problems.append(
                f"the pooler audit read {self.log.offset} bytes of the server's log of "
                f"{self.log_size}, and {self.records} records of the pooler's connections"
            )
        left = self.unclaimed()
        if left:
            problems.append(
                "through the pooler, outside the tests' own databases or after their end:\n"
                + "\n".join(f"  {f}" for f in left)
            )
        return "\n".join(problems) or None


@dataclass
class AuditedPooler:
    """A private server, a PgBouncer in transaction mode in front of it whose server
    connections log in as ``ROLE``, and the watch on them (started)."""

    server: Server
    bouncer: PgBouncer
    audit: PoolerAudit

    @property
    def server_url(self) -> str:
        """The server's superuser, directly."""
        return self.server.pg.url()


@contextlib.contextmanager
def audited_pooler() -> Iterator[AuditedPooler]:
    """An ``AuditedPooler`` until the block ends (the watch stopped, its findings left to
    read: ``audit.check()``)."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries for a private server")
    settings = {
        "max_connections": "300",
        "shared_buffers": "'128MB'",
        "log_line_prefix": f"'{LOG_LINE_PREFIX}'",
    }
    with private_server(bindir, settings=settings) as server:
        url = server.pg.url()
        with psycopg.connect(url, autocommit=True) as conn:
            # A superuser, as the clients' user is: the tests do through the pooler what they
            # do directly elsewhere.
            conn.execute(f"CREATE ROLE {ROLE} SUPERUSER LOGIN")
            for name, value in ROLE_SETTINGS.items():
                conn.execute(f"ALTER ROLE {ROLE} SET {name} = '{value}'")
        audit = PoolerAudit(url, server.pg.log_file)
        with pgbouncer(url, server_user=ROLE) as bouncer:
            audit.start()
            try:
                yield AuditedPooler(server, bouncer, audit)
            finally:
                audit.stop()
