"""What each API token may do: its scopes, the one table of the scope each route needs, and
the token syntax of PGQUEUE_API_TOKENS.

A token is ``TOKEN`` (admin: everything, as tokens always were) or ``SCOPE[+SCOPE...]:TOKEN``:

- ``metrics``: ``GET /metrics``, for a Prometheus scraper;
- ``read``: every read of /api/v1 (lists, payloads, stats, dead letters, schedules, limits),
  ``/metrics``, the OpenAPI document and ``/docs``;
- ``submit``: submit tasks, read one task or workflow by its id (``?wait=`` included) and
  cancel a task by its id, for an application that enqueues; no lists;
- ``admin``: everything, including pausing queues, limits and the dead-letter queue.

The table is keyed by route **name** (FastAPI's default: the endpoint function's name), so a
path can change without touching it. A route missing from it needs ``admin`` (fail closed);
``tests/unit/test_scope_table.py`` lists every route of ``create_app()`` and fails on one that
is missing, so that a new route's scope is a decision, not an accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pgqueue.errors import ConfigurationError

METRICS = "metrics"
READ = "read"
SUBMIT = "submit"
ADMIN = "admin"
SCOPES = (METRICS, READ, SUBMIT, ADMIN)

# Open: no token needed. The probes carry none, and the dashboard's files hold no data (its
# script asks the API for everything, with a token).
OPEN = "open"

# The shortest token accepted: what `openssl rand -hex 16` gives. A short or guessable token
# is worse than none, as it looks like protection.
MIN_TOKEN_LENGTH = 32

# Route name -> the scopes that may call it, the narrowest first (the first is the one a
# refusal names in WWW-Authenticate). ``admin`` may call every route and is never listed.
ROUTE_SCOPES: dict[str, tuple[str, ...]] = {
    # tasks
    "submit": (SUBMIT,),
    "get_task": (SUBMIT, READ),  # submit: its own task, by the id it was given
    "cancel_task": (SUBMIT,),  # by id: a submitter may take back what it submitted
    "list_tasks": (READ,),
    # workflows
    "get_workflow": (SUBMIT, READ),
    # dead letters
    "list_dead_letters": (READ,),
    "count_dead_letters": (READ,),
    # schedules, queues, limits, stats
    "list_schedules": (READ,),
    "list_queues": (READ,),
    "list_limits": (READ,),
    "stats": (READ,),
    "throughput_series": (READ,),
    "failures": (READ,),
    # outside /api/v1
    "metrics": (METRICS, READ),
    "openapi": (READ,),
    "swagger_ui_html": (READ,),
    "swagger_ui_redirect": (READ,),
    "redoc_html": (READ,),
    # Swagger UI's and ReDoc's published files: no data, the same on every server, and a
    # browser loads them by <script src>, which sends no token. Open, as the dashboard's are.
    "docs_asset": (OPEN,),
    "root_redirect": (OPEN,),  # to /dashboard/, itself open
    "healthz": (OPEN,),
    "readyz": (OPEN,),
    "dashboard_redirect": (OPEN,),
    "dashboard": (OPEN,),
    "dashboard_file": (OPEN,),
    # admin only, listed so that the choice is visible: every write but submit and a cancel
    # by id. A workflow's cancel stops tasks its caller may not have submitted itself.
    "cancel_workflow": (ADMIN,),
    "replay_one": (ADMIN,),
    "replay_many": (ADMIN,),
    "discard_one": (ADMIN,),
    "discard_many": (ADMIN,),
    "pause_queue": (ADMIN,),
    "resume_queue": (ADMIN,),
    "remove_queue": (ADMIN,),
    "set_queue_retention": (ADMIN,),
    "set_limit": (ADMIN,),
    "clear_limit": (ADMIN,),
}


def needed(route_name: str | None) -> tuple[str, ...]:
    """The scopes that may call the route of this name; a route not in the table needs admin."""
    if route_name is None:
        return (ADMIN,)
    return ROUTE_SCOPES.get(route_name, (ADMIN,))


def allows(granted: Iterable[str], route_name: str | None) -> bool:
    """Whether a token with these scopes may call the route of this name."""
    scopes = needed(route_name)
    if OPEN in scopes:
        return True
    granted = set(granted)
    return ADMIN in granted or not granted.isdisjoint(scopes)


def describe(route_name: str | None) -> str:
    """The scopes a route needs, for people: ``read or submit (or admin)``."""
    scopes = needed(route_name)
    if OPEN in scopes:
        return "none (open)"
    if scopes == (ADMIN,):
        return ADMIN
    return f"{' or '.join(scopes)} (or {ADMIN})"


_SCOPE_PREFIX = re.compile(r"[A-Za-z][A-Za-z_+-]*")


def parse_token(entry: str, where: str) -> tuple[str, frozenset[str]]:
    """``TOKEN`` or ``SCOPE[+SCOPE...]:TOKEN`` as (token, scopes); ``where`` names the setting
    in errors, which never include the token."""
    entry = entry.strip()
    prefix, colon, rest = entry.partition(":")
    if colon and _SCOPE_PREFIX.fullmatch(prefix):
        names = [s.strip().lower() for s in prefix.split("+")]
        unknown = [s for s in names if s not in SCOPES]
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown scope {unknown[0]!r}; the scopes are {', '.join(SCOPES)} "
                "(SCOPE[+SCOPE]:TOKEN; a token that itself holds ':' is written admin:TOKEN)"
            )
        token, scopes = rest.strip(), frozenset(names)
    else:
        token, scopes = entry, frozenset({ADMIN})
    _check_token(token, scopes, where)
    return token, scopes


def _check_token(token: str, scopes: frozenset[str], where: str) -> None:
    if len(token) < MIN_TOKEN_LENGTH:
        shown = f"a {'+'.join(sorted(scopes))} token"
        raise ConfigurationError(
            f"{where}: {shown} has {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}; "
            "make one with `openssl rand -hex 32`"
        )
    if any(c.isspace() or c == "," for c in token):
        raise ConfigurationError(f"{where}: a token may not contain spaces or commas")


def parse_tokens(entries: Iterable[str], where: str) -> dict[str, frozenset[str]]:
    """Every entry parsed; the same token twice with other scopes is refused, as the
    scopes it was meant to have cannot be told."""
    tokens: dict[str, frozenset[str]] = {}
    for entry in entries:
        token, scopes = parse_token(entry, where)
        tokens = merge(tokens, {token: scopes}, where)
    return tokens


def merge(
    first: Mapping[str, frozenset[str]], second: Mapping[str, frozenset[str]], where: str
) -> dict[str, frozenset[str]]:
    """Both lists of tokens; a token in both with other scopes is refused."""
    tokens = dict(first)
    for token, scopes in second.items():
        if tokens.get(token, scopes) != scopes:
            both = " and ".join("+".join(sorted(s)) for s in (tokens[token], scopes))
            raise ConfigurationError(
                f"{where}: a token is listed twice, with the scopes {both}: list it once"
            )
        tokens[token] = scopes
    return tokens


def check_scopes(tokens: Mapping[str, Iterable[str]], where: str) -> dict[str, frozenset[str]]:
    """A mapping of token -> scopes checked as the parsed entries are."""
    checked: dict[str, frozenset[str]] = {}
    for token, given in tokens.items():
        scopes = frozenset(s.lower() for s in given)
        unknown = sorted(scopes - set(SCOPES))
        if unknown or not scopes:
            raise ConfigurationError(
                f"{where}: unknown scope {unknown[0] if unknown else ''!r}; "
                f"the scopes are {', '.join(SCOPES)}"
            )
        _check_token(token, scopes, where)
        checked[token] = scopes
    return checked
