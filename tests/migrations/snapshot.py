"""A deterministic description of the ``pgqueue`` schema, and the tool that rewrites the snapshot.

``describe_schema(url)`` reads the system catalogs of one database and describes everything in
the ``pgqueue`` schema as SQL-like text: tables (columns, constraints, indexes, triggers,
storage options), views, sequences, types, functions and comments. It is not pg_dump, whose
output changes from one server version to the next; the same schema gives the same text on
PostgreSQL 15 to 18. Two things need care for that:

* PostgreSQL 18 records NOT NULL as constraints too; they are left out, since nullability is
  already in the column list.
* PostgreSQL 16 stopped qualifying column names (``tasks.status``) in the definition of a view
  over one relation, so view definitions are compared with their column qualifiers removed,
  next to the view's column list and the table columns it reads.

After adding a migration, regenerate the committed snapshot with (from the repository root)::

    python tests/migrations/snapshot.py postgresql://USER@HOST:PORT/DBNAME

The URL may name any database on a server where you may create databases: the tool migrates
a scratch database to head, writes ``schema_snapshot.sql`` next to this file, then drops it.
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

SCHEMA = "pgqueue"
SNAPSHOT_PATH = Path(__file__).resolve().with_name("schema_snapshot.sql")
REGENERATE = "python tests/migrations/snapshot.py postgresql://USER@HOST:PORT/DBNAME"

HEADER = f"""\
-- The pgqueue schema as `alembic upgrade head` (`pgqueue migrate`) leaves an empty database.
-- Generated from the system catalogs by tests/migrations/snapshot.py: do not edit by hand.
-- Regenerate after adding a migration (the URL may name any database on the server):
--     {REGENERATE}
-- View definitions are shown without column qualifiers (PostgreSQL 16+ omits them, 15 not).
"""

# A column qualifier in deparsed SQL: an identifier followed by a dot and another identifier,
# not itself part of a longer dotted name.
_QUALIFIER = re.compile(r'(?<![\w$."])([A-Za-z_][\w$]*|"(?:[^"]|"")+")\.(?=[A-Za-z_"])')
_STRING_LITERAL = re.compile(r"('(?:[^']|'')*')")

# Objects that belong to an extension are described by the extension's name alone.
_NOT_EXTENSION_MEMBER = """
    NOT EXISTS (SELECT 1 FROM pg_depend d
                 WHERE d.classid = {catalog}::regclass AND d.objid = {oid}
                   AND d.deptype = 'e')
"""


def _unqualify(definition: str, schemas: set[str]) -> str:
    """Drop column qualifiers (``tasks.status`` -> ``status``), keeping schema names."""

    def strip(match: re.Match[str]) -> str:
        name = match.group(1)
        bare = name[1:-1].replace('""', '"') if name.startswith('"') else name
        return match.group(0) if bare in schemas else ""

    pieces = _STRING_LITERAL.split(definition)
    return "".join(
        piece if i % 2 else _QUALIFIER.sub(strip, piece) for i, piece in enumerate(pieces)
    )


def _rows(conn: psycopg.Connection[Any], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def _columns(conn: psycopg.Connection[Any], relid: int, *, full: bool) -> list[str]:
    rows = _rows(
        conn,
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               CASE WHEN a.attcollation <> t.typcollation THEN co.collname END,
               col_description(a.attrelid, a.attnum)
          FROM pg_attribute a
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation
         WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum
        """,
        relid,
    )
    lines = []
    for name, type_, notnull, default, identity, generated, collation, comment in rows:
        line = f"{_ident(name)} {type_}"
        if full:
            if collation:
                line += f' COLLATE "{collation}"'
            if notnull:
                line += " NOT NULL"
            if identity:
                line += " GENERATED " + ("ALWAYS" if identity == "a" else "BY DEFAULT")
                line += " AS IDENTITY"
            elif generated:
                kind = "STORED" if generated == "s" else "VIRTUAL"
                line += f" GENERATED ALWAYS AS ({default}) {kind}"
            elif default is not None:
                line += f" DEFAULT {default}"
        if comment is not None:
            line += f"  -- {comment}"
        lines.append(line)
    return lines


def _ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _block(head: str, items: list[str], tail: str) -> str:
    body = ",\n".join(f"    {item}" for item in items)
    return f"{head} (\n{body}\n){tail}"


