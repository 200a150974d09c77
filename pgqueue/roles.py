"""The application role: what workers and the HTTP API may do in the database, and no DDL.

pgqueue runs as two roles (docs/security.md): the owner of the ``pgqueue`` schema, which runs
``pgqueue migrate``, and an application role for workers, the API, :class:`pgqueue.Client`
and the operator commands, which reads and writes tasks but can create, alter, drop or
truncate nothing. The grants live in ``sql/grants.sql``, with a comment per grant saying why,
for a DBA to run with psql; this module reads that file, so ``pgqueue grant`` and psql grant
exactly the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import textwrap
from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.errors import PgQueueError, SchemaNotReady, ValidationError

GRANTS_FILE = "grants.sql"
ROLE_IDENTIFIER = ':"app_role"'  # psql's spelling of the role name as a quoted identifier
ROLE_LITERAL = ":'app_role'"  # ... and as a quoted string
MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names would be cut short silently
_PRIVILEGE_NOT_GRANTED = "01007"  # the warning GRANT gives instead of failing
_PRIVILEGE_NOT_REVOKED = "01006"


class PrivilegeMissing(PgQueueError):
    """The database refused a statement for want of a privilege on the pgqueue schema: the
    role pgqueue logs in as was granted less than this pgqueue needs (by an older pgqueue's
    grants, or a DBA revoked one). Not retried: someone must run the grants again."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"the database refused: {detail}; the role pgqueue logs in as lacks a privilege "
            "this pgqueue needs: run `pgqueue grant ROLE` for it as the pgqueue schema's owner "
            "(the role that ran `pgqueue migrate`; docs/security.md)"
        )


@contextlib.contextmanager
def privileges_explained() -> Iterator[None]:
    """Turn the database's bare "permission denied for table ..." into
    :class:`PrivilegeMissing`, which says what to run."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        raise privilege_missing(exc) from exc


def privilege_missing(exc: psycopg.errors.InsufficientPrivilege) -> PrivilegeMissing:
    """The database's refusal as :class:`PrivilegeMissing` (its first line, and what to run)."""
    return PrivilegeMissing(_first_line(exc))


@dataclasses.dataclass(frozen=True)
class GrantTemplate:
    """One statement of grants.sql: the comment above it (why) and its text (placeholders)."""

    why: str
    text: str


@dataclasses.dataclass(frozen=True)
class Granted:
    role: str
    statements: list[str]
    server_version: int
    maintain: bool  # MAINTAIN was granted (PostgreSQL 17+): the role's workers may ANALYZE


@functools.cache
def templates() -> tuple[GrantTemplate, ...]:
    """The statements of grants.sql in order. psql meta-commands (``\\set``) are skipped; a
    statement ends with a line ending in ``;`` outside ``$$`` quotes."""
    text = resources.files("pgqueue.sql").joinpath(GRANTS_FILE).read_text(encoding="utf-8")
    out: list[GrantTemplate] = []
    comment: list[str] = []
    body: list[str] = []
    in_dollar = False
    for line in text.splitlines():
        stripped = line.strip()
        if not body:
            if not stripped or stripped.startswith("\\"):
                comment = []  # a blank line or a meta-command ends the comment above it
                continue
            if stripped.startswith("--"):
                comment.append(stripped[2:].strip())
                continue
        body.append(line.rstrip())
        if stripped.count("$$") % 2:
            in_dollar = not in_dollar
        if not in_dollar and stripped.endswith(";"):
            out.append(GrantTemplate(" ".join(comment), "\n".join(body)))
            comment, body = [], []
    if body:
        raise RuntimeError(f"{GRANTS_FILE} ends inside a statement: {body[0]!r}")
    return tuple(out)


def check_role_name(role: str) -> str:
    """The role's name as given (names are case-sensitive once quoted), or ValidationError."""
    if not isinstance(role, str) or not role:
        raise ValidationError("role", "give the name of the role workers and the API log in as")
    if "\x00" in role:
        raise ValidationError("role", "must not contain a NUL character")
    if len(role.encode("utf-8")) > MAX_NAME_BYTES:
        raise ValidationError(
            "role", f"{role[:20]!r}... is longer than PostgreSQL's {MAX_NAME_BYTES} bytes"
        )
    if role.lower() in ("public", "none"):
        # GRANT ... TO "public" means every role, even quoted; "none" is reserved.
        raise ValidationError(
            "role", f"{role!r} is not a role pgqueue grants to (PUBLIC would mean every role)"
        )
    return role


def _compose(text: str, role: str) -> sql.Composed:
    escaped = text.replace("{", "{{").replace("}", "}}")
    escaped = escaped.replace(ROLE_IDENTIFIER, "{role}").replace(ROLE_LITERAL, "{role_literal}")
    return sql.SQL(escaped).format(role=sql.Identifier(role), role_literal=sql.Literal(role))


def grant_statements(role: str) -> list[sql.Composed]:
    """The statements that give ``role`` what workers and the API need, the name quoted."""
    name = check_role_name(role)
    return [_compose(t.text, name) for t in templates()]


def grant_script(role: str) -> str:
    """grants.sql for ``role``: each statement after its reason, ready for psql."""
    parts = []
    for template, statement in zip(templates(), grant_statements(role), strict=True):
        why = "".join(f"-- {line}\n" for line in textwrap.wrap(template.why, 96))
        parts.append(why + statement.as_string(None))
    return "\n\n".join(parts)


def grant(conn: psycopg.Connection[Any], role: str) -> Granted:
    """Run the grants for ``role`` on ``conn``, connected as the owner of the pgqueue schema.

    All or nothing: on an autocommit connection in a transaction of its own; otherwise in the
    caller's transaction, which the caller commits. A GRANT that its runner may not make only
    warns in PostgreSQL and grants nothing; here it is an error, so a grant run as the wrong
    role cannot look like it worked.
    """
    statements = grant_statements(role)
    refused: list[str] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.sqlstate in (_PRIVILEGE_NOT_GRANTED, _PRIVILEGE_NOT_REVOKED):
            refused.append(diag.message_primary or "no privileges were granted")

    def run_all() -> None:
        for statement in statements:
            conn.execute(statement)
        if refused:
            raise PgQueueError(
                f"role {conn.info.user!r} may not grant on the pgqueue schema ({refused[0]}): "
                "run `pgqueue grant` as the schema's owner, the role that ran `pgqueue migrate`"
            )

    conn.add_notice_handler(on_notice)
    try:
        if conn.autocommit:
            with conn.transaction():
                run_all()
        else:
            run_all()
    except psycopg.errors.UndefinedObject as exc:
        raise PgQueueError(
            f"{_first_line(exc)}: create it first, e.g. CREATE ROLE {_ident(role, conn)} "
            "LOGIN PASSWORD '...'"
        ) from None
    except (
        psycopg.errors.InvalidSchemaName,
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
    ) as exc:
        raise SchemaNotReady(
            f"the pgqueue schema is missing or out of date ({_first_line(exc)}); "
            "run `pgqueue migrate` as the schema's owner first"
        ) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PgQueueError(
            f"role {conn.info.user!r} may not grant on the pgqueue schema ({_first_line(exc)}): "
            "run `pgqueue grant` as the schema's owner, the role that ran `pgqueue migrate`"
        ) from None
    finally:
        conn.remove_notice_handler(on_notice)
    version = conn.info.server_version
    return Granted(
        role=role,
        statements=[s.as_string(conn) for s in statements],
        server_version=version,
        maintain=version >= 170000,
    )


def _ident(role: str, conn: psycopg.Connection[Any]) -> str:
    return sql.Identifier(role).as_string(conn)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
