"""pgqueue's schema, installed by ``manage.py migrate``.

The tables are pgqueue's own, in the ``pgqueue`` schema, migrated by pgqueue's alembic
revisions (their history in ``pgqueue.pgqueue_alembic_version``), on a connection of their
own to the same database: Django's history and tables are not touched. Later pgqueue
versions bring new revisions that this migration, once applied, does not run again:
``manage.py pgqueue_migrate`` does (the worker refuses to start on a schema behind).
Reversing it changes nothing: dropping the queue with every task in it is left to
``pgqueue`` itself, on purpose.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def install(apps: Any, schema_editor: Any) -> None:
    from pgqueue import migrate
    from pgqueue.contrib.django.database import database_url

    migrate.upgrade(database_url(schema_editor.connection.alias))


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
