"""``pgqueue worker``: run the handlers of a registry, in this process or in several.

With ``--processes N`` this process only supervises: it starts N children with the same
options and replaces any that dies (pgqueue/supervisor.py). A child is forked from this
process, with the worker and the registry already imported, or, where it cannot be forked,
is ``pgqueue worker ... --processes 1``. For the latter the options travel twice, once into a
:class:`~pgqueue.worker.WorkerConfig` and once back into a command line; :class:`WorkerOptions`
holds them between the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from pgqueue.cli.state import state
from pgqueue.config import DEFAULT_QUEUE, ENV_DATABASE_URL, EXIT_RECYCLE, max_result_bytes
from pgqueue.enqueue import check_name
from pgqueue.pooling import ENV_LISTEN_URL, ENV_POOLER

if TYPE_CHECKING:
    from pgqueue.registry import TaskRegistry
    from pgqueue.worker import WorkerConfig

commands = typer.Typer()

# The options, declared here so that the command's signature reads as the list it is.
RegistryArg = Annotated[
    str | None,
    typer.Argument(
        help="Your handlers: MODULE:ATTRIBUTE naming a pgqueue.TaskRegistry "
        "(e.g. app.tasks:tasks); or --django."
    ),
]
DjangoOption = Annotated[
    bool,
    typer.Option(
        "--django",
        help="Run the Django project's tasks (DJANGO_SETTINGS_MODULE) instead of a registry.",
    ),
]
QueuesOption = Annotated[
    list[str] | None,
    typer.Option("--queue", "-q", help="Queue to work on (repeatable; default: default)."),
]
ConcurrencyOption = Annotated[
    int, typer.Option("--concurrency", "-c", min=1, help="Tasks run at once per process.")
]
ProcessesOption = Annotated[
    int, typer.Option("--processes", "-p", min=1, help="Worker processes to run and supervise.")
]
LeaseSecondsOption = Annotated[
    float, typer.Option(min=1, help="Visibility timeout; renewed by heartbeat while running.")
]
GracePeriodOption = Annotated[
    float, typer.Option(min=0, help="On SIGTERM, seconds to let running tasks finish.")
]
PollIntervalOption = Annotated[
    float,
    typer.Option(
        min=0.01,
        help="Seconds between polls when no NOTIFY arrives: a scheduled task starts "
        "within about this long of its time.",
    ),
]
MaintenanceOption = Annotated[
    bool, typer.Option(help="Run the lease sweep and retention pruning in this worker.")
]
SweepIntervalOption = Annotated[float, typer.Option(min=0.05, help="Seconds between sweeps.")]
PruneIntervalOption = Annotated[
    float, typer.Option(min=0.05, help="Seconds between retention pruning rounds.")
]
StartupTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0,
        help="Seconds a starting worker waits for a database that is down or starting up.",
    ),
]
CompletedRetentionOption = Annotated[
    float,
    typer.Option(
        min=1,
        help="Seconds to keep completed and cancelled tasks (a queue's own retention, "
        "`pgqueue queue retention`, wins).",
    ),
]
DeadRetentionOption = Annotated[
    float,
    typer.Option(min=1, help="Seconds to keep dead letters (a queue's own retention wins)."),
]
PromoteAfterOption = Annotated[
    float,
    typer.Option(
        min=0,
        help="Starvation policy: a task waiting this long moves up one priority (0: never).",
    ),
]
SchedulerOption = Annotated[
    bool,
    typer.Option(help="Enqueue the registry's periodic tasks (once per tick, fleet-wide)."),
]
LogFormatOption = Annotated[str, typer.Option(help="text or json.")]
LogLevelOption = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")]
AppLogLevelOption = Annotated[
    str,
    typer.Option(
        help="Print your own code's logging (logging.getLogger(__name__) in a handler) from "
        "this level up, in --log-format: debug, info, warning, error, or off. Ignored when "
        "your code configures logging itself (the root logger has a handler).",
    ),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65535,
        help="Serve Prometheus /metrics and a liveness /healthz on this port (needs "
        "prometheus-client: the api extra). With --processes N, process i gets PORT+i.",
    ),
]
MetricsHostOption = Annotated[
    str,
    typer.Option(
        help="Address for --metrics-port: loopback by default. 0.0.0.0 (every IPv4 "
        "interface) lets Prometheus and the kubelet reach a pod on its IP; the port has no "
        "authentication, so open it only where the network is yours.",
    ),
]
PoolerOption = Annotated[
    str | None,
    typer.Option(
        "--pooler",
        envvar=ENV_POOLER,
        show_envvar=True,
        help="What is between the worker and PostgreSQL: none, session, or transaction for a "
        "transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy), where the worker and "
        "its children prepare no statement and LISTEN only on --listen-url; without one "
        "they poll, adaptively. Default: the global --pooler, else none.",
    ),
]
ListenUrlOption = Annotated[
    str | None,
    typer.Option(
        "--listen-url",
        envvar=ENV_LISTEN_URL,
        show_envvar=True,
        help="A direct PostgreSQL URL (bypassing the pooler) used only to LISTEN for "
        "wake-ups and cancels. Default: the database URL, unless --pooler is transaction.",
    ),
]

# How a supervisor tells a spawned child the worker id it chose for it (its lease owner,
# whose tasks the supervisor fails should the child die): not for people, so not in --help.
WorkerIdOption = Annotated[str, typer.Option(hidden=True)]
MaxOverrunningOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Recycle the worker when more than N sync handlers run on past their timeout "
        "(a thread cannot be killed; each holds its slot until it returns): it stops "
        f"claiming, records them timed out and exits with code {EXIT_RECYCLE}, for its "
        "supervisor to start a fresh one (--processes N restarts it at once). Default: never.",
    ),
]
LoopBlockedAfterOption = Annotated[
    float,
    typer.Option(
        min=0,
        help="Warn (worker.loop_blocked, naming the async handler that held it) when the "
        "event loop runs nothing for longer than this many seconds; 0: off.",
    ),
]
ExecutorOption = Annotated[
    str,
    typer.Option(
        help="Where handlers that name no executor run: thread (plain functions in threads, "
        "async ones on the event loop) or process (each in a pool of child processes).",
    ),
]
ProcessPoolSizeOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Child processes for process tasks (default: the CPUs, at most --concurrency).",
    ),
]
HardTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="Seconds after a process task's timeout (or a cancel) before its child is "
        "killed and replaced (a type's own hard_timeout wins).",
    ),
]
MaxTasksPerChildOption = Annotated[
    int | None, typer.Option(min=1, help="Replace a child process after this many tasks.")
]
MaxMemoryPerChildOption = Annotated[
    float | None,
    typer.Option(
        min=1, help="Replace a child process between tasks once its memory (RSS) passes MB."
    ),
]
MemoryLimitOption = Annotated[
    float | None,
    typer.Option(
        min=1,
        help="Kill a child process whose memory (RSS) passes MB, failing its task "
        '("memory limit exceeded").',
    ),
]


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What each worker process is told, whether it runs here or as a supervised child."""

    queues: list[str]
    concurrency: int
    lease_seconds: float
    grace_period: float
    poll_interval: float
    maintenance: bool
    sweep_interval: float
    prune_interval: float
    startup_timeout: float
    completed_retention: float
    dead_retention: float
    promote_after: float
    scheduler: bool
    log_format: str
    log_level: str
    metrics_port: int | None
    metrics_host: str
    app_log_level: str = "info"
    worker_id: str = ""  # empty: the worker makes one up (HOST:PID:RANDOM)
    max_overrunning: int | None = None
    loop_block_threshold: float = 0.1
    executor: str = "thread"
    process_pool_size: int | None = None
    hard_timeout: float = 5.0
    max_tasks_per_child: int | None = None
    max_memory_per_child: float | None = None
    memory_limit: float | None = None
    pooler: str = "none"
    # Given to a spawned child in its environment, not its argv, like the database URL.
    listen_url: str | None = None


