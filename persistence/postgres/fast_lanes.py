"""The PostgreSQL store's hot writes — task changes, acceptances, outbox deletions — each
one call of a server-side function (postgres/change_call.py, accept_call.py) on one of
:attr:`FastLanes.LANES` connections driven by the event loop (postgres/loop_conn.py).

A call is its own transaction, committed without waiting for the WAL flush; its caller
gets the result once the syncer (postgres/syncer.py) has flushed past it — or, pipelined
(a step's commit), at once with a future for that. A refusal waits for the flush too: it
may rest on a commit not yet durable.

Each connection is a pipeline (postgres/pipeline_conn.py): calls are sent as they come,
without waiting for those before them. Several connections: the server runs them side by
side, on the other core. A task's calls always take the same connection (by its id).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, Protocol

import psycopg

from ratchet.persistence.postgres.pipeline_conn import PipelineConnection
from ratchet.persistence.postgres.prepared import Prepared
from ratchet.persistence.postgres.syncer import PgSyncer
from ratchet.protocol.errors import StoreUnavailable

__all__ = ["Call", "FastLanes"]


class Call(Protocol):
    """What a lane runs: ``statement`` with ``args()`` (built when it is sent, in the
    caller's context), ``result(row)`` read from its row, ``refusal(error)`` for a
    statement the server refused."""

    statement: Prepared

    @property
    def task_id(self) -> str | None: ...

    def args(self) -> tuple[Any, ...]: ...

    def result(self, row: list[Any]) -> Any: ...

    def refusal(self, exc: psycopg.Error) -> Exception: ...




class FastLanes:
    """The lanes and the syncer they report to (whose flushes are the commit figures)."""

    LANES = 4

    def __init__(self, dsn: str, syncer: PgSyncer) -> None:
        # Commits do not wait for the WAL flush: the syncer's flush vouches for them.
        self._lanes = [PipelineConnection(dsn, setup=("SET synchronous_commit = off",))
                       for _ in range(self.LANES)]
        self.syncer = syncer

    async def open(self) -> None:
        for lane in self._lanes:
            await lane.open()

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()

    async def call(self, call: Call) -> Any:
        """``call``'s result once its commit is durable."""
        loop = asyncio.get_running_loop()
        generation, ok, value = await self._run(call)
        fut: asyncio.Future[Any] = loop.create_future()
        self.syncer.after(generation, [(fut, (ok, value))], commits=int(ok))
        return await fut

    async def call_pipelined(self, call: Call) -> tuple[Any, asyncio.Future[None]]:
        """``(result, durable)`` as soon as it committed; ``durable`` resolves once the
        commit is durable, or fails if it never will be. A refusal raises at once (nothing
        was committed). Nothing that depends on the commit may leave the process before
        ``durable``."""
        generation, ok, value = await self._run(call)
        if not ok:
            raise value
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.syncer.after(generation, [(durable, (True, None))], commits=1)
        return value, durable

    async def _run(self, call: Call) -> tuple[int, bool, Any]:
        """``(syncer generation before the commit, ok, result or exception)``."""
        key = call.task_id
        lane = self._lanes[zlib.crc32(key.encode()) % len(self._lanes) if key else 0]
        if lane.lost:  # the server restarted? the syncer's connection too, first
            await self.syncer.reconnect()
        generation = self.syncer.generation
        try:
            row = await lane.run(call.statement, call.args())
            outcome: tuple[bool, Any] = (True, call.result(row))
        except (psycopg.OperationalError, psycopg.errors.DeadlockDetected,
                psycopg.errors.SerializationFailure) as exc:  # retryable
            error = StoreUnavailable(f"the store cannot write: {exc}", postgres_error=str(exc))
            error.__cause__ = exc
            outcome = (False, error)
        except psycopg.Error as exc:
            outcome = (False, call.refusal(exc))
        return generation, *outcome