def _table(conn: psycopg.Connection[Any], rel: tuple[Any, ...]) -> list[str]:
    relid, name, kind, persistence, reloptions, rls, partkey, partbound, parent = rel
    qualified = f"{SCHEMA}.{_ident(name)}"
    head = "CREATE " + ("UNLOGGED " if persistence == "u" else "") + f"TABLE {qualified}"
    tail = ""
    if parent is not None:
        tail += f" PARTITION OF {parent} {partbound}"
    if kind == "p":
        tail += f" PARTITION BY {partkey}"
    if reloptions:
        tail += " WITH (" + ", ".join(sorted(reloptions)) + ")"
    out = [_block(head, _columns(conn, relid, full=True), tail) + ";"]
    if rls:
        out.append(f"ALTER TABLE {qualified} ENABLE ROW LEVEL SECURITY;")
    for conname, condef in _rows(
        conn,
        """
        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
         WHERE conrelid = %s AND contype <> 'n'
         ORDER BY conname COLLATE "C"
        """,
        relid,
    ):
        out.append(f"ALTER TABLE {qualified} ADD CONSTRAINT {_ident(conname)} {condef};")
    for (indexdef,) in _rows(
        conn,
        """
        SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
          JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = %s
         ORDER BY c.relname COLLATE "C"
        """,
        relid,
    ):
        out.append(f"{indexdef};")
    for (triggerdef,) in _rows(
        conn,
        """
        SELECT pg_get_triggerdef(oid) FROM pg_trigger
         WHERE tgrelid = %s AND NOT tgisinternal
         ORDER BY tgname COLLATE "C"
        """,
        relid,
    ):
        out.append(f"{triggerdef};")
    for polname, polcmd, permissive, using, check in _rows(
        conn,
        """
        SELECT polname, polcmd, polpermissive, pg_get_expr(polqual, polrelid),
               pg_get_expr(polwithcheck, polrelid)
          FROM pg_policy WHERE polrelid = %s ORDER BY polname COLLATE "C"
        """,
        relid,
    ):
        commands = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}
        policy = f"CREATE POLICY {_ident(polname)} ON {qualified}"
        policy += f" AS {'PERMISSIVE' if permissive else 'RESTRICTIVE'} FOR {commands[polcmd]}"
        if using is not None:
            policy += f" USING ({using})"
        if check is not None:
            policy += f" WITH CHECK ({check})"
        out.append(policy + ";")
    return out


def _view(conn: psycopg.Connection[Any], rel: tuple[Any, ...], schemas: set[str]) -> list[str]:
    relid, name, kind = rel[:3]
    qualified = f"{SCHEMA}.{_ident(name)}"
    keyword = "MATERIALIZED VIEW" if kind == "m" else "VIEW"
    (definition,) = _rows(conn, "SELECT pg_get_viewdef(%s::oid, true)", relid)[0]
    reads: dict[str, list[str]] = {}
    for table, column in _rows(
        conn,
        """
        SELECT DISTINCT d.refobjid::regclass::text COLLATE "C" AS tab,
               a.attname::text COLLATE "C" AS col
          FROM pg_rewrite r
          JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
          JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
         WHERE r.ev_class = %s AND d.refclassid = 'pg_class'::regclass
           AND d.refobjid <> %s AND d.refobjsubid > 0
         ORDER BY tab, col
        """,
        relid,
        relid,
    ):
        reads.setdefault(table, []).append(column)
    out = [f"-- {qualified} reads {table}: {', '.join(cols)}" for table, cols in reads.items()]
    columns = _columns(conn, relid, full=False)
    out.append(_block(f"CREATE {keyword} {qualified}", columns, " AS"))
    out.append(_unqualify(definition.rstrip().rstrip(";"), schemas) + ";")
    if kind == "m":
        for (indexdef,) in _rows(
            conn,
            """
            SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
              JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = %s ORDER BY c.relname COLLATE "C"
            """,
            relid,
        ):
            out.append(f"{indexdef};")
    return out


