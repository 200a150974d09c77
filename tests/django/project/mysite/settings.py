"""A small Django project on pgqueue's Tasks backend, for tests/django.

The database comes from ``DJANGO_DATABASE_URL`` (the tests give each run a database of its
own); everything else is what a project would write.
"""

import os
from urllib.parse import parse_qs, unquote, urlsplit

import django

_url = urlsplit(os.environ.get("DJANGO_DATABASE_URL", "postgresql://postgres@127.0.0.1/shop"))

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
MIDDLEWARE: list[str] = []

INSTALLED_APPS = [
    "pgqueue.contrib.django",
    "shop",
]
if django.VERSION < (6,):  # Django 5.2: the django-tasks backport is the Tasks framework
    INSTALLED_APPS.insert(0, "django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        # A Unix socket (the embedded server) comes as ?host=/path.
        "HOST": _url.hostname or parse_qs(_url.query).get("host", [""])[0],
        "PORT": str(_url.port or ""),
    }
}

TASKS = {
    "default": {
        "BACKEND": "pgqueue.contrib.django.PgQueueBackend",
        "QUEUES": ["default", "ordered"],
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 2},
    }
}

# bench/django_compare.py runs the same project on django-tasks-db, the reference backend.
if os.environ.get("SHOP_TASKS_BACKEND") == "django-tasks-db":
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_db.DatabaseBackend",
            "QUEUES": ["default", "ordered"],
        }
    }
