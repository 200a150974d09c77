"""``python manage.py pgqueue_migrate``: bring pgqueue's schema to this pgqueue's head.

pgqueue's tables live in their own schema (``pgqueue``) with their own alembic history, so
this touches none of the project's tables or Django migrations. ``manage.py migrate`` runs it
too (this app's migration), but only once: run this command after upgrading pgqueue.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pgqueue import migrate
from pgqueue.contrib.django.database import database_url
from pgqueue.contrib.django.worker import database_alias


class Command(BaseCommand):  # type: ignore[misc]
    help = "Install or upgrade pgqueue's schema in the Django database the backend uses."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            help="Django database alias (default: the pgqueue backend's OPTIONS DATABASE).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or database_alias()
        before = migrate.current(database_url(alias))
        migrate.upgrade(database_url(alias))
        after = migrate.head()
        if before == after:
            self.stdout.write(f"pgqueue schema already at {after} (database {alias!r})")
        else:
            self.stdout.write(f"pgqueue schema: {before or 'none'} -> {after} (database {alias!r})")
