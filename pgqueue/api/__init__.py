"""The HTTP API: submit, inspect and cancel tasks, and operate the dead-letter queue.

An ASGI application (FastAPI) over :mod:`pgqueue.aio`; it holds no SQL. Run it with
``pgqueue serve``, or mount it in your own ASGI application::

    from pgqueue.api import ApiSettings, create_app
    app.mount("/queue", create_app(ApiSettings(database_url=URL, tokens={TOKEN})))

(``TOKEN``: 32 characters at least, ``openssl rand -hex 32``; ``read:TOKEN`` for a token that
may only read, see :mod:`~pgqueue.api.scopes`.)

Status codes are fixed: 202 for a new task (with its path in ``Location``), 200 with
``Idempotent-Replayed: true`` when an idempotency key returns an existing task, 400 for
malformed JSON or a Host the API does not answer to (``host_not_allowed``), 401 without a
valid bearer token (when tokens are configured), 403 for a token without the scope the
request needs (``insufficient_scope``), a cross-site write, or, without tokens, a request
from another machine (``unauthenticated_remote``), 404 for an
unknown or malformed id, 409 for an operation the task's status does not allow, 413 for a
body over the limit (``body_too_large``) or a payload over PGQUEUE_MAX_PAYLOAD_BYTES
(``payload_too_large``), 415 for a body not sent as ``application/json``, 422 for invalid
fields (the body names each field and the reason), 503 when the database cannot be reached.

``/dashboard/`` serves a web page over this API (static files from ``pgqueue/dashboard``, under
a strict Content-Security-Policy); the page needs no token, the data it reads does.

The package follows FastAPI's layout for bigger applications, so that a new endpoint has one
obvious home: :mod:`~pgqueue.api.routes` holds one router per resource, apart from the wire
models (:mod:`~pgqueue.api.schemas`), the error responses (:mod:`~pgqueue.api.errors`), the
ASGI middlewares (:mod:`~pgqueue.api.middleware`), the per-app state (:mod:`~pgqueue.api.state`)
and :func:`create_app`, which only wires them together (:mod:`~pgqueue.api.app`).
"""

from pgqueue.api.app import app_from_env, create_app
from pgqueue.api.settings import ApiSettings

__all__ = ["ApiSettings", "app_from_env", "create_app"]
