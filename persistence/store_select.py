"""Which store a location names: a ``postgresql://`` URL (persistence/postgres/) or a
SQLite file path (persistence/store.py), opened behind the same ports."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ratchet.persistence.store import Store

__all__ = ["STORE_ENV", "is_postgres_url", "open_store"]

#: The environment variable ``ratchet serve`` reads its store from (``--store`` wins).
STORE_ENV = "RATCHET_STORE"


def is_postgres_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


async def open_store(location: str | Path, *args: Any, **kwargs: Any) -> Store:
    """``Store.open`` for a SQLite path, ``PostgresStore.open`` for a PostgreSQL URL (its
    driver imported only then: a SQLite node does not need it installed)."""
    if is_postgres_url(location):
        try:
            postgres = importlib.import_module("ratchet.persistence.postgres")
        except ImportError as exc:
            raise ImportError(f"a PostgreSQL store needs its driver ({exc}): install"
                              " ratchet-runtime[postgres]") from exc
        store: Store = await postgres.PostgresStore.open(str(location), *args, **kwargs)
        return store
    return await Store.open(location, *args, **kwargs)