@commands.command()
def worker(
    ctx: typer.Context,
    registry: RegistryArg = None,
    django: DjangoOption = False,
    queue: QueuesOption = None,
    concurrency: ConcurrencyOption = 10,
    processes: ProcessesOption = 1,
    lease_seconds: LeaseSecondsOption = 30.0,
    grace_period: GracePeriodOption = 30.0,
    poll_interval: PollIntervalOption = 0.5,
    maintenance: MaintenanceOption = True,
    sweep_interval: SweepIntervalOption = 5.0,
    prune_interval: PruneIntervalOption = 60.0,
    startup_timeout: StartupTimeoutOption = 60.0,
    completed_retention: CompletedRetentionOption = 24 * 3600.0,
    dead_retention: DeadRetentionOption = 14 * 24 * 3600.0,
    promote_after: PromoteAfterOption = 300.0,
    scheduler: SchedulerOption = True,
    log_format: LogFormatOption = "text",
    log_level: LogLevelOption = "INFO",
    app_log_level: AppLogLevelOption = "info",
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
    worker_id: WorkerIdOption = "",
    max_overrunning: MaxOverrunningOption = None,
    loop_blocked_after: LoopBlockedAfterOption = 0.1,
    executor: ExecutorOption = "thread",
    process_pool_size: ProcessPoolSizeOption = None,
    hard_timeout: HardTimeoutOption = 5.0,
    max_tasks_per_child: MaxTasksPerChildOption = None,
    max_memory_per_child: MaxMemoryPerChildOption = None,
    memory_limit: MemoryLimitOption = None,
    pooler: PoolerOption = None,
    listen_url: ListenUrlOption = None,
) -> None:
    """Run handlers for queued tasks until SIGTERM/SIGINT (a second signal, a second or more
    later, stops at once).

    Exit code: 0 once stopped; 75 when it recycled itself (--max-overrunning), for its
    supervisor to start another."""
    from pgqueue import log
    from pgqueue.registry import load

    log.configure(log_format, log_level)
    _check_app_log_level(app_log_level)
    _check_early(queue, metrics_port, processes)
    options = WorkerOptions(
        queues=queue or [DEFAULT_QUEUE],
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        grace_period=grace_period,
        poll_interval=poll_interval,
        maintenance=maintenance,
        sweep_interval=sweep_interval,
        prune_interval=prune_interval,
        startup_timeout=startup_timeout,
        completed_retention=completed_retention,
        dead_retention=dead_retention,
        promote_after=promote_after,
        scheduler=scheduler,
        log_format=log_format,
        log_level=log_level,
        app_log_level=app_log_level,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        worker_id=worker_id,
        max_overrunning=max_overrunning,
        loop_block_threshold=loop_blocked_after,
        executor=executor,
        process_pool_size=process_pool_size,
        hard_timeout=hard_timeout,
        max_tasks_per_child=max_tasks_per_child,
        max_memory_per_child=max_memory_per_child,
        memory_limit=memory_limit,
        pooler=_pooler(ctx, pooler),
        listen_url=listen_url,
    )
    _config(options)  # a bad combination refused here, before any process or connection
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory's modules are importable
    if django == (registry is not None):
        raise typer.BadParameter(
            "give a registry (MODULE:ATTRIBUTE) or --django, one of the two",
            param_hint="'REGISTRY'",
        )
    if registry is None:
        tasks, url = _django_tasks()
        if queue is None:
            options = dataclasses.replace(options, queues=_django_queues())
    else:
        url = state.url()
        tasks = load(registry)  # fail fast, in the parent too, on a bad MODULE:ATTRIBUTE
    # After the application's modules are imported: one that configured logging itself wins.
    log.configure_app(app_log_level)
    if processes > 1:
        raise typer.Exit(_supervise(registry, tasks, processes, options, url))
    code = _run(tasks, url, options)
    if code:
        raise typer.Exit(code)


