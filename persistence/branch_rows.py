"""Fan-out branch rows as the join and the branches use them: the port (:class:`BranchStore`)
and the batched settlement of many branches in one transaction (:class:`BranchRows`, a
mixin of :class:`persistence.store.Store`).

Settling a branch writes its row and its event. A wide fan-out's branches finish together,
so :meth:`BranchRows.finish_branches` settles a group of them in one transaction: one read
and one update of the task row for the group, the branch rows and events written with
``executemany``-sized work per branch, instead of a whole task change per branch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack

from ratchet.persistence.graph_rows import finish_branch_txn
from ratchet.persistence.txns import ChangeResult, OutboxRow, TaskChange, apply_change_txn
from ratchet.persistence.writer import Writer
from ratchet.protocol.redaction import pack_redacted
from ratchet.protocol.secrets import Sealer

__all__ = ["BranchRows", "BranchSettlement", "BranchStore", "finish_branches_txn"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BranchSettlement:
    """One branch's end: its status, its result or error, and the event that records it
    (``(type, payload)``: ``branch.completed``, ``branch.failed`` or ``branch.timed_out``)."""

    branch: str
    status: str
    result: Any
    error: dict[str, Any] | None
    event: tuple[str, dict[str, Any]]


class BranchStore(Protocol):
    """The branch rows of a task's fan-outs (part of ``TaskStore``)."""

    async def finish_branch(self, change: TaskChange, node: str, branch: str, status: str,
                            result: Any, error: dict[str, Any] | None) -> bool:
        """Settle a RUNNING branch and, only if it was still running, apply ``change`` in
        the same transaction."""
        ...

    async def finish_branches(self, task_id: str, node: str, producer: str, now: float,
                              settled: list[BranchSettlement]) -> list[str]:
        """Settle those of ``settled`` still RUNNING, with their events, in one transaction;
        returns the branches it settled (a branch settled before, e.g. by its timeout, is
        left as it was and its event is not written)."""
        ...

    async def branches(self, task_id: str, node: str) -> dict[str, dict[str, Any]]:
        ...

    async def branch(self, task_id: str, node: str, branch: str) -> dict[str, Any] | None:
        ...


def finish_branches_txn(conn: sqlite3.Connection, task_id: str, node: str, producer: str,
                        now: float, settled: list[BranchSettlement],
                        default: Callable[[Any], Any] | None = None
                        ) -> tuple[list[str], ChangeResult | None]:
    """Settle the RUNNING ones of ``settled`` and append their events as one side-channel
    change of the task (contiguous sequence numbers, one task-row update). ``default``:
    msgpack's hook for results (the store's sealer)."""
    if len(settled) == 1:
        s = settled[0]
        done = [s] if finish_branch_txn(conn, task_id, node, s.branch, s.status, s.result,
                                        s.error, now, default) else []
    else:
        # Which are still RUNNING, read once; then one executemany writes them (the
        # writer's transaction: nothing settles them in between).
        running = _running(conn, task_id, node, [s.branch for s in settled])
        done = []
        for s in settled:
            if s.branch in running:
                running.discard(s.branch)  # a branch twice in a group settles once
                done.append(s)
        conn.executemany(
            "UPDATE branches SET status = ?, result = ?, error = ?, finished_at = ?"
            " WHERE task_id = ? AND node = ? AND branch = ? AND status = 'RUNNING'",
            [(s.status, None if s.result is None else msgpack.packb(
                s.result, use_bin_type=True, default=default),
              None if s.error is None else pack_redacted(s.error), now, task_id, node,
              s.branch) for s in done])
    if not done:
        return [], None
    change = TaskChange(task_id=task_id, expected_version=None, producer=producer, now=now,
                        events=[s.event for s in done])
    return [s.branch for s in done], apply_change_txn(conn, change)


#: Branch names per ``IN (...)`` query (well under SQLite's bound on parameters).
_IN_CHUNK = 500


def _running(conn: sqlite3.Connection, task_id: str, node: str, branches: list[str]) -> set[str]:
    """Those of ``branches`` of the fan-out ``node`` still RUNNING."""
    found: set[str] = set()
    for i in range(0, len(branches), _IN_CHUNK):
        chunk = branches[i:i + _IN_CHUNK]
        found.update(b for (b,) in conn.execute(
            "SELECT branch FROM branches WHERE task_id = ? AND node = ? AND status = 'RUNNING'"
            f" AND branch IN ({','.join('?' * len(chunk))})", (task_id, node, *chunk)))
    return found


class BranchRows:
    """:meth:`finish_branches` of the Store (what it uses of the Store is declared here)."""

    _writer: Writer
    secrets: Sealer

    def _announce(self, rows: list[OutboxRow]) -> None:
        raise NotImplementedError

    def _fenced(self, task_id: str, fn: Callable[[sqlite3.Connection], T]
                ) -> Callable[[sqlite3.Connection], T]:
        raise NotImplementedError

    async def finish_branches(self, task_id: str, node: str, producer: str, now: float,
                              settled: list[BranchSettlement]) -> list[str]:
        def txn(conn: sqlite3.Connection) -> tuple[list[str], ChangeResult | None]:
            return finish_branches_txn(conn, task_id, node, producer, now, settled,
                                       self.secrets.default)

        done, applied = await self._writer.submit(self._fenced(task_id, txn))
        if applied is not None:
            self._announce(applied.outbox)
        return done
