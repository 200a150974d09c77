"""replay and discard take one task id, as cancel does, or many: a lone id (a UUID or its
text) is one task, never a string of characters; anything else is refused by name."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from helpers import make_dead_letters

import pgqueue


def status_of(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str:
    return pgqueue.get_task(conn, task_id).status


def test_replay_takes_one_id_as_a_uuid_or_as_its_text(conn):
    first, second, untouched = make_dead_letters(conn, 3)

    assert pgqueue.replay(conn, first) == [first]
    assert pgqueue.replay(conn, str(second)) == [second]

    assert status_of(conn, first) == "queued"
    assert status_of(conn, second) == "queued"
    assert status_of(conn, untouched) == "failed"


def test_replay_of_one_id_that_is_not_a_dead_letter_replays_nothing(conn):
    (dead,) = make_dead_letters(conn, 1)
    queued = pgqueue.enqueue(conn, "ok").task.id

    assert pgqueue.replay(conn, queued) == []
    assert pgqueue.replay(conn, uuid.uuid4()) == []
    assert status_of(conn, queued) == "queued"
    assert status_of(conn, dead) == "failed"


def test_replay_and_discard_still_take_any_iterable_of_ids(conn):
    a, b, c, d = make_dead_letters(conn, 4)

    assert sorted(pgqueue.replay(conn, (i for i in [a, str(b)]))) == sorted([a, b])
    assert sorted(pgqueue.discard(conn, {c, d})) == sorted([c, d])


def test_discard_takes_one_id(conn):
    dead, kept = make_dead_letters(conn, 2)

    assert pgqueue.discard(conn, str(dead)) == [dead]

    with pytest.raises(pgqueue.TaskNotFound):
        pgqueue.get_task(conn, dead)
    assert status_of(conn, kept) == "failed"


def test_the_async_forms_take_one_id(conn, database_url):
    replayed, discarded = make_dead_letters(conn, 2)

    async def main() -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            return (
                await pgqueue.aio.replay(aconn, str(replayed)),
                await pgqueue.aio.discard(aconn, discarded),
            )

    assert asyncio.run(main()) == ([replayed], [discarded])
    assert status_of(conn, replayed) == "queued"


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (42, "ids: must be a task id (a UUID or its text) or a list of them, not int"),
        (b"abc", "ids: must be a task id (a UUID or its text) or a list of them, not bytes"),
        ({"id": "x"}, "ids: must be a task id (a UUID or its text) or a list of them, not dict"),
        ([uuid.uuid4(), 7], "ids: each must be a task id (a UUID or its text), not int"),
    ],
)
def test_anything_else_is_refused_naming_what_to_send_and_nothing_changes(conn, ids, message):
    (dead,) = make_dead_letters(conn, 1)

    for operation in (pgqueue.replay, pgqueue.discard):
        with pytest.raises(pgqueue.ValidationError) as caught:
            operation(conn, ids)
        assert str(caught.value) == message
        assert caught.value.field == "ids"
    assert status_of(conn, dead) == "failed"