def _check_app_log_level(level: str) -> None:
    from pgqueue.log import APP_LOG_LEVELS

    if level.strip().lower() not in APP_LOG_LEVELS:
        raise typer.BadParameter(
            f"{level!r} is not one of {', '.join(APP_LOG_LEVELS)}", param_hint="'--app-log-level'"
        )


def _check_early(queues: list[str] | None, metrics_port: int | None, processes: int) -> None:
    """What can be refused before any process or connection is started."""
    _check_metrics_ports(metrics_port, processes)
    for name in queues or []:  # before any connection: a queue no task can be in
        check_name("queue", name)
    max_result_bytes()  # a bad PGQUEUE_MAX_RESULT_BYTES: refused here, not by N children
    if processes > 1:
        from pgqueue.supervisor import start_method

        start_method()  # a bad PGQUEUE_WORKER_START_METHOD, likewise


def _pooler(ctx: typer.Context, given: str | None) -> str:
    """The pooler mode: this command's own --pooler, else the root's (``pgqueue --pooler``,
    which already fell back to PGQUEUE_POOLER, then none). A value this command read from
    PGQUEUE_POOLER itself yields to the root's, which an explicit root option makes differ."""
    from pgqueue.pooling import resolve_pooler

    source = ctx.get_parameter_source("pooler")
    if given is None or (source is not None and source.name == "ENVIRONMENT"):
        given = getattr(state, "pooler", None) or given
    try:
        return resolve_pooler(given)
    except Exception as exc:
        raise typer.BadParameter(str(exc), param_hint="'--pooler'") from None


