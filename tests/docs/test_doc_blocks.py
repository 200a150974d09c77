"""The parser of the docs' code blocks (tests/docs/doc_blocks.py) keeps the contract pages are
written to: what runs, what is a file, what is skipped and why, and which page runs first."""

from __future__ import annotations

import pytest
from doc_blocks import DocBlockError, commands, parse_page, python_source
from doc_session import (
    PageSession,
    _background,
    _logs_its_start,
    _words,
    curl_fails_on_http_errors,
    runs,
    strip_comment,
)


def test_a_python_block_whose_first_line_is_a_path_is_a_file() -> None:
    page = parse_page(
        "docs/x.md",
        "Intro\n\n```python\n# app/tasks.py\nimport pgqueue\n```\n\n"
        "```python\n# app/other.py  (the second module)\nx = 1\n```\n\n"
        "```python\n# a comment, not a path\nprint(1)\n```\n",
    )
    kinds = [(b.kind, b.file_path) for b in page.blocks]
    assert kinds == [("file", "app/tasks.py"), ("file", "app/other.py"), ("python", None)]
    assert page.blocks[0].line == 4
    assert page.blocks[0].text == "# app/tasks.py\nimport pgqueue\n"


def test_a_file_block_may_not_leave_the_page_directory() -> None:
    page = parse_page("docs/x.md", "```python\n# ../escape.py\n```\n")
    with pytest.raises(DocBlockError, match="under the page's directory"):
        _ = page.blocks[0].file_path


def test_a_skip_without_a_reason_is_refused() -> None:
    with pytest.raises(DocBlockError, match="needs a reason"):
        parse_page("docs/x.md", "<!-- docs-test: skip -->\n```python\nboom()\n```\n")


def test_a_skip_with_a_reason_marks_only_the_next_block() -> None:
    page = parse_page(
        "docs/x.md",
        "<!-- docs-test: skip needs a Django project -->\n```python\nboom()\n```\n"
        "```python\nfine()\n```\n",
    )
    assert [b.skip for b in page.blocks] == ["needs a Django project", None]


def test_a_skip_marker_away_from_a_fence_is_refused() -> None:
    with pytest.raises(DocBlockError, match="just before a fence"):
        parse_page("docs/x.md", "<!-- docs-test: skip why -->\n\n```python\nboom()\n```\n")
    with pytest.raises(DocBlockError, match="just before a fence"):
        parse_page("docs/x.md", "text\n<!-- docs-test: skip why -->\n")


def test_an_unknown_marker_is_refused() -> None:
    with pytest.raises(DocBlockError, match="unknown marker"):
        parse_page("docs/x.md", "<!-- docs-test: skipp typo -->\n```python\nx\n```\n")


def test_after_names_the_pages_that_run_first() -> None:
    page = parse_page(
        "docs/tutorial/worker.md",
        "<!-- docs-test: after docs/tutorial/first-task.md -->\n# The worker\n",
    )
    assert page.after == ["docs/tutorial/first-task.md"]
    with pytest.raises(DocBlockError, match="needs a path"):
        parse_page("docs/x.md", "<!-- docs-test: after -->\n")


def test_indented_fences_are_dedented_and_tildes_and_info_strings_work() -> None:
    page = parse_page(
        "docs/x.md",
        '!!! note\n\n    ```python title="app.py"\n    def f():\n        return 1\n    ```\n\n'
        "1. Step\n\n    ~~~py\n    x = 2\n    ~~~\n\n"
        "````console\n$ pgqueue worker app:tasks\n```\nnot a fence end\n````\n",
    )
    assert [(b.language, b.line) for b in page.blocks] == [
        ("python", 4),
        ("py", 11),
        ("console", 15),
    ]
    assert page.blocks[0].text == "def f():\n    return 1\n"
    assert page.blocks[1].kind == "python"
    assert "not a fence end" in page.blocks[2].text


def test_an_unclosed_fence_is_refused() -> None:
    with pytest.raises(DocBlockError, match="never closed"):
        parse_page("docs/x.md", "```python\nx = 1\n")


