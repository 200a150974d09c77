"""A primary and its streaming standby on loopback, and a failover between them: the chaos
run's ``failover_async`` and ``failover_sync`` scenarios (bench/chaos.py) are built on it.

    with private_server(18) as primary:          # bench/private_postgres.py
        migrate.upgrade(primary.url())
        with standby(primary, synchronous=True) as pair:
            url = pair.url()                      # both hosts, target_session_attrs=read-write
            ...                                   # producers and workers on url
            failover = pair.fail_over(lag=0.5)    # the primary crashes, the standby is promoted

The standby is a ``pg_basebackup`` of the primary (WAL streamed with it, through a replication
slot of its own) in a temporary directory of its own, started on a second free port of
127.0.0.1 with ``standby.signal`` and a ``primary_conninfo`` naming it ``pgqueue_standby``.
Its WAL receiver reaches the primary through a relay of ours (``Link``, a third loopback
port): the network between them, which a failover can hold up.
It runs as the primary's user (``postgres`` or ``nobody`` when we are root, as
private_postgres.py runs the primary), and is stopped and deleted on exit like the primary.
``synchronous=True`` names it in the primary's ``synchronous_standby_names`` once it streams
(not before: the primary's commits would wait for a standby that does not exist yet), so every
commit that waits for its WAL (``synchronous_commit`` on, the server's default) is
acknowledged only once the standby has flushed it. The standby's own configuration never
names a synchronous standby: promoted, it accepts writes alone.

A failover is what a production one does without the orchestrator's delay: the primary stops
with ``pg_ctl stop -m immediate`` (every process killed at once: a crash), and the standby is
promoted with ``pg_ctl promote``. ``lag`` first holds the link for that many seconds (the
relay stops reading what the primary sends), then cuts it as the primary dies, what it held
lost with it: the standby is as far behind as a standby under load or across a slow link is.
With asynchronous replication, what the primary acknowledged meanwhile is lost; with
synchronous replication the primary cannot acknowledge anything meanwhile (its commits wait
for the standby), and nothing acknowledged is lost. (Pausing the WAL receiver itself, with
SIGSTOP, does not make it lag: the kernel's socket buffers hold what the primary sent, and the
receiver reads it all once resumed, before the promotion.)
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.private_postgres import PrivateServer, free_port

STANDBY_NAME = "pgqueue_standby"  # its application_name, replication slot and sync name


class Link:
    """A TCP relay on 127.0.0.1 from ``port`` (``start`` binds it) to ``target`` (the
    primary's port): each connection it accepts is relayed to one of its own to the target,
    by a thread per direction. ``hold`` stops reading what the target sends (it piles up in
    the kernel's buffers, then the target's sender waits), ``cut`` closes every relayed
    connection, losing what was held."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._held = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True, name="link-accept").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the primary is down: the WAL receiver tries again later
                continue
            for sock in (client, upstream):  # as PostgreSQL's own: no Nagle delay (40 ms)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst, holdable in ((upstream, client, True), (client, upstream, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, holdable), daemon=True, name="link-pump"
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        try:
            while not self._closed.is_set():
                if holdable and self._held.is_set():
                    time.sleep(0.01)
                    continue
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):  # closed under us by cut()
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def hold(self) -> None:
        self._held.set()

    def cut(self) -> None:
        """Close every relayed connection (what was held is lost) and stop holding."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self._held.clear()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()


@dataclass
class Failover:
    """What one failover did, in epoch seconds and WAL positions."""

    synchronous: bool
    lag_s: float  # how long the link to the standby was held before the crash
    crashed_at: float  # the primary's immediate stop began
    stopped_s: float  # how long the immediate stop took (pg_ctl waits until it is down)
    promote_requested_at: float  # pg_ctl promote began (the old primary was down by then)
    promoted_at: float  # the standby accepted writes (seen within 10 ms)
    primary_flushed: str | None  # the primary's flushed WAL position just before the crash
    standby_received: str | None  # the last WAL position the standby received and flushed
    lacked_bytes: int | None  # primary_flushed less standby_received (0 if not behind)
    replication: dict[str, Any]  # pg_stat_replication's row for the standby before the crash

    @property
    def down_s(self) -> float:
        """From the crash to the promoted standby accepting writes."""
        return self.promoted_at - self.crashed_at


@dataclass
class Pair:
    """A running primary and its streaming standby (see :func:`standby`)."""

    primary: PrivateServer
    standby: PrivateServer
    synchronous: bool
    link: Link  # the standby's way to the primary

    def url(self, database: str = "postgres") -> str:
        """Both servers as one URL, the form ``pgqueue --database-url`` takes: libpq tries
        them in order and keeps the first that accepts writes (the primary, or the standby
        once promoted). The ports go in the query string, one of the spellings libpq takes
        (docs/databases.md#failover)."""
        return (
            f"postgresql://postgres@127.0.0.1,127.0.0.1/{database}"
            f"?port={self.primary.port},{self.standby.port}&target_session_attrs=read-write"
        )

    def dsn(self, database: str = "postgres") -> str:
        """The same as libpq keywords, for a psycopg connection of the caller's own."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port}"
            f" user=postgres dbname={database} target_session_attrs=read-write"
        )

    def replication(self) -> dict[str, Any] | None:
        """The primary's ``pg_stat_replication`` row for the standby (None: not connected)."""
        with _connect(self.primary.url()) as conn:
            cur = conn.execute(
                "SELECT state, sync_state, sent_lsn::text, write_lsn::text, flush_lsn::text,"
                " replay_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint"
                " AS flush_lag_bytes"
                " FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            )
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([c.name for c in cur.description or ()], row, strict=True))

    def wait_streaming(self, timeout: float = 60) -> dict[str, Any]:
        """Until the primary streams to the standby (synchronously, if the pair is)."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.replication()
            if (
                row is not None
                and row["state"] == "streaming"
                and (not self.synchronous or row["sync_state"] == "sync")
            ):
                return row
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the standby is not streaming after {timeout} s ({row});"
                    f" its log:\n{self.standby.log_tail()}"
                )
            time.sleep(0.1)

    def fail_over(self, lag: float = 0.0, down: float = 0.0) -> Failover:
        """Crash the primary (``pg_ctl stop -m immediate``) and, ``down`` seconds later (an
        orchestrator's delay), promote the standby (``pg_ctl promote``, waiting until it
        accepts writes). With ``lag``, the link is held that many seconds first, and cut as
        the primary is down (what it held is lost)."""
        try:
            if lag > 0:
                self.link.hold()
                time.sleep(lag)
            replication = self.replication() or {}
            with _connect(self.primary.url()) as conn:
                flushed = str(_scalar(conn, "SELECT pg_current_wal_flush_lsn()::text"))
            crashed_at = time.time()
            self.primary.shutdown("immediate")
            stopped_s = time.time() - crashed_at
        finally:
            self.link.cut()
        time.sleep(max(0.0, crashed_at + down - time.time()))
        with _connect(self.standby.url()) as conn:
            requested_at = time.time()
            # Without waiting (-W): pg_ctl polls every 0.1 s; we look every 10 ms.
            result = self.standby.run_tool("pg_ctl", "-D", str(self.standby.data), "-W", "promote")
            if result.returncode != 0:
                raise RuntimeError(f"pg_ctl promote failed: {result.stderr.strip()}")
            deadline = time.monotonic() + 60
            while _scalar(conn, "SELECT pg_is_in_recovery()"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not promoted after 60 s:\n{self.standby.log_tail()}")
                time.sleep(0.01)
            promoted_at = time.time()
            # Static once recovery ended: what the standby received before it was promoted.
            received = _scalar(conn, "SELECT pg_last_wal_receive_lsn()::text")
            lacked = _scalar(
                conn,
                "SELECT greatest(0, pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn))::bigint",
                (flushed, received),
            )
        return Failover(
            synchronous=self.synchronous,
            lag_s=lag,
            crashed_at=crashed_at,
            stopped_s=stopped_s,
            promote_requested_at=requested_at,
            promoted_at=promoted_at,
            primary_flushed=flushed,
            standby_received=None if received is None else str(received),
            lacked_bytes=None if lacked is None else int(lacked),
            replication=replication,
        )


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5, application_name="bench")


def _scalar(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _owned(path: Path, server: PrivateServer) -> None:
    if server.user is not None:
        os.chown(path, server.user.pw_uid, server.user.pw_gid)


@contextlib.contextmanager
def standby(
    primary: PrivateServer, *, synchronous: bool = False, timeout: float = 60
) -> Iterator[Pair]:
    """A streaming standby of the running ``primary`` (asynchronous unless ``synchronous``),
    stopped and deleted on exit even on an error; the pair is yielded once it streams."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-bench-standby-"))
    server: PrivateServer | None = None
    link = Link(primary.port)
    try:
        link.start()
        _owned(root, primary)
        server = PrivateServer(primary.version, primary.bin, root, free_port(), primary.user)
        result = server.run_tool(
            "pg_basebackup",
            *("-D", str(server.data), "-h", "127.0.0.1", "-p", str(primary.port)),
            *("-U", "postgres", "-X", "stream", "-c", "fast"),
            # A slot of its own: the primary keeps the WAL the standby has not received yet.
            *("-C", "-S", STANDBY_NAME),
            # As initdb's --no-sync in private_postgres.py: the copy is thrown away after.
            "--no-sync",
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {result.stderr.strip()}")
        signal_file = server.data / "standby.signal"
        signal_file.touch()
        _owned(signal_file, server)
        with (server.data / "postgresql.conf").open("a") as conf:  # later lines win
            conf.write("\n# bench/replication.py: the standby\n")
            conf.write(f"port = {server.port}\n")
            conf.write(f"unix_socket_directories = '{root}'\n")
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={link.port} user=postgres"
                f" application_name={STANDBY_NAME}'\n"
            )
            conf.write(f"primary_slot_name = '{STANDBY_NAME}'\n")
            conf.write("hot_standby = on\n")
            # PostgreSQL's default is 5 s: a standby whose reconnection to its lost primary
            # has just failed acts on a promote request only after it (seen: promoted in
            # 5.2 s instead of 0.2 s, by the timing of the request). The failover's delay is
            # ``down``'s to choose, not this.
            conf.write("wal_retrieve_retry_interval = '200ms'\n")
        server.start()
        pair = Pair(primary, server, synchronous, link)
        if synchronous:
            with _connect(primary.url()) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '\"{STANDBY_NAME}\"'")
                conn.execute("SELECT pg_reload_conf()")
        pair.wait_streaming(timeout)
        yield pair
    finally:
        try:
            if server is not None:
                server.stop()
        finally:
            link.close()
            shutil.rmtree(root, ignore_errors=True)
