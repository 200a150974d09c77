"""The Django app: its migration installs pgqueue's schema, its commands run the worker."""

from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):  # type: ignore[misc]
    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"

    def ready(self) -> None:
        # Django 6 registers the Tasks framework's system check (each backend's check():
        # ours reports pgqueue.E001 and E002) when django.tasks is first imported, and a
        # project's settings and apps need not import it before `check` or `migrate` run.
        # Without this, a project on SQLite passes `check` and `migrate` fails inside
        # pgqueue's migration with a traceback. (The django-tasks backport registers its
        # check in its own app's ready().)
        from pgqueue.contrib.django import compat  # noqa: F401