def _django_tasks() -> tuple[TaskRegistry, str]:
    """Django set up, its project's tasks, and the database to work on: --database-url or
    PGQUEUE_DATABASE_URL, else the Django database the backend enqueues on."""
    from pgqueue.contrib.django.setup import setup_django

    setup_django()
    from pgqueue.contrib.django.worker import worker_database_url, worker_registry

    return worker_registry(), worker_database_url(state.database_url)


def _django_queues() -> list[str]:
    from pgqueue.contrib.django.worker import queues

    return queues()


def _check_metrics_ports(metrics_port: int | None, processes: int) -> None:
    """Process i listens on PORT+i: refuse before starting any if the last would not fit."""
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        raise typer.BadParameter(
            f"{processes} processes need ports {metrics_port} to {metrics_port + processes - 1}, "
            "past 65535",
            param_hint="'--metrics-port'",
        )


def _child_argv(registry: str | None, options: WorkerOptions) -> list[str]:
    """The command line of one supervised child: these options, one process each (a
    registry of None: --django)."""
    target = "--django" if registry is None else registry
    argv = [sys.executable, "-m", "pgqueue", "worker", target, "--processes", "1"]
    for name, value in (
        ("--concurrency", options.concurrency),
        ("--lease-seconds", options.lease_seconds),
        ("--grace-period", options.grace_period),
        ("--poll-interval", options.poll_interval),
        ("--sweep-interval", options.sweep_interval),
        ("--prune-interval", options.prune_interval),
        ("--startup-timeout", options.startup_timeout),
        ("--completed-retention", options.completed_retention),
        ("--dead-retention", options.dead_retention),
        ("--promote-after", options.promote_after),
        ("--log-format", options.log_format),
        ("--log-level", options.log_level),
        ("--app-log-level", options.app_log_level),
        ("--loop-blocked-after", options.loop_block_threshold),
    ):
        argv += [name, str(value)]
    if options.max_overrunning is not None:
        argv += ["--max-overrunning", str(options.max_overrunning)]
    argv += ["--executor", options.executor, "--hard-timeout", str(options.hard_timeout)]
    argv += ["--pooler", options.pooler]
    for name, given in (
        ("--process-pool-size", options.process_pool_size),
        ("--max-tasks-per-child", options.max_tasks_per_child),
        ("--max-memory-per-child", options.max_memory_per_child),
        ("--memory-limit", options.memory_limit),
    ):
        if given is not None:
            argv += [name, str(given)]
    for q in options.queues:
        argv += ["--queue", q]
    if not options.maintenance:
        argv.append("--no-maintenance")
    if not options.scheduler:
        argv.append("--no-scheduler")
    return argv


