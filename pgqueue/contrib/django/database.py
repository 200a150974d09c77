"""Django's database, as pgqueue needs it: its open connection, or a URL to the same server.

Enqueueing must run on the connection Django's ORM uses, so that ``transaction.atomic()``
decides whether the task exists. Django configures that psycopg connection for itself, in
one way that matters here: it loads ``jsonb`` as text (Django decodes JSON fields itself),
while pgqueue reads a task's payload and result as JSON values. :func:`django_connection`
lends the connection with psycopg's JSON loader for the duration of pgqueue's call and gives
Django its own back afterwards. Django's connections are per thread (and per async context),
so nothing else uses this connection meanwhile.

The worker, the migrations and the management commands open connections of their own, to
the server and database Django is configured with: :func:`database_url`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from psycopg.abc import Loader
from psycopg.pq import Format
from psycopg.types.json import JsonbLoader


def _check_postgresql(alias: str) -> Any:
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"pgqueue needs PostgreSQL: the database {alias!r} is {wrapper.vendor}"
        )
    return wrapper


@contextlib.contextmanager
def django_connection(alias: str) -> Iterator[psycopg.Connection[Any]]:
    """The psycopg 3 connection of Django's database ``alias`` (opened if need be), in
    whatever transaction Django has it in, with jsonb read as JSON while it is lent."""
    wrapper = _check_postgresql(alias)
    wrapper.ensure_connection()
    conn = wrapper.connection
    if not isinstance(conn, psycopg.Connection):
        raise ImproperlyConfigured(
            f"pgqueue needs psycopg 3: the database {alias!r} connects with "
            f"{type(conn).__module__} (pip install 'psycopg[binary]')"
        )
    jsonb = conn.adapters.types["jsonb"].oid
    django_loader: type[Loader] | None = conn.adapters.get_loader(jsonb, Format.TEXT)
    conn.adapters.register_loader("jsonb", JsonbLoader)
    try:
        yield conn
    finally:
        if django_loader is not None:
            conn.adapters.register_loader("jsonb", django_loader)


def database_url(alias: str) -> str:
    """A libpq URL to Django's database ``alias``: every connection setting Django would pass
    (NAME, USER, PASSWORD, HOST, PORT and OPTIONS such as sslmode), as query parameters."""
    wrapper = _check_postgresql(alias)
    params = wrapper.get_connection_params()
    keywords = {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}
    kept = {
        key: str(value)
        for key, value in params.items()
        if key in keywords and value not in (None, "")
    }
    return "postgresql://?" + urlencode(sorted(kept.items()))
