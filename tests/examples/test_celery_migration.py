"""examples/celery_app against a real Redis (a private redis-server) and real PostgreSQL: the
shop on Celery and its pgqueue port each run by their own real workers, and the move between
them: a moved task's Celery call sites land in pgqueue, and the messages left in Redis are
forwarded into pgqueue once each (keyed by their Celery id), never lost on the way, and run
once by a pgqueue worker while the other tasks' messages stay for Celery.

Without ``redis-server`` these tests skip, unless ``PGQUEUE_REQUIRE_REDIS`` is set (as
.ci/run sets it), where they fail instead."""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from acceptance.test_worker_processes import Workers, wait_until

import pgqueue

pytest.importorskip("celery")
redis = pytest.importorskip("redis")

ROOT = Path(__file__).resolve().parents[2]  # where `import examples` works
REDIS_SERVER = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
)
MOVED = ("shop.send_welcome", "shop.charge")  # what examples/celery_app/moving.py moves


# --- a private Redis ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this module's own on a free loopback port (flushed per test): the
    Celery app reads its broker once, at import."""
    if REDIS_SERVER is None:
        if os.environ.get("PGQUEUE_REQUIRE_REDIS"):
            pytest.fail(
                "PGQUEUE_REQUIRE_REDIS is set (as .ci/run sets it) but redis-server was not "
                "found: apt-get install redis-server"
            )
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    directory = tmp_path_factory.mktemp("redis")
    port = _free_port()
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(directory),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(directory / "redis.log"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)

        def answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited ({proc.returncode})")
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, timeout=20, what="redis-server to answer")
        client.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def broker(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def shop(
    redis_url: str, broker: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """The example's modules, on this test's database and the module's Redis."""
    monkeypatch.setenv("SHOP_BROKER_URL", redis_url)
    monkeypatch.setenv("SHOP_DATABASE_URL", database_url)
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", database_url)
    from examples.celery_app import celery_app, moving, pgqueue_app
    from examples.celery_app import shop as shop_module

    celery_app.app.conf.broker_url = redis_url
    celery_app.app.conf.result_backend = redis_url
    with psycopg.connect(database_url, autocommit=True) as c:
        shop_module.create_schema(c)

    class Shop:
        celery = celery_app
        port = pgqueue_app
        move = moving
        url = database_url

    yield Shop
    from pgqueue.contrib import celery as contrib

    contrib._clients.close()  # the next test has another database
    gc.collect()  # Celery's results unsubscribe now, not at the interpreter's exit


def queued_in_redis(broker: Any, queue: str = "celery") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]


def tasks_of(conn: psycopg.Connection[Any], type_: str) -> list[pgqueue.Task]:
    return [t for t in pgqueue.list_tasks(conn, type=type_, limit=100)]


