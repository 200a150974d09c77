"""The worker's start line says which database it works on, without its password, and
whether that is the embedded server (and where its data is); types whose declared queue it
does not claim are found for the warning that follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

import pgqueue
from pgqueue.worker.service import database_fields, unclaimed_queues


def test_a_server_url_is_named_with_its_password_masked() -> None:
    fields = database_fields("postgresql://app:hunter2@db.internal:5432/jobs")
    assert fields == {"database": "postgresql://app:***@db.internal:5432/jobs"}


def embedded_home(tmp_path: Path, socket_dir: Path) -> Path:
    """A PGQUEUE_HOME whose embedded server's postmaster.pid names ``socket_dir``."""
    data = tmp_path / "home" / "pg18"
    data.mkdir(parents=True)
    lines = ["4242", str(data), "1764900000", "5432", str(socket_dir), "", "  1 2", "ready"]
    (data / "postmaster.pid").write_text("\n".join(lines) + "\n")
    return data


def test_the_embedded_server_is_named_as_such_with_its_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_dir = tmp_path / "sock"
    data = embedded_home(tmp_path, socket_dir)
    monkeypatch.setenv("PGQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PGQUEUE_EMBEDDED_PG_VERSION", "18")
    url = f"postgresql://postgres:@/pgqueue?host={socket_dir}"
    assert database_fields(url) == {
        "database": f"postgresql://postgres:***@/pgqueue?host={socket_dir}",
        "embedded": str(data),
    }


def test_another_server_on_a_unix_socket_is_not_called_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedded_home(tmp_path, tmp_path / "sock")
    monkeypatch.setenv("PGQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PGQUEUE_EMBEDDED_PG_VERSION", "18")
    fields = database_fields("postgresql://postgres@/app?host=/var/run/postgresql")
    assert "embedded" not in fields


def test_no_embedded_server_ever_started_means_not_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_HOME", str(tmp_path / "nothing-here"))
    assert "embedded" not in database_fields("postgresql://postgres:@/pgqueue?host=/tmp/x")


def test_types_whose_declared_queue_is_not_claimed_are_found() -> None:
    tasks = pgqueue.TaskRegistry()

    @tasks.task(queue="mail", name="send_confirmation")
    def send_confirmation(to: str) -> None: ...

    @tasks.task(queue="default", name="resize")
    def resize(path: str) -> None: ...

    @tasks.handler("undeclared")
    def undeclared(payload: object, ctx: object) -> None: ...

    assert unclaimed_queues(tasks, ["default"]) == [("send_confirmation", "mail")]
    assert unclaimed_queues(tasks, ["default", "mail"]) == []
    assert unclaimed_queues(tasks, ["reports"]) == [
        ("resize", "default"),
        ("send_confirmation", "mail"),
    ]
