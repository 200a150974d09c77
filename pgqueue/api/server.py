"""How ``pgqueue serve`` runs uvicorn: bounds on what one connection may hold, and an access
log without credentials.

uvicorn's HTTP protocols bound neither a request's head nor the time it takes to arrive:
httptools buffers an unfinished header whatever its size (five connections each sending a
40 MiB header held over 200 MB), a connection that sends nothing is never timed out (the
keep-alive timeout starts only after a response), and one that dribbles a header byte by
byte stays open for as long as it likes. :class:`LimitedHttpToolsProtocol` is uvicorn's
httptools protocol with three things added, at the cost of a few attribute updates per read:

- a connection that sends nothing within the keep-alive timeout is closed, as an idle
  keep-alive connection is;
- a request's head (request line and headers) must be complete within ``header_timeout``
  seconds of the connection's start or of the previous response (else 408 and close);
- a head over ``max_header_bytes`` is refused (431 and close) as soon as that many bytes have
  arrived without its end, so an endless header costs at most the limit plus one read.

The access log (``uvicorn.access``) writes every request's path with its query string: a
client that sends its token as ``?token=...`` (refused by the API, which reads only the
``Authorization`` header) would otherwise leave it in the log. :class:`CredentialFilter`
masks the value of every query parameter whose name looks like a credential, in every line
uvicorn's handlers write, and leaves the others (``?wait=30``) as they were.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import re
import resource
from typing import Any, cast
from urllib.parse import unquote_plus

import httptools
from uvicorn.config import LOGGING_CONFIG, Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
# File descriptors a server process needs besides its connections: the database pool, the
# waiters' LISTEN connection, the dashboard's files, the interpreter's own.
SPARE_FILES = 256


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold: see the module's docstring."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT


class _HeadRefused(Exception):
    """Raised from a parser callback to stop httptools once the reply has been written."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head and a head timeout."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.timeout_keep_alive = limits.keep_alive_timeout  # type: ignore[assignment]
        self._in_head = True  # the next byte that arrives belongs to a request's head
        self._head_bytes = 0  # bytes of the head that is arriving, counted read by read
        self._message_completed = False  # in the read being parsed
        self._head_begun = False  # some of a request's head has been parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # --- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timeout after a response only: a connection that never
        # sent a request would stay open for ever.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head's bytes counted: a read is counted while the head it
        continues is unfinished after it (a read that also finished a request holds that
        request's body, so it is not; the head it starts is then bounded by the next read)."""
        if self._refused:
            return
        was_in_head = self._in_head
        self._message_completed = False
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:
                message = "Invalid HTTP request received."
                self.logger.warning(message)
                self.send_400_response(message)
            return
        if self._in_head and was_in_head and not self._message_completed:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse_head_too_large()

    # --- the parser's callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True

    def on_headers_complete(self) -> None:
        self._in_head = self._head_begun = False
        self._cancel_head_timer()
        # A head that arrived in one read was not counted: count its parts too.
        parts = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        size = max(self._head_bytes, parts)
        self._head_bytes = 0
        if size > self.limits.max_header_bytes:
            self._refuse_head_too_large()
            raise _HeadRefused  # stops the parser: nothing of this request reaches the app
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._message_completed = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()  # the next head's clock starts now

    # --- the limits -----------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if self.transport.is_closing() or not self._in_head or busy or self.pipeline:
            return  # a request is being served: its response re-arms the timer
        if self._head_bytes == 0 and not self._head_begun:
            self.transport.close()  # nothing of a request arrived: an idle connection
            return
        self.logger.info(
            "%s - request head not complete after %g s: closed (408; pgqueue serve "
            "--header-timeout)",
            self._client(),
            self.limits.header_timeout,
        )
        self._reply_and_close(408, b"Request Timeout", "the request's head arrived too slowly\n")

    def _refuse_head_too_large(self) -> None:
        self._refused = True
        self._cancel_head_timer()
        self.logger.warning(
            "%s - request head over %d bytes: refused (431; pgqueue serve --max-header-bytes)",
            self._client(),
            self.limits.max_header_bytes,
        )
        self._reply_and_close(
            431,
            b"Request Header Fields Too Large",
            f"the request's URL and headers are over {self.limits.max_header_bytes} bytes\n",
        )

    def _reply_and_close(self, status: int, reason: bytes, body: str) -> None:
        self._refused = True
        content = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        encoded = body.encode()
        content += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(encoded),
            b"connection: close\r\n\r\n",
            encoded,
        ]
        self.transport.write(b"".join(content))
        self.transport.close()

    def _client(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "-"


def protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """What uvicorn's ``http`` takes: the protocol with these limits. A partial, not a class
    made here, so that ``--workers N`` can pickle it for its spawned processes."""
    return cast(type[asyncio.Protocol], functools.partial(LimitedHttpToolsProtocol, limits=limits))


# --- the access log -----------------------------------------------------------------------

# Query parameters whose value is masked: these names, and any name containing one of the
# parts (compared lower-cased, after percent-decoding): x-api-key, refresh_token, ...
CREDENTIAL_NAMES = frozenset(
    {"token", "access_token", "api_key", "apikey", "key", "password", "secret", "auth"}
    | {"authorization"}
)
CREDENTIAL_PARTS = (
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api_key",
    "api-key",
    "auth",
    "credential",
    "signature",
    "session",
)
MASK = "***"
_PARAMETER = re.compile(r"(?<=[?&;])([^=&;?#\s\"']+)=([^&;#\s\"']*)")


def is_credential(name: str) -> bool:
    """Whether a query parameter of this name may carry a secret."""
    name = unquote_plus(name).strip().lower()
    return name in CREDENTIAL_NAMES or any(part in name for part in CREDENTIAL_PARTS)


def mask_credentials(text: str) -> str:
    """``text`` with the value of each credential-looking query parameter replaced by
    ``***`` (``/tasks?wait=30&token=s3cret`` -> ``/tasks?wait=30&token=***``)."""
    if "=" not in text:
        return text

    def masked(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"{name}={MASK}" if is_credential(name) else match.group(0)

    return _PARAMETER.sub(masked, text)


class CredentialFilter(logging.Filter):
    """Masks credential-looking query values in a record's message and arguments (the
    access log's path is an argument), on uvicorn's handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = mask_credentials(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(
                mask_credentials(a) if isinstance(a, str) else a for a in record.args
            )
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`CredentialFilter` on its handlers
    (configured again in each ``--workers`` process, hence a dictionary, not a filter
    added here)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["credentials"] = {
        "()": f"{CredentialFilter.__module__}.{CredentialFilter.__qualname__}"
    }
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("credentials")
    return config


# --- open files -----------------------------------------------------------------------------


def raise_open_files_limit(connections: int) -> tuple[int, int]:
    """Raise this process's soft limit on open files (often 1,024) towards the hard one, so
    that ``connections`` connections can be open before ``--limit-concurrency`` answers 503
    (past the limit, accept() fails and clients wait in the backlog instead). Returns (the
    soft limit now, what was wanted)."""
    wanted = connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft, wanted
