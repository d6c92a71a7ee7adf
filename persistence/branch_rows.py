"""Fan-out branch rows as the join and the branches use them: the port (:class:`BranchStore`)
and the batched settlement of many branches in one transaction (:class:`BranchRows`, a
mixin of :class:`persistence.store.Store`).

Settling a branch writes its row and its event. A wide fan-out's branches finish together,
so :meth:`BranchRows.finish_branches` settles a group of them in one transaction: one read
and one update of the task row for the group, the branch rows and events written with
``executemany``-sized work per branch, instead of a whole task change per branch.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack

from ratchet.persistence.graph_rows import BranchStep, finish_branch_txn
from ratchet.persistence.pipelined import PipelinedWriter
from ratchet.persistence.txns import ChangeResult, OutboxRow, TaskChange, apply_change_txn
from ratchet.persistence.writer import Writer
from ratchet.protocol.redaction import pack_redacted
from ratchet.protocol.secrets import Sealer

__all__ = ["BranchProgress", "BranchRows", "BranchSettlement", "BranchStore",
           "branch_steps_txn", "finish_branches_txn"]

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


@dataclass(frozen=True, slots=True)
class BranchProgress:
    """Where a running branch goes on: the node after its last committed step (None: it
    committed none), its state and node visits there, the steps committed so far and its
    failed runs retried so far (migration 23)."""

    next_node: str | None
    state: dict[str, Any]
    visits: dict[str, int]
    steps: int
    attempts: int = 0


class BranchStore(Protocol):
    """The branch rows of a task's fan-outs (part of ``TaskStore``)."""

    async def finish_branch(self, change: TaskChange, node: str, branch: str, status: str,
                            result: Any, error: dict[str, Any] | None) -> bool:
        """Settle a RUNNING branch and, only if it was still running, apply ``change`` in
        the same transaction."""
        ...

    async def finish_branches(self, task_id: str, node: str, producer: str, now: float,
                              settled: list[BranchSettlement], *,
                              pipelined: bool = False) -> dict[str, Any]:
        """Settle those of ``settled`` still RUNNING, with their events, in one transaction;
        returns the branches it settled, in order, each with its result as the store now
        holds it (what :meth:`branches` reads back: None but for SUCCEEDED). A branch
        settled before, e.g. by its timeout, is left as it was and its event not written.
        ``pipelined``: return at the commit, before it is durable (its events leave once
        it is: as a task change's ``pipelined``)."""
        ...

    async def record_branch_steps(self, task_id: str, node: str, producer: str, now: float,
                                  steps: list[tuple[BranchStep, tuple[str, dict[str, Any]]]],
                                  *, pipelined: bool = False) -> set[str]:
        """Record the progress of those of ``steps``' branches still RUNNING, each with its
        event, in one transaction; returns the branches recorded (one settled meanwhile is
        left alone, its event not written). ``pipelined``: as :meth:`finish_branches`."""
        ...

    async def branches(self, task_id: str, node: str) -> dict[str, dict[str, Any]]:
        ...

    async def branch(self, task_id: str, node: str, branch: str) -> dict[str, Any] | None:
        ...

    async def branches_named(self, task_id: str, node: str,
                             names: list[str]) -> dict[str, dict[str, Any]]:
        """The rows of those of ``names`` (as :meth:`branches` reads them)."""
        ...

    async def branch_inputs(self, task_id: str, node: str,
                            branches: list[str]) -> dict[str, dict[str, Any]]:
        """The initial state of those of ``branches`` of the fan-out ``node`` whose rows
        hold one (migration 24), secrets opened."""
        ...

    async def running_branches(self, task_id: str, node: str) -> set[str]:
        """The fan-out ``node``'s branches still RUNNING."""
        ...

    async def placed_branches(self, partitions: set[int]) -> dict[tuple[str, str], list[str]]:
        """The RUNNING branches placed in ``partitions`` whose task is RUNNING, by
        ``(task_id, fan-out key)``: what a node that takes those partitions over resumes."""
        ...

    async def branch_progress(self, task_id: str, node: str,
                              branches: list[str] | None = None) -> dict[str, BranchProgress]:
        """The progress of the fan-out ``node``'s RUNNING branches that committed a step or
        were retried (of ``branches`` only, if given), secrets opened."""
        ...


