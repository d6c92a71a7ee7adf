"""The store on PostgreSQL (docs/operations.md, "PostgreSQL"): the SQLite store's SQL and
guarantees, run through psycopg 3."""

from ratchet.persistence.postgres.store import PgLeaseClock, PostgresStore, migrate_pg

__all__ = ["PgLeaseClock", "PostgresStore", "migrate_pg"]