def _sequence(conn: psycopg.Connection[Any], rel: tuple[Any, ...]) -> list[str]:
    relid, name = rel[:2]
    type_, start, increment, minimum, maximum, cache, cycle, owner = _rows(
        conn,
        """
        SELECT format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
               s.seqcache, s.seqcycle,
               (SELECT d.refobjid::regclass::text || '.' || a.attname
                  FROM pg_depend d
                  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                 WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
                   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
          FROM pg_sequence s WHERE s.seqrelid = %s
        """,
        relid,
    )[0]
    line = (
        f"CREATE SEQUENCE {SCHEMA}.{_ident(name)} AS {type_} START {start} INCREMENT {increment}"
        f" MINVALUE {minimum} MAXVALUE {maximum} CACHE {cache}{' CYCLE' if cycle else ''}"
    )
    if owner:
        line += f" OWNED BY {owner}"
    return [line + ";"]


def _types(conn: psycopg.Connection[Any], nspid: int) -> list[str]:
    out = []
    member = _NOT_EXTENSION_MEMBER.format(catalog="'pg_type'", oid="t.oid")
    types = _rows(
        conn,
        f"""
        SELECT t.oid, t.typname, t.typtype, t.typrelid,
               format_type(t.typbasetype, t.typtypmod), t.typnotnull, t.typdefault,
               obj_description(t.oid, 'pg_type')
          FROM pg_type t
          LEFT JOIN pg_class c ON c.oid = t.typrelid
         WHERE t.typnamespace = %s AND {member}
           AND (t.typtype IN ('e', 'd', 'r', 'm') OR (t.typtype = 'c' AND c.relkind = 'c'))
         ORDER BY t.typname COLLATE "C"
        """,
        nspid,
    )
    for oid, name, typtype, typrelid, base, notnull, default, comment in types:
        qualified = f"{SCHEMA}.{_ident(name)}"
        if typtype == "e":
            labels = [
                "'" + label.replace("'", "''") + "'"
                for (label,) in _rows(
                    conn,
                    "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder",
                    oid,
                )
            ]
            out.append(f"CREATE TYPE {qualified} AS ENUM ({', '.join(labels)});")
        elif typtype == "d":
            line = f"CREATE DOMAIN {qualified} AS {base}"
            if default is not None:
                line += f" DEFAULT {default}"
            if notnull:
                line += " NOT NULL"
            for conname, condef in _rows(
                conn,
                """
                SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE contypid = %s AND contype <> 'n' ORDER BY conname COLLATE "C"
                """,
                oid,
            ):
                line += f" CONSTRAINT {_ident(conname)} {condef}"
            out.append(line + ";")
        elif typtype in ("r", "m"):
            (subtype,) = _rows(
                conn,
                "SELECT format_type(rngsubtype, NULL) FROM pg_range"
                " WHERE rngtypid = %s OR rngmultitypid = %s",
                oid,
                oid,
            )[0]
            kind = "RANGE" if typtype == "r" else "MULTIRANGE"
            out.append(f"CREATE TYPE {qualified} AS {kind} (SUBTYPE = {subtype});")
        else:
            columns = _columns(conn, typrelid, full=False)
            out.append(_block(f"CREATE TYPE {qualified} AS", columns, ";"))
        if comment is not None:
            out.append(f"COMMENT ON TYPE {qualified} IS {_literal(comment)};")
    return out


