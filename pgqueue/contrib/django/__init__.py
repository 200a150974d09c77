"""pgqueue as a backend of Django's Tasks framework (``django.tasks``, Django 6).

``INSTALLED_APPS += ["pgqueue.contrib.django"]`` and, in settings::

    TASKS = {"default": {"BACKEND": "pgqueue.contrib.django.PgQueueBackend"}}

The backend enqueues on Django's own database connection, so a task enqueued inside
``transaction.atomic()`` exists only if the block commits; ``python manage.py pgqueue_worker``
runs the tasks. See docs/django.md.

Nothing here is imported by pgqueue's core: this package imports Django.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.contrib.django.backend import PgQueueBackend

__all__ = ["PgQueueBackend"]


def __getattr__(name: str) -> Any:
    # Lazy: Django imports this package (the app) before its settings allow the backend's
    # imports (django.tasks) to be made.
    if name == "PgQueueBackend":
        from pgqueue.contrib.django.backend import PgQueueBackend

        return PgQueueBackend
    raise AttributeError(name)
