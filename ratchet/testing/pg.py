"""A PostgreSQL 16 of its own for a test or a bench that restarts it (``pg_ctl restart -m
immediate``: a crash as far as the server's clients can tell, then crash recovery from its
WAL), from the ``pgserver`` wheel's binaries (a dev extra: no apt, no Docker).

    with PgServer() as pg:
        url = pg.database("ratchet")          # created with the C collation
        pg.restart()                           # connections dropped; back within seconds

The server listens only on a Unix socket (:attr:`socket_path`); a :class:`TcpProxy`
in front of it gives a TCP path that a test can cut.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["PgServer", "create_database"]


def create_database(server_url: str, name: str) -> str:
    """Create ``name`` on the server of ``server_url`` (its ``postgres`` database's URL) with
    the C collation (text orders by bytes, as in SQLite); returns its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'"
                      " LC_COLLATE 'C' LC_CTYPE 'C'")
    return server_url.replace("/postgres?", f"/{name}?", 1)


class PgServer:
    """One pgserver-managed PostgreSQL in a temp dir, deleted at :meth:`close`."""

    def __init__(self, base: Path | None = None) -> None:
        self.pgdata = Path(tempfile.mkdtemp(prefix="ratchet-pg-", dir=base))
        self._server: Any = None

    def start(self) -> str:
        """Start it (about a second); returns the ``postgres`` database's URL."""
        with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR, /tmp is used
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import get_server

            self._server = get_server(self.pgdata, cleanup_mode=None)
        return self.url

    @property
    def url(self) -> str:
        return str(self._server.get_uri())

    @property
    def socket_path(self) -> str:
        """The server's Unix socket (what a proxy relays to)."""
        info = self._server.get_postmaster_info()
        return str(Path(info.socket_dir) / f".s.PGSQL.{info.port or 5432}")

    def database(self, name: str) -> str:
        return create_database(self.url, name)

    def pg_ctl(self, *args: str, timeout: float = 60.0) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH

        command = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args]
        user = self._server.system_user  # as root, pgserver runs the server as "pgserver"
        # Not a pipe: the server pg_ctl starts would inherit it, and the wait never end.
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, user=user, cwd="/")

    def restart(self, mode: str = "immediate") -> float:
        """``pg_ctl restart -m <mode>`` (``immediate``: no checkpoint, every backend killed;
        the start replays the WAL); returns the seconds until it accepted connections again
        (``-w``: pg_ctl waits for that)."""
        t0 = time.monotonic()
        self.pg_ctl("-w", "-m", mode, "-l", str(self.pgdata / "log"), "restart")
        return time.monotonic() - t0

    def close(self) -> None:
        if self._server is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.pg_ctl("-w", "-m", "fast", "stop")
        self._server = None
        shutil.rmtree(self.pgdata, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

