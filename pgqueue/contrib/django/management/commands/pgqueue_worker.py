"""``python manage.py pgqueue_worker``: run the project's Django tasks in pgqueue's worker.

The options are ``pgqueue worker``'s most used; for the rest (``--processes``, metrics,
retention) run ``pgqueue worker --django`` with ``DJANGO_SETTINGS_MODULE`` set, which takes
all of them.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pgqueue import log
from pgqueue.contrib.django.worker import (
    queues,
    run_worker,
    worker_database_url,
    worker_registry,
)
from pgqueue.worker import WorkerConfig
from pgqueue.worker.maintenance import MaintenanceConfig


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the Django tasks enqueued through pgqueue's backend, until SIGTERM/SIGINT."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            help="Queue to work on (repeatable; default: every queue of the pgqueue "
            "backends in TASKS).",
        )
        parser.add_argument("--concurrency", "-c", type=int, default=10)
        parser.add_argument("--lease-seconds", type=float, default=30.0)
        parser.add_argument("--grace-period", type=float, default=30.0)
        parser.add_argument("--poll-interval", type=float, default=0.5)
        parser.add_argument("--no-maintenance", action="store_true")
        parser.add_argument("--no-scheduler", action="store_true")
        parser.add_argument("--log-format", default="text", choices=["text", "json"])
        parser.add_argument("--log-level", default="INFO")
        parser.add_argument(
            "--database-url",
            help="PostgreSQL URL (default: $PGQUEUE_DATABASE_URL, else the Django database "
            "the backend enqueues on).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        log.configure(options["log_format"], options["log_level"])
        registry = worker_registry()
        config = WorkerConfig(
            queues=options["queues"] or queues(),
            concurrency=options["concurrency"],
            lease_seconds=options["lease_seconds"],
            poll_interval=options["poll_interval"],
            grace_period=options["grace_period"],
            scheduler=not options["no_scheduler"],
            maintenance=MaintenanceConfig(enabled=not options["no_maintenance"]),
        )
        run_worker(registry, worker_database_url(options["database_url"]), config)