def finish_branches_txn(conn: sqlite3.Connection, task_id: str, node: str, producer: str,
                        now: float, settled: list[BranchSettlement],
                        default: Callable[[Any], Any] | None = None
                        ) -> tuple[dict[str, bytes | None], ChangeResult | None]:
    """Settle the RUNNING ones of ``settled`` and append their events as one side-channel
    change of the task (contiguous sequence numbers, one task-row update). Returns the
    branches settled with their results' bytes as written. ``default``: msgpack's hook for
    results (the store's sealer)."""
    if len(settled) == 1:
        s = settled[0]
        done = [s] if finish_branch_txn(conn, task_id, node, s.branch, s.status, s.result,
                                        s.error, now, default) else []
        packed = {s.branch: _pack(s.result, default) for s in done}
    else:
        # Which are still RUNNING, read once; then one executemany writes them (the
        # writer's transaction: nothing settles them in between).
        running = _running(conn, task_id, node, [s.branch for s in settled])
        done = []
        for s in settled:
            if s.branch in running:
                running.discard(s.branch)  # a branch twice in a group settles once
                done.append(s)
        packed = {s.branch: _pack(s.result, default) for s in done}
        conn.executemany(
            "UPDATE branches SET status = ?, result = ?, error = ?, finished_at = ?"
            " WHERE task_id = ? AND node = ? AND branch = ? AND status = 'RUNNING'",
            [(s.status, packed[s.branch], None if s.error is None else pack_redacted(s.error),
              now, task_id, node, s.branch) for s in done])
    if not done:
        return {}, None
    change = TaskChange(task_id=task_id, expected_version=None, producer=producer, now=now,
                        events=[s.event for s in done])
    return packed, apply_change_txn(conn, change)


def branch_steps_txn(conn: sqlite3.Connection, task_id: str, node: str, producer: str,
                     now: float, steps: list[tuple[BranchStep, tuple[str, dict[str, Any]]]]
                     ) -> tuple[set[str], ChangeResult | None]:
    """Record the progress of the RUNNING ones of ``steps``' branches, and their events as
    one side-channel change of the task (the branches that reach their safe point together
    share one task-row update)."""
    running = _running(conn, task_id, node, [st.branch for st, _ in steps])
    done = [(st, ev) for st, ev in steps if st.branch in running]
    if not done:
        return set(), None
    conn.executemany(
        "UPDATE branches SET next_node = ?, state = ?, visits = ?, steps = ?"
        " WHERE task_id = ? AND node = ? AND branch = ? AND status = 'RUNNING'",
        [(st.next_node, st.state, st.visits, st.steps, task_id, node, st.branch)
         for st, _ in done])
    change = TaskChange(task_id=task_id, expected_version=None, producer=producer, now=now,
                        events=[ev for _, ev in done])
    return {st.branch for st, _ in done}, apply_change_txn(conn, change)


def _pack(result: Any, default: Callable[[Any], Any] | None) -> bytes | None:
    return None if result is None else msgpack.packb(result, use_bin_type=True,
                                                     default=default)


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


def _announce_durable(announce: Callable[[list[OutboxRow]], None], rows: list[OutboxRow],
                      durable: asyncio.Future[None]) -> None:
    if not durable.cancelled() and durable.exception() is None:
        announce(rows)  # else never durable: never published