def outbox(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    rows = conn.execute("SELECT recipient, sent_by FROM shop_outbox ORDER BY recipient").fetchall()
    return [(r[0], r[1]) for r in rows]


# --- real workers -----------------------------------------------------------------------------


@pytest.fixture
def celery_worker(shop: Any, redis_url: str, database_url: str, tmp_path: Path) -> Iterator[Any]:
    """A real Celery worker of the example app (solo pool), in a process group of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SHOP_BROKER_URL": redis_url,
        "SHOP_DATABASE_URL": database_url,
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "celery.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "examples.celery_app.celery_app", "worker",
             "--pool", "solo", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-Q", "celery", "-n", f"shop-{uuid.uuid4().hex[:8]}@test"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=tmp_path, start_new_session=True,
        )  # fmt: skip
    yield proc
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.returncode not in (0, -signal.SIGKILL):
        print(log.read_text()[-4000:])


PORT = "examples.celery_app.pgqueue_app:tasks"


# --- both apps, each on its own workers -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_celery_app_retries_the_mailer_runs_a_chord_and_a_countdown_on_a_celery_worker(
    shop: Any, celery_worker: Any, conn: psycopg.Connection[Any]
) -> None:
    sent = shop.celery.send_welcome.delay(1, "ada@flaky.example")
    assert isinstance(sent.get(timeout=90), int)  # the first attempt failed: retried once
    album = shop.celery.publish(7, [3, 1, 2])
    assert album.get(timeout=60) == {
        "album_id": 7,
        "thumbnails": ["thumbs/1-200.jpg", "thumbs/2-200.jpg", "thumbs/3-200.jpg"],
    }
    charged = shop.celery.charge.apply_async((5, 900), countdown=1)
    assert charged.get(timeout=60) == {"order_id": 5, "charged": 900}
    assert outbox(conn) == [("ada@flaky.example", "celery")]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_pgqueue_port_retries_the_mailer_runs_the_chord_and_a_delay_on_a_pgqueue_worker(
    shop: Any, workers: Workers, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    worker = workers.start(database_url, "--poll-interval", "0.2", registry=PORT)
    sent = shop.port.send_welcome.enqueue(conn, 1, "ada@flaky.example")
    done = wait_until(
        lambda: (t := pgqueue.get_task(conn, sent.id)).status == "completed" and t,
        timeout=90,
        what="the welcome e-mail",
        alive=[worker],
    )
    assert done.attempts == 2  # the mailer was down on the first
    album = shop.port.publish(7, [3, 1, 2]).enqueue(conn)
    assert album.wait(conn, timeout=60) == {
        "album_id": 7,
        "thumbnails": ["thumbs/1-200.jpg", "thumbs/2-200.jpg", "thumbs/3-200.jpg"],
    }
    charged = shop.port.charge.options(delay=1).enqueue(conn, 5, 900)
    assert charged.wait(conn, timeout=60).result == {"order_id": 5, "charged": 900}
    assert outbox(conn) == [("ada@flaky.example", "pgqueue")]
    schedules = wait_until(
        lambda: pgqueue.list_schedules(conn), timeout=30, what="the worker's schedules"
    )
    assert [(s["name"], s["type"]) for s in schedules] == [
        ("nightly-report", "shop.nightly_report")
    ]


# --- the move: call sites ---------------------------------------------------------------------


def test_a_moved_tasks_celery_call_sites_submit_to_pgqueue_and_the_others_still_go_to_redis(
    shop: Any, broker: Any, conn: psycopg.Connection[Any]
) -> None:
    from pgqueue.contrib.celery import MovedResult

    welcome = shop.move.send_welcome.delay(3, "bo@example.com")
    assert isinstance(welcome, MovedResult) and welcome.created
    task = pgqueue.get_task(conn, uuid.UUID(welcome.id))
    assert (task.type, task.payload) == (
        "shop.send_welcome",
        {"user_id": 3, "email": "bo@example.com"},
    )
    assert welcome.status == "PENDING" and not welcome.ready()

    before = datetime.now(UTC)
    celery_id = str(uuid.uuid4())
    charged = shop.move.charge.apply_async(
        (8,), {"amount_cents": 100}, countdown=60, task_id=celery_id, expires=600
    )
    task = pgqueue.get_task(conn, uuid.UUID(charged.id))
    assert task.idempotency_key == celery_id
    assert timedelta(seconds=59) <= task.visible_after - before <= timedelta(seconds=65)
    assert task.expires_at is not None
    assert timedelta(seconds=599) <= task.expires_at - before <= timedelta(seconds=605)
    again = shop.move.charge.apply_async((8, 100), task_id=celery_id)
    assert (again.id, again.created) == (charged.id, False)  # task_id: one task

    eta = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = shop.move.charge.apply_async((9, 1), eta=eta, queue="billing", priority="high")
    task = pgqueue.get_task(conn, uuid.UUID(later.id))
    assert (task.visible_after, task.queue, task.priority) == (eta, "billing", 0)

    assert broker.llen("celery") == 0  # nothing of the moved tasks went to Redis
    shop.move.resize.delay(1, 100)  # not moved: Celery's, as before
    assert [m["headers"]["task"] for m in queued_in_redis(broker)] == ["shop.resize"]
    assert len(tasks_of(conn, "shop.send_welcome")) == 1
    assert len(tasks_of(conn, "shop.charge")) == 2


def test_a_moved_tasks_call_refuses_what_pgqueue_cannot_honour_and_writes_nothing(
    shop: Any, broker: Any, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(pgqueue.ValidationError, match="link"):
        shop.move.charge.apply_async((1, 2), link=shop.move.resize.s(3))
    with pytest.raises(pgqueue.ValidationError, match=r"pgqueue\.chain"):
        shop.move.send_welcome.s(1, "a@example.com")
    with pytest.raises(pgqueue.InvalidArgument, match="user_id"):
        shop.move.send_welcome.delay("one", "a@example.com")
    with pytest.raises(pgqueue.ValidationError, match="countdown or eta"):
        shop.move.charge.apply_async((1, 2), countdown=1, eta=datetime.now(UTC))
    assert pgqueue.list_tasks(conn) == [] and broker.llen("celery") == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_moved_call_sites_result_gets_the_pgqueue_workers_result_and_its_status(
    shop: Any, workers: Workers, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    workers.start(database_url, "--poll-interval", "0.2", registry=PORT)
    result = shop.move.charge.delay(11, 250)
    assert result.get(timeout=60) == {"order_id": 11, "charged": 250}
    assert (result.status, result.ready(), result.successful()) == ("SUCCESS", True, True)
    welcome = shop.move.send_welcome.delay(12, "cy@flaky.example")
    assert isinstance(welcome.get(timeout=90), int)
    assert outbox(conn) == [("cy@flaky.example", "pgqueue")]


# --- the move: the messages left in Redis -----------------------------------------------------


def produce_leftovers(shop: Any, broker: Any) -> dict[str, str]:
    """What the Celery producers left in Redis before the move: Celery ids by what they are."""
    ids = {
        "ada": shop.celery.send_welcome.delay(1, "ada@example.com").id,
        "bo": shop.celery.send_welcome.apply_async(kwargs={"user_id": 2, "email": "bo@x.org"}).id,
        "cy": shop.celery.send_welcome.delay(3, "cy@flaky.example").id,
        "charge": shop.celery.charge.apply_async((5, 900), countdown=3600).id,
        "resize": shop.celery.resize.delay(1, 200).id,  # not moved
    }
    # A redelivery: the same message (its Celery id) in the queue twice.
    first = next(m for m in broker.lrange("celery", 0, -1) if ids["ada"].encode() in m)
    broker.lpush("celery", first)
    return ids


def forward(shop: Any, redis_url: str, **options: Any) -> Any:
    """The forwarder of the shop mid-move: its moved tasks by name, unless ``only`` gives
    them otherwise."""
    from pgqueue.contrib.celery import forward as forward_messages

    options.setdefault("only", MOVED)
    return forward_messages(redis_url, shop.port.tasks, **options)


@pytest.mark.parametrize("given", ["by name", "as function tasks"])
def test_the_forwarder_moves_the_moved_tasks_messages_into_pgqueue_once_each_and_leaves_the_rest(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any], given: str
) -> None:
    only = MOVED if given == "by name" else [shop.port.send_welcome, shop.port.charge]
    ids = produce_leftovers(shop, broker)
    eta = next(
        datetime.fromisoformat(m["headers"]["eta"])
        for m in queued_in_redis(broker)
        if m["headers"]["id"] == ids["charge"]
    )
    report = forward(shop, redis_url, only=only)
    assert (report.forwarded, report.duplicates, report.left, report.refused) == (4, 1, 1, {})

    left = queued_in_redis(broker)
    assert [m["headers"]["id"] for m in left] == [ids["resize"]]
    assert broker.llen("pgqueue:celery-forwarding:celery") == 0
    welcomes = {t.idempotency_key: t for t in tasks_of(conn, "shop.send_welcome")}
    assert set(welcomes) == {ids["ada"], ids["bo"], ids["cy"]}
    assert welcomes[ids["bo"]].payload == {"user_id": 2, "email": "bo@x.org"}
    [charge] = tasks_of(conn, "shop.charge")
    assert (charge.idempotency_key, charge.payload) == (
        ids["charge"],
        {"order_id": 5, "amount_cents": 900},
    )
    assert charge.visible_after == eta  # the countdown, as the eta Celery wrote

    # A second run (a forwarder restarted, Celery's redelivery after it): nothing doubles.
    again = forward(shop, redis_url, only=only)
    assert (again.forwarded, again.duplicates, again.left) == (0, 0, 1)
    assert len(tasks_of(conn, "shop.send_welcome")) == 3


def test_a_forwarder_that_cannot_commit_keeps_every_message_and_the_next_run_forwards_each_once(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    ids = produce_leftovers(shop, broker)
    with socket.socket() as s:  # a port nothing listens on: the database is down
        s.bind(("127.0.0.1", 0))
        down = f"postgresql://postgres@127.0.0.1:{s.getsockname()[1]}/postgres?connect_timeout=2"
    with pytest.raises(pgqueue.PgQueueError):
        forward(shop, redis_url, database_url=down)

    # Taken or not, every message is still in Redis: in the queue or the forwarder's list.
    held = broker.lrange("celery", 0, -1) + broker.lrange("pgqueue:celery-forwarding:celery", 0, -1)
    assert sorted(json.loads(m)["headers"]["id"] for m in held) == sorted(
        [*ids.values(), ids["ada"]]
    )
    report = forward(shop, redis_url)
    assert report.forwarded == 4
    assert broker.llen("pgqueue:celery-forwarding:celery") == 0
    assert sorted(t.idempotency_key or "" for t in tasks_of(conn, "shop.send_welcome")) == sorted(
        [ids["ada"], ids["bo"], ids["cy"]]
    )
    assert [m["headers"]["id"] for m in queued_in_redis(broker)] == [ids["resize"]]


def test_messages_the_forwarder_cannot_forward_stay_in_redis_with_the_reason_and_expired_go(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    from celery import chain

    chained = chain(shop.celery.charge.s(1, 2), shop.celery.resize.s(3)).delay()
    wrong = shop.celery.app.send_task("shop.send_welcome", args=[1, "a@x.org", "extra"])
    expired = shop.celery.charge.apply_async((3, 4), expires=datetime.now(UTC) - timedelta(1))
    body = base64.b64encode(pickle.dumps(((1, 2), {}, {}))).decode()
    pickled = {
        "body": body,
        "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {"task": "shop.charge", "id": "pickled-1", "lang": "py"},
        "properties": {"body_encoding": "base64", "delivery_tag": "t1", "priority": 0},
    }
    broker.lpush("celery", json.dumps(pickled))

    report = forward(shop, redis_url)
    assert (report.forwarded, report.expired) == (0, 1)
    assert set(report.refused) == {wrong.id, "pickled-1", chained.parent.id}
    assert "chain" in report.refused[chained.parent.id]
    assert "application/x-python-serialize" in report.refused["pickled-1"]
    assert "3 positional" in report.refused[wrong.id]
    left = {m["headers"]["id"] for m in queued_in_redis(broker)}
    assert left == {wrong.id, "pickled-1", chained.parent.id}
    assert expired.id not in left
    assert pgqueue.list_tasks(conn) == []


def test_the_forwarder_reads_every_priority_list_of_a_queue(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    sent = [shop.celery.charge.apply_async((i, 1), priority=p).id for i, p in enumerate([0, 5, 9])]
    assert broker.llen("celery") == 1  # the others in kombu's lists of their priority steps
    report = forward(shop, redis_url)
    assert report.forwarded == 3
    assert sorted(t.idempotency_key or "" for t in tasks_of(conn, "shop.charge")) == sorted(sent)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_forwarded_messages_run_once_on_a_pgqueue_worker_while_celery_keeps_the_rest(
    shop: Any,
    broker: Any,
    redis_url: str,
    workers: Workers,
    database_url: str,
    conn: psycopg.Connection[Any],
) -> None:
    ids = produce_leftovers(shop, broker)
    worker = workers.start(database_url, "--poll-interval", "0.2", registry=PORT)
    assert forward(shop, redis_url).forwarded == 4
    assert forward(shop, redis_url).forwarded == 0  # run twice: nothing doubles

    def welcomed() -> list[pgqueue.Task] | None:
        done = [t for t in tasks_of(conn, "shop.send_welcome") if t.status == "completed"]
        return done if len(done) == 3 else None

    done = wait_until(welcomed, timeout=90, what="the forwarded welcomes", alive=[worker])
    assert sorted(t.idempotency_key or "" for t in done) == sorted(
        [ids["ada"], ids["bo"], ids["cy"]]
    )
    assert outbox(conn) == [
        ("ada@example.com", "pgqueue"),
        ("bo@x.org", "pgqueue"),
        ("cy@flaky.example", "pgqueue"),
    ]
    assert [m["headers"]["id"] for m in queued_in_redis(broker)] == [ids["resize"]]


def test_pgqueue_celery_forward_forwards_the_named_tasks_and_reports_in_json(
    shop: Any, broker: Any, redis_url: str, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    ids = produce_leftovers(shop, broker)
    command = [sys.executable, "-m", "pgqueue", "--json", "celery", "forward", PORT]
    # A type by name, and a function task (module:function) itself.
    command += ["--broker", redis_url, "--task", "examples.celery_app.pgqueue_app:send_welcome"]
    command += ["--task", "shop.charge"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PGQUEUE_DATABASE_URL": database_url}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "forwarded": 4,
        "duplicates": 1,
        "expired": 0,
        "refused": {},
        "left": 1,
    }
    assert [m["headers"]["id"] for m in queued_in_redis(broker)] == [ids["resize"]]

    # A Celery name that moved under another type's name; a message that cannot go: exit 1.
    renamed = shop.celery.app.send_task("billing.charge_v1", args=[21, 5]).id
    wrong = shop.celery.app.send_task("shop.charge", args=[1]).id
    command = [sys.executable, "-m", "pgqueue", "--json", "celery", "forward", PORT, "--broker"]
    command += [redis_url, "--task", "shop.charge", "--name", "billing.charge_v1=shop.charge"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["forwarded"], list(report["refused"])) == (1, [wrong])
    assert "amount_cents" in report["refused"][wrong]
    [task] = [t for t in tasks_of(conn, "shop.charge") if t.idempotency_key == renamed]
    assert task.payload == {"order_id": 21, "amount_cents": 5}


def test_a_following_forwarder_forwards_messages_sent_after_it_started_until_stopped(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    import threading

    stop = threading.Event()
    reports: list[Any] = []
    follower = threading.Thread(
        target=lambda: reports.append(
            forward(shop, redis_url, follow=True, poll_interval=0.1, stop=stop)
        )
    )
    follower.start()
    try:
        sent = shop.celery.charge.delay(31, 7).id  # a producer not moved yet, after the start
        shop.celery.resize.delay(2, 50)
        wait_until(
            lambda: [t for t in tasks_of(conn, "shop.charge") if t.idempotency_key == sent],
            timeout=30,
            what="the follower to forward the charge",
        )
    finally:
        stop.set()
        follower.join(timeout=30)
    assert not follower.is_alive()
    assert (reports[0].forwarded, reports[0].left) == (1, 1)
    assert [m["headers"]["task"] for m in queued_in_redis(broker)] == ["shop.resize"]


def test_a_moved_call_sites_result_times_out_as_pgqueue_and_raises_for_a_task_that_did_not_succeed(
    shop: Any, conn: psycopg.Connection[Any]
) -> None:
    result = shop.move.charge.delay(41, 3)
    with pytest.raises(pgqueue.WaitTimeout):
        result.get(timeout=0.3)  # no worker runs it
    pgqueue.cancel(conn, uuid.UUID(result.id))
    with pytest.raises(pgqueue.TaskWasCancelled) as raised:
        result.get(timeout=10)
    assert raised.value.task.status == "cancelled"
    assert (result.status, result.ready(), result.successful()) == ("REVOKED", True, False)
    assert result.get(timeout=10, propagate=False) is None  # no error stored: cancelled


def test_a_following_forwarder_rides_out_an_unreachable_database_and_keeps_the_messages(
    shop: Any, broker: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    sent = shop.celery.charge.delay(51, 9).id
    with socket.socket() as s:  # a port nothing listens on: the database is down
        s.bind(("127.0.0.1", 0))
        down = f"postgresql://postgres@127.0.0.1:{s.getsockname()[1]}/postgres?connect_timeout=2"
    stop = threading.Event()
    reports: list[Any] = []
    follower = threading.Thread(
        target=lambda: reports.append(
            forward(shop, redis_url, database_url=down, follow=True, poll_interval=0.05, stop=stop)
        )
    )
    with caplog.at_level("WARNING", logger="pgqueue.contrib.celery"):
        follower.start()
        try:
            wait_until(
                lambda: "streak=2" in caplog.text,
                timeout=60,
                what="the follower to try a second time",
            )
            assert follower.is_alive()
        finally:
            stop.set()
            follower.join(timeout=30)
    assert not follower.is_alive() and reports[0].forwarded == 0
    held = broker.lrange("celery", 0, -1) + broker.lrange("pgqueue:celery-forwarding:celery", 0, -1)
    assert [json.loads(m)["headers"]["id"] for m in held] == [sent]


def test_a_message_pgqueue_refuses_stays_in_redis_and_the_rest_of_its_batch_is_forwarded(
    shop: Any,
    broker: Any,
    redis_url: str,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_MAX_PAYLOAD_BYTES", "2048")
    big = shop.celery.send_welcome.delay(1, "x" * 4096 + "@example.com").id
    small = [shop.celery.send_welcome.delay(i, f"u{i}@example.com").id for i in (2, 3)]
    report = forward(shop, redis_url)
    assert (report.forwarded, list(report.refused)) == (2, [big])
    assert "2048" in report.refused[big]
    assert sorted(t.idempotency_key or "" for t in tasks_of(conn, "shop.send_welcome")) == sorted(
        small
    )
    assert [m["headers"]["id"] for m in queued_in_redis(broker)] == [big]
    assert broker.llen("pgqueue:celery-forwarding:celery") == 0


def test_taking_moved_messages_behind_a_long_backlog_holds_redis_briefly(
    shop: Any, broker: Any, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    # Redis runs nothing else while the forwarder's script runs: each message it takes must
    # be searched for from the list's end nearer it, not across the whole backlog.
    sent = [shop.celery.charge.delay(i, 1).id for i in range(200)]  # the oldest, at the tail
    shop.celery.resize.delay(1, 1)
    other = broker.lpop("celery")
    with broker.pipeline(transaction=False) as pipe:
        for _ in range(40):
            pipe.lpush("celery", *([other] * 1000))  # 40,000 newer messages, not moved
        pipe.execute()
    broker.config_resetstat()
    report = forward(shop, redis_url, only=["shop.charge"])
    assert (report.forwarded, report.left) == (200, 40_000)
    keys = conn.execute("SELECT idempotency_key FROM pgqueue.tasks WHERE type = 'shop.charge'")
    assert sorted(k for (k,) in keys.fetchall()) == sorted(sent)
    took = broker.info("commandstats")["cmdstat_evalsha"]
    assert took["usec_per_call"] < 50_000, took  # 50 ms; over 0.1 s a batch searched from the head
