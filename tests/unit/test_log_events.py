"""pgqueue's events carry their fields whatever logging the application set up (with
plain ``logging.basicConfig`` they printed as ``WARNING:pgqueue:task.lease_expired``, with no
task id, type or attempt)."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator

import pytest

from pgqueue import log

TASK = uuid.UUID("00000000-0000-4000-8000-000000000001")


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    saved = (log.logger.handlers[:], log.logger.level, log.logger.propagate)
    log.logger.handlers[:] = [handler]
    log.logger.setLevel(logging.INFO)
    log.logger.propagate = False
    yield stream, handler
    log.logger.handlers[:], log.logger.level, log.logger.propagate = saved


def emit() -> None:
    log.event("task.lease_expired", logging.WARNING, task_id=TASK, type="send email", attempt=2)


def test_a_plain_basic_config_format_shows_the_fields(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    emit()
    assert stream.getvalue().strip() == (
        f'WARNING:pgqueue:task.lease_expired task_id={TASK} type="send email" attempt=2'
    )


def test_fields_are_record_attributes_for_format_strings(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logging.Formatter("%(pgqueue_event)s %(task_id)s %(attempt)s"))
    emit()
    assert stream.getvalue().strip() == f"task.lease_expired {TASK} 2"


def test_pgqueue_formatters_show_each_field_once(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(log.TextFormatter())
    emit()
    handler.setFormatter(log.JsonFormatter())
    emit()
    text, doc = stream.getvalue().splitlines()
    assert text.endswith(f'task.lease_expired task_id={TASK} type="send email" attempt=2')
    assert text.count("task_id=") == 1
    fields = json.loads(doc)
    assert (fields["event"], fields["task_id"], fields["attempt"]) == (
        "task.lease_expired",
        str(TASK),
        2,
    )
    assert "message" not in fields


def test_a_field_named_like_a_record_attribute_does_not_break_logging(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.event("maintenance.sweep", name="sweeper", message="x", requeued=3)
    assert stream.getvalue().strip() == "maintenance.sweep name=sweeper message=x requeued=3"
