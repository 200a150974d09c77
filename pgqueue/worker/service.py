"""The worker: builds its services, runs them on one asyncio loop and stops them.

What is left here is what belongs to no single service: waiting at startup for a database
that is not up yet, the order in which the services start and stop, and the graceful stop
(signals, the grace period, releasing what did not finish, the last flush).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue import aio, db, migrate
from pgqueue.config import EXIT_RECYCLE, max_result_bytes, redact, resolve_database_url
from pgqueue.errors import ConfigurationError, DatabaseUnavailable
from pgqueue.log import event
from pgqueue.pooling import resolve_listen_url, resolve_notify, resolve_pooler
from pgqueue.queries.driver import arun
from pgqueue.queries.maintenance import schema_revision
from pgqueue.registry import TaskRegistry
from pgqueue.worker.cancels import CancelPoll, Cancels
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.completer import Completer
from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.database import Database
from pgqueue.worker.handler_pools import HandlerPools
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.listener import Listener
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.metrics import create as create_metrics
from pgqueue.worker.overruns import Overruns
from pgqueue.worker.processes import ProcessPool, needed
from pgqueue.worker.runner import Runner
from pgqueue.worker.scheduler import Scheduler
from pgqueue.worker.state import Running, Slots, StopRequest
from pgqueue.worker.watchdog import LoopWatchdog

# A stop signal this soon after the previous one is its echo (see Worker._on_signal).
SIGNAL_ECHO_SECONDS = 1.0


class Worker:
    """Runs the handlers of ``registry`` for tasks of ``config.queues``. Once it has run,
    ``exit_code`` is 0, or ``pgqueue.config.EXIT_RECYCLE`` when it stopped to be replaced
    (``WorkerConfig.max_overrunning``), or 1 when it stopped because one of its services
    failed on a bug of its own (``worker.service_failed``).

    ``pooler="transaction"`` (else ``config.pooler``, else ``PGQUEUE_POOLER``) is for a
    database URL that goes through a transaction-mode pooler (PgBouncer, Supavisor, RDS
    Proxy): no connection of the worker or its children prepares a statement, and it LISTENs
    only on ``listen_url`` (else ``config.listen_url``, else ``PGQUEUE_LISTEN_URL``), a
    direct URL; without one it polls, adaptively (see worker/claimer.py), and reads its
    running tasks' cancel flags twice a second (worker/cancels.py)."""

    def __init__(
        self,
        registry: TaskRegistry,
        database_url: str | None = None,
        config: WorkerConfig | None = None,
        *,
        pooler: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        # Read once, first: a bad PGQUEUE_MAX_RESULT_BYTES stops the worker before it starts
        # anything (the embedded server included), not at its first result, and no task pays
        # for reading the environment.
        self._max_result_bytes = max_result_bytes()
        self.registry = registry
        self.database_url = resolve_database_url(database_url)
        self.config = _own_config(config or WorkerConfig(), pooler, listen_url)
        # Where to LISTEN (None: nowhere), and whether producers NOTIFY: without both, the
        # claimer polls adaptively, and without a listener, running tasks' cancel flags too.
        self.listen_url = resolve_listen_url(
            self.database_url, listen_url=self.config.listen_url, pooler=self.config.pooler
        )
        hears_enqueues = self.listen_url is not None and resolve_notify()
        self._slots = Slots()
        self._stop = StopRequest()
        self._signalled_at: float | None = None  # when the last stop signal was taken
        # 0, or EXIT_RECYCLE once the worker decided to recycle itself: what the process
        # running it (the CLI) exits with.
        self.exit_code = 0
        self.metrics = create_metrics(
            self.config.metrics_port,
            host=self.config.metrics_host,
            queues=self.config.queues,
            database_url=self.database_url,
        )
        cfg, slots, url = self.config, self._slots, self.database_url
        self._db = Database(url, cfg, self._stop, self.metrics)
        self._pools = HandlerPools(url, cfg)
        # The process executor's children, when a handler runs in one (processes.py).
        self._processes = (
            ProcessPool(
                cfg,
                registry,
                url,
                metrics=self.metrics,
                stop=self._stop,
                max_result_bytes=self._max_result_bytes,
                slots=slots,
            )
            if needed(registry, cfg)
            else None
        )
        self._completer = Completer(self._db, self.metrics, slots)
        self._overruns = Overruns(cfg.max_overrunning, metrics=self.metrics, recycle=self.recycle)
        self._watchdog = LoopWatchdog(cfg.loop_block_threshold, slots=slots, metrics=self.metrics)
        self._runner = Runner(
            cfg,
            registry,
            db=self._db,
            metrics=self.metrics,
            slots=slots,
            completer=self._completer,
            pools=self._pools,
            max_result_bytes=self._max_result_bytes,
            overruns=self._overruns,
            stalled=self._watchdog.stalled,
            processes=self._processes,
        )
        self._claimer = Claimer(
            cfg,
            db=self._db,
            metrics=self.metrics,
            slots=slots,
            stop=self._stop,
            start=self._runner.start,
            declarations=registry.declarations(),
            adaptive=not hears_enqueues,
        )
        self._cancels = Cancels(cfg, slots=slots)
        self._heartbeat = Heartbeat(cfg, db=self._db, slots=slots, cancels=self._cancels)
        self._listener: Listener | None = None
        self._cancel_poll: CancelPoll | None = None
        if self.listen_url is not None:
            self._listener = Listener(
                self.listen_url,
                cfg,
                wake=slots.wake,
                on_cancel=self._cancels.notified,
                on_connect=self._heartbeat.soon,
                on_released=self._claimer.starts.forget,
                metrics=self.metrics,
            )
        else:
            self._cancel_poll = CancelPoll(self._cancels, db=self._db, slots=slots)
        self._scheduler = Scheduler(registry, db=self._db)

    @property
    def processed(self) -> int:
        """Tasks whose outcome this worker recorded."""
        return self._runner.processed + self._completer.processed

    # --- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (graceful; a second signal stops at once)."""
        if self._processes is not None:
            # Now, before the event loop, a connection or a thread exists: the fork server
            # can be forked from this process (run_async alone has to spawn it).
            self._processes.prepare()
        asyncio.run(self.run_async(install_signal_handlers=True))

    def request_stop(self, *, force: bool = False) -> None:
        """Stop claiming and finish within the grace period (``force``: release at once)."""
        stop = self._stop
        if stop.stopping and not force:
            force = True  # a second request means now
        if force:
            stop.force = True
            stop.forced.set()
        if not stop.stopping:
            event(
                "worker.stopping",
                worker=self.config.worker_id,
                running=len(self._slots.running),
                grace_period_s=self.config.grace_period,
            )
        stop.stopping = True
        stop.requested.set()
        self._slots.wake.set()
        self._slots.slot_freed.set()

    def recycle(self, reason: str) -> None:
        """Stop claiming and exit gracefully with EXIT_RECYCLE, for the supervisor
        (``--processes``, systemd, Kubernetes) to start a fresh process in its place."""
        if self._stop.stopping:
            return
        self.exit_code = EXIT_RECYCLE
        event(
            "worker.recycling",
            logging.WARNING,
            worker=self.config.worker_id,
            reason=reason,
            exit_code=EXIT_RECYCLE,
        )
        self.request_stop()

    def _on_signal(self) -> None:
        """SIGTERM/SIGINT: stop gracefully; another one later means now. One that arrives
        within SIGNAL_ECHO_SECONDS of the first is the same request arriving twice, not a
        second request: signalling a process group (systemd's default KillMode, Ctrl-C in a
        terminal, ``kill -TERM -PGID``) reaches a supervised worker directly and again
        through its supervisor, and must not cut the grace period short."""
        now = time.monotonic()
        if self._signalled_at is not None and now - self._signalled_at < SIGNAL_ECHO_SECONDS:
            return
        self._signalled_at = now
        self.request_stop()

    async def run_async(self, *, install_signal_handlers: bool = False) -> None:
        processes = self._processes
        if processes is not None:
            processes.prepare()  # before the metrics thread (spawned if the loop's socket is there)
        self.metrics.start()  # /metrics and /healthz, with a metrics port only
        try:
            if processes is not None:
                await processes.open()
            await self._run(install_signal_handlers)
        finally:
            if processes is not None:
                await processes.close()
            self.metrics.stop()

    async def _run(self, install_signal_handlers: bool) -> None:
        cfg = self.config
        conn, autovacuum = await self._wait_for_database()
        listener = self._listener
        if listener is not None and listener.database_url == self.database_url:
            # The check's connection is the listener's: one connection (a server process)
            # fewer to open while the worker starts.
            listener.adopt(conn)
        else:  # nothing to LISTEN on, or a direct URL other than the one checked
            await conn.close()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        try:
            pool = await self._db.open()
            self._runner.open()
        except BaseException:
            if listener is not None:
                await listener.close()
            raise
        self._watchdog.start()
        event(
            "worker.started",
            worker=cfg.worker_id,
            queues=",".join(cfg.queues),
            concurrency=cfg.concurrency,
            lease_s=cfg.lease_seconds,
            handlers=",".join(self.registry.types),
            pooler=cfg.pooler,
            wake_ups="poll" if self._claimer.polls.adaptive else "notify",
            **database_fields(self.database_url),
        )
        for type, queue in unclaimed_queues(self.registry, cfg.queues):
            event(
                "worker.queue_not_claimed",
                logging.WARNING,
                worker=cfg.worker_id,
                type=type,
                queue=queue,
                claims=",".join(cfg.queues),
                note=f"{type}'s tasks go to queue {queue!r}, which this worker does not claim: "
                f"they wait until a worker does (add --queue {queue})",
            )
        helpers = self._start_helpers(pool)
        if autovacuum == "off":
            event(
                "worker.autovacuum_off",
                logging.WARNING,
                worker=cfg.worker_id,
                note="the server has autovacuum off: every claim and completion leaves a dead "
                "row, and pgqueue.tasks will grow and slow down unless it is vacuumed",
            )
        try:
            await self._claimer.run()
            await self._drain()
        finally:
            self._watchdog.stop()
            for t in helpers:
                t.cancel()
            for t in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await self._close()
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            event("worker.stopped", worker=cfg.worker_id, processed=self.processed)

    def _start_helpers(self, pool: AsyncConnectionPool[Any]) -> list[asyncio.Task[None]]:
        """The services that run beside the claimer until it and the drain are done (the
        heartbeat and the completer must outlive the drain: its tasks still finish)."""
        cfg = self.config
        helpers = [
            asyncio.create_task(self._heartbeat.run(), name="heartbeat"),
            asyncio.create_task(self._completer.run(), name="completer"),
        ]
        if self._listener is not None:
            helpers.append(asyncio.create_task(self._listener.run(), name="listener"))
        if self._cancel_poll is not None:
            helpers.append(asyncio.create_task(self._cancel_poll.run(), name="cancel-poll"))
        if cfg.scheduler and self.registry.schedules:
            helpers.append(asyncio.create_task(self._scheduler.run(), name="scheduler"))
        if cfg.maintenance.enabled:
            maintenance = Maintenance(cfg.maintenance, metrics=self.metrics)

            async def maintain() -> None:
                # After the first claim, not beside it: the claim needs a connection first.
                await self._claimer.first_claim_tried.wait()
                await maintenance.run(pool, self._stop.requested, worker=cfg.worker_id)

            helpers.append(asyncio.create_task(maintain(), name="maintenance"))

        async def grow_pool() -> None:
            await self._claimer.first_claim_tried.wait()
            await self._db.started()

        helpers.append(asyncio.create_task(grow_pool(), name="pool-size"))
        for helper in helpers:
            helper.add_done_callback(self._service_ended)
        return helpers

    def _service_ended(self, helper: asyncio.Task[None]) -> None:
        """A service beside the claimer ended by itself. Database errors never do that (they
        are retried: worker/database.py), so this is a bug of the worker's own (one of
        database_errors.PROGRAMMING_ERRORS): say so with its traceback, and stop gracefully
        with exit code 1, to be restarted, rather than run on without it (a worker without
        its heartbeat would hold leases it no longer renews)."""
        exc = None if helper.cancelled() else helper.exception()
        if exc is None:
            return
        event(
            "worker.service_failed",
            logging.CRITICAL,
            worker=self.config.worker_id,
            service=helper.get_name(),
            error=repr(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        self.exit_code = 1
        self.request_stop()

    async def _wait_for_database(self) -> tuple[psycopg.AsyncConnection[Any], str]:
        """Refuse a schema behind head, waiting up to ``startup_timeout`` for a database that
        is down or starting up. A running worker rides out an outage; one that starts during
        it should too, rather than exit and be restarted in a loop by its supervisor (whose
        backoff grows to minutes). A refusal that waiting cannot cure (wrong password, no
        such database) still fails at once. Returns the connection checked on, still open,
        and the server's autovacuum setting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout
        delay = 0.2
        while True:
            try:
                return await self._checked_connection()
            except DatabaseUnavailable as exc:
                if not exc.transient or loop.time() + delay > deadline:
                    raise
                event(
                    "worker.database_unreachable",
                    logging.WARNING,
                    worker=self.config.worker_id,
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                    gives_up_in_s=round(deadline - loop.time(), 1),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _checked_connection(self) -> tuple[psycopg.AsyncConnection[Any], str]:
        """A connection on which the schema was found at head (``migrate.check``'s rule), and
        the server's autovacuum setting, read on it too: a queue table without vacuum grows
        and slows down, which the worker warns about once it has started."""
        conn = await db.aconnect(self.database_url, autocommit=True)
        try:
            migrate.check_revision(await arun(conn, schema_revision()))
            cur = await conn.execute("SELECT current_setting('autovacuum')")
            row = await cur.fetchone()
        except BaseException:
            await conn.close()
            raise
        return conn, str(row[0]) if row else "on"

    async def _close(self) -> None:
        self._runner.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()  # its connection, if it was stopped before taking it
        for pool in (self._pools.async_pool, self._db.pool):
            if pool is not None:
                with contextlib.suppress(Exception):
                    await pool.close(timeout=2)
        if self._pools.sync_pool is not None:
            sync_pool = self._pools.sync_pool
            with contextlib.suppress(Exception):
                await asyncio.to_thread(sync_pool.close, 2)

    # --- the graceful stop ---------------------------------------------------------------

    async def _drain(self) -> None:
        """Shutdown: let running tasks finish within the grace period, release the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.grace_period
        # A recycling worker does not wait for the overrunning threads: they are why it stops.
        recycling = self.exit_code == EXIT_RECYCLE
        while not self._stop.force:
            jobs = [
                r.job
                for r in self._slots.running.values()
                if r.job is not None
                and not r.job.done()
                and not (recycling and r.ctx.overrunning_since is not None)
            ]
            remaining = deadline - loop.time()
            if not jobs or remaining <= 0:
                break
            forced = asyncio.ensure_future(self._stop.forced.wait())
            await asyncio.wait(
                [*jobs, forced], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
        await self._release_leftovers()
        await self._completer.flush(final=True)

    async def _release_leftovers(self) -> None:
        """Give back the leases of the tasks that did not finish in time, so that they run
        again elsewhere now rather than when their leases expire. A task whose sync handler
        overruns its timeout is recorded timed out instead (its attempt counts, as it would
        have when its thread returned): released, a handler that always hangs would run
        again and again. A sync handler's thread cannot be stopped: it is abandoned, logged
        (``task.abandoned``), and ends with the process."""
        leftovers = [r for r in self._slots.running.values() if not r.released]
        if not leftovers:
            return
        for r in leftovers:
            r.released = True
            r.ctx.stop()
        overrunning = [r for r in leftovers if r.ctx.overrunning_since is not None]
        held = [r for r in leftovers if r.ctx.overrunning_since is None]
        if self._processes is not None:  # their children dead first: none may run on
            await self._processes.terminate({r.task.id for r in leftovers})
        leases = [r.task.lease for r in held]
        released: set[Any] = set()
        if leases:
            released = (
                await self._db.call("release", lambda c: aio.release(c, leases), attempts=3)
                or set()
            )
        for r in held:
            event(
                "task.released",
                task_id=r.task.id,
                type=r.task.type,
                attempt=r.task.attempts,
                released=r.task.id in released,
            )
            if not r.recording and self._runs_in_a_thread(r):
                _abandoned(r)
        # Last, so that a retry (after its backoff) finds this process gone, the thread with it.
        for r in overrunning:
            await self._runner.record_abandoned(r)
        for r in leftovers:
            if r.job is not None:
                r.job.cancel()

    def _runs_in_a_thread(self, running: Running) -> bool:
        handler = self.registry.get(running.task.type)
        if handler is None or handler.is_async:
            return False
        return self._processes is None or not self._processes.takes(handler)


def _own_config(config: WorkerConfig, pooler: str | None, listen_url: str | None) -> WorkerConfig:
    """The worker's own copy of ``config``, its pooler mode resolved (an argument, else the
    config's, else PGQUEUE_POOLER): every service and child process is given this one, and
    none of them reads the environment again."""
    return dataclasses.replace(
        config,
        pooler=resolve_pooler(pooler or config.pooler),
        listen_url=listen_url or config.listen_url,
    )


def _abandoned(running: Running) -> None:
    """A sync handler still running as the worker exits: its thread cannot be stopped; the
    process's exit ends it."""
    event(
        "task.abandoned",
        logging.WARNING,
        task_id=running.task.id,
        type=running.task.type,
        attempt=running.task.attempts,
        running_s=round(time.monotonic() - running.started, 2),
        note="its handler's thread is still running; the exit ends it",
    )


def database_fields(url: str) -> dict[str, str]:
    """The start line's word on the database: its URL, password masked, and, when it is the
    embedded server, where that keeps its data (the one thing to know before deleting it)."""
    fields = {"database": redact(url)}
    data = embedded_data_dir(url)
    if data is not None:
        fields["embedded"] = str(data)
    return fields


def embedded_data_dir(url: str) -> Path | None:
    """The embedded server's data directory when ``url`` is its (its socket directory is the
    one its postmaster.pid names), else None. Reads a file: starts no server."""
    from urllib.parse import parse_qs, urlsplit

    from pgqueue import embedded

    try:
        socket_dir = parse_qs(urlsplit(url).query).get("host", [""])[0]
        data = embedded.data_dir()
        lines = (data / "postmaster.pid").read_text().splitlines()
    except (ValueError, OSError, ConfigurationError):
        return None
    # postmaster.pid: pid, data directory, start time, port, socket directory, ...
    if socket_dir and len(lines) > 4 and lines[4] and Path(lines[4]) == Path(socket_dir):
        return data
    return None


def unclaimed_queues(registry: TaskRegistry, claimed: Iterable[str]) -> list[tuple[str, str]]:
    """(type, queue) for each type of ``registry`` whose declared queue
    (``@tasks.task(queue=...)``) is not among ``claimed``: its tasks would wait for a worker
    that is not this one."""
    claimed = set(claimed)
    found = []
    for type in registry.types:
        handler = registry.get(type)
        if handler is not None and handler.queue is not None and handler.queue not in claimed:
            found.append((type, handler.queue))
    return found
