"""The shop's tasks: Django's own ``@task``, nothing of pgqueue's."""

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskContext, task

from shop.models import Order


@task
def process_order(order_id: int) -> int:
    """Reads and writes through the ORM in the worker: Django is set up there."""
    order = Order.objects.get(id=order_id)
    order.processed = True
    order.save()
    return order.id


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def multiply(a: int, b: int) -> dict[str, int]:
    count = await Order.objects.acount()  # the async ORM, from an async task
    return {"product": a * b, "orders": count}


@task(takes_context=True)
def flaky(context: TaskContext, key: str) -> dict[str, object]:
    """Fails its first attempt, succeeds on the second."""
    if context.attempt == 1:
        raise RuntimeError(f"flaky {key} fails its first attempt")
    return {"key": key, "attempt": context.attempt, "task_id": context.task_result.id}


class Declined(Exception):
    pass


@task
def charge(key: str) -> None:
    """Always fails: a dead letter once its attempts are spent."""
    raise Declined(f"card declined for {key}")


@task(queue_name="ordered")
def record(label: str) -> str:
    return label


@task
def noop() -> None:
    """For bench/django_compare.py's throughput."""


@task
def nap(seconds: float) -> float:
    """For bench/django_compare.py's kill -9: a task that is running when its worker dies."""
    import time

    time.sleep(seconds)
    return seconds


@task
def backend_pid() -> int:
    """The PostgreSQL backend of the worker thread's Django connection: the test checks that
    the worker closes it after the task (CONN_MAX_AGE = 0), as Django does after a request."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])
