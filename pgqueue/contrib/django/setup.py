"""Setting Django up in a process pgqueue started (``pgqueue worker --django``): the one
module of the integration that may be imported before Django's settings are known."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pgqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from pgqueue.registry import TaskRegistry


def setup_django() -> None:
    """``django.setup()``, after checking that there are settings to set up with."""
    try:
        import django
    except ImportError:
        raise ConfigurationError(
            "--django needs Django: pip install 'pgqueue-jobs[django]'"
        ) from None
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ConfigurationError(
            "--django needs DJANGO_SETTINGS_MODULE (e.g. mysite.settings), or run "
            "`python manage.py pgqueue_worker`"
        )
    django.setup()


def process_registry() -> TaskRegistry:
    """Django set up in this (new) process, and the project's tasks' registry: where a
    spawned child of the process executor gets it (DjangoTaskRegistry.origin names this)."""
    setup_django()
    from pgqueue.contrib.django.worker import worker_registry

    return worker_registry()
