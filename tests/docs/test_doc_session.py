"""The page runner itself (tests/docs/doc_session.py), on small pages of its own against real
PostgreSQL: a file block a worker process loads, a console worker in the background, an
async block whose objects the next block uses, the HTTP API on the page's port, and failures
that name the page's line."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from doc_blocks import parse_page
from doc_session import PageSession, free_port, threads_left

from pgqueue import defaults

TASKS = """
```python
# app/tasks.py
import pgqueue

tasks = pgqueue.TaskRegistry()


@tasks.task(name="send_receipt")
def send_receipt(order_id: int) -> dict[str, int]:
    return {"sent": order_id}
```
"""

WORKER = """
In another terminal:

```console
$ pgqueue worker app.tasks:tasks
```
"""

WAIT = """
```python
import os

import psycopg

from app.tasks import send_receipt

with psycopg.connect(os.environ["PGQUEUE_DATABASE_URL"], autocommit=True) as conn:
    handle = send_receipt.enqueue(conn, 42)
    task = handle.wait(conn, timeout=30)
assert task.status == "completed", task
assert task.result == {"sent": 42}
```
"""


@pytest.fixture
def run_page(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], PageSession]]:
    """Run the Markdown text given as page ``docs/sample.md`` in a session of its own."""
    sessions: list[PageSession] = []

    def _run(text: str) -> PageSession:
        directory = tmp_path / f"s{len(sessions)}" / "page"
        directory.mkdir(parents=True)
        session = PageSession(directory, database_url, free_port())
        sessions.append(session)
        monkeypatch.chdir(directory)
        monkeypatch.syspath_prepend(str(directory))
        for name, value in session.env.items():
            monkeypatch.setenv(name, value)
        for block in parse_page("docs/sample.md", text).blocks:
            session.run(block)
        return session

    yield _run
    for session in sessions:
        session.close()
    defaults.reset()
    for name in [n for n in sys.modules if n == "app" or n.startswith("app.")]:
        del sys.modules[name]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_started_by_a_console_block_runs_the_tasks_of_a_file_block(
    run_page: Callable[[str], PageSession],
) -> None:
    session = run_page(TASKS + WORKER + WAIT)
    assert (session.directory / "app" / "__init__.py").is_file()
    [worker] = session.background
    assert worker.proc.poll() is None
    # A later block's failure shows the worker's log with it.
    with pytest.raises(pytest.fail.Exception) as failed:
        for block in parse_page("docs/sample.md", "```python\nassert False\n```\n").blocks:
            session.run(block)
    assert "`pgqueue worker app.tasks:tasks` (page line 17), running" in str(failed.value)
    assert "worker.started" in str(failed.value)
    session.close()
    assert worker.proc.poll() is not None
    assert session.died() == []


@pytest.mark.timeout(60)
def test_an_awaiting_block_and_the_next_share_the_pages_event_loop(
    run_page: Callable[[str], PageSession],
) -> None:
    session = run_page(
        "```python\nimport asyncio\n\nloop = asyncio.get_running_loop()\n"
        "queue: asyncio.Queue[int] = asyncio.Queue()\nawait queue.put(1)\n```\n\n"
        "```python\nassert asyncio.get_running_loop() is loop\nvalue = await queue.get()\n```\n"
    )
    assert session.namespace["value"] == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_answers_curl_on_the_pages_port(run_page: Callable[[str], PageSession]) -> None:
    session = run_page(
        "```console\n$ pgqueue serve\n```\n\n"
        "```console\n$ curl -fsS http://localhost:8000/healthz\n```\n\n"
        "```python\nimport urllib.request\n\n"
        'with urllib.request.urlopen("http://127.0.0.1:8000/healthz") as r:\n'
        "    status = r.status\n```\n"
    )
    assert session.namespace["status"] == 200
    [server] = session.background
    assert f"--port {session.port}" in server.command.text
    # A documented request the server refuses is a failing example...
    missing = "```console\n$ curl -s localhost:8000/api/v1/tasks/" + str(uuid.uuid4()) + "\n```\n"
    with pytest.raises(pytest.fail.Exception, match="exited 22"):
        for block in parse_page("docs/sample.md", missing).blocks:
            session.run(block)
    # ...unless the page shows the error as its answer: then it must be one.
    shown = missing.replace("\n```", '\n{"error":"not_found", ...}\n```')
    for block in parse_page("docs/sample.md", shown).blocks:
        session.run(block)
    wrong = shown.replace("/api/v1/tasks/", "/healthz?")
    with pytest.raises(pytest.fail.Exception, match="answered with an error, but it was not"):
        for block in parse_page("docs/sample.md", wrong).blocks:
            session.run(block)


def test_a_failing_block_names_the_page_and_its_line(
    run_page: Callable[[str], PageSession],
) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_page("Intro\n\n```python\nx = 1\nraise ValueError('no such order')\n```\n")
    text = str(failed.value)
    assert "docs/sample.md: the python block at line 4 raised" in text
    assert 'docs/sample.md", line 5' in text
    assert "ValueError: no such order" in text
    assert "doc_session.py" not in text


def test_a_failing_command_shows_its_output(run_page: Callable[[str], PageSession]) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_page("```console\n$ pgqueue status not-a-task-id\n$ pip install nothing\n```\n")
    text = str(failed.value)
    assert "docs/sample.md:2: `pgqueue status not-a-task-id` exited" in text
    assert "not-a-task-id" in text.split("stderr:", 1)[1]


def test_skipped_blocks_and_other_commands_are_not_run(
    run_page: Callable[[str], PageSession],
) -> None:
    session = run_page(
        "<!-- docs-test: skip needs a Django project -->\n```python\nraise SystemExit\n```\n\n"
        "```console\n$ pip install 'pgqueue-jobs[api]'\n$ export PGQUEUE_X=1\n```\n\n"
        "```console\n$ python -c 'import psycopg, pgqueue'\n```\n\n"
        "```sql\nSELECT nonsense;\n```\n"
    )
    assert session.background == []


def test_a_thread_a_page_leaves_running_is_named() -> None:
    before = set(threading.enumerate())
    release = threading.Event()
    left = threading.Thread(target=release.wait, name="page-worker")
    done = threading.Thread(target=lambda: None, name="finished")
    daemon = threading.Thread(target=release.wait, name="daemon", daemon=True)
    for thread in (left, done, daemon):
        thread.start()
    try:
        assert threads_left(before, wait=0.3) == ["page-worker"]
    finally:
        release.set()
    assert threads_left(before, wait=5) == []
