"""What a failed attempt's stored error says first (``format_exception``), and what every
reader takes for its summary and traceback (``split_error``): the exception's type and message
first, in the rows the worker writes now and in the rows older versions wrote (traceback
first), and for errors that are plain text."""

from __future__ import annotations

import traceback
import uuid

import pytest

from pgqueue.error_text import (
    MAX_ERROR_LENGTH,
    MAX_SUMMARY_LENGTH,
    TRACEBACK_HEADER,
    format_exception,
    split_error,
)
from pgqueue.models import Failure, Priority


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a real traceback, as the worker's handler would have raised it."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def doomed() -> None:
    raise ValueError("doomed always fails")


def raised_by(function: object) -> BaseException:
    try:
        function()  # type: ignore[operator]
    except BaseException as caught:
        return caught
    raise AssertionError("it did not raise")


def chained_from() -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        raise RuntimeError("could not load the order") from exc


def raised_during() -> None:
    try:
        {}["missing"]
    except KeyError:
        raise RuntimeError("cleanup failed too")  # noqa: B904


def old_layout(exc: BaseException) -> str:
    """The text older versions stored: Python's traceback as is, the exception at its end."""
    return "".join(traceback.format_exception(exc))


# --- what the worker writes now --------------------------------------------------------------


def test_the_exception_comes_first_and_the_traceback_follows_it() -> None:
    text = format_exception(raised_by(doomed))
    assert text.startswith("ValueError: doomed always fails\nTraceback (most recent call last):")
    error = split_error(text)
    assert error.summary == "ValueError: doomed always fails"
    assert error.headline == "ValueError: doomed always fails"
    assert error.traceback is not None
    assert error.traceback.startswith(TRACEBACK_HEADER)
    assert "in doomed" in error.traceback  # the frame where it failed
    assert error.traceback.endswith("ValueError: doomed always fails")


def test_a_chained_exception_is_summarised_by_the_last_one_raised() -> None:
    error = split_error(format_exception(raised_by(chained_from)))
    assert error.summary == "RuntimeError: could not load the order"
    assert error.traceback is not None
    assert "KeyError: 'missing'" in error.traceback  # the cause stays in the traceback
    assert "direct cause of the following exception" in error.traceback


def test_an_exception_raised_while_handling_another_is_summarised_by_itself() -> None:
    error = split_error(format_exception(raised_by(raised_during)))
    assert error.summary == "RuntimeError: cleanup failed too"
    assert error.traceback is not None
    assert "During handling of the above exception" in error.traceback


def test_a_message_of_several_lines_is_the_whole_summary_and_its_first_line_the_headline() -> None:
    exc = raised(ValueError("bad rows:\nrow 3: no amount\n  row 7: negative"))
    error = split_error(format_exception(exc))
    assert error.summary == "ValueError: bad rows:\nrow 3: no amount\n  row 7: negative"
    assert error.headline == "ValueError: bad rows:"
    assert error.traceback is not None and error.traceback.startswith(TRACEBACK_HEADER)


def test_notes_added_to_an_exception_belong_to_its_summary() -> None:
    exc = raised(ValueError("doomed always fails"))
    exc.add_note("while charging order 1042")
    error = split_error(format_exception(exc))
    assert error.summary == "ValueError: doomed always fails\nwhile charging order 1042"
    assert error.headline == "ValueError: doomed always fails"


@pytest.mark.parametrize("exc", [ValueError(), ValueError(""), KeyboardInterrupt()])
def test_an_exception_without_a_message_is_summarised_by_its_type(exc: BaseException) -> None:
    error = split_error(format_exception(raised(exc)))
    assert error.summary == type(exc).__name__
    assert error.traceback is not None and error.traceback.startswith(TRACEBACK_HEADER)


def test_an_exception_whose_str_fails_is_still_summarised_by_its_type() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    error = split_error(format_exception(raised(Unprintable())))
    assert error.summary.endswith("Unprintable: <exception str() failed>")
    assert error.traceback is not None


def test_an_exception_group_is_summarised_by_the_group_and_keeps_its_members_below() -> None:
    group = raised(ExceptionGroup("2 charges failed", [ValueError("card"), TypeError("amount")]))
    error = split_error(format_exception(group))
    assert error.summary == "ExceptionGroup: 2 charges failed (2 sub-exceptions)"
    assert error.traceback is not None
    assert error.traceback.lstrip().startswith("+ Exception Group Traceback")
    assert "ValueError: card" in error.traceback and "TypeError: amount" in error.traceback
    assert not error.traceback.startswith("ExceptionGroup")  # the summary is not repeated


