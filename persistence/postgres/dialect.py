"""SQLite's SQL, as Ratchet writes it, in PostgreSQL's dialect.

The ``*_txn`` functions and the read mixins stay the single source of the SQL: a statement
is translated once (the result is cached by its text) when a PostgreSQL store first runs
it, so the SQLite store pays nothing. What changes:

- ``?`` placeholders become ``%s`` (and a literal ``%`` becomes ``%%``);
- ``x'…'`` blob literals become ``'\\x…'::bytea``;
- ``INSERT OR IGNORE`` becomes ``ON CONFLICT DO NOTHING``; ``INSERT OR REPLACE`` an upsert
  on the table's primary key (read from the schema) setting every column it names;
- a plain ``INSERT … VALUES`` also gets ``ON CONFLICT DO NOTHING``, and the connection
  raises ``sqlite3.IntegrityError`` when a row was not inserted: PostgreSQL aborts the
  whole transaction on a unique violation, SQLite only the statement, and the ledger's
  "inserting the key is the check" relies on the latter;
- an INSERT into a table whose key is SQLite's rowid gets ``RETURNING`` it (``lastrowid``);
- in write transactions, reading one task row or one lease row locks it (``FOR UPDATE``):
  see docs/operations.md, "PostgreSQL", for why that is what keeps SQLite's guarantees
  under READ COMMITTED.

The schema (persistence/schema.py's MIGRATIONS) is translated by :func:`translate_ddl`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ratchet.persistence.postgres.change_sql import PG_MIGRATION_22
from ratchet.persistence.schema import MIGRATIONS

__all__ = ["PG_ONLY", "Statement", "pg_migrations", "translate", "translate_ddl"]


def translate_ddl(sql: str) -> str:
    """One migration's DDL in PostgreSQL's types (64-bit integers, bytea, doubles)."""
    sql = re.sub(r"\b(\w+)\s+INTEGER\s+PRIMARY\s+KEY(\s+AUTOINCREMENT)?",
                 r"\1 BIGSERIAL PRIMARY KEY", sql, flags=re.I)
    # Types are upper case in the schema, names lower case (a column is called "blob").
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    sql = re.sub(r"\bBLOB\b", "BYTEA", sql)
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    sql = re.sub(r"\)\s*WITHOUT\s+ROWID", ")", sql, flags=re.I)
    return sql


def pg_migrations() -> list[tuple[int, str, str]]:
    """MIGRATIONS, each translated: the same versions, names and order; those of
    PostgreSQL alone (empty on SQLite) from :data:`PG_ONLY`."""
    return [(v, name, PG_ONLY.get(v) or translate_ddl(sql)) for v, name, sql in MIGRATIONS]


#: Migrations whose PostgreSQL text is not SQLite's translated (SQLite's is empty).
PG_ONLY = {22: PG_MIGRATION_22}


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


@functools.cache
def _schema_keys() -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Each table's primary key columns, and the rowid-key column of those that have one."""
    keys: dict[str, tuple[str, ...]] = {}
    serial: dict[str, str] = {}
    for _, _, sql in MIGRATIONS:
        for m in re.finditer(r"CREATE TABLE (\w+)\s*\((.*?)\)\s*(?:WITHOUT ROWID)?\s*(?:;|$)",
                             _strip_comments(sql), flags=re.S | re.I):
            table, body = m.group(1), m.group(2)
            composite = re.search(r"PRIMARY KEY\s*\(([^)]*)\)", body, flags=re.I)
            if composite:
                keys[table] = tuple(c.strip() for c in composite.group(1).split(","))
                continue
            single = re.search(r"(\w+)\s+\w+\s+PRIMARY KEY", body, flags=re.I)
            if single:
                keys[table] = (single.group(1),)
                if re.search(rf"\b{single.group(1)}\s+INTEGER\s+PRIMARY KEY", body, re.I):
                    serial[table] = single.group(1)
    return keys, serial


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement in PostgreSQL's dialect, and how its result is read."""

    sql: str
    #: A plain INSERT … VALUES: a row not inserted (a key taken) is an IntegrityError.
    strict_insert: bool = False
    #: The statement RETURNs the new row's rowid-key column (``lastrowid``).
    returns_id: bool = False


_INSERT = re.compile(r"^\s*INSERT\s+(?:OR\s+(IGNORE|REPLACE)\s+)?INTO\s+(\w+)\s*\(([^)]*)\)",
                     re.I | re.S)
_LOCKED_READ = re.compile(
    r"^\s*SELECT\s[^;]*?\sFROM\s+(tasks|leases)\s+WHERE\s+(task_id|partition)\s*=\s*\?\s*$",
    re.I | re.S)


def _placeholders(sql: str) -> str:
    """``?`` → ``%s`` and ``%`` → ``%%`` outside quoted literals; ``x'ab'`` → bytea."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch == "'":
            j = sql.index("'", i + 1)
            while j + 1 < n and sql[j + 1] == "'":  # '' inside a literal
                j = sql.index("'", j + 2)
            literal = sql[i:j + 1]
            if out and out[-1] in ("x", "X") and (len(out) < 2 or not out[-2].isalnum()):
                out.pop()
                literal = "'\\x" + literal[1:-1] + "'::bytea"
            out.append(literal.replace("%", "%%"))
            i = j + 1
            continue
        out.append("%s" if ch == "?" else "%%" if ch == "%" else ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def translate(sql: str, writing: bool = False) -> Statement:
    """``sql`` (SQLite, ``?`` placeholders) for PostgreSQL; ``writing``: run in a write
    transaction (single-row reads of a task or a lease lock that row)."""
    keys, serial = _schema_keys()
    strict = returns = False
    m = _INSERT.match(sql)
    if m is not None:
        mode, table, columns = (m.group(1) or "").upper(), m.group(2), m.group(3)
        sql = re.sub(r"^\s*INSERT\s+OR\s+(IGNORE|REPLACE)\s+INTO", "INSERT INTO", sql,
                     flags=re.I)
        if mode == "REPLACE":
            key = keys[table]
            names = [c.strip() for c in columns.split(",")]
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in names if c not in key)
            sql += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}"
        elif not re.search(r"\bON\s+CONFLICT\b", sql, re.I):
            sql += " ON CONFLICT DO NOTHING"
            strict = mode == "" and re.search(r"\)\s*VALUES\s*\(", sql, re.I) is not None
        if table in serial:
            sql += f" RETURNING {serial[table]}"
            returns = True
    elif writing and _LOCKED_READ.match(sql):
        sql += " FOR UPDATE"
    return Statement(_placeholders(sql), strict, returns)