def _functions(conn: psycopg.Connection[Any], nspid: int) -> list[str]:
    out = []
    member = _NOT_EXTENSION_MEMBER.format(catalog="'pg_proc'", oid="p.oid")
    for oid, name, args, kind, result, comment in _rows(
        conn,
        f"""
        SELECT p.oid, p.proname, pg_get_function_identity_arguments(p.oid), p.prokind,
               pg_get_function_result(p.oid), obj_description(p.oid, 'pg_proc')
          FROM pg_proc p
         WHERE p.pronamespace = %s AND {member}
         ORDER BY p.proname COLLATE "C",
                  pg_get_function_identity_arguments(p.oid) COLLATE "C"
        """,
        nspid,
    ):
        signature = f"{SCHEMA}.{_ident(name)}({args})"
        if kind == "a":
            out.append(f"CREATE AGGREGATE {signature} -- returns {result}")
        else:
            (definition,) = _rows(conn, "SELECT pg_get_functiondef(%s::oid)", oid)[0]
            out.append(definition.rstrip() + ";")
        if comment is not None:
            noun = {"a": "AGGREGATE", "p": "PROCEDURE"}.get(kind, "FUNCTION")
            out.append(f"COMMENT ON {noun} {signature} IS {_literal(comment)};")
    return out


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def describe_schema(url: str) -> str:
    """Describe the ``pgqueue`` schema of the database at ``url`` (empty if it has none)."""
    url = re.sub(r"^postgres(ql)?(\+psycopg)?://", "postgresql://", url)
    with psycopg.connect(url, autocommit=True) as conn:
        # Nothing but pg_catalog on the path: every pgqueue object is printed schema-qualified,
        # whatever the role's or database's search_path is.
        conn.execute("SET search_path = pg_catalog")
        row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone()
        if row is None:
            return ""
        nspid = row[0]
        schemas = {name for (name,) in _rows(conn, "SELECT nspname FROM pg_namespace")}
        sections: list[list[str]] = [[f"CREATE SCHEMA {SCHEMA};"]]
        comment = _rows(conn, "SELECT obj_description(%s::oid, 'pg_namespace')", nspid)[0][0]
        if comment is not None:
            sections[0].append(f"COMMENT ON SCHEMA {SCHEMA} IS {_literal(comment)};")
        extensions = _rows(
            conn,
            'SELECT extname FROM pg_extension WHERE extnamespace = %s ORDER BY extname COLLATE "C"',
            nspid,
        )
        for (extname,) in extensions:
            sections.append([f"CREATE EXTENSION {_ident(extname)} SCHEMA {SCHEMA};"])
        version_table = conn.execute(
            "SELECT to_regclass(%s)", (f"{SCHEMA}.pgqueue_alembic_version",)
        ).fetchone()
        if version_table is not None and version_table[0] is not None:
            revisions = [
                r
                for (r,) in _rows(conn, f"SELECT version_num FROM {SCHEMA}.pgqueue_alembic_version")
            ]
            at = ", ".join(sorted(revisions)) or "none"
            sections.append([f"-- alembic revision in {SCHEMA}.pgqueue_alembic_version: {at}"])
        sections.extend([line] for line in _types(conn, nspid))
        member = _NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")
        relations = _rows(
            conn,
            f"""
            SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.reloptions,
                   c.relrowsecurity, CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
                   pg_get_expr(c.relpartbound, c.oid),
                   (SELECT i.inhparent::regclass::text FROM pg_inherits i
                     WHERE i.inhrelid = c.oid AND c.relispartition),
                   obj_description(c.oid, 'pg_class')
              FROM pg_class c
             WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
               AND {member}
             ORDER BY CASE c.relkind WHEN 'S' THEN 0 WHEN 'v' THEN 2 WHEN 'm' THEN 3 ELSE 1 END,
                      c.relname COLLATE "C"
            """,
            nspid,
        )
        for rel in relations:
            kind, comment = rel[2], rel[-1]
            if kind == "S":
                section = _sequence(conn, rel)
            elif kind in ("v", "m"):
                section = _view(conn, rel, schemas)
            else:
                section = _table(conn, rel[:-1])
            if comment is not None:
                noun = {"S": "SEQUENCE", "v": "VIEW", "m": "MATERIALIZED VIEW"}.get(kind, "TABLE")
                qualified = f"{SCHEMA}.{_ident(rel[1])}"
                section.append(f"COMMENT ON {noun} {qualified} IS {_literal(comment)};")
            sections.append(section)
        sections.extend([line] for line in _functions(conn, nspid))
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def render(url: str) -> str:
    """The snapshot file's text for the database at ``url``: header and description."""
    return HEADER + "\n" + describe_schema(url)


def with_database(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def regenerate(server_url: str, path: Path = SNAPSHOT_PATH) -> str:
    """Migrate a scratch database on ``server_url`` to head and write its description to path."""
    from pgqueue import migrate

    name = f"pgqueue_snapshot_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        scratch = with_database(server_url, name)
        migrate.upgrade(scratch)
        text = render(scratch)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    path.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        print(f"usage: {REGENERATE}", file=sys.stderr)
        return 2
    before = SNAPSHOT_PATH.read_text(encoding="utf-8") if SNAPSHOT_PATH.exists() else None
    after = regenerate(argv[0])
    state = "unchanged" if before == after else "rewritten"
    print(f"{SNAPSHOT_PATH}: {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
