"""The Django app: its migration installs pgqueue's schema, its commands run the worker."""

from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):  # type: ignore[misc]
    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"
