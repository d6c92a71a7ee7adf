"""The PostgreSQL a chaos run uses (``bench/chaos.py --store postgres``): a server of the
run's own (ratchet/testing/pg.py's ``PgServer``), one database the nodes share, and the
``pg_restart`` fault: ``pg_ctl restart -m immediate`` — every backend killed, no
checkpoint, crash recovery from the WAL at start — struck at every ``every``-th strike in
place of that strike's node kill (the kill point still chooses the moment). The nodes must
ride it out: their connections drop mid-transaction, they reconnect and go on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.pg_view import PgView
from bench.steps import percentile
from ratchet.testing.pg import PgServer

__all__ = ["PgUnderTest"]


class PgUnderTest:
    def __init__(self, every: int = 4) -> None:
        self.every = every
        self.server = PgServer()
        self.url = ""
        self.restart_seconds: list[float] = []
        self._view: PgView | None = None
        self._turns = 0

    def start(self) -> str:
        """Start the server and make the database; returns its URL."""
        self.server.start()
        self.url = self.server.database("chaos")
        self._view = PgView(self.url)
        return self.url

    def takes_turn(self) -> bool:
        """Called at each strike that would kill a node: whether this one restarts
        PostgreSQL instead (every ``every``-th; an operator's cancel takes no turn)."""
        self._turns += 1
        return self._turns % self.every == 0

    async def strike(self) -> None:
        """Restart the server (``-m immediate``); back once it accepts connections."""
        self.restart_seconds.append(await asyncio.to_thread(self.server.restart, "immediate"))

    def outcome(self, task_id: str) -> tuple[str | None, int, int]:
        """(status, handoffs, unsettled writes) of a run's task (bench/chaos.py)."""
        assert self._view is not None
        return self._view.outcome(task_id)

    def summary(self) -> dict[str, Any]:
        s = self.restart_seconds
        return {"store": "postgres", "pg_restarts": len(s),
                "pg_restart_p50_s": round(percentile(s, 0.5), 2) if s else -1.0,
                "pg_restart_max_s": round(max(s), 2) if s else -1.0}

    def close(self) -> None:
        if self._view is not None:
            self._view.close()
        self.server.close()