def _supervise(
    registry: str | None, tasks: TaskRegistry, processes: int, options: WorkerOptions, url: str
) -> int:
    """Run ``processes`` children until they stop; the supervisor's exit code."""
    from pgqueue.cli.errors import exit_reporting_errors
    from pgqueue.supervisor import Supervisor, start_method

    method = start_method()
    # The URL goes to the children in their environment, not their argv: any local user
    # can read a command line (ps), and the URL may hold a password.
    argv = _child_argv(registry, options)
    env = {**os.environ, ENV_DATABASE_URL: url}
    if options.listen_url:
        env[ENV_LISTEN_URL] = options.listen_url
    first_port = options.metrics_port
    if first_port is not None:
        argv += ["--metrics-host", options.metrics_host]

    def slot_args(slot: int, worker_id: str) -> list[str]:
        """The worker id the supervisor chose; child i on PORT+i, a replacement on the same."""
        port = [] if first_port is None else ["--metrics-port", str(first_port + slot)]
        return [*port, "--worker-id", worker_id]

    def run_forked(slot: int, worker_id: str) -> int:
        """A forked child: the worker of that slot, its errors reported as the command's."""
        os.environ[ENV_DATABASE_URL] = url  # what a spawned child has (its handlers may read it)
        port = None if first_port is None else first_port + slot
        mine = dataclasses.replace(options, metrics_port=port, worker_id=worker_id)
        exit_reporting_errors(lambda: _run(tasks, url, mine))  # its code: 0 or EXIT_RECYCLE

    if method == "fork":
        _preload(options)
    supervisor = Supervisor(
        argv,
        processes,
        env=env,
        slot_args=slot_args,
        run_forked=run_forked,
        method=method,
        database_url=url,  # to fail the tasks a dead child held, at once
    )
    return supervisor.run()


def _preload(options: WorkerOptions) -> None:
    """Import, once, what every forked child would otherwise import on its own as it
    starts: the worker's services and what they load on first use."""
    import concurrent.futures.thread  # noqa: F401  (asyncio.to_thread's executor)

    import pgqueue.worker  # noqa: F401  (the services, psycopg_pool)
    from pgqueue import migrate
    from pgqueue.queries import driver

    migrate.revisions()  # the revision files, read (and cached) once
    driver.statements()  # the SQL files, likewise
    if options.metrics_port is not None:
        with contextlib.suppress(ImportError):  # missing: each child says so, as before
            import prometheus_client  # noqa: F401


def _run(tasks: TaskRegistry, url: str, options: WorkerOptions) -> int:
    """One worker, in this process, until it is told to stop (or recycles itself); the
    process's exit code."""
    from pgqueue.worker import Worker

    worker = Worker(tasks, url, _config(options))
    worker.run()
    return worker.exit_code


def _config(options: WorkerOptions) -> WorkerConfig:
    from pgqueue.worker import WorkerConfig
    from pgqueue.worker.maintenance import MaintenanceConfig

    return WorkerConfig(
        queues=options.queues,
        concurrency=options.concurrency,
        lease_seconds=options.lease_seconds,
        poll_interval=options.poll_interval,
        grace_period=options.grace_period,
        startup_timeout=options.startup_timeout,
        scheduler=options.scheduler,
        metrics_port=options.metrics_port,
        metrics_host=options.metrics_host,
        worker_id=options.worker_id,
        maintenance=MaintenanceConfig(
            enabled=options.maintenance,
            sweep_interval=options.sweep_interval,
            prune_interval=options.prune_interval,
            completed_retention=options.completed_retention,
            dead_retention=options.dead_retention,
            promote_after=options.promote_after,
        ),
        max_overrunning=options.max_overrunning,
        loop_block_threshold=options.loop_block_threshold,
        executor=options.executor,
        process_pool_size=options.process_pool_size,
        hard_timeout=options.hard_timeout,
        max_tasks_per_child=options.max_tasks_per_child,
        max_memory_per_child=options.max_memory_per_child,
        memory_limit=options.memory_limit,
        pooler=options.pooler,
        listen_url=options.listen_url,
    )
