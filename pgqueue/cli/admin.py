"""The schema and its privileges (``migrate``, ``grant``): run by the schema's owner, usually
once per deploy, where the other commands run day to day as the role ``grant`` set up."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue.cli.output import emit
from pgqueue.cli.state import state
from pgqueue.config import redact, resolve_database_url

commands = typer.Typer()


@commands.command()
def migrate(
    check: Annotated[
        bool, typer.Option("--check", help="Only report; exit 1 if the schema is behind.")
    ] = False,
) -> None:
    """Create or upgrade the pgqueue schema (idempotent)."""
    from pgqueue import migrate as migrate_mod  # alembic is slow to import: only here

    url = state.url()
    before = migrate_mod.current(url)
    head = migrate_mod.head()
    if check:
        ok = before == head
        emit(
            {"current": before, "head": head, "up_to_date": ok},
            f"schema at {before or 'nothing'}; head is {head}: "
            + ("up to date" if ok else "behind, run `pgqueue migrate`"),
        )
        raise typer.Exit(0 if ok else 1)
    if before is not None and not migrate_mod.known(before):
        raise migrate_mod.unknown_revision(before)  # alembic would fail with a traceback
    migrate_mod.upgrade(url)
    emit(
        {"previous": before, "current": head, "database": redact(url)},
        f"pgqueue schema at {head} ({_was(before, head)}) on {redact(url)}",
    )


@commands.command()
def grant(
    role: Annotated[
        str,
        typer.Argument(
            metavar="ROLE", help="The role workers and the API log in as (it must exist)."
        ),
    ],
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="The schema owner's URL (default: the global --database-url, else "
            "$PGQUEUE_DATABASE_URL).",
        ),
    ] = None,
    print_only: Annotated[
        bool,
        typer.Option("--print", help="Print the SQL for ROLE instead of running it (offline)."),
    ] = False,
) -> None:
    """Grant ROLE what workers and the HTTP API need, and no DDL (run as the schema's owner)."""
    from pgqueue import roles

    if print_only:
        script = roles.grant_script(role)
        statements = [s.as_string(None) for s in roles.grant_statements(role)]
        emit({"role": role, "statements": statements}, script)
        return
    from pgqueue import db
    from pgqueue import migrate as migrate_mod

    roles.check_role_name(role)  # a usage error before any connection
    url = resolve_database_url(database_url) if database_url is not None else state.url()
    migrate_mod.check(url)
    with db.connect(url, autocommit=True, pooler=state.pooler) as conn:
        granted = roles.grant(conn, role)
    human = (
        f"granted role {role!r} what workers and the API need ({len(granted.statements)} "
        f"statements) on {redact(url)}"
    )
    if not granted.maintain:
        human += (
            f"\nnote: PostgreSQL {granted.server_version // 10000} has no MAINTAIN privilege, so "
            f"workers running as {role!r} cannot ANALYZE pgqueue.tasks: they say so once "
            "(maintenance.analyze_not_permitted) and autovacuum keeps its statistics"
        )
    emit(
        {
            "role": role,
            "database": redact(url),
            "statements": granted.statements,
            "server_version": granted.server_version,
            "maintain": granted.maintain,
        },
        human,
    )


def _was(before: str | None, head: str) -> str:
    """What the schema was before ``migrate``, in words: a second run changes nothing."""
    if before is None:
        return "was not installed"
    return "already up to date, nothing to do" if before == head else f"was {before}"
