"""Which store ``ratchet replay`` and ``ratchet export`` read, opened read-only: the one the
node uses — ``--store`` (a SQLite file or a ``postgresql://`` URL), else ``$RATCHET_STORE``
(as ``serve`` reads it), else ``<state-dir>/ratchet.db``.

The history readers (actors/replay/history.py) take a connection with sqlite3's
``execute`` / ``fetchone`` / iteration; the PostgreSQL store's :class:`PgConnection` offers
the same over psycopg, and the SQL is translated the way the store translates it
(persistence/postgres/dialect.py). Read-only on either engine: SQLite is opened
``mode=ro`` (``query_only``), the PostgreSQL session with
``default_transaction_read_only``, so the server refuses any write a replay could make.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ratchet.actors.replay import (
    open_read_only,
    read_task,
    select_tasks,
    write_recordings,
)
from ratchet.persistence.store_select import STORE_ENV, is_postgres_url
from ratchet.protocol.auth import redact_url
from ratchet.protocol.errors import UsageError

__all__ = ["export_from", "history_store", "open_history"]


def history_store(flag: str | Path | None, state_dir: str | Path) -> str | Path:
    """``--store`` (a SQLite file or a PostgreSQL URL), else ``$RATCHET_STORE``, else the
    state dir's SQLite file."""
    if flag:
        return str(flag) if is_postgres_url(str(flag)) else Path(flag)
    env = os.environ.get(STORE_ENV)
    if env:
        if not is_postgres_url(env):
            raise UsageError(f"{STORE_ENV} takes a postgresql:// URL")
        return env
    return Path(state_dir) / "ratchet.db"


@contextmanager
def open_history(store: str | Path) -> Iterator[Any]:
    """A read-only connection to ``store`` for the history readers; closed at the end.

    Raises:
        NotFound: no SQLite file there.
        UsageError: the PostgreSQL store cannot be reached (or its driver is missing).
    """
    conn = _open_postgres(str(store)) if is_postgres_url(store) else open_read_only(store)
    try:
        yield conn
    finally:
        conn.close()


def _open_postgres(url: str) -> Any:
    try:
        pg = importlib.import_module("ratchet.persistence.postgres.connection")
        psycopg = importlib.import_module("psycopg")
    except ImportError as exc:
        raise UsageError(f"a PostgreSQL store needs its driver ({exc}): install"
                         " ratchet-runtime[postgres]") from None
    try:
        raw = pg.connect(url)
    except psycopg.OperationalError as exc:
        raise UsageError(f"cannot reach the store {redact_url(url)}: {exc}") from None
    raw.execute("SET default_transaction_read_only = on")  # the server refuses writes
    return pg.PgConnection(raw, writing=False)  # writing=False: no row locks taken


def export_from(store: str | Path, out: str | Path, *, task_ids: list[str] | None = None,
                **filters: Any) -> int:
    """``actors.replay.export_tasks`` for a store of either engine: the recorded tasks
    ``task_ids`` (else those ``filters`` select) written to ``out``; how many."""
    with open_history(store) as conn:
        ids = task_ids or select_tasks(conn, **filters)
        return write_recordings(out, (read_task(conn, t) for t in ids))