class BranchRows:
    """:meth:`finish_branches` of the Store (what it uses of the Store is declared here)."""

    _writer: Writer
    _syncing: PipelinedWriter | None  # the writer, when its commits may be pipelined
    secrets: Sealer

    def _announce(self, rows: list[OutboxRow]) -> None:
        raise NotImplementedError

    def _fenced(self, task_id: str, fn: Callable[[sqlite3.Connection], T]
                ) -> Callable[[sqlite3.Connection], T]:
        raise NotImplementedError

    async def _rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def branch_progress(self, task_id: str, node: str,
                              branches: list[str] | None = None) -> dict[str, BranchProgress]:
        sql = ("SELECT branch, next_node, state, visits, steps, attempts FROM branches"
               " WHERE task_id = ? AND node = ? AND status = 'RUNNING'"
               " AND (next_node IS NOT NULL OR attempts > 0)")
        rows: list[Any] = []
        if branches is None:
            rows = await self._rows(sql, (task_id, node))
        for i in range(0, len(branches or ()), _IN_CHUNK):
            chunk = (branches or [])[i:i + _IN_CHUNK]
            rows += await self._rows(f"{sql} AND branch IN ({','.join('?' * len(chunk))})",
                                     (task_id, node, *chunk))
        unpack = self.secrets.unpack_optional
        return {r[0]: BranchProgress(r[1], unpack(r[2]) or {}, unpack(r[3]) or {}, int(r[4]),
                                     int(r[5])) for r in rows}

    async def branch_inputs(self, task_id: str, node: str,
                            branches: list[str]) -> dict[str, dict[str, Any]]:
        rows: list[Any] = []
        for i in range(0, len(branches), _IN_CHUNK):
            chunk = branches[i:i + _IN_CHUNK]
            rows += await self._rows(
                "SELECT branch, input FROM branches WHERE task_id = ? AND node = ?"
                f" AND input IS NOT NULL AND branch IN ({','.join('?' * len(chunk))})",
                (task_id, node, *chunk))
        unpack = self.secrets.unpack_optional
        return {r[0]: unpack(r[1]) or {} for r in rows}

    async def running_branches(self, task_id: str, node: str) -> set[str]:
        return {r[0] for r in await self._rows(
            "SELECT branch FROM branches WHERE task_id = ? AND node = ? AND status = 'RUNNING'",
            (task_id, node))}

    async def placed_branches(self, partitions: set[int]) -> dict[tuple[str, str], list[str]]:
        if not partitions:
            return {}
        wanted = sorted(partitions)
        rows = await self._rows(
            "SELECT b.task_id, b.node, b.branch FROM branches b JOIN tasks t"
            " ON t.task_id = b.task_id WHERE b.status = 'RUNNING' AND t.status = 'RUNNING'"
            f" AND b.partition IN ({','.join('?' * len(wanted))})", wanted)
        found: dict[tuple[str, str], list[str]] = {}
        for task_id, key, branch in rows:
            found.setdefault((task_id, key), []).append(branch)
        return found

    async def finish_branches(self, task_id: str, node: str, producer: str, now: float,
                              settled: list[BranchSettlement], *,
                              pipelined: bool = False) -> dict[str, Any]:
        def txn(conn: sqlite3.Connection) -> tuple[dict[str, bytes | None], ChangeResult | None]:
            return finish_branches_txn(conn, task_id, node, producer, now, settled,
                                       self.secrets.default)

        packed = await self._side_txn(task_id, txn, pipelined)
        # Unpacked as a read of the row would (secrets opened, msgpack's types): the join
        # decides on these without reading the rows back.
        return {b: self.secrets.unpack_optional(p) for b, p in packed.items()}

    async def record_branch_steps(self, task_id: str, node: str, producer: str, now: float,
                                  steps: list[tuple[BranchStep, tuple[str, dict[str, Any]]]],
                                  *, pipelined: bool = False) -> set[str]:
        def txn(conn: sqlite3.Connection) -> tuple[set[str], ChangeResult | None]:
            return branch_steps_txn(conn, task_id, node, producer, now, steps)

        return await self._side_txn(task_id, txn, pipelined)

    async def _side_txn(self, task_id: str,
                        txn: Callable[[sqlite3.Connection], tuple[T, ChangeResult | None]],
                        pipelined: bool) -> T:
        """Run a branch group's transaction (fenced); its events leave once durable."""
        durable: asyncio.Future[None] | None = None
        out: T
        applied: ChangeResult | None
        if pipelined and self._syncing is not None:
            (out, applied), durable = await self._syncing.submit_pipelined(
                self._fenced(task_id, txn))
        else:
            out, applied = await self._writer.submit(self._fenced(task_id, txn))
        if applied is not None and durable is None:
            self._announce(applied.outbox)
        elif applied is not None and applied.outbox:
            assert durable is not None
            durable.add_done_callback(functools.partial(_announce_durable, self._announce,
                                                        applied.outbox))
        return out