def test_a_very_long_message_is_cut_but_still_comes_first_within_the_column() -> None:
    text = format_exception(raised(ValueError("x" * 50_000)))
    assert len(text) <= MAX_ERROR_LENGTH
    error = split_error(text)
    assert error.summary.startswith("ValueError: xxx")
    assert error.summary.endswith("…")
    assert len(error.summary) == MAX_SUMMARY_LENGTH
    assert error.traceback is not None and error.traceback.startswith(TRACEBACK_HEADER)


def test_a_very_deep_traceback_loses_its_oldest_frames_not_the_exception() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise ValueError("doomed always fails " + "y" * 1500)
        recurse(n - 1)

    text = format_exception(raised_by(lambda: recurse(400)))
    assert len(text) <= MAX_ERROR_LENGTH
    error = split_error(text)
    assert error.summary.startswith("ValueError: doomed always fails yyy")
    assert error.traceback is not None
    assert error.traceback.startswith(TRACEBACK_HEADER)
    assert "in recurse" in error.traceback


# --- rows older versions wrote (the traceback first) -----------------------------------------


def test_an_old_row_is_summarised_by_the_exception_at_its_end() -> None:
    error = split_error(old_layout(raised_by(doomed)))
    assert error.summary == "ValueError: doomed always fails"
    assert error.traceback == old_layout(raised_by(doomed)).rstrip()


def test_an_old_row_of_a_chained_exception_is_summarised_by_the_last_one() -> None:
    error = split_error(old_layout(raised_by(chained_from)))
    assert error.summary == "RuntimeError: could not load the order"


def test_an_old_row_with_a_message_of_several_lines_keeps_the_whole_message() -> None:
    exc = raised(ValueError("bad rows:\nrow 3: no amount\n  row 7: negative"))
    error = split_error(old_layout(exc))
    assert error.summary == "ValueError: bad rows:\nrow 3: no amount\n  row 7: negative"
    assert error.headline == "ValueError: bad rows:"


def test_an_old_row_of_an_exception_without_a_message_is_summarised_by_its_type() -> None:
    assert split_error(old_layout(raised(ValueError()))).summary == "ValueError"


def test_an_old_row_of_an_exception_group_is_summarised_by_the_group() -> None:
    group = raised(ExceptionGroup("2 charges failed", [ValueError("card"), TypeError("amount")]))
    error = split_error(old_layout(group))
    assert error.summary == "ExceptionGroup: 2 charges failed (2 sub-exceptions)"


@pytest.mark.parametrize("cut", [1, 17, 40, 60])
def test_an_old_row_cut_at_its_start_is_still_summarised_by_its_exception(cut: int) -> None:
    """Old rows kept the last 8000 characters, so a long one starts mid-traceback."""
    text = old_layout(raised_by(chained_from))[cut:]
    error = split_error(text)
    assert error.summary == "RuntimeError: could not load the order"
    assert error.traceback is not None


# --- errors that are plain text ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["timed out after 5 s", "Retry: the card network is down", "ValueError: boom"],
)
def test_a_plain_error_is_its_own_summary_without_a_traceback(text: str) -> None:
    error = split_error(text)
    assert error.summary == text
    assert error.traceback is None


def test_a_plain_error_of_several_lines_is_the_summary_and_its_first_line_the_headline() -> None:
    error = split_error("\n\nupstream said no\nstatus 503\n\n")
    assert error.summary == "upstream said no\nstatus 503"
    assert error.headline == "upstream said no"
    assert error.traceback is None


@pytest.mark.parametrize("text", ["", "   ", "\n\n \n"])
def test_an_empty_error_has_an_empty_summary_and_no_traceback(text: str) -> None:
    error = split_error(text)
    assert error.summary == ""
    assert error.headline == ""
    assert error.traceback is None


def test_a_long_plain_error_is_kept_whole() -> None:
    text = "z" * MAX_ERROR_LENGTH
    error = split_error(text)
    assert error.summary == text
    assert error.traceback is None


@pytest.mark.parametrize("last_error", [None, "ValueError: boom"])
def test_a_failure_without_an_error_has_none_and_one_with_text_is_split(
    last_error: str | None,
) -> None:
    failure = Failure(
        task_id=uuid.uuid4(),
        dead=True,
        type="payment.capture",
        queue="payments",
        priority=Priority.NORMAL,
        attempts=1,
        max_attempts=1,
        last_error=last_error,
        started_at=None,
        retry_at=None,
        finished_at=None,
    )
    if last_error is None:
        assert failure.error is None
    else:
        assert failure.error == split_error(last_error)
