"""TaskFailed reads the handler's exception type and message out of the stored error text, as
the worker writes it (``error_text.format_exception``), and says plainly when there is none."""

from __future__ import annotations

import types
import uuid
from typing import Any

import pgqueue
from pgqueue.error_text import format_exception


class Declined(Exception):
    pass


def failed_task(last_error: str | None) -> Any:
    return types.SimpleNamespace(
        id=uuid.uuid4(), type="pay", attempts=3, max_attempts=3, last_error=last_error
    )


def stored(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException as raised:  # any exception, as a handler's
        return format_exception(raised)


def test_a_builtin_exceptions_type_and_message_are_read_back() -> None:
    err = pgqueue.TaskFailed(failed_task(stored(ValueError("bad: order 7"))))
    assert (err.exception_type, err.exception_message) == ("ValueError", "bad: order 7")
    assert err.traceback is not None and err.traceback.startswith("Traceback")
    assert str(err).endswith("failed after attempt 3 of 3: ValueError: bad: order 7")


def test_an_application_exception_keeps_its_module_and_a_message_of_several_lines() -> None:
    err = pgqueue.TaskFailed(failed_task(stored(Declined("no funds\nretry tomorrow"))))
    assert err.exception_type == f"{__name__}.Declined"
    assert err.exception_message == "no funds\nretry tomorrow"


def test_an_exception_without_a_message_has_an_empty_one() -> None:
    err = pgqueue.TaskFailed(failed_task(stored(KeyError())))
    assert (err.exception_type, err.exception_message) == ("KeyError", "")


def test_an_error_that_was_no_exception_is_the_message_without_a_type() -> None:
    for text in ("timed out after 5 s", "worker process died (signal 9)", "disk full: /var"):
        err = pgqueue.TaskFailed(failed_task(text))
        assert err.exception_type is None and err.exception_message == text
    err = pgqueue.TaskFailed(failed_task(None))
    assert err.exception_type is None and err.exception_message == "no error recorded"
