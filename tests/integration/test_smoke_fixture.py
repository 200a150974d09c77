import pgqueue


def test_fresh_database_starts_empty_and_accepts_a_task(conn):
    assert pgqueue.list_tasks(conn) == []
    result = pgqueue.enqueue(conn, "noop", {})
    assert pgqueue.get_task(conn, result.id).status is pgqueue.TaskStatus.QUEUED
