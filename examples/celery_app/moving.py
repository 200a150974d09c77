"""The shop mid-move: ``send_welcome`` and ``charge`` are on pgqueue, the album is still on
Celery. The call sites import their tasks from here and do not change: ``.delay`` and
``.apply_async`` of a moved task submit to pgqueue, the others to Redis as before.

In an app's own tasks module, the same is one line above each moved task::

    @moved(pgqueue_app.send_welcome)
    @app.task(name="shop.send_welcome", ...)
    def send_welcome(self, user_id, email): ...

The Celery app keeps both tasks registered, so a Celery worker still runs the messages sent
before the move, until ``pgqueue celery-forward`` has drained them into pgqueue.
"""

from __future__ import annotations

from examples.celery_app import celery_app, pgqueue_app
from pgqueue.contrib.celery import moved

send_welcome = moved(pgqueue_app.send_welcome)(celery_app.send_welcome)
charge = moved(pgqueue_app.charge)(celery_app.charge)
resize = celery_app.resize
publish_album = celery_app.publish_album
publish = celery_app.publish