def test_console_commands_join_continuation_lines_and_skip_output() -> None:
    page = parse_page(
        "docs/x.md",
        "```console\n$ pgqueue enqueue send_receipt \\\n    --payload '{\"order\": 1}'\n"
        "3f1c...  queued\n$ pgqueue status 3f1c\nstatus: completed\n```\n",
    )
    found = commands(page.blocks[0])
    assert [(c.line, c.text, c.output) for c in found] == [
        (2, "pgqueue enqueue send_receipt --payload '{\"order\": 1}'", "3f1c...  queued"),
        (5, "pgqueue status 3f1c", "status: completed"),
    ]


def test_python_source_keeps_the_page_line_numbers() -> None:
    page = parse_page("docs/x.md", "a\nb\n```python\nraise ValueError\n```\n")
    code = compile(python_source(page.blocks[0]), "x", "exec")
    with pytest.raises(ValueError) as raised:
        exec(code, {})
    assert raised.traceback[-1].lineno + 1 == 4


def test_which_commands_run_in_the_background() -> None:
    assert _background(_words("pgqueue worker app.tasks:tasks --concurrency 4")) == "worker"
    assert _background(_words("PGQUEUE_API_TOKENS=t pgqueue serve --port 8000")) == "serve"
    assert _background(_words("python -m pgqueue worker app:tasks")) == "worker"
    assert _background(_words("pgqueue worker --help")) is None
    assert _background(_words("pgqueue status 3f1c")) is None
    assert _background(_words("curl localhost:8000/healthz")) is None


def test_which_commands_run_and_which_are_shown() -> None:
    assert runs(_words("pgqueue migrate"))
    assert runs(_words("python app/checkout.py"))
    assert runs(_words("PGQUEUE_LOG_FORMAT=json python3 -m pgqueue list"))
    assert runs(_words("curl -s localhost:8000/healthz | python -m json.tool"))
    assert not runs(_words("python3 -m venv .venv"))
    assert not runs(_words("python -m pip install 'pgqueue-jobs[api]'"))
    assert not runs(_words("pip install 'pgqueue-jobs[api]'"))
    assert not runs(_words("export PGQUEUE_DATABASE_URL=postgresql://localhost/app"))
    assert not runs(_words("psql \"$PGQUEUE_DATABASE_URL\" -c 'TABLE pgqueue.queue_depth'"))


def test_a_trailing_comment_is_not_part_of_the_command() -> None:
    assert strip_comment("pgqueue serve   # in another terminal") == "pgqueue serve"
    assert strip_comment("pgqueue enqueue x --payload '{\"#\": 1}' # c") == (
        "pgqueue enqueue x --payload '{\"#\": 1}'"
    )
    assert strip_comment("curl localhost:8000/a#b") == "curl localhost:8000/a#b"
    assert strip_comment('echo "a\\" #b" # c') == 'echo "a\\" #b"'


def test_curl_fails_on_an_http_error_unless_it_shows_the_status() -> None:
    def fixed(text: str) -> str:
        return curl_fails_on_http_errors(text, _words(text))

    assert fixed("curl -s localhost:8000/x") == "curl --fail-with-body -s localhost:8000/x"
    assert fixed("T=1 curl -s a | python -m json.tool") == (
        "T=1 curl --fail-with-body -s a | python -m json.tool"
    )
    for shows in ("curl -i a", "curl -fsS a", "curl -w '%{http_code}' a", "curl --head a"):
        assert fixed(shows) == shows
    assert fixed("pgqueue status x") == "pgqueue status x"


def test_port_8000_becomes_the_page_port(tmp_path: object) -> None:
    session = PageSession.__new__(PageSession)
    session.port = 54321
    assert (
        session.substitute("curl http://localhost:8000/tasks; pgqueue serve --port 8000")
        == "curl http://localhost:54321/tasks; pgqueue serve --port 54321"
    )
    assert session.substitute("127.0.0.1:80001") == "127.0.0.1:80001"


def test_a_worker_logging_above_info_is_not_waited_for_by_its_start_line() -> None:
    assert _logs_its_start(_words("pgqueue worker app.tasks:tasks"))
    assert _logs_its_start(_words("pgqueue worker app.tasks:tasks --log-level debug"))
    assert not _logs_its_start(_words("pgqueue worker app.tasks:tasks --log-level warning"))
    assert not _logs_its_start(_words("pgqueue worker app.tasks:tasks --log-level=ERROR"))
