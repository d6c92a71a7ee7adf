"""A task change whose caller goes on before it is durable (``TaskChange.pipelined``).

With ``synchronous=FULL`` a step's commit is written on the loop and synced by the WAL
syncer a little later (persistence/syncer.py). The task actor starts its next step at
the commit; what others may see of the change waits for the sync: its outbox rows (events,
mail) are announced to the relay only then, reads of the store answer only once what they
read is durable (``Store._rows``), and the actor holds back the answer to any mail until
its last change is durable (actors/task/durability.py). A change that is never durable
(the sync failed) is never announced.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol

from ratchet.persistence.txns import ChangeResult, OutboxRow

__all__ = ["PipelinedWriter", "announce_when_durable", "apply_pipelined"]


class PipelinedWriter(Protocol):
    """A writer whose commits may be handed back before they are durable: SQLite's
    LoopWriter under FULL, PostgreSQL's PgWriter (persistence/postgres/writer.py)."""

    def submit_pipelined(self, fn: Callable[[Any], Any]
                         ) -> asyncio.Future[tuple[Any, asyncio.Future[None] | None]]:
        """``(result, durable)`` at the commit; ``durable`` None when durable already."""
        ...

    async def synced(self) -> None:
        """Return once every commit made so far is durable."""
        ...


async def apply_pipelined(writer: PipelinedWriter,
                          txn: Callable[[sqlite3.Connection], tuple[ChangeResult, object]],
                          announce: Callable[[list[OutboxRow]], None]) -> ChangeResult:
    """Run ``txn`` (the store's change transaction, returning ``(result, audit head)``)
    in the next batch; return at its commit with ``durable`` set when it is not yet."""
    (result, _), durable = await writer.submit_pipelined(txn)
    assert isinstance(result, ChangeResult)
    return announce_when_durable(result, durable, announce)


def announce_when_durable(result: ChangeResult, durable: asyncio.Future[None] | None,
                          announce: Callable[[list[OutboxRow]], None]) -> ChangeResult:
    """``result`` with ``durable`` set; its outbox rows announced once it resolves (at
    once when ``durable`` is None: durable already)."""
    if durable is None:  # durable already (NORMAL: as durable as configured)
        announce(result.outbox)
        return result
    if result.outbox:
        durable.add_done_callback(functools.partial(_announce_durable, announce, result.outbox))
    # Built directly: dataclasses.replace inspects the fields at every call (~3 µs a step).
    return ChangeResult(result.version, result.status, result.last_event_seq,
                        result.last_checkpoint, result.outbox, durable)


def _announce_durable(announce: Callable[[list[OutboxRow]], None], rows: list[OutboxRow],
                      durable: asyncio.Future[None]) -> None:
    if not durable.cancelled() and durable.exception() is None:
        announce(rows)  # else never durable: never published
